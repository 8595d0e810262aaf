//! Issuing TFs and accounting for them: pacing, placement through the policy (assign,
//! wait, drop), waiting TFs oldest first, re-assignment off a dead EPN, and TF ends.

use std::time::Duration;

use fanin_proto::{Message, Reason, TfStatus};
use fanin_sched::{DropReason, EpnId, Placed, TfId};

use super::{Action, IcnCore, Now, Phase, ISSUE_BATCH};
use crate::icn::ledger::TfRow;

impl IcnCore {
    /// Absolute issue time of TF `n`: t0 + n / rate. No drift, however late a wake-up.
    pub(super) fn deadline_of(&self, n: u64) -> Now {
        let t0 = self.run_t0.expect("running") + self.paused_total;
        t0 + Duration::from_secs_f64(n as f64 / self.cfg.run.cfg.rate_hz)
    }

    /// Issues every TF that is due, and moves the run along its phases.
    pub(super) fn pump(&mut self) {
        if matches!(self.phase, Phase::Running | Phase::Draining) {
            self.assign_waiting();
        }
        if self.cfg.run.on_data() {
            self.pump_on_data();
        } else if self.phase == Phase::Running && self.paused_at.is_none() {
            let total = self.cfg.run.total_tfs;
            let mut budget = ISSUE_BATCH;
            self.more_due = false;
            while total.is_none_or(|t| self.next_tf < t) && self.may_issue() {
                if budget == 0 {
                    self.more_due = true;
                    break;
                }
                self.issue_next();
                budget -= 1;
                if self.phase != Phase::Running {
                    return;
                }
            }
            if total.is_some_and(|t| self.next_tf >= t) {
                self.begin_drain();
            }
        }
        if self.phase == Phase::Draining && self.ledger.pending() == 0 {
            self.begin_stop();
        }
    }

    /// Is the next TF due now? Paced: its deadline passed. Unthrottled: fewer than
    /// `max_inflight` in flight, and every node present (or the wait for a missing one,
    /// bounded by the pre-run time-out, is over: then its TFs drop with the reason).
    fn may_issue(&mut self) -> bool {
        let now = self.now;
        if self.cfg.run.paced() {
            return self.deadline_of(self.next_tf) <= now;
        }
        if self.ledger.pending() as u64 >= self.window.size() {
            return false; // wait for acknowledgements: back-pressure, not drops
        }
        if (self.flps.len() as u32) < self.cfg.run.cfg.flps
            || self.placer.policy().epns().is_empty()
        {
            let since = *self.paused_since.get_or_insert(now);
            return now.saturating_sub(since).as_secs_f64() >= self.cfg.run.cfg.prerun_timeout_s;
        }
        self.paused_since = None;
        true
    }

    fn issue_next(&mut self) {
        let tf = self.cfg.id_base + self.next_tf;
        self.next_tf += 1;
        let now = self.now_us();
        if self.cfg.run.paced() && self.ledger.pending() as u64 >= self.cfg.run.cfg.max_inflight {
            let row = self.ledger.issue_dropped(tf, Reason::IcnInflightLimit, now);
            return self.ended(&row);
        }
        if (self.flps.len() as u32) < self.cfg.run.cfg.flps {
            // An FLP of this run is gone: no TF can be complete any more.
            let row = self.ledger.issue_dropped(tf, Reason::FlpLost, now);
            return self.ended(&row);
        }
        self.place_issued(tf, self.tf_bytes(tf));
    }

    /// A new TF: to its EPN, waiting for one, or dropped by the policy.
    pub(super) fn place_issued(&mut self, tf: TfId, bytes: u64) {
        let now = self.now_us();
        match self.placer.issue(tf, bytes) {
            Placed::Assigned(epn) => {
                self.ledger.issue(tf, epn, now);
                self.dispatch(tf, epn);
            }
            Placed::Waiting => {
                self.ledger.issue_waiting(tf, now);
                let n = self.placer.waiting_len() as u64;
                self.metrics.set_level("tfs_waiting", n);
            }
            Placed::Dropped(r) => {
                let row = self.ledger.issue_dropped(tf, drop_reason(r), now);
                self.ended(&row);
            }
        }
    }

    pub(super) fn tf_bytes(&self, tf: TfId) -> u64 {
        if self.cfg.run.on_data() {
            return self.ondata.sizes.get(&tf).copied().unwrap_or(0);
        }
        let cfg = &self.cfg.run.cfg;
        self.cfg.run.stf_size.tf_bytes(cfg.seed, cfg.flps, tf)
    }

