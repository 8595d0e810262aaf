//! The run's life: all registered -> Prepare, all ready -> RunStart, issuing until the
//! configured length, drain, RunStop and run-end counters, time-outs, and the summary.

use std::time::Duration;

use fanin_proto::{EpnEntry, Message, Prepare, Reason};

use super::{Action, ConnId, IcnCore, Level, Phase, STOP_WAIT};
use crate::config::size_to_wire;
use crate::icn::summary::Summary;

impl IcnCore {
    pub(super) fn prepare_msg(&self) -> Prepare {
        let run = &self.cfg.run;
        Prepare {
            run_id: self.cfg.run_id,
            flps: run.cfg.flps,
            build_timeout_ms: run.cfg.build_timeout_ms.min(u32::MAX as u64) as u32,
            crc: run.cfg.crc,
            size: size_to_wire(run.stf_size),
            seed: run.cfg.seed,
            retain: run.cfg.reassign,
            schedule: run.cfg.schedule.wire(),
            // 0 means as fast as the buffer allows: a rate above 0 stays above.
            rate_mhz: ((run.cfg.rate_hz * 1000.0).round() as u64)
                .max(u64::from(run.cfg.rate_hz > 0.0)),
            tfs: run.total_tfs.filter(|_| run.on_data()).unwrap_or(0),
            pull: run.cfg.transfer == crate::config::Transfer::Pull,
        }
    }

    /// All nodes registered: tell EPNs the run parameters, FLPs the EPN list.
    pub(super) fn prepare(&mut self) {
        self.registered_s = self.now.saturating_sub(self.started).as_secs_f64();
        self.phase = Phase::Preparing;
        let prep = self.prepare_msg();
        let list: Vec<EpnEntry> = self.epn_list();
        for c in self.epns.values().copied().collect::<Vec<_>>() {
            self.send(c, Message::Prepare(prep.clone()));
        }
        for c in self.flps.values().copied().collect::<Vec<_>>() {
            self.send(c, Message::Prepare(prep.clone()));
            self.send(c, Message::EpnList(list.clone()));
        }
    }

    pub(super) fn start_run(&mut self) {
        let now = self.now;
        // A held run's pre-run ended when every node was ready, not at START.
        if !self.cfg.hold_start {
            self.prerun_s = now.saturating_sub(self.started).as_secs_f64();
        }
        let line = format!(
            "pre-run took {:.3} s (registration {:.3} s, connections {:.3} s); run {} starts",
            self.prerun_s,
            self.registered_s,
            self.prerun_s - self.registered_s,
            self.cfg.run_id
        );
        self.log(Level::Info, line);
        // A take-over goes on with the run's time axis (the shell's clock counts from
        // the run's start), unless its ICN died in the pre-run: that run starts now, as
        // a fresh one does (its start noted, the take-over's gathering no pause).
        let resumed = self.gathered.is_some();
        let started = self.gathered.as_ref().is_some_and(|g| g.started);
        self.run_t0 = Some(if started { Duration::ZERO } else { now });
        self.emit(Action::RunStarted { resumed: started });
        for p in self.peers.values_mut() {
            p.last_seen = now;
        }
        self.phase = Phase::Running;
        self.last_lease_check = now;
        for epn in self.epns.keys().copied().collect::<Vec<_>>() {
            self.placer.policy_mut().add_epn(epn);
        }
        if resumed {
            self.resume_ledger();
        }
        if started {
            self.outage_as_pause();
        }
        self.phase_deadline = self.run_deadline(self.run_t0.unwrap_or(now) + self.paused_total);
        self.broadcast(Message::RunStart {
            run_id: self.cfg.run_id,
            elapsed_us: self.now_us(),
        });
    }

    /// A paced run that was taken over issues on from where the failed ICN stopped:
    /// the time without an ICN counts as a pause (no burst of overdue TFs).
    fn outage_as_pause(&mut self) {
        if self.cfg.run.paced() {
            let due = self.deadline_of(self.next_tf);
            self.paused_total += self.now.saturating_sub(due);
        }
    }

    /// When the run's length is over (None: its TF count ends it). On-data with
    /// `duration_s` (and no `tfs`): that long, plus a stale time for the last TFs.
    fn run_deadline(&self, now: super::Now) -> Option<super::Now> {
        let run = &self.cfg.run;
        if run.on_data() {
            let d = run.cfg.duration_s.filter(|_| run.cfg.tfs.is_none())?;
            let slack = Duration::from_millis(run.cfg.stf_stale_ms);
            return Some(now + Duration::from_secs_f64(d) + slack);
        }
        if run.paced() {
            return None;
        }
        run.configured_duration.map(|d| now + d)
    }

