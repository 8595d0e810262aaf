//! The nodes model's processes: a node's process (its counters, its ZooKeeper session)
//! and its incarnations (one per control connection); starts, kills, freezes and thaws.
//!
//! A kill ends the process (a restart is a new one); a lost ICN ends only the
//! incarnation (the process joins again). With a registry a node keeps its run for an
//! ICN that takes it over, as the runtime does; an ICN that did not die answers its
//! rejoin with `resume = false`, and the kept run ends. A frozen process handles
//! nothing: what reaches it waits, in order, for the thaw.

use std::collections::VecDeque;
use std::sync::Arc;

use fanin_node::icn::core::ConnId;
use fanin_node::metrics::Metrics;

use super::net::End;
use super::world::{Ev, World, REJOIN};
use crate::engine::{Time, MS};

/// A node's process, across its incarnations.
#[derive(Default)]
pub struct Proc {
    /// The current incarnation's control connection.
    pub conn: Option<ConnId>,
    /// The control connection its run's state began on: that state's data events name
    /// it (a run kept across a take-over outlives its control connection).
    pub key: Option<ConnId>,
    /// Which process this is: a kill makes the next start a new one.
    pub gen: u64,
    pub frozen_until: Time,
    /// When its current freeze began (a second freeze while frozen lengthens it).
    pub frozen_since: Time,
    /// Which freeze: a thaw of an earlier one does nothing.
    pub freeze: u64,
    /// Events that reached it while frozen, in order.
    pub deferred: VecDeque<Ev>,
    /// The process's counters: they add up over its rejoins, as a real node's do.
    pub metrics: Option<Arc<Metrics>>,
    /// It left the run, gave up, or was killed for good: it does not come back.
    pub gone: bool,
}

/// A node: its process and its current incarnation's state.
pub struct Slot<S> {
    pub proc: Proc,
    pub state: Option<S>,
    /// Runs its processes began (a second one starts its source anew).
    pub runs: u32,
}

impl<S> Default for Slot<S> {
    fn default() -> Self {
        Slot {
            proc: Proc::default(),
            state: None,
            runs: 0,
        }
    }
}

impl World {
    pub fn proc(&self, end: End) -> &Proc {
        match end {
            End::Flp(i) => &self.flps[i as usize].proc,
            End::Epn(i) => &self.epns[i as usize].proc,
            End::Icn => unreachable!("the ICN is not a node process"),
        }
    }

    pub fn proc_mut(&mut self, end: End) -> &mut Proc {
        match end {
            End::Flp(i) => &mut self.flps[i as usize].proc,
            End::Epn(i) => &mut self.epns[i as usize].proc,
            End::Icn => unreachable!("the ICN is not a node process"),
        }
    }

    /// The process's counters (made at its first start).
    pub fn metrics_of(&mut self, end: End) -> Arc<Metrics> {
        let (role, id) = match end {
            End::Flp(i) => ("flp", i),
            End::Epn(i) => ("epn", i),
            End::Icn => unreachable!("the ICN's metrics are its core's"),
        };
        let p = self.proc_mut(end);
        p.metrics
            .get_or_insert_with(|| Metrics::new(role, Some(id)))
            .clone()
    }

    /// The incarnation on `conn`, if it is still its node's current one.
    pub fn current(&self, conn: ConnId) -> Option<End> {
        let end = *self.owner.get(&conn)?;
        (end != End::Icn && self.proc(end).conn == Some(conn)).then_some(end)
    }

    /// The node whose run's state began on `key`, if that state is still its current one.
    pub fn holder(&self, key: ConnId) -> Option<End> {
        let end = *self.owner.get(&key)?;
        (end != End::Icn && self.proc(end).key == Some(key)).then_some(end)
    }

    /// The node's current incarnation ends (its state is gone; the process lives on).
    pub fn end_incarnation(&mut self, end: End) {
        self.proc_mut(end).conn = None;
        self.proc_mut(end).key = None;
        match end {
            End::Flp(i) => {
                self.close_data(i); // its data connections end with its run
                self.flps[i as usize].state = None
            }
            End::Epn(i) => self.epns[i as usize].state = None,
            End::Icn => {}
        }
    }

    /// The node's run goes on without an ICN until one takes it over (`flp.rs`, `epn.rs`).
    fn keep_run(&mut self, end: End) {
        let now = self.q.now();
        match end {
            End::Flp(i) => self.flp_away(i),
            End::Epn(i) => self.epn_away(i, now),
            End::Icn => {}
        }
    }

    /// An FLP process that had a run ends (killed, or gives up): its source ends with it
    /// (on-data, the TFs it would have made do not exist).
    pub fn cut_source(&mut self, end: End) {
        if let End::Flp(i) = end {
            self.seen.sources_cut += u64::from(self.flps[i as usize].runs > 0);
        }
    }

    /// The process joins again after `after` (its incarnation ended).
    pub fn rejoin(&mut self, end: End, after: Time) {
        let gen = self.proc(end).gen;
        self.q.after(after, Ev::Start { end, gen });
    }

