//! The nodes model's world: the ICN, FLP and EPN cores of fanin-node, unchanged, driven
//! by one event queue in simulated time (no threads, no sockets, no clock).
//!
//! This file holds the loop and the faults; `icn.rs` holds the ICNs (leader, standby),
//! `flp.rs` and `epn.rs` the nodes' shells (what the tokio shells do with sockets, done
//! with events here), `life.rs` their processes, `source.rs` the on-data source, `zk.rs`
//! ZooKeeper.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use fanin_node::config::{Checked, Registry};
use fanin_node::icn::core::{ConnId, Phase};
use fanin_node::icn::ledger::TfRow;
use fanin_node::Summary;
use fanin_proto::{Message, Register, Role, TfStatus};

use super::epn::EpnState;
use super::fault::{Fault, FaultKind, Peer};
use super::flp::FlpState;
use super::icn::{new_icn, IcnProc};
use super::life::Slot;
use super::net::{End, Net};
use super::zk::SimZk;
use crate::engine::{Queue, Time, MS, US};

/// How long a node whose ICN connection ended waits before it joins again.
pub const REJOIN: Time = 100 * MS;

/// What happens next.
pub enum Ev {
    /// A node's process `gen` (re)starts an incarnation: it connects and registers.
    Start {
        end: End,
        gen: u64,
    },
    /// A frozen node's freeze `freeze` ends.
    Thaw {
        end: End,
        freeze: u64,
    },
    Register {
        conn: ConnId,
        reg: Register,
    },
    ToIcn {
        conn: ConnId,
        msg: Message,
    },
    IcnClosed {
        conn: ConnId,
        err: Option<String>,
    },
    IcnWake {
        icn: usize,
        gen: u64,
    },
    /// A frozen ICN's freeze `freeze` ends.
    IcnThaw {
        icn: usize,
        freeze: u64,
    },
    /// The standby's election, if the leader `from` is still silent.
    Elect {
        from: usize,
    },
    /// A deposed ICN's re-election attempt finds another leader.
    IcnLostLead {
        icn: usize,
    },
    ToNode {
        conn: ConnId,
        msg: Message,
    },
    /// The node learns that its control connection ended.
    NodeClosed {
        conn: ConnId,
    },
    /// FLP heartbeat (100 ms) or EPN tick (20 ms) of the incarnation on `conn`.
    Tick {
        conn: ConnId,
    },
    /// An FLP's pre-run connections are up: it says Ready.
    FlpConnected {
        conn: ConnId,
    },
    /// A mid-run data connection from an FLP to an EPN incarnation is set up or not.
    DataConnected {
        flp: ConnId,
        epn: u32,
        to: ConnId,
    },
    /// An STF left the FLP; it arrives at `arrive` if its connection still stands.
    Written {
        flp: ConnId,
        to: ConnId,
        job: fanin_node::flp::core::StfJob,
        arrive: Time,
    },
    /// An STF arrived in full at the EPN incarnation `to`.
    Arrived {
        flp: u32,
        to: ConnId,
        job: fanin_node::flp::core::StfJob,
    },
    Fault(usize),
    /// On-data: the FLP's source looks for its next STF.
    Produce {
        conn: ConnId,
    },
    /// ZooKeeper: the incarnation on `conn` creates its znode; its session expired; the
    /// ICN's watch delivers a snapshot.
    ZkCreate {
        conn: ConnId,
    },
    ZkExpire {
        end: End,
        gen: u64,
    },
    ZkWatch(fanin_node::registry::Membership),
}

