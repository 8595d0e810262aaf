//! The nodes model's EPN shell: what `fanin epn` does with sockets and tasks, done with
//! events. The decisions are the unchanged `EpnCore`'s and `Builder`'s.
//!
//! An incarnation joins, builds its core at Prepare, says Ready, ticks every 20 ms,
//! takes arriving STFs into its byte-limited build buffer (no room: lost, named), and
//! leaves with its counters once the core says it stopped. A run kept while its ICN is
//! away goes on building on a stopped clock, holding back what it builds until the
//! RunStart of the ICN that took it over, which hears what it holds first.

use fanin_node::budget::ByteBudget;
use fanin_node::config::check_prepare;
use fanin_node::epn::builder::Builder;
use fanin_node::epn::clock::BuildClock;
use fanin_node::epn::core::{Action, EpnCore, Input};
use fanin_node::flp::core::StfJob;
use fanin_node::icn::core::ConnId;
use fanin_proto::{Message, Reason, Role};

use super::net::End;
use super::world::{Ev, World};
use crate::engine::{Time, MS};

const TICK: Time = 20 * MS;

/// TFs in building at once (`fanin epn --max-building`'s default).
const MAX_BUILDING: usize = 4096;

pub enum EpnState {
    Joining,
    Running(Box<EpnRun>),
}

/// The payload of a simulated STF: its length.
type Len = u64;

pub struct EpnRun {
    pub core: EpnCore<Len>,
    budget: ByteBudget,
    run_id: u64,
    /// Its ICN is away (the run is kept): `true` once an ICN that took it over heard
    /// what it holds.
    away: Option<bool>,
    /// The build clock stands while the ICN is away (`fanin epn`'s own).
    clock: BuildClock,
}

impl World {
    fn epn_run(&mut self, i: u32) -> Option<&mut EpnRun> {
        match self.epns[i as usize].state.as_mut()? {
            EpnState::Running(r) => Some(r),
            EpnState::Joining => None,
        }
    }

    pub fn epn_control(&mut self, i: u32, conn: ConnId, msg: Message) {
        if let Some(run) = self.epn_run(i) {
            if run.away.is_some() {
                return self.epn_rejoining(i, conn, msg);
            }
            return self.epn_feed(i, Input::Control(msg));
        }
        match msg {
            Message::Prepare(p) => self.epn_prepare(i, conn, p),
            Message::RunStop { .. } => self.leave(End::Epn(i), conn),
            Message::Reject { reason, code } => {
                self.rejected(End::Epn(i), code.transient(), reason)
            }
            Message::RegisterAck { .. } => self.registered(conn),
            _ => {}
        }
    }

    fn epn_prepare(&mut self, i: u32, conn: ConnId, p: fanin_proto::Prepare) {
        let limit = self.run.epn_buffer;
        if let Err(e) = check_prepare(&p, ("--build-buffer", limit)) {
            self.seen.log.push(format!("EPN {i}: {e:#}"));
            return self.leave(End::Epn(i), conn);
        }
        let metrics = self.metrics_of(End::Epn(i));
        let timeout_us = u64::from(p.build_timeout_ms) * 1000;
        let builder = Builder::new(i, p.flps, timeout_us, MAX_BUILDING);
        let run = EpnRun {
            core: EpnCore::new(builder, None, metrics).with_pull(p.pull),
            budget: ByteBudget::new(limit),
            run_id: p.run_id,
            away: None,
            clock: BuildClock::default(),
        };
        self.epns[i as usize].state = Some(EpnState::Running(Box::new(run)));
        let ready = Message::Ready {
            role: Role::Epn,
            node_id: i,
            connected: 0,
        };
        self.send_icn(conn, ready);
        self.q.after(TICK, Ev::Tick { conn });
    }

    pub fn epn_tick(&mut self, i: u32, conn: ConnId) {
        let Some(run) = self.epn_run(i) else { return };
        let free_bytes = run.budget.limit() - run.budget.used();
        self.epn_feed(i, Input::Tick { free_bytes });
        self.q.after(TICK, Ev::Tick { conn });
    }

    /// An STF arrived at the EPN incarnation `to` (if it still lives).
    pub fn arrived(&mut self, flp: u32, to: ConnId, job: StfJob) {
        let Some(End::Epn(i)) = self.holder(to) else {
            return;
        };
        let Some(run) = self.epn_run(i) else { return };
        let input = if run.budget.try_reserve(job.len) {
            Input::Stf {
                tf: job.tf,
                flp,
                target: job.epn,
                bytes: job.len,
                payload: job.len,
            }
        } else {
            Input::Lost {
                tf: job.tf,
                flp,
                reason: Reason::EpnBufferFull,
            }
        };
        self.epn_feed(i, input);
    }

