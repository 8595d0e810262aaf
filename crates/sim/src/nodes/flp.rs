//! The nodes model's FLP shell: what `fanin flp` does with sockets and tasks, done with
//! events. The decisions are the unchanged `FlpCore`'s; this only moves frames and STFs.
//!
//! An incarnation joins (Prepare and EPN list), connects to every EPN, says Ready,
//! heartbeats every 100 ms, writes STFs through the simulated network and leaves with
//! its counters after RunStop once nothing is on the wire. A run kept while its ICN is
//! away (a take-over) waits; the ICN taking over hears what it holds, and it goes on.

use fanin_node::config::check_prepare;
use fanin_node::flp::core::{Action, FlpCore, Input, StfJob};
use fanin_node::icn::core::ConnId;
use fanin_proto::{EpnEntry, Message, Prepare, Role, Schedule};
use fanin_sched::EpnId;
use std::collections::{BTreeMap, VecDeque};

use super::net::End;
use super::source::SimSource;
use super::world::{Ev, World, REJOIN};
use crate::engine::{Time, MS};

const HEARTBEAT: Time = 100 * MS;

pub enum FlpState {
    /// Before the run: the parameters and the EPN list, in either order.
    Joining {
        prep: Option<Prepare>,
        list: Option<Vec<EpnEntry>>,
    },
    Running(Box<FlpRun>),
}

impl FlpState {
    pub fn joining() -> FlpState {
        FlpState::Joining {
            prep: None,
            list: None,
        }
    }
}

pub struct FlpRun {
    pub core: FlpCore,
    run_id: u64,
    /// Its ICN is away: the run is kept for the one that takes it over.
    away: Option<Away>,
    /// The EPN incarnations (control connections) it has a data connection to.
    data: BTreeMap<EpnId, ConnId>,
    /// STFs on the wire.
    writing: u32,
    pub stopping: bool,
    /// On-data: the synthetic source.
    pub source: Option<SimSource>,
}

/// A run kept while its ICN is away. As `fanin flp`'s kept run, its loop stands still:
/// what its sends and connections report waits until the run goes on.
#[derive(Default)]
struct Away {
    /// An ICN took the run over and heard what it holds: its parameters come next.
    told: bool,
    prep: Option<Prepare>,
    list: Option<Vec<EpnEntry>>,
    pending: VecDeque<Input>,
}

impl World {
    pub fn flp_run(&mut self, i: u32) -> Option<&mut FlpRun> {
        match self.flps[i as usize].state.as_mut()? {
            FlpState::Running(r) => Some(r),
            FlpState::Joining { .. } => None,
        }
    }

    pub fn flp_control(&mut self, i: u32, conn: ConnId, msg: Message) {
        if let Some(run) = self.flp_run(i) {
            if run.away.is_some() {
                return self.flp_rejoining(i, conn, msg);
            }
            let key = self.flps[i as usize].proc.key.expect("a run has its key");
            if let Message::RunStart { elapsed_us, .. } = msg {
                self.source_start(i, key, elapsed_us);
            }
            return self.flp_feed(i, key, Input::Control(msg));
        }
        let Some(FlpState::Joining { prep, list }) = self.flps[i as usize].state.as_mut() else {
            return;
        };
        match msg {
            Message::Prepare(p) => *prep = Some(p),
            Message::EpnList(l) => *list = Some(l),
            Message::RunStop { .. } => return self.leave(End::Flp(i), conn),
            Message::Reject { code, reason } => {
                return self.rejected(End::Flp(i), code.transient(), reason)
            }
            Message::RegisterAck { .. } => return self.registered(conn),
            _ => return,
        }
        if let (Some(p), Some(l)) = (prep.clone(), list.clone()) {
            self.flp_prepare(i, conn, p, l);
        }
    }