/// What the world saw, for the promises' checks.
#[derive(Default)]
pub struct Seen {
    /// Complete reports that reached an ICN, per TF: from which EPN runs (EPN, the key
    /// of its run's state; a run kept across a take-over tells its reports again).
    pub complete_reports: BTreeMap<u64, BTreeSet<(u32, ConnId)>>,
    /// Breaches of a byte limit, as lines.
    pub over_limit: Vec<String>,
    pub faults_injected: u64,
    /// Of them at the ICN, and the standby's take-overs they caused.
    pub icn_faults: u64,
    pub takeovers: u64,
    pub log: Vec<String>,
    /// What an ICN did after it lost the lead (it must do nothing).
    pub fenced: Vec<String>,
    /// FLP runs cut short (killed, or begun anew): on-data, the TFs their sources would
    /// have made do not exist (a source begun anew starts at the TF due then).
    pub sources_cut: u64,
}

pub struct World {
    pub q: Queue<Ev>,
    pub net: Net,
    pub run: Checked,
    /// The ICNs, in the order they led the run; `leader` leads it now.
    pub icns: Vec<IcnProc>,
    pub leader: usize,
    /// Whose each control connection is, to which ICN it goes, and the key of the run
    /// state it serves.
    pub owner: BTreeMap<ConnId, End>,
    pub conn_icn: BTreeMap<ConnId, usize>,
    pub conn_key: BTreeMap<ConnId, ConnId>,
    /// When the run started (a standby's clock counts from there).
    pub run_started_at: Option<Time>,
    next_conn: ConnId,
    pub flps: Vec<Slot<FlpState>>,
    pub epns: Vec<Slot<EpnState>>,
    /// EPN data addresses -> the incarnation (control connection) they belong to.
    pub data_addrs: BTreeMap<String, ConnId>,
    pub faults: Vec<Fault>,
    /// `registry = "zookeeper"`: the simulated ZooKeeper.
    pub zk: Option<SimZk>,
    pub rows: Vec<TfRow>,
    /// The TF ids of `rows`.
    pub ended: BTreeSet<u64>,
    pub seen: Seen,
}

impl World {
    pub fn new(run: Checked, net: Net, faults: Vec<Fault>) -> World {
        let zk = (run.cfg.registry == Registry::ZooKeeper)
            .then(|| SimZk::new(run.cfg.zk_session_timeout_ms, run.cfg.zk_tick_ms));
        let icn = new_icn(&run, zk.as_ref(), None, (0, 0));
        let mut w = World {
            q: Queue::new(),
            net,
            flps: (0..run.cfg.flps).map(|_| Slot::default()).collect(),
            epns: (0..run.cfg.epns).map(|_| Slot::default()).collect(),
            run,
            icns: vec![icn],
            leader: 0,
            owner: BTreeMap::new(),
            conn_icn: BTreeMap::new(),
            conn_key: BTreeMap::new(),
            run_started_at: None,
            next_conn: 0,
            data_addrs: BTreeMap::new(),
            faults,
            zk,
            rows: Vec::new(),
            ended: BTreeSet::new(),
            seen: Seen::default(),
        };
        // EPNs first, FLPs 1 µs apart after them: registration order is fixed.
        let epns = w.epns.len() as u32;
        for e in 0..epns {
            let end = End::Epn(e);
            w.q.at(Time::from(e) * US, Ev::Start { end, gen: 0 });
        }
        for f in 0..w.flps.len() as u32 {
            let end = End::Flp(f);
            w.q.at(Time::from(epns + f) * US, Ev::Start { end, gen: 0 });
        }
        for (i, f) in w.faults.iter().enumerate() {
            w.q.at(f.at_ms * MS, Ev::Fault(i));
        }
        w.reschedule_wake(0);
        w
    }

    /// Runs until the ICN is done or `limit` (simulated) passes; then its summary.
    pub fn run(&mut self, limit: Time) -> (Summary, bool) {
        while self.icn().phase() != Phase::Done {
            let Some((t, ev)) = self.q.pop() else { break };
            if t > limit {
                break;
            }
            self.dispatch(ev);
        }
        let k = self.leader;
        let ended = self.icn().phase() == Phase::Done;
        let now = self.icn_now(k);
        let summary = self.icns[k].core.finish(now);
        self.drain_icn(k);
        (summary, ended)
    }

