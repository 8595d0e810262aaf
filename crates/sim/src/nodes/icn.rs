//! The nodes model's ICNs: the leader's unchanged `IcnCore` and its connections, kills
//! and freezes of it, and the standby that takes the run over when its session ends.
//!
//! As in a run with `registry = "zookeeper"` and a standby started beside the leader: one
//! session time-out after the leader died (or froze), its znode is gone and the standby
//! takes the run over from the rows so far and what the nodes hold; the nodes follow the
//! new leader. A frozen leader that thaws after that first finds its session gone (the
//! run goes on while no other ICN leads, it believes: its rows go to its own file, its
//! frames to connections the nodes closed), learns a registry round trip later that
//! another ICN leads, and must then say nothing to anyone (checked).

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use fanin_node::config::Checked;
use fanin_node::icn::core::{Action, ConnId, CoreConfig, IcnCore, Input, Takeover};
use fanin_node::metrics::Metrics;

use super::fault::FaultKind;
use super::net::End;
use super::world::{Ev, World};
use super::zk::SimZk;
use crate::engine::{Time, MS};

/// One ICN process: the first leader, or a standby that took the run over.
pub struct IcnProc {
    pub core: IcnCore,
    /// Control connections it has open.
    pub open: BTreeSet<ConnId>,
    /// The simulated time its core's clock counts from: a standby's from the run's start,
    /// as the runtime's does (the run's time axis goes on).
    origin: Time,
    wake: (u64, Option<Time>),
    pub dead: bool,
    /// Another ICN took the run over: this one is fenced.
    pub deposed: bool,
    /// A deposed ICN learnt it lost the lead: from then on it must do nothing.
    lost_lead: bool,
    /// Since when it has been silent to ZooKeeper (frozen), for the session's expiry.
    silent_since: Option<Time>,
    frozen_until: Time,
    freeze: u64,
    /// Events that reached it while frozen, in order.
    deferred: VecDeque<Ev>,
}

impl IcnProc {
    fn new(core: IcnCore, origin: Time) -> IcnProc {
        IcnProc {
            core,
            open: BTreeSet::new(),
            origin,
            wake: (0, None),
            dead: false,
            deposed: false,
            lost_lead: false,
            silent_since: None,
            frozen_until: 0,
            freeze: 0,
            deferred: VecDeque::new(),
        }
    }

    /// Does it take inputs (not dead: killed, or exited once fenced)?
    pub fn acts(&self) -> bool {
        !self.dead
    }

    /// Does it lead (alive and not deposed)?
    pub fn leads(&self) -> bool {
        !self.dead && !self.deposed
    }
}

/// The first ICN's core, or a standby's taking the run over at `now`; its clock counts
/// from `origin`.
pub fn new_icn(
    run: &Checked,
    zk: Option<&SimZk>,
    takeover: Option<Takeover>,
    (origin, now): (Time, Time),
) -> IcnProc {
    let cfg = CoreConfig {
        run: run.clone(),
        run_id: 1,
        id_base: 0,
        registry_members: zk.map(|z| z.members.clone()),
        stopwatch_ns: || 0,
        hold_start: false,
        takeover,
    };
    let now = Duration::from_nanos(now - origin);
    IcnProc::new(IcnCore::new(cfg, Metrics::new("icn", None), now), origin)
}

impl World {
    /// The ICN leading the run now.
    pub fn icn(&self) -> &IcnCore {
        &self.icns[self.leader].core
    }

    /// The leader's core clock now.
    pub fn icn_now(&self, k: usize) -> Duration {
        Duration::from_nanos(self.q.now().saturating_sub(self.icns[k].origin))
    }

    /// An input for the leader.
    pub fn feed_icn(&mut self, input: Input) {
        self.feed_icn_of(self.leader, input);
    }

    /// An input for ICN `k` (none for one dead or fenced), and what it does.
    pub fn feed_icn_of(&mut self, k: usize, input: Input) {
        if !self.icns[k].acts() {
            return;
        }
        let now = self.icn_now(k);
        self.icns[k].core.handle(now, input);
        self.drain_icn(k);
        self.reschedule_wake(k);
    }