    /// The run's parameters are known: the core, and a data connection to every EPN.
    fn flp_prepare(&mut self, i: u32, conn: ConnId, prep: Prepare, list: Vec<EpnEntry>) {
        let limit = self.run.flp_buffer;
        let size = match check_prepare(&prep, ("--send-buffer", limit)) {
            Ok(s) => s,
            Err(e) => {
                self.seen.log.push(format!("FLP {i}: {e:#}"));
                return self.leave(End::Flp(i), conn);
            }
        };
        let mut data = BTreeMap::new();
        for e in &list {
            match self.data_addrs.get(&e.addr) {
                Some(&to) if self.epn_alive(e.epn_id, to) => {
                    data.insert(e.epn_id, to);
                }
                // An EPN that is gone: leave, and join again (as `fanin flp` does).
                _ => return self.flp_lost(i, conn),
            }
        }
        let metrics = self.metrics_of(End::Flp(i));
        self.cut_source(End::Flp(i)); // a run begun anew starts its source anew
        self.flps[i as usize].runs += 1;
        let epns: Vec<EpnId> = list.iter().map(|e| e.epn_id).collect();
        let on_data = prep.schedule == Schedule::OnData;
        let source = on_data.then(|| SimSource::new(&prep, size));
        let core = FlpCore::new(
            i,
            (size, prep.seed, prep.retain, on_data),
            limit,
            &epns,
            metrics,
        )
        .with_pull(prep.pull);
        let run = FlpRun {
            core,
            run_id: prep.run_id,
            away: None,
            data,
            writing: 0,
            stopping: false,
            source,
        };
        self.flps[i as usize].state = Some(FlpState::Running(Box::new(run)));
        // TCP connects and the data handshakes: one round trip.
        self.q
            .after(2 * self.net.latency(), Ev::FlpConnected { conn });
    }

    /// The EPN incarnation on `to` still lives (its listener takes connections; before
    /// its Prepare the FLP's handshake waits for it, as the runtime's does).
    pub fn epn_alive(&self, epn: EpnId, to: ConnId) -> bool {
        self.epns[epn as usize].proc.key == Some(to)
    }

    pub fn flp_connected(&mut self, conn: ConnId) {
        let Some(End::Flp(i)) = self.holder(conn) else {
            return;
        };
        let Some(run) = self.flp_run(i) else { return };
        let connected = run.data.len() as u32;
        let ready = Message::Ready {
            role: Role::Flp,
            node_id: i,
            connected,
        };
        self.send_icn(conn, ready);
        self.q.after(HEARTBEAT, Ev::Tick { conn });
    }

    pub fn flp_tick(&mut self, i: u32, conn: ConnId) {
        if self.flp_run(i).is_some_and(|r| !r.stopping) {
            self.flp_feed(i, conn, Input::Heartbeat);
            self.q.after(HEARTBEAT, Ev::Tick { conn });
        }
    }

