//! What each frame from a registered FLP or EPN does: readiness, TF reports, dropped
//! STFs, reachability of EPNs, load reports and heartbeats, run-end counters.

use fanin_proto::{Message, Reason, Role, TfReport};
use fanin_sched::{EpnId, EpnLoad, TfId};

use super::{ConnId, IcnCore, Level, Phase};
use crate::icn::ledger::Outcome;

impl IcnCore {
    pub(super) fn on_msg(&mut self, conn: ConnId, msg: Message) {
        let p = &self.peers[&conn];
        let (role, id, joining) = (p.role, p.id, p.joined_at.is_some());
        let running = matches!(self.phase, Phase::Running | Phase::Draining);
        match msg {
            Message::Ready { connected, .. } if self.phase == Phase::Preparing => {
                self.on_ready(conn, role, id, connected)
            }
            Message::Ready { .. } if running && joining => self.rejoin_ready(conn),
            // Taking over, reports wait with what the EPNs hold until the run goes on.
            Message::TfReport(r) if role == Role::Epn && self.gathered.is_some() => {
                self.on_tfs_held(id, Vec::new(), vec![r])
            }
            Message::TfReport(r) if role == Role::Epn => self.on_report(id, r),
            Message::StfDropped { tf_id, reason, .. } if role == Role::Flp => {
                // The TF ends first, so the freed tokens go to other TFs.
                self.on_stf_dropped(tf_id, reason);
                self.transfer_dropped(id, tf_id)
            }
            Message::StfSent { tf_id, epn_id } if role == Role::Flp => {
                self.transfer_ended(id, tf_id, epn_id)
            }
            Message::StfReceived { tf_id, flp_id } if role == Role::Epn => {
                self.transfer_ended(flp_id, tf_id, id)
            }
            Message::EpnReachable { epn_id, ok } if role == Role::Flp => {
                self.on_reachable(conn, id, epn_id, ok)
            }
            Message::LoadReport { .. } if role == Role::Flp => {} // heartbeat
            Message::StfAnnounce(list) if role == Role::Flp => self.on_announce(conn, id, list),
            Message::SourceEnded { ok, detail } if role == Role::Flp => {
                self.on_source_ended(id, ok, detail)
            }
            Message::StfsHeld(list) if role == Role::Flp => self.on_stfs_held(conn, id, list),
            Message::TfsHeld { building, reports } if role == Role::Epn => {
                self.on_tfs_held(id, building, reports)
            }
            Message::LoadReport {
                free_bytes,
                building,
            } if role == Role::Epn => self.on_load(
                id,
                EpnLoad {
                    free_bytes,
                    building,
                },
            ),
            Message::NodeStats(s) => self.on_node_stats(conn, role, id, s),
            other => {
                let line = format!(
                    "{} {id}: unexpected {:?} in phase {:?}",
                    role.name(),
                    other.msg_type(),
                    self.phase
                );
                self.log(Level::Warn, line);
                self.metrics.error("unexpected_message");
            }
        }
    }

    /// An EPN's load report: to the policy, and to `loads.csv`.
    fn on_load(&mut self, epn: EpnId, load: EpnLoad) {
        self.placer.policy_mut().report_load(epn, load);
        self.record_load(epn, load);
    }

    /// A node's run-end counters; the run ends once every node's are in.
    fn on_node_stats(&mut self, conn: ConnId, role: Role, id: u32, s: fanin_proto::NodeStats) {
        if let Some(p) = self.peers.get_mut(&conn) {
            p.stats = true;
        }
        let name = format!("{} {}", role.name(), id);
        self.node_stats
            .insert(name, s.counters.into_iter().collect());
        if self.phase == Phase::Stopping {
            self.maybe_all_stats();
        }
    }

    fn on_ready(&mut self, conn: ConnId, role: Role, id: u32, connected: u32) {
        // The EPNs it was told of (a take-over may go on without some, even without
        // one that left after it was told).
        let epns = self.epns.len() as u32;
        let short = match self.gathered {
            Some(_) => connected < epns,
            None => connected != epns,
        };
        if role == Role::Flp && short {
            self.fatal = Some(format!("FLP {id} connected to {connected} of {epns} EPNs"));
            self.phase = Phase::Done;
            return;
        }
        if let Some(p) = self.peers.get_mut(&conn) {
            p.ready = true;
        }
        self.maybe_all_ready();
    }