    /// Carries out ICN `k`'s actions. A deposed ICN's rows go to its own file (no one
    /// reads it) and its frames to connections its nodes closed; once it learnt it lost
    /// the lead it must do nothing but log and close.
    pub fn drain_icn(&mut self, k: usize) {
        while let Some(a) = self.icns[k].core.poll_action() {
            let quiet = matches!(a, Action::Log { .. } | Action::Close { .. });
            if self.icns[k].lost_lead && !quiet {
                let s = self.q.now() as f64 / 1e9;
                self.seen.fenced.push(format!(
                    "{s:.6} ICN {k} acted after it lost the lead: {a:?}"
                ));
                continue;
            }
            if self.icns[k].deposed && matches!(a, Action::TfEnded(_)) {
                continue; // its own rows file
            }
            match a {
                Action::Send { conn, msg } => {
                    if self.icns[k].open.contains(&conn) {
                        let to = self.owner[&conn];
                        let at = self.net.control(self.q.now(), conn, End::Icn, to);
                        self.q.at(at, Ev::ToNode { conn, msg });
                    }
                }
                Action::Close { conn } => {
                    if self.icns[k].open.remove(&conn) {
                        let to = self.owner[&conn];
                        let at = self.net.control(self.q.now(), conn, End::Icn, to);
                        self.q.at(at, Ev::NodeClosed { conn });
                    }
                }
                Action::Log { line, .. } => {
                    let s = self.q.now() as f64 / 1e9;
                    self.seen.log.push(format!("{s:.6} ICN {k}: {line}"));
                }
                Action::TfEnded(row) => {
                    self.ended.insert(row.tf_id);
                    self.rows.push(row);
                }
                Action::RunStarted { resumed } => {
                    if !resumed {
                        self.run_started_at = Some(self.q.now());
                    }
                }
                Action::EpnLoad { .. } => {}
            }
        }
    }

    pub fn reschedule_wake(&mut self, k: usize) {
        let p = &self.icns[k];
        let want = p.core.poll_timeout().map(|d| {
            let t = d.as_nanos().min(u128::from(u64::MAX / 2)) as Time;
            (t + p.origin).max(self.q.now())
        });
        if want != p.wake.1 {
            let gen = p.wake.0 + 1;
            self.icns[k].wake = (gen, want);
            if let Some(t) = want {
                self.q.at(t, Ev::IcnWake { icn: k, gen });
            }
        }
    }

    /// The frozen ICN an event is for, if any (it waits for the thaw).
    pub fn icn_frozen_target(&self, ev: &Ev) -> Option<usize> {
        let k = match ev {
            Ev::Register { conn, .. } | Ev::ToIcn { conn, .. } | Ev::IcnClosed { conn, .. } => {
                *self.conn_icn.get(conn)?
            }
            Ev::IcnWake { icn, .. } => *icn,
            Ev::ZkWatch(_) => self.leader,
            _ => return None,
        };
        (self.icns[k].frozen_until > self.q.now()).then_some(k)
    }

    /// An event for an ICN: a registration, a frame, a closed connection, a wake-up.
    pub fn icn_event(&mut self, ev: Ev) {
        match ev {
            Ev::Register { conn, reg } => {
                let k = self.conn_icn[&conn];
                if self.icns[k].acts() {
                    let peer = super::world::peer_addr(conn);
                    self.icns[k].open.insert(conn);
                    self.feed_icn_of(k, Input::Registered { conn, peer, reg });
                }
            }
            Ev::ToIcn { conn, msg } => {
                let k = self.conn_icn[&conn];
                if self.icns[k].open.contains(&conn) {
                    self.note_report(conn, &msg);
                    self.feed_icn_of(k, Input::Msg { conn, msg });
                }
            }
            Ev::IcnClosed { conn, err } => {
                let k = self.conn_icn[&conn];
                if self.icns[k].open.remove(&conn) {
                    self.feed_icn_of(k, Input::Closed { conn, err });
                }
            }
            Ev::IcnWake { icn, gen } => {
                if gen == self.icns[icn].wake.0 {
                    self.icns[icn].wake.1 = None;
                    self.feed_icn_of(icn, Input::Timeout);
                }
            }
            _ => unreachable!("not an ICN event"),
        }
    }

    /// A fault of the leading ICN (kill or freeze: `Fault::check`).
    pub fn icn_fault(&mut self, kind: FaultKind) {
        match kind {
            FaultKind::Kill { .. } => self.kill_icn(),
            FaultKind::Freeze { ms } => self.freeze_icn(ms),
            _ => unreachable!("Fault::check lets only kills and freezes at the ICN"),
        }
    }

    /// kill -9 of the leader: its connections reset (frames sent before still arrive),
    /// and its standby takes over once its session expired.
    fn kill_icn(&mut self) {
        let k = self.leader;
        if self.icns[k].dead {
            return;
        }
        let now = self.q.now();
        let p = &mut self.icns[k];
        p.dead = true;
        p.deferred.clear();
        (p.frozen_until, p.freeze) = (0, p.freeze + 1);
        // Its session has been silent since it froze, if it did.
        let silent = p.silent_since.take().unwrap_or(now);
        let conns = self.conns_to(k);
        self.nodes_leave(conns, 0);
        let at = (silent + self.zk_timeout()).max(now);
        self.q.at(at, Ev::Elect { from: k });
    }