    /// Feeds the core of the run on `key` one input, carries out its actions (a write
    /// that cannot start comes back at once as a failed send), and leaves once stopped
    /// and idle. While its ICN is away the input waits (a heartbeat is skipped).
    pub fn flp_feed(&mut self, i: u32, key: ConnId, input: Input) {
        let conn = key;
        if let Some(away) = self.flp_run(i).and_then(|r| r.away.as_mut()) {
            if !matches!(input, Input::Heartbeat) {
                away.pending.push_back(input);
            }
            return;
        }
        // As `fanin flp`: a held source asks again after any input but these.
        let retry = !matches!(input, Input::Flush | Input::Heartbeat);
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let Some(run) = self.flp_run(i) else { return };
            run.core.handle(input);
            let actions: Vec<Action> = std::iter::from_fn(|| run.core.poll_action()).collect();
            for a in actions {
                inputs.extend(self.flp_act(i, conn, a));
            }
        }
        let Some(run) = self.flp_run(i) else { return };
        let (used, limit) = (run.core.buffered(), run.core.limit());
        let done = run.stopping && run.writing == 0;
        if used > limit {
            let line = format!("FLP {i}: send buffer {used} over {limit}");
            self.seen.over_limit.push(line);
        }
        if done {
            let ctl = self.flps[i as usize]
                .proc
                .conn
                .expect("a running FLP's connection");
            self.leave(End::Flp(i), ctl);
        } else if retry {
            self.source_unhold(i, conn); // room may have been freed
        }
    }

    fn flp_act(&mut self, i: u32, conn: ConnId, a: Action) -> Option<Input> {
        match a {
            Action::Control(m) | Action::ControlLossy(m) => {
                if let Some(ctl) = self.flps[i as usize].proc.conn {
                    self.send_icn(ctl, m);
                }
            }
            Action::Queue(job) => return self.write_stf(i, conn, job),
            Action::Connect(e) => {
                let to = self.data_addrs.get(&e.addr).copied().unwrap_or(0);
                let ev = Ev::DataConnected {
                    flp: conn,
                    epn: e.epn_id,
                    to,
                };
                self.q.after(2 * self.net.latency(), ev);
            }
            Action::Stop => self.flp_run(i).expect("running").stopping = true,
            Action::Free(_) | Action::Scheduled(_) => {}
        }
        None
    }

    /// Starts writing an STF on its EPN's data connection (none: failed at once).
    fn write_stf(&mut self, i: u32, conn: ConnId, job: StfJob) -> Option<Input> {
        let now = self.q.now();
        let run = self.flp_run(i).expect("running");
        let Some(&to) = run.data.get(&job.epn) else {
            return Some(Input::Sent { job, ok: false });
        };
        run.writing += 1;
        let (written, arrive) = self.net.stf(now, i, job.epn, job.len);
        let ev = Ev::Written {
            flp: conn,
            to,
            job,
            arrive,
        };
        self.q.at(written, ev);
        None
    }

    /// An STF left the FLP: it arrives if its connection still stands.
    pub fn written(&mut self, conn: ConnId, to: ConnId, job: StfJob, arrive: Time) {
        let Some(End::Flp(i)) = self.holder(conn) else {
            return;
        };
        let epn_alive = self.epn_alive(job.epn, to);
        let Some(run) = self.flp_run(i) else { return };
        run.writing -= 1;
        let current = run.data.get(&job.epn) == Some(&to);
        let ok = epn_alive && current;
        if ok {
            // A frozen FLP wrote late: its bytes arrive no earlier than now.
            let at = arrive.max(self.q.now());
            self.q.at(at, Ev::Arrived { flp: i, to, job });
        } else if current {
            // This connection failed; a newer one to a restarted EPN stays.
            run.data.remove(&job.epn);
        }
        self.flp_feed(i, conn, Input::Sent { job, ok });
    }

    pub fn data_connected(&mut self, conn: ConnId, epn: EpnId, to: ConnId) {
        let Some(End::Flp(i)) = self.holder(conn) else {
            return;
        };
        let ok = self.epn_alive(epn, to);
        let Some(run) = self.flp_run(i) else { return };
        if ok {
            run.data.insert(epn, to);
        }
        self.flp_feed(i, conn, Input::Connected { epn, ok });
    }

    /// Fault: the FLP's data connection to `epn` is reset.
    pub fn reset_data(&mut self, i: u32, epn: EpnId) {
        let reset = self.flp_run(i).and_then(|run| run.data.remove(&epn));
        if reset.is_some() {
            self.flp_gone(i, epn);
        }
    }

    /// FLP `i`'s run ends here (its process ends, or it starts afresh): every EPN it
    /// had a data connection to sees it close, as the runtime's EPNs do.
    pub fn close_data(&mut self, i: u32) {
        let peers: Vec<EpnId> = self
            .flp_run(i)
            .map_or_else(Vec::new, |run| run.data.keys().copied().collect());
        for epn in peers {
            self.flp_gone(i, epn);
        }
    }

    /// The FLP cannot start its run (an EPN is gone): it leaves and joins again.
    fn flp_lost(&mut self, i: u32, conn: ConnId) {
        let end = End::Flp(i);
        self.end_incarnation(end);
        self.close_from_node(conn, None);
        self.rejoin(end, REJOIN);
    }

    /// Refused by the ICN: try again later when that can help (a kept run stays kept),
    /// else give up.
    pub fn rejected(&mut self, end: End, transient: bool, reason: String) {
        self.seen
            .log
            .push(format!("{}: rejected: {reason}", end.name()));
        let p = self.proc(end);
        if transient && p.key.is_some() && p.key != p.conn {
            self.proc_mut(end).conn = None;
            return self.rejoin(end, 2 * REJOIN);
        }
        self.cut_source(end); // it gives up
        self.end_incarnation(end);
        if transient {
            self.rejoin(end, 2 * REJOIN);
        } else {
            self.proc_mut(end).gone = true;
        }
    }

    /// Registered: with ZooKeeper, the node's znode (one latency later).
    pub fn registered(&mut self, conn: ConnId) {
        if self.zk.is_some() {
            self.q.after(self.net.latency(), Ev::ZkCreate { conn });
        }
    }

    /// Its ICN died or was deposed: the run is kept (its loop stands still).
    pub fn flp_away(&mut self, i: u32) {
        if let Some(run) = self.flp_run(i) {
            // Away again before it went on (that ICN failed too): what waited still waits.
            let away = run.away.get_or_insert_with(Away::default);
            (away.told, away.prep, away.list) = (false, None, None);
            if let Some(s) = run.source.as_mut() {
                s.paused = true; // until the new ICN's RunStart
            }
        }
    }

    fn flp_away_mut(&mut self, i: u32) -> &mut Away {
        let run = self.flp_run(i).expect("a kept run");
        run.away.as_mut().expect("its ICN away")
    }

    /// A frame while the run is kept: the answer to its Register (the ICN took the run
    /// over: it tells what it holds; else the kept run ends and a new one starts), then
    /// the run's parameters.
    fn flp_rejoining(&mut self, i: u32, conn: ConnId, msg: Message) {
        let end = End::Flp(i);
        let told = self.flp_away_mut(i).told;
        match msg {
            Message::RegisterAck { resume, run_id, .. } if !told => {
                self.registered(conn);
                let run = self.flp_run(i).expect("a kept run");
                let ends = fanin_node::join::kept_run_ends(resume, run_id, run.run_id);
                if let Some(over) = ends {
                    // As `fanin flp`: the kept run is lost (its sends end with it).
                    run.core.handle(Input::RunLost { over });
                    return self.fresh_start(end, conn);
                }
                let held = run.core.held();
                self.flp_away_mut(i).told = true;
                let line = format!(
                    "FLP {i}: the run was taken over; it holds {} STFs",
                    held.len()
                );
                self.seen.log.push(line);
                for chunk in held.chunks(fanin_proto::HELD_BATCH) {
                    self.send_icn(conn, Message::StfsHeld(chunk.to_vec()));
                }
            }
            Message::Prepare(p) if told => self.flp_away_mut(i).prep = Some(p),
            Message::EpnList(l) if told => self.flp_away_mut(i).list = Some(l),
            Message::RunStop { .. } => {
                // As `fanin flp`: stopped during the take-over, the kept run is over.
                let run = self.flp_run(i).expect("a kept run");
                run.core.handle(Input::RunLost { over: true });
                self.leave(end, conn)
            }
            Message::Reject { code, reason } => self.rejected(end, code.transient(), reason),
            _ => {}
        }
        let Some(away) = self.flp_run(i).and_then(|r| r.away.as_ref()) else {
            return;
        };
        if let (Some(_), Some(list)) = (&away.prep, away.list.clone()) {
            self.flp_resume(i, conn, list);
        }
    }

    /// The ICN that took the run over sent its parameters: connections to the EPNs it
    /// does not reach, Ready, and the run goes on with what waited.
    fn flp_resume(&mut self, i: u32, conn: ConnId, list: Vec<EpnEntry>) {
        for e in &list {
            let to = self.data_addrs.get(&e.addr).copied();
            let alive = to.is_some_and(|to| self.epn_alive(e.epn_id, to));
            let run = self.flp_run(i).expect("a kept run");
            if run.core.reaches(e.epn_id) && run.data.get(&e.epn_id) == to.as_ref() {
                continue;
            }
            let Some(to) = to.filter(|_| alive) else {
                // As `fanin flp`: lost in the take-over; the run stays kept.
                let away = self.flp_away_mut(i);
                (away.told, away.prep, away.list) = (false, None, None);
                self.flps[i as usize].proc.conn = None;
                self.close_from_node(conn, None);
                return self.rejoin(End::Flp(i), REJOIN);
            };
            run.data.insert(e.epn_id, to);
            run.core.connected_anew(e.epn_id);
        }
        let ready = Message::Ready {
            role: Role::Flp,
            node_id: i,
            connected: list.len() as u32,
        };
        self.send_icn(conn, ready);
        let run = self.flp_run(i).expect("a kept run");
        let away = run.away.take().expect("its ICN away");
        let key = self.flps[i as usize].proc.key.expect("a kept run's key");
        for input in away.pending {
            self.flp_feed(i, key, input);
        }
    }

    /// The ICN did not take the kept run over: it ends, and a new one starts on `conn`
    /// (an EPN's on the same data port).
    pub fn fresh_start(&mut self, end: End, conn: ConnId) {
        let old = self.proc(end).key.expect("a kept run's key");
        self.proc_mut(end).key = Some(conn);
        self.conn_key.insert(conn, conn);
        match end {
            End::Flp(i) => {
                self.close_data(i); // the kept run ends: so do its data connections
                self.flps[i as usize].state = Some(FlpState::joining());
            }
            End::Epn(i) => {
                let addr = self.data_addr_of(old);
                self.data_addrs.insert(addr, conn);
                self.epns[i as usize].state = Some(super::epn::EpnState::Joining);
            }
            End::Icn => unreachable!("only nodes keep runs"),
        }
    }
}