    /// Sends `msg` to every registered node, in connection order.
    fn broadcast(&mut self, msg: Message) {
        let mut conns: Vec<ConnId> = self.peers.keys().copied().collect();
        conns.sort_unstable();
        for c in conns {
            self.send(c, msg.clone());
        }
    }

    /// Time passed: leases, then the phase's deadline (paced issuing is `pump`'s).
    pub(super) fn on_timeout(&mut self) {
        if self.now >= self.last_lease_check + super::LEASE_CHECK {
            self.check_leases();
        }
        self.expire_ended_grants();
        let Some(deadline) = self.phase_deadline else {
            return;
        };
        if self.phase == Phase::Running && self.paused_at.is_some() {
            return; // a paused run's length waits for it
        }
        if self.now < deadline {
            return;
        }
        match self.phase {
            Phase::Registering | Phase::Preparing | Phase::Ready => self.prerun_timed_out(),
            Phase::Running => self.begin_drain(),
            Phase::Draining => {
                let line = format!(
                    "drain time-out with {} TFs outstanding",
                    self.ledger.pending()
                );
                self.log(Level::Warn, line);
                self.begin_stop();
            }
            Phase::Stopping => {
                let mut missing: Vec<String> = self
                    .peers
                    .values()
                    .filter(|p| !p.stats)
                    .map(|p| p.name())
                    .collect();
                missing.sort();
                self.log(Level::Warn, format!("no run-end counters from {missing:?}"));
                self.note(format!("no run-end counters from {}", missing.join(", ")));
                self.phase = Phase::Done;
            }
            Phase::Done => {}
        }
    }

    fn prerun_timed_out(&mut self) {
        // A take-over goes on with whoever came back, even nobody: the run's TFs must
        // end here, named (no EPN: dropped `no_epn`; the rest may join later).
        if self.gathered.is_some() && self.phase == Phase::Registering {
            // A take-over goes on with the nodes that came back; the rest may join later.
            let line = format!(
                "take-over: {} of {} FLPs and {} of {} EPNs came back; going on with them",
                self.flps.len(),
                self.cfg.run.cfg.flps,
                self.epns.len(),
                self.cfg.run.cfg.epns
            );
            self.log(Level::Warn, line.clone());
            self.note(line);
            self.phase_deadline = Some(self.now + self.cfg.run.drain_timeout());
            self.prepare();
            return self.maybe_all_ready(); // nobody came back: nothing to wait for
        }
        if self.gathered.is_some() && self.phase == Phase::Preparing {
            // Nodes that came back but are not ready (an FLP still connecting to an EPN
            // that died meanwhile) are dropped, as if they had left: they may join later.
            let mut late: Vec<ConnId> = self
                .peers
                .iter()
                .filter(|(_, p)| !p.ready && p.joined_at.is_none())
                .map(|(c, _)| *c)
                .collect();
            late.sort_unstable();
            for c in late {
                self.metrics.error("not_ready");
                self.peer_gone(c, "not ready by the take-over's pre-run deadline");
            }
            return self.maybe_all_ready();
        }
        let cfg = &self.cfg.run.cfg;
        let missing_flps: Vec<u32> = (0..cfg.flps)
            .filter(|i| !self.flps.contains_key(i))
            .collect();
        self.fatal = Some(format!(
            "pre-run timed out after {} s in phase {:?}: {} of {} EPNs and {} of {} FLPs registered (missing FLP ids {:?}), {} nodes not ready",
            cfg.prerun_timeout_s,
            self.phase,
            self.epns.len(),
            cfg.epns,
            self.flps.len(),
            cfg.flps,
            missing_flps,
            self.peers.values().filter(|p| !p.ready).count()
        ));
        self.phase = Phase::Done;
    }

    pub(super) fn on_lost_leadership(&mut self) {
        if self.lost_leadership {
            return;
        }
        // Another ICN leads now and goes on with the run (it took it over), or this one
        // cannot rule that out: it is fenced. It stops at once and says nothing more to
        // anyone: no RunStop, no rows, no summary.
        self.lost_leadership = true;
        let msg = "lost leadership and did not win it back: the run ends here (another ICN goes on with it, or may)";
        self.log(Level::Warn, msg.into());
        self.note(msg.into());
        match self.phase {
            Phase::Registering | Phase::Preparing | Phase::Ready => {
                self.fatal = Some("lost leadership before the run started".into());
                self.phase = Phase::Done;
            }
            Phase::Running | Phase::Draining | Phase::Stopping => {
                self.fatal = Some(format!(
                    "lost leadership of run {} and did not win it back: another ICN goes on with it, or may (fenced: no summary here)",
                    self.cfg.run_id
                ));
                self.phase = Phase::Done;
            }
            Phase::Done => {}
        }
    }