    pub fn dispatch(&mut self, ev: Ev) {
        if let Some(end) = self.frozen_target(&ev) {
            self.proc_mut(end).deferred.push_back(ev);
            return;
        }
        if let Some(k) = self.icn_frozen_target(&ev) {
            return self.icn_defer(k, ev);
        }
        match ev {
            Ev::Start { end, gen } => self.start(end, gen),
            Ev::Thaw { end, freeze } => self.thaw(end, freeze),
            ev @ (Ev::Register { .. }
            | Ev::ToIcn { .. }
            | Ev::IcnClosed { .. }
            | Ev::IcnWake { .. }) => self.icn_event(ev),
            Ev::IcnThaw { icn, freeze } => self.thaw_icn(icn, freeze),
            Ev::Elect { from } => self.elect(from),
            Ev::IcnLostLead { icn } => self.icn_lost_lead(icn),
            Ev::ToNode { conn, msg } => self.deliver(conn, msg),
            Ev::NodeClosed { conn } => self.node_closed(conn),
            Ev::Tick { conn } => self.tick(conn),
            Ev::FlpConnected { conn } => self.flp_connected(conn),
            Ev::DataConnected { flp, epn, to } => self.data_connected(flp, epn, to),
            Ev::Written {
                flp,
                to,
                job,
                arrive,
            } => self.written(flp, to, job, arrive),
            Ev::Arrived { flp, to, job } => self.arrived(flp, to, job),
            Ev::Fault(i) => self.fault(i),
            Ev::Produce { conn } => self.produce(conn),
            Ev::ZkCreate { conn } => self.zk_create(conn),
            Ev::ZkExpire { end, gen } => self.zk_expire(end, gen, true),
            Ev::ZkWatch(m) => self.zk_watch(m),
        }
    }

    /// A new incarnation of process `gen` of `end` (if that process still lives): a
    /// fresh control connection to the leading ICN, and its Register. A run kept for a
    /// take-over stays (an EPN's data address with it).
    fn start(&mut self, end: End, gen: u64) {
        let p = self.proc(end);
        if p.gone || p.gen != gen || p.conn.is_some() {
            return;
        }
        if self.icns[self.leader].dead {
            // No ICN to reach until the standby is elected: it tries again.
            return self.rejoin(end, REJOIN);
        }
        self.next_conn += 1;
        let conn = self.next_conn;
        self.owner.insert(conn, end);
        self.conn_icn.insert(conn, self.leader);
        let key = *self.proc_mut(end).key.get_or_insert(conn);
        self.proc_mut(end).conn = Some(conn);
        self.conn_key.insert(conn, key);
        let kept = key != conn;
        let (role, id, data_addr) = match end {
            End::Flp(i) => {
                if !kept {
                    self.flps[i as usize].state = Some(FlpState::joining());
                }
                (Role::Flp, i, String::new())
            }
            End::Epn(i) if kept => (Role::Epn, i, self.data_addr_of(key)),
            End::Epn(i) => {
                self.epns[i as usize].state = Some(EpnState::Joining);
                let addr = format!("10.2.{}.{}:{}", i / 256, i % 256, 1024 + conn % 60_000);
                self.data_addrs.insert(addr.clone(), conn);
                (Role::Epn, i, addr)
            }
            End::Icn => unreachable!("the ICN does not restart"),
        };
        let reg = Register {
            role,
            node_id: Some(id),
            data_addr,
            proof: [0; 32],
        };
        // The challenge's round trip, then the Register frame (a close sent later on
        // this connection never overtakes it).
        let sent = self.q.now() + self.net.latency();
        let at = self.net.control(sent, conn, end, End::Icn);
        self.q.at(at, Ev::Register { conn, reg });
    }

