//! Run control of a held run (`CoreConfig::hold_start`): START once every node is ready,
//! PAUSE and RESUME of issuing, STOP (drain, then RunStop), and the state nodes are told.

use std::time::Duration;

use fanin_proto::{Message, RunState};

use super::{IcnCore, Level, Now, Phase};
use crate::runctl::Command;

impl IcnCore {
    /// The run-control state of this run.
    pub fn run_state(&self) -> RunState {
        match self.phase {
            Phase::Running if self.paused_at.is_some() => RunState::Paused,
            Phase::Running | Phase::Draining | Phase::Stopping => RunState::Running,
            _ => RunState::Configured,
        }
    }

    /// Time spent paused so far (the current pause included).
    pub fn paused(&self) -> Duration {
        let now = self.paused_at.map(|p| self.now.saturating_sub(p));
        self.paused_total + now.unwrap_or_default()
    }

    /// This run's number (its run id).
    pub fn run_number(&self) -> u64 {
        self.cfg.run_id
    }

    /// The run's configuration.
    pub fn config(&self) -> &crate::config::Checked {
        &self.cfg.run
    }

    /// Did this run start (RunStart sent)?
    pub fn started(&self) -> bool {
        self.run_t0.is_some()
    }

    /// Carries out a run-control command at `now`: Ok(what was done) or why not (one
    /// line; nothing changed). Configure and exit belong to the session, not the run.
    pub fn command(&mut self, now: Now, cmd: Command) -> Result<String, String> {
        debug_assert!(now >= self.now, "time went backwards");
        self.now = now.max(self.now);
        let id = self.cfg.run_id;
        let done = match cmd {
            Command::Start => self.start_held()?,
            Command::Pause => self.pause()?,
            Command::Resume => self.resume()?,
            Command::Stop => self.stop()?,
            Command::Configure | Command::Exit => {
                return Err(format!("{} is not a command of run {id}", cmd.name()))
            }
        };
        self.broadcast_state();
        self.pump();
        Ok(done)
    }

    fn start_held(&mut self) -> Result<String, String> {
        self.startable()?;
        self.start_run();
        Ok(format!("run {} started", self.cfg.run_id))
    }

    /// Would START start the run now (every node ready), or why not.
    pub fn startable(&self) -> Result<(), String> {
        match self.phase {
            Phase::Ready => Ok(()),
            Phase::Registering | Phase::Preparing => Err(self.not_ready()),
            p => Err(format!("run {} is {p:?}", self.cfg.run_id)),
        }
    }

    /// Who the run still waits for.
    fn not_ready(&self) -> String {
        let cfg = &self.cfg.run.cfg;
        format!(
            "not ready: {} of {} FLPs and {} of {} EPNs registered, {} not ready yet",
            self.flps.len(),
            cfg.flps,
            self.epns.len(),
            cfg.epns,
            self.peers.values().filter(|p| !p.ready).count()
        )
    }

    fn pause(&mut self) -> Result<String, String> {
        if matches!(self.phase, Phase::Draining | Phase::Stopping) {
            // Draining or stopping: the state still reads RUNNING until the run ended.
            let id = self.cfg.run_id;
            return Err(format!(
                "pause is not possible: run {id} issues no more TFs, it is ending"
            ));
        }
        if self.phase != Phase::Running || self.paused_at.is_some() {
            return Err(format!("pause is not possible in {:?}", self.run_state()));
        }
        self.paused_at = Some(self.now);
        let line = format!(
            "t={:.3}s paused after issuing {} TFs",
            self.now_us() as f64 / 1e6,
            self.ledger.issued
        );
        self.log(Level::Info, line.clone());
        self.note(line);
        Ok(format!("run {} paused", self.cfg.run_id))
    }

    fn resume(&mut self) -> Result<String, String> {
        let Some(at) = self.paused_at.take() else {
            return Err("resume is not possible: the run is not paused".into());
        };
        let pause = self.now.saturating_sub(at);
        self.paused_total += pause;
        // An unthrottled run of a configured duration runs that long, pauses left out.
        if let (Phase::Running, Some(d)) = (self.phase, self.phase_deadline.as_mut()) {
            *d += pause;
        }
        // Nor does a pause count as waiting for a missing node.
        if let Some(t) = self.paused_since.as_mut() {
            *t += pause;
        }
        let line = format!(
            "t={:.3}s resumed after {:.3} s",
            self.now_us() as f64 / 1e6,
            pause.as_secs_f64()
        );
        self.log(Level::Info, line.clone());
        self.note(line);
        Ok(format!("run {} resumed", self.cfg.run_id))
    }

    /// STOP: like the first Ctrl-C (stop issuing, drain, RunStop); a second one stops
    /// at once.
    fn stop(&mut self) -> Result<String, String> {
        if !matches!(
            self.phase,
            Phase::Running | Phase::Draining | Phase::Stopping
        ) {
            return Err(format!("run {} has not started", self.cfg.run_id));
        }
        // A pause that ends in STOP came after the last TF issued: it is not part of
        // the run's duration.
        if let Some(at) = self.paused_at.take() {
            let line = format!(
                "t={:.3}s stopped after {:.3} s paused",
                self.now_us() as f64 / 1e6,
                self.now.saturating_sub(at).as_secs_f64()
            );
            self.note(line);
        }
        let draining = self.phase == Phase::Draining && self.interrupts == 0;
        self.on_interrupt();
        let (id, pending) = (self.cfg.run_id, self.ledger.pending());
        Ok(match draining {
            true => format!(
                "run {id} drains already ({pending} TFs in flight); stop again to stop it at once"
            ),
            false => format!("run {id} stopping: {pending} TFs in flight"),
        })
    }

    /// A run that never started ends without a result: every node is told (EXIT first
    /// when the session ends) and stopped, and joins the next run or exits.
    pub fn cancel(&mut self, exit: bool) {
        assert!(
            !self.started(),
            "cancel of run {} that ran",
            self.cfg.run_id
        );
        let state = match exit {
            true => RunState::Exit,
            false => RunState::Configured,
        };
        let stop = Message::RunStop {
            run_id: self.cfg.run_id,
        };
        let mut conns: Vec<_> = self.peers.keys().copied().collect();
        conns.sort_unstable();
        for c in conns {
            let run_number = self.cfg.run_id;
            self.send(c, Message::RunState { state, run_number });
            self.send(c, stop.clone());
        }
        self.phase = Phase::Done;
    }

    /// Every node learns the run-control state (also each node that registers).
    pub(super) fn broadcast_state(&mut self) {
        let msg = self.state_msg();
        let mut conns: Vec<_> = self.peers.keys().copied().collect();
        conns.sort_unstable();
        for c in conns {
            self.send(c, msg.clone());
        }
    }

    pub(super) fn state_msg(&self) -> Message {
        Message::RunState {
            state: self.run_state(),
            run_number: self.cfg.run_id,
        }
    }
}
