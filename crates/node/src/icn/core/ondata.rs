//! On-data scheduling (`schedule = "on-data"`): the FLPs' STF announcements, a TF
//! scheduled once every FLP announced it or when it goes stale, late and repeated STFs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use fanin_proto::{Message, Reason, StfInfo};
use fanin_sched::{FlpId, Gather, Heard, TfId};

use super::{ConnId, IcnCore, Level, Now, Phase};
use crate::config::{OnStale, MAX_STF_BYTES};

/// TF ids remembered as scheduled, to answer late announcements (older ones: below the
/// floor, also answered as over).
const SCHEDULED_KEPT: usize = 1 << 20;

/// The ICN's view of the data: TFs announced (the rule is `fanin_sched::Gather`'s),
/// complete ones waiting for a pause to end, what was scheduled.
pub(crate) struct OnData {
    /// Announced and not complete; first heard of in run time without pauses.
    gather: Gather<Now>,
    /// TFs every FLP announced, to schedule in TF-id order when not paused: bytes.
    complete: BTreeMap<TfId, u64>,
    /// TFs scheduled (recent ones), and below `floor` all are taken as scheduled.
    scheduled: BTreeSet<TfId>,
    floor: TfId,
    /// The size of each TF in flight (placement of a re-assigned TF needs it).
    pub(crate) sizes: HashMap<TfId, u64>,
    /// FLPs whose source ended (or failed).
    sources_ended: BTreeSet<FlpId>,
    /// FLPs lost from the run, since when (run time without pauses): after
    /// `stf_stale_ms` away, their sources count as ended (the run must end without them).
    lost: BTreeMap<FlpId, Now>,
}

impl OnData {
    pub(crate) fn new(flps: u32) -> OnData {
        OnData {
            gather: Gather::new(flps),
            complete: BTreeMap::new(),
            scheduled: BTreeSet::new(),
            floor: 0,
            sizes: HashMap::new(),
            sources_ended: BTreeSet::new(),
            lost: BTreeMap::new(),
        }
    }

    fn was_scheduled(&self, tf: TfId) -> bool {
        tf < self.floor || self.scheduled.contains(&tf)
    }

    pub(super) fn mark_scheduled(&mut self, tf: TfId) {
        self.scheduled.insert(tf);
        while self.scheduled.len() > SCHEDULED_KEPT {
            let oldest = self.scheduled.pop_first().expect("non-empty");
            self.floor = self.floor.max(oldest + 1);
        }
    }
}

impl IcnCore {
    fn stale_after(&self) -> Duration {
        Duration::from_millis(self.cfg.run.cfg.stf_stale_ms)
    }

    /// Run time without its pauses, the current one included (stale deadlines do not run
    /// while paused, and an STF announced during a pause counts from its start).
    fn active_now(&self) -> Now {
        self.now.saturating_sub(self.paused())
    }

    /// TFs announced and not scheduled (reported when the run ends).
    pub(super) fn unscheduled(&self) -> usize {
        self.ondata.gather.len() + self.ondata.complete.len()
    }

    /// An FLP joined the run again: its (new) source produces again.
    pub(super) fn source_restarted(&mut self, flp: FlpId) {
        self.ondata.sources_ended.remove(&flp);
        self.ondata.lost.remove(&flp);
    }

    /// An FLP left the run: its source may come back with it (a ring survives its FLP),
    /// for as long as its TFs wait (`stf_stale_ms`).
    pub(super) fn source_lost(&mut self, flp: FlpId) {
        let now = self.active_now();
        self.ondata.lost.insert(flp, now);
    }

    /// Why the run ends without them: the lost FLPs whose sources count as ended.
    fn note_lost_sources(&mut self) {
        let t = self.now_us() as f64 / 1e6;
        let ended = &self.ondata.sources_ended;
        let lost: Vec<FlpId> = self
            .ondata
            .lost
            .keys()
            .filter(|f| !ended.contains(f))
            .copied()
            .collect();
        for f in lost {
            let line =
                format!("t={t:.3}s FLP {f}: away for stf_stale_ms: its source counts as ended");
            self.log(Level::Warn, line.clone());
            self.note(line);
        }
    }

    /// Every FLP's source ended, or its FLP has been away for `stf_stale_ms`: no STF
    /// can come any more.
    fn sources_done(&self) -> bool {
        let flps = self.cfg.run.cfg.flps;
        let gone_since = self.active_now().checked_sub(self.stale_after());
        (0..flps).all(|f| {
            self.ondata.sources_ended.contains(&f)
                || self
                    .ondata
                    .lost
                    .get(&f)
                    .is_some_and(|&t| gone_since.is_some_and(|g| t <= g))
        })
    }

    /// An FLP announced STFs its source produced.
    pub(super) fn on_announce(&mut self, conn: ConnId, flp: FlpId, list: Vec<StfInfo>) {
        if !self.cfg.run.on_data() || self.run_t0.is_none() {
            self.metrics.error("unexpected_message");
            return;
        }
        for s in list {
            self.announce_one(conn, flp, s);
        }
    }