    pub(super) fn on_interrupt(&mut self) {
        self.interrupts += 1;
        let issued = self.ledger.issued;
        let of = self
            .cfg
            .run
            .total_tfs
            .map(|t| format!(" of {t}"))
            .unwrap_or_default();
        let msg = format!("interrupted after issuing {issued}{of} TFs");
        self.log(Level::Warn, msg.clone());
        match (self.phase, self.interrupts) {
            (Phase::Registering | Phase::Preparing | Phase::Ready, _) => {
                self.fatal = Some("interrupted before the run started".into());
                self.phase = Phase::Done;
            }
            (Phase::Running, 1) => {
                self.note(msg);
                self.begin_drain();
            }
            // The run reached its length and drains already: it goes on draining (what
            // it issued still completes); a second interrupt stops it at once.
            (Phase::Draining, 1) => {
                self.log(
                    Level::Warn,
                    "the run drains already; interrupt again to stop it at once".into(),
                );
                self.note(msg);
            }
            (Phase::Running | Phase::Draining, _) => self.begin_stop(),
            (Phase::Stopping, 1) => self.note(msg),
            (Phase::Stopping, _) => self.phase = Phase::Done,
            (Phase::Done, _) => {}
        }
    }

    pub(super) fn begin_drain(&mut self) {
        self.phase = Phase::Draining;
        if self.unscheduled() > 0 {
            // Never issued, so outside the ledger; their STFs stay with the sources.
            let line = format!(
                "{} TFs announced by some FLPs were not scheduled when the run ended",
                self.unscheduled()
            );
            self.log(Level::Info, line.clone());
            self.note(line);
        }
        self.phase_deadline = Some(self.now + self.cfg.run.drain_timeout());
        let line = format!(
            "issued {} TFs; draining {} in flight",
            self.ledger.issued,
            self.ledger.pending()
        );
        self.log(Level::Info, line);
    }

    pub(super) fn begin_stop(&mut self) {
        // TFs still waiting for an EPN never got one.
        let now = self.now_us();
        for tf in self.placer.drain_waiting() {
            if let Some(row) = self.ledger.flp_dropped(tf, Reason::EpnsBusy, now) {
                self.ended(&row);
            }
        }
        self.phase = Phase::Stopping;
        self.transfers_stopped();
        self.phase_deadline = Some(self.now + STOP_WAIT);
        self.broadcast(Message::RunStop {
            run_id: self.cfg.run_id,
        });
        if self.peers.is_empty() {
            self.phase = Phase::Done;
        }
    }

    /// Ends the run at `now`: every TF still pending ends as `unacknowledged`, and the
    /// summary is built (the shell writes it, and the rows still in the outbox).
    pub fn finish(&mut self, now: Duration) -> Summary {
        self.now = now.max(self.now);
        let rows = self.ledger.close_all(Reason::Unacknowledged, self.now_us());
        for r in &rows {
            self.ended(r);
        }
        if !rows.is_empty() {
            let line = format!("{} TFs never acknowledged (unacknowledged)", rows.len());
            self.note(line);
        }
        if self.events_not_kept > 0 {
            let n = self.events_not_kept;
            self.events
                .push(format!("{n} more events and membership changes not kept"));
        }
        self.tally.ids = self.next_tf;
        // A held run stopped by run control had no planned length: its configured one
        // was a limit, not a target.
        let mut run = self.cfg.run.clone();
        if self.cfg.hold_start && self.interrupts > 0 {
            (run.total_tfs, run.configured_duration) = (None, None);
        }
        let summary = Summary::build(
            self.cfg.run_id,
            &run,
            &self.ledger,
            &self.tally,
            (self.prerun_s, self.paused().as_secs_f64()),
            std::mem::take(&mut self.node_stats),
            std::mem::take(&mut self.events),
        );
        self.phase = Phase::Done;
        Summary {
            interrupted: self.interrupts > 0,
            policy_resets: self.placer.policy().resets(),
            membership: std::mem::take(&mut self.membership),
            ..summary
        }
    }
}