    /// Tells the EPN, then every FLP, that `tf` is built on `epn`.
    pub(super) fn dispatch(&mut self, tf: TfId, epn: EpnId) {
        debug_assert_eq!(self.ledger.assigned(tf), Some(epn), "dispatch of TF {tf}");
        self.metrics
            .set_level("tfs_in_flight", self.ledger.pending() as u64);
        let assign = Message::Assign {
            tf_id: tf,
            epn_id: epn,
        };
        // The EPN learns first, so it expects the TF before its STFs arrive.
        let Some(&epn_conn) = self.epns.get(&epn) else {
            return;
        };
        self.send(epn_conn, assign.clone());
        if !self.want_stfs(tf, epn) {
            self.send_to_flps(assign);
        }
    }

    /// Gives waiting TFs an EPN, oldest first, while the policy finds one. TFs that
    /// ended meanwhile (an FLP could not send its STF) leave the queue.
    pub(super) fn assign_waiting(&mut self) {
        loop {
            let ledger = &self.ledger;
            let Some((tf, placed)) = self.placer.place_next(|tf| ledger.is_pending(tf)) else {
                break;
            };
            match placed {
                Placed::Assigned(epn) => {
                    self.ledger.assign_waiting(tf, epn);
                    self.dispatch(tf, epn);
                }
                Placed::Dropped(r) => {
                    let now = self.now_us();
                    if let Some(row) = self.ledger.flp_dropped(tf, drop_reason(r), now) {
                        self.ended(&row);
                    }
                }
                Placed::Waiting => unreachable!("place_next never answers Waiting"),
            }
        }
        let n = self.placer.waiting_len() as u64;
        self.metrics.set_level("tfs_waiting", n);
    }

    /// Zero-loss mode: the TFs of a dead EPN go to live EPNs, and the FLPs re-send
    /// their kept STFs. Returns (re-assigned, dropped because no EPN could take them).
    pub(super) fn reassign_from(&mut self, dead: EpnId) -> (u64, u64) {
        let (mut moved, mut lost) = (0, 0);
        for tf in self.ledger.pending_on(dead) {
            let reason = match self.placer.replace(tf, self.tf_bytes(tf)) {
                Placed::Assigned(to) if self.epns.contains_key(&to) => {
                    if self.ledger.reassign(tf, to) {
                        self.metrics.tf("reassigned", "epn_lost");
                        moved += 1;
                        self.dispatch(tf, to);
                    } else {
                        self.transfers_of_tf_unplaced(tf);
                    }
                    continue;
                }
                Placed::Waiting => {
                    // No EPN has room now: it waits (the FLPs keep its STFs), in id order.
                    self.ledger.unassign(tf);
                    self.kept_unplaced.insert(tf);
                    self.transfers_of_tf_unplaced(tf);
                    moved += 1;
                    continue;
                }
                Placed::Dropped(r) => drop_reason(r),
                Placed::Assigned(_) => Reason::EpnLost,
            };
            let now = self.now_us();
            if let Some(row) = self.ledger.flp_dropped(tf, reason, now) {
                self.ended(&row);
                lost += 1;
            }
        }
        (moved, lost)
    }

    /// A TF ended: count it, write its row, and let the FLPs free its STFs.
    pub(super) fn ended(&mut self, row: &TfRow) {
        self.tally.count(row.status);
        self.metrics.tf(row.status.name(), row.reason.name());
        if row.status == TfStatus::Complete {
            self.metrics
                .observe_latency(row.ended_us.saturating_sub(row.issued_us) as f64 / 1e6);
        }
        self.emit(Action::TfEnded(row.clone()));
        // FLPs kept the STFs of this TF for a re-send (on-data: always, in their
        // sources): they may free them now. With re-assignment, a TF with an EPN, or
        // one that had STFs sent out and ends without one (`kept_unplaced`); never one
        // dropped before any FLP heard of it.
        // After RunStop they freed every STF the run scheduled (and kept those it did
        // not), and read no more: a frame then would only make their close a reset
        // that can lose their run-end counters.
        self.ondata.sizes.remove(&row.tf_id);
        self.transfers_of_tf_over(row.tf_id);
        let unplaced = self.kept_unplaced.remove(&row.tf_id);
        let kept = self.cfg.run.on_data()
            || (self.cfg.run.cfg.reassign && (row.epn.is_some() || unplaced));
        // Taking over, the FLPs are in their pre-run: the start releases what ended.
        let stopped = matches!(self.phase, Phase::Stopping | Phase::Done);
        if kept && !stopped && self.gathered.is_none() {
            self.send_to_flps(Message::Release { tf_id: row.tf_id });
        }
    }
}

pub(super) fn drop_reason(r: DropReason) -> Reason {
    match r {
        DropReason::NoEpn => Reason::NoEpn,
        DropReason::NoEpnBuffer => Reason::NoEpnBuffer,
        DropReason::EpnsBusy => Reason::EpnsBusy,
    }
}