    fn announce_one(&mut self, conn: ConnId, flp: FlpId, s: StfInfo) {
        let tf = s.tf_id;
        if self.ledger.is_pending(tf) {
            // Scheduled and open: this FLP's STF still goes to the TF's EPN (a late
            // STF, or one a restarted FLP announces again).
            self.metrics.stf("announced_late", "", 1);
            if let Some(epn_id) = self.ledger.assigned(tf) {
                if !self.want_late_stf(tf, epn_id, flp) {
                    self.send(conn, Message::Assign { tf_id: tf, epn_id });
                }
            }
            return;
        }
        if self.phase != Phase::Running && !self.ondata.was_scheduled(tf) {
            // The run ends: it stays with its source (a ring slot READY for the next
            // run; RunStop frees the rest); after RunStop the FLP reads nothing more.
            self.metrics.stf("not_scheduled", "", 1);
            return;
        }
        let over = self.ondata.was_scheduled(tf);
        if over || s.size > MAX_STF_BYTES {
            if !over {
                let line = format!("FLP {flp}: STF of TF {tf}: size {} is over 1 GiB", s.size);
                self.log(Level::Warn, line);
                self.metrics.error("bad_announce");
            }
            self.metrics.stf("late", "", 1);
            self.send(conn, Message::Release { tf_id: tf });
            return;
        }
        if self.ondata.complete.contains_key(&tf) {
            return; // complete already, waiting for the pause to end
        }
        let now = self.active_now();
        if let Heard::Complete { bytes } = self.ondata.gather.announce(tf, flp, s.size, now) {
            self.ondata.complete.insert(tf, bytes);
        }
        // Bounded: past max_inflight TFs announced and not complete, the oldest goes
        // stale. A paused run holds them all (the FLPs' buffers bound them).
        while self.ondata.gather.len() as u64 > self.cfg.run.cfg.max_inflight
            && self.paused_at.is_none()
        {
            let Some((oldest, bytes)) = self.ondata.gather.pop_oldest() else {
                break;
            };
            self.stale(oldest, bytes);
        }
    }

    /// An FLP's source ended (`ok`) or failed.
    pub(super) fn on_source_ended(&mut self, flp: FlpId, ok: bool, detail: String) {
        let t = self.now_us() as f64 / 1e6;
        // A failure's line names the FLP and its source already.
        let line = if ok {
            format!("t={t:.3}s FLP {flp}: source ended: {detail}")
        } else {
            format!("t={t:.3}s source failed: {detail}")
        };
        let level = if ok { Level::Info } else { Level::Error };
        self.log(level, line.clone());
        self.note(line);
        self.ondata.sources_ended.insert(flp);
    }

    /// Schedules what the data allow: complete TFs in order, then stale ones. Ends
    /// the run at its TF count, or when every source ended and nothing waits.
    pub(super) fn pump_on_data(&mut self) {
        if self.phase != Phase::Running || self.paused_at.is_some() {
            return;
        }
        while let Some((tf, bytes)) = self.ondata.complete.pop_first() {
            self.schedule(tf, bytes);
            if self.phase != Phase::Running {
                return;
            }
        }
        // Stale: first heard of `stf_stale_ms` ago or longer (none yet early in a run).
        let before = self.active_now().checked_sub(self.stale_after());
        while let Some((tf, bytes)) = before.and_then(|b| self.ondata.gather.pop_stale(b)) {
            self.stale(tf, bytes);
            if self.phase != Phase::Running {
                return;
            }
        }
        // The cheap test first: this runs on every pump.
        if self.unscheduled() == 0 && self.sources_done() {
            self.note_lost_sources();
            self.begin_drain();
        }
    }

    /// When the oldest announced TF goes stale, or a lost FLP's source counts as ended
    /// (None: nothing waits, or paused).
    pub(super) fn stale_deadline(&self) -> Option<Now> {
        let first = self.ondata.gather.first_arrival();
        // Lost FLPs not yet counted as ended (those past it need no more wake-ups).
        let now = self.active_now();
        let waiting = |t: &&Now| **t + self.stale_after() > now;
        let lost = self.ondata.lost.values().filter(waiting).min().copied();
        let at = first.into_iter().chain(lost).min()? + self.stale_after() + self.paused_total;
        self.paused_at.is_none().then_some(at)
    }

    /// A TF not every FLP announced in time: built from what exists, or dropped.
    fn stale(&mut self, tf: TfId, bytes: u64) {
        self.metrics.tf("stale", "stf_stale");
        match self.cfg.run.cfg.on_stale {
            OnStale::Incomplete => self.schedule(tf, bytes),
            OnStale::Drop => {
                self.count_scheduled(tf);
                let row = self
                    .ledger
                    .issue_dropped(tf, Reason::StfStale, self.now_us());
                self.ended(&row);
                self.end_at_count();
            }
        }
    }

    /// Places a TF whose size is known now.
    fn schedule(&mut self, tf: TfId, bytes: u64) {
        self.count_scheduled(tf);
        self.ondata.sizes.insert(tf, bytes);
        self.place_issued(tf, bytes);
        self.end_at_count();
    }

    fn count_scheduled(&mut self, tf: TfId) {
        self.ondata.mark_scheduled(tf);
        self.next_tf += 1;
    }

    /// The run's TF count reached: drain.
    fn end_at_count(&mut self) {
        let total = self.cfg.run.total_tfs;
        if self.phase == Phase::Running && total.is_some_and(|t| self.next_tf >= t) {
            self.begin_drain();
        }
    }
}