    /// The data address of the EPN run on `key`.
    pub fn data_addr_of(&self, key: ConnId) -> String {
        let found = self.data_addrs.iter().find(|(_, &k)| k == key);
        found
            .map(|(a, _)| a.clone())
            .expect("a kept EPN run has its address")
    }

    /// A frame from a node's incarnation on `conn` to the ICN.
    pub fn send_icn(&mut self, conn: ConnId, msg: Message) {
        let from = self.owner[&conn];
        let at = self.net.control(self.q.now(), conn, from, End::Icn);
        self.q.at(at, Ev::ToIcn { conn, msg });
    }

    /// The node on `conn` closes it (it left, or died): the ICN sees it after a latency.
    pub fn close_from_node(&mut self, conn: ConnId, err: Option<String>) {
        let from = self.owner[&conn];
        let at = self.net.control(self.q.now(), conn, from, End::Icn);
        self.q.at(at, Ev::IcnClosed { conn, err });
    }

    pub fn note_report(&mut self, conn: ConnId, msg: &Message) {
        let Some(&End::Epn(e)) = self.owner.get(&conn) else {
            return;
        };
        let key = self.conn_key[&conn];
        // A kept report of a TF that has its row is answered with a Release: no second
        // completion in the ICN's books (the EPN built a copy while counted lost).
        let reports: Vec<&fanin_proto::TfReport> = match msg {
            Message::TfReport(r) => vec![r],
            Message::TfsHeld { reports, .. } => reports
                .iter()
                .filter(|r| !self.ended.contains(&r.tf_id))
                .collect(),
            _ => return,
        };
        for r in reports
            .into_iter()
            .filter(|r| r.status == TfStatus::Complete)
        {
            let by = self.seen.complete_reports.entry(r.tf_id).or_default();
            by.insert((e, key));
        }
    }

    fn deliver(&mut self, conn: ConnId, msg: Message) {
        match self.current(conn) {
            Some(End::Flp(i)) => self.flp_control(i, conn, msg),
            Some(End::Epn(i)) => self.epn_control(i, conn, msg),
            _ => {}
        }
    }

    fn tick(&mut self, conn: ConnId) {
        match self.holder(conn) {
            Some(End::Flp(i)) => self.flp_tick(i, conn),
            Some(End::Epn(i)) => self.epn_tick(i, conn),
            _ => {}
        }
    }

    fn fault(&mut self, i: usize) {
        let f = self.faults[i];
        let end = f.node.end();
        let now = self.q.now();
        self.seen.faults_injected += 1;
        self.seen.log.push(format!("fault {}", f.describe()));
        if f.node == Peer::Icn {
            self.seen.icn_faults += 1;
            return self.icn_fault(f.kind);
        }
        match f.kind {
            FaultKind::Kill { restart_ms } => self.kill(end, restart_ms),
            FaultKind::Freeze { ms } => self.freeze(end, ms),
            FaultKind::ResetControl => {
                if let Some(conn) = self.proc(end).conn {
                    self.close_from_node(conn, Some("connection reset".into()));
                    let at = self.net.control(now, conn, End::Icn, end);
                    self.q.at(at, Ev::NodeClosed { conn });
                }
            }
            FaultKind::ResetData { epn } => {
                if let End::Flp(i) = end {
                    self.reset_data(i, epn);
                }
            }
            FaultKind::Partition { peer, ms } => {
                let other = peer.map_or(End::Icn, |p| p.end());
                self.net.partition(end, other, now, now + ms * MS);
            }
            FaultKind::Slow { extra_us, ms } => self.net.slow(end, now + ms * MS, extra_us * US),
            FaultKind::ExpireSession => {
                let gen = self.proc(end).gen;
                self.zk_expire(end, gen, true);
            }
        }
    }
}

/// The address the ICN sees a connection come from (its number in the port).
pub fn peer_addr(conn: ConnId) -> SocketAddr {
    let port = 1024 + (conn % 60_000) as u16;
    SocketAddr::from(([10, 1, 0, 1], port))
}