    /// The node's control connection ended. After its run started it joins again; in
    /// the pre-run the process ends (as `fanin flp` and `fanin epn` do: "the ICN closed
    /// the connection before the run").
    pub fn node_closed(&mut self, conn: ConnId) {
        let Some(end) = self.current(conn) else {
            return;
        };
        // With a registry, a node whose ICN died or was deposed looks for the leader again.
        let icn_gone = self.zk.is_some() && !self.icns[self.conn_icn[&conn]].leads();
        let started = match end {
            End::Flp(i) => matches!(
                self.flps[i as usize].state,
                Some(super::flp::FlpState::Running(_))
            ),
            End::Epn(i) => matches!(
                self.epns[i as usize].state,
                Some(super::epn::EpnState::Running(_))
            ),
            End::Icn => false,
        };
        if started && self.zk.is_some() {
            // Its run is kept for an ICN that takes it over (as `fanin flp` and `fanin
            // epn` do whenever they lose the ICN; the same ICN answers the rejoin with
            // `resume = false`, and the kept run ends).
            self.proc_mut(end).conn = None;
            self.keep_run(end);
            return self.rejoin(end, REJOIN);
        }
        self.end_incarnation(end);
        if started || icn_gone {
            self.rejoin(end, REJOIN);
        } else {
            self.seen.log.push(format!(
                "{}: the ICN closed the connection before the run; it exits",
                end.name()
            ));
            self.proc_mut(end).gone = true;
            self.cut_source(end); // a rejoining FLP that exits
        }
    }

    /// SIGKILL: the process and its incarnation end; a new process starts after
    /// `restart_ms`, or never.
    pub fn kill(&mut self, end: End, restart_ms: Option<u64>) {
        let conn = self.proc(end).conn;
        self.cut_source(end);
        self.end_incarnation(end); // a run kept for a take-over too
        if let Some(conn) = conn {
            self.close_from_node(conn, Some("connection reset by peer".into()));
        }
        let gen = self.proc(end).gen;
        self.zk_silent(end, gen, None);
        let p = self.proc_mut(end);
        p.gen += 1;
        p.freeze += 1;
        p.frozen_until = 0;
        p.metrics = None;
        let waiting = std::mem::take(&mut p.deferred);
        let gen = p.gen;
        match restart_ms {
            Some(ms) if !p.gone => self.q.after(ms * MS, Ev::Start { end, gen }),
            _ => p.gone = true,
        }
        // What waited for it now meets a dead process: its own events are ignored, an
        // FLP's write blocked on it fails (the connection resets).
        for ev in waiting {
            self.dispatch(ev);
        }
    }

    /// SIGSTOP for `ms`: nothing reaches the process until it thaws. A second freeze
    /// while frozen lasts until the later of the two ends.
    pub fn freeze(&mut self, end: End, ms: u64) {
        let now = self.q.now();
        let p = self.proc_mut(end);
        if p.frozen_until <= now {
            p.frozen_since = now;
        }
        p.frozen_until = p.frozen_until.max(now + ms * MS);
        let (gen, silent) = (p.gen, (p.frozen_since, p.frozen_until));
        self.zk_silent(end, gen, Some(silent));
        let p = self.proc_mut(end);
        p.freeze += 1;
        let (until, freeze) = (p.frozen_until, p.freeze);
        self.q.at(until, Ev::Thaw { end, freeze });
    }

    /// SIGCONT: what waited is handled now, in the order it came.
    pub fn thaw(&mut self, end: End, freeze: u64) {
        let p = self.proc_mut(end);
        if p.freeze != freeze {
            return;
        }
        p.frozen_until = 0;
        let waiting = std::mem::take(&mut p.deferred);
        for ev in waiting {
            self.dispatch(ev);
        }
    }

    /// A write waits for its frozen FLP, or for the EPN it writes to while that EPN
    /// (still the incarnation on `to`) is frozen: it reads nothing, TCP's window closes
    /// (the model has no socket buffer to fill first).
    fn write_blocked(&self, flp: ConnId, to: ConnId) -> Option<End> {
        let frozen = |end: End| self.proc(end).frozen_until > self.q.now();
        let f = *self.owner.get(&flp)?;
        if frozen(f) {
            return Some(f);
        }
        let e = self.holder(to)?;
        frozen(e).then_some(e)
    }

    /// The frozen node an event is for, if any.
    pub fn frozen_target(&self, ev: &Ev) -> Option<End> {
        let end = match ev {
            Ev::Start { end, .. } => *end,
            Ev::ToNode { conn, .. }
            | Ev::NodeClosed { conn }
            | Ev::Tick { conn }
            | Ev::Produce { conn }
            | Ev::FlpConnected { conn } => *self.owner.get(conn)?,
            Ev::Written { flp, to, .. } => return self.write_blocked(*flp, *to),
            Ev::DataConnected { flp, .. } => *self.owner.get(flp)?,
            Ev::Arrived { to, .. } => *self.owner.get(to)?,
            _ => return None,
        };
        (end != End::Icn && self.proc(end).frozen_until > self.q.now()).then_some(end)
    }
}