    /// SIGSTOP of the leader for `ms`: past its session time-out, the standby takes over.
    fn freeze_icn(&mut self, ms: u64) {
        let k = self.leader;
        let now = self.q.now();
        let p = &mut self.icns[k];
        if p.dead {
            return;
        }
        p.frozen_until = p.frozen_until.max(now + ms * MS);
        p.freeze += 1;
        let silent = *p.silent_since.get_or_insert(now);
        let (until, freeze) = (p.frozen_until, p.freeze);
        self.q.at(until, Ev::IcnThaw { icn: k, freeze });
        // Its session expires after a time-out of silence (freezes back to back add up).
        let timeout = self.zk_timeout();
        if until > silent + timeout {
            self.q.at(silent + timeout, Ev::Elect { from: k });
        }
    }

    /// The control connections nodes have to ICN `k` (open, or still registering), which
    /// it forgets.
    fn conns_to(&mut self, k: usize) -> BTreeSet<ConnId> {
        let mut conns = std::mem::take(&mut self.icns[k].open);
        let registering = self.conn_icn.iter().filter(|&(_, &icn)| icn == k);
        let current: Vec<ConnId> = registering
            .map(|(&c, _)| c)
            .filter(|&c| self.current(c).is_some())
            .collect();
        conns.extend(current);
        conns
    }

    /// Each node on one of `conns` sees it closed (`extra`: after the registry told it).
    fn nodes_leave(&mut self, conns: BTreeSet<ConnId>, extra: Time) {
        let now = self.q.now() + extra;
        for conn in conns {
            let to = self.owner[&conn];
            let at = self.net.control(now, conn, End::Icn, to);
            self.q.at(at, Ev::NodeClosed { conn });
        }
    }

    /// SIGCONT of ICN `k`: what waited is handled in order. A deposed one first finds
    /// its session gone (the run goes on while no other ICN leads, it believes), and
    /// learns one registry round trip later that another leads.
    pub fn thaw_icn(&mut self, k: usize, freeze: u64) {
        let p = &mut self.icns[k];
        if p.freeze != freeze {
            return;
        }
        (p.frozen_until, p.silent_since) = (0, None);
        let mut waiting = std::mem::take(&mut p.deferred);
        if p.deposed {
            let what = "lost the registry leadership (session ended)".to_string();
            self.feed_icn_of(k, Input::RegistryOutage { lost: true, what });
            self.q
                .after(2 * self.net.latency(), Ev::IcnLostLead { icn: k });
            // Its registry watch ended with its session: those snapshots are not its.
            waiting.retain(|ev| !matches!(ev, Ev::ZkWatch(_)));
        }
        for ev in waiting {
            self.dispatch(ev);
        }
    }

    /// The deposed ICN `k`'s re-election found another leader: it stops, fenced (what
    /// it does on that news is checked), and its process exits, as `fanin icn` does.
    pub fn icn_lost_lead(&mut self, k: usize) {
        self.icns[k].lost_lead = true;
        self.feed_icn_of(k, Input::LostLeadership);
        self.icns[k].dead = true;
    }

    fn zk_timeout(&self) -> Time {
        self.zk
            .as_ref()
            .expect("checked: ICN faults need ZooKeeper")
            .timeout
    }

    /// Defers an event for the frozen ICN `k`.
    pub fn icn_defer(&mut self, k: usize, ev: Ev) {
        self.icns[k].deferred.push_back(ev);
    }

    /// The standby's election: the leader `from` is still silent (dead, or frozen past
    /// its session), so the standby takes the run over; the nodes follow it.
    pub fn elect(&mut self, from: usize) {
        let now = self.q.now();
        let old = &self.icns[from];
        if from != self.leader || (!old.dead && old.frozen_until <= now) {
            return;
        }
        if !old.dead
            && old
                .silent_since
                .is_some_and(|t| now < t + self.zk_timeout())
        {
            return; // a later freeze's election (its silence began later)
        }
        let origin = self.run_started_at.unwrap_or(now);
        let takeover = Takeover {
            epoch: self.icns.len() as u64 - 1,
            elapsed: Duration::from_nanos(now - origin),
            rows: self.rows.clone(),
        };
        let p = new_icn(&self.run, self.zk.as_ref(), Some(takeover), (origin, now));
        if !self.icns[from].dead {
            // Frozen: fenced. Its nodes learn of the new leader and leave it.
            self.icns[from].deposed = true;
            let conns = self.conns_to(from);
            let watch = self.net.latency();
            self.nodes_leave(conns, watch);
        }
        self.seen.log.push(format!(
            "{:.6} ICN {}: the standby takes the run over",
            now as f64 / 1e9,
            self.icns.len()
        ));
        self.icns.push(p);
        self.leader = self.icns.len() - 1;
        self.seen.takeovers += 1;
        self.reschedule_wake(self.leader);
    }
}