    /// Every node of the pre-run is ready: the run starts (a held one waits for START).
    pub(super) fn maybe_all_ready(&mut self) {
        let prerun = matches!(self.phase, Phase::Preparing);
        // A take-over goes on even when nobody came back: its TFs must end here.
        let nobody = self.peers.is_empty() && self.gathered.is_none();
        if !prerun || nobody || !self.peers.values().all(|p| p.ready) {
            return;
        }
        if self.cfg.hold_start {
            self.phase = Phase::Ready;
            self.prerun_s = self.now.saturating_sub(self.started).as_secs_f64();
            let line = format!(
                "run {}: every node is ready; waiting for START",
                self.cfg.run_id
            );
            self.log(Level::Info, line);
        } else {
            self.start_run();
        }
    }

    pub(super) fn on_report(&mut self, epn: EpnId, r: TfReport) {
        let now = self.now_us();
        let tf_id = r.tf_id;
        match self
            .ledger
            .report(r.tf_id, epn, r.status, r.reason, r.bytes, now)
        {
            Outcome::Ended(row) => {
                let latency_us = row.ended_us.saturating_sub(row.issued_us);
                let complete = row.status == fanin_proto::TfStatus::Complete;
                self.window.ended(complete, latency_us, row.ended_us);
                self.ended(&row)
            }
            Outcome::NotPending => self.metrics.error("stale_report"),
            Outcome::WrongEpn { assigned } => {
                let line = format!("EPN {epn} reported TF {} assigned to {assigned:?}", r.tf_id);
                self.log(Level::Warn, line);
                self.metrics.error("wrong_epn_report");
            }
        }
        // The EPN keeps its report until the ICN has it (for a take-over): now it may
        // forget it (the row, if any, is written before this leaves). After RunStop the
        // EPNs read no more (a frame then could turn their close into a reset).
        // Taking over, the EPN is in its pre-run: the Release waits for the start.
        let stopped = matches!(self.phase, Phase::Stopping | Phase::Done);
        let gathering = self.gathered.is_some();
        if let Some(&c) = self.epns.get(&epn).filter(|_| !stopped && !gathering) {
            self.send(c, Message::Release { tf_id });
        }
    }

    /// Records an EPN's load for `loads.csv`, at most once a second, while running.
    fn record_load(&mut self, epn: EpnId, load: EpnLoad) {
        self.last_load.insert(epn, load);
        if self.run_t0.is_none() {
            return;
        }
        let t_us = self.now_us();
        let last = self.load_recorded.get(&epn).copied();
        if last.is_some_and(|l| t_us < l + 1_000_000) {
            return;
        }
        self.load_recorded.insert(epn, t_us);
        self.emit(super::Action::EpnLoad {
            t_us,
            epn,
            free_bytes: load.free_bytes,
            building: load.building,
        });
    }

    fn on_stf_dropped(&mut self, tf_id: TfId, reason: Reason) {
        let now = self.now_us();
        if let Some(row) = self.ledger.flp_dropped(tf_id, reason, now) {
            self.ended(&row);
            // The EPN holds the other STFs of this TF: let it free them now.
            if let Some(&c) = row.epn.and_then(|e| self.epns.get(&e)) {
                self.send(c, Message::Abandon { tf_id, reason });
            }
        }
    }

    fn on_reachable(&mut self, conn: ConnId, flp: u32, epn: EpnId, ok: bool) {
        if !ok {
            // The FLP cannot reach this EPN: out of the schedule (its TFs move); if it
            // is alive, it joins again and every FLP connects afresh.
            return self.epn_unreachable(flp, epn);
        }
        if let Some((_, waiting)) = self.joining.get_mut(&epn) {
            waiting.retain(|f| *f != flp);
            self.maybe_epn_joined(epn);
        }
        if let Some(p) = self.peers.get_mut(&conn) {
            let before = p.awaiting.len();
            p.awaiting.retain(|e| *e != epn);
            if before > 0 && p.awaiting.is_empty() && p.joined_at.is_some() {
                self.rejoin_ready(conn);
            }
        }
    }

    /// Stopping: the run is done when every node sent its run-end counters.
    pub(super) fn maybe_all_stats(&mut self) {
        if self.peers.values().all(|p| p.stats) {
            self.phase = Phase::Done;
        }
    }
}