    /// EPN `epn` sees FLP `flp`'s data connection close.
    pub fn flp_gone(&mut self, flp: u32, epn: u32) {
        self.epn_feed(epn, Input::FlpGone { flp });
    }

    /// Feeds the EPN's run one input and carries out its actions (frames
    /// for the ICN go nowhere while it is away and the new one has not asked yet).
    fn epn_feed(&mut self, i: u32, input: Input<Len>) {
        let now = self.q.now();
        let ctl = self.epns[i as usize].proc.conn;
        let Some(run) = self.epn_run(i) else { return };
        let now_us = run.clock.now_us(now);
        let ctl = ctl.filter(|_| run.away != Some(false));
        run.core.handle(now_us, input);
        let actions: Vec<_> = std::iter::from_fn(|| run.core.poll_action()).collect();
        let building = run.core.builder().building();
        let mut stopped = false;
        for a in actions {
            match a {
                Action::Control(m) | Action::ControlLossy(m) => {
                    if let Some(c) = ctl {
                        self.send_icn(c, m);
                    }
                }
                Action::Free(len) => self.epn_run(i).expect("running").budget.release(len),
                Action::Deliver(_) => unreachable!("the nodes model's EPNs have no sinks"),
                Action::Die { .. } => unreachable!("the nodes model kills by its faults"),
                Action::Stopped => stopped = true,
            }
        }
        if building > MAX_BUILDING {
            let line = format!("EPN {i}: {building} TFs in building, over {MAX_BUILDING}");
            self.seen.over_limit.push(line);
        }
        if let (true, Some(c)) = (stopped, ctl) {
            self.leave(End::Epn(i), c);
        }
    }

    /// Its ICN is lost: the run is kept, its build clock stops, what it builds is held
    /// back.
    pub fn epn_away(&mut self, i: u32, now: Time) {
        if let Some(run) = self.epn_run(i) {
            run.away = Some(false);
            run.clock.stop(true, now); // stopped already if the last ICN never went on
            self.epn_feed(i, Input::IcnLost);
        }
    }

    /// A frame while the run is kept: the answer to its Register (the ICN took the run
    /// over: it tells what it builds and its reports not released; else the kept run
    /// ends and a new one starts), then the run's parameters: Ready, the clock goes on.
    fn epn_rejoining(&mut self, i: u32, conn: ConnId, msg: Message) {
        let end = End::Epn(i);
        let run = self.epn_run(i).expect("a kept run");
        let (told, run_id) = (run.away == Some(true), run.run_id);
        match msg {
            Message::RegisterAck {
                resume, run_id: id, ..
            } if !told => {
                self.registered(conn);
                if fanin_node::join::kept_run_ends(resume, id, run_id).is_some() {
                    return self.fresh_start(end, conn);
                }
                let run = self.epn_run(i).expect("a kept run");
                run.away = Some(true);
                let (building, reports) = run.core.held();
                let line = format!(
                    "EPN {i}: the run was taken over; it builds {:?}, reports {:?}",
                    building,
                    reports.iter().map(|r| r.tf_id).collect::<Vec<_>>()
                );
                self.seen.log.push(line);
                for msg in fanin_node::epn::core::tfs_held(&building, &reports) {
                    self.send_icn(conn, msg);
                }
            }
            Message::Prepare(_) if told => {
                let ready = Message::Ready {
                    role: Role::Epn,
                    node_id: i,
                    connected: 0,
                };
                self.send_icn(conn, ready);
                let now = self.q.now();
                let run = self.epn_run(i).expect("a kept run");
                run.away = None;
                run.clock.stop(false, now);
            }
            Message::RunStop { .. } => self.leave(end, conn),
            Message::Reject { code, reason } => self.rejected(end, code.transient(), reason),
            _ => {}
        }
    }

    /// The run ended for this node: its process's counters to the ICN, then it closes the
    /// connection and exits (its ZooKeeper session closes: its znode goes at once).
    pub fn leave(&mut self, end: End, conn: ConnId) {
        let (role, node_id) = match end {
            End::Flp(i) => (Role::Flp, i),
            End::Epn(i) => (Role::Epn, i),
            End::Icn => unreachable!("only nodes leave"),
        };
        let counters = self
            .proc(end)
            .metrics
            .as_ref()
            .map_or_else(Vec::new, |m| m.run_snapshot());
        let stats = fanin_proto::NodeStats {
            role,
            node_id,
            counters,
        };
        self.send_icn(conn, Message::NodeStats(stats));
        self.close_from_node(conn, None);
        let gen = self.proc(end).gen;
        self.zk_expire(end, gen, false);
        self.end_incarnation(end);
        self.proc_mut(end).gone = true;
    }
}
