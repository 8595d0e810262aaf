//! The ICN's decisions as a pure state machine (sans I/O, in the style of quinn-proto):
//! input = (now, event), output = actions in an outbox. No clock, socket, channel or stdout.
//!
//! The tokio shell (`icn::run`) feeds connection events, timer wake-ups and registry
//! changes in, and carries the actions out: frames to peers, closed connections, log
//! lines, `tfs.csv` rows. A send that fails comes back later as `Input::SendFailed`,
//! never as a re-entrant call. The work is split by concern: `membership` (who is in the
//! run), `issuing` (TF ids, placement, re-assignment, accounting), `phases` (the run's
//! life from registration to the summary), `control` (run control: start, pause,
//! resume, stop of a held run).

mod control;
mod issuing;
mod membership;
mod messages;
mod ondata;
mod phases;
mod status;
mod takeover;
#[cfg(test)]
mod tests;
mod transfers;
mod window;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fanin_proto::{Message, Register, Role};
use fanin_sched::{EpnId, FlpId, Placer};

use super::ledger::{Ledger, TfRow};
use super::summary::{MemberEvent, Tally};
use crate::config::Checked;
use crate::metrics::Metrics;
use crate::registry::Membership;
pub use takeover::Takeover;

/// Time since the shell's origin (the ICN's start). Simulations pass simulated time.
pub type Now = Duration;

/// A control connection, numbered by the shell.
pub type ConnId = u64;

/// A node whose znode vanished but whose heartbeat came this recently is alive.
const REGISTRY_LEFT_GRACE: Duration = Duration::from_millis(300);

/// How often leases are checked (the resolution of detection times).
const LEASE_CHECK: Duration = Duration::from_millis(20);

/// How long the ICN waits for every node's run-end counters after RunStop.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// TFs issued in one `pump`, to stay responsive to reports between batches (and to
/// learn of a failed send before many more TFs go to that peer).
const ISSUE_BATCH: u32 = 256;

/// Events and membership changes kept for the summary (the rest are counted).
pub const MAX_EVENTS: usize = 10_000;

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Registering,
    Preparing,
    /// Every node ready; a held run (run control) waits for START.
    Ready,
    Running,
    Draining,
    Stopping,
    Done,
}

/// What happens to the ICN.
#[derive(Debug, Clone)]
pub enum Input {
    /// A new control connection sent its Register frame.
    Registered {
        conn: ConnId,
        peer: SocketAddr,
        reg: Register,
    },
    /// A frame from a registered connection.
    Msg { conn: ConnId, msg: Message },
    /// The connection ended (`err` says why, when it failed).
    Closed { conn: ConnId, err: Option<String> },
    /// A frame the core asked to send could not be queued.
    SendFailed { conn: ConnId, why: String },
    /// The registry's membership changed (ZooKeeper): a new snapshot.
    Membership(Membership),
    /// The registry's membership watch ended: leases detect failures again.
    MembershipLost,
    /// This ICN lost its registry leadership and did not win it back: another ICN
    /// leads now, or it cannot rule out a take-over.
    LostLeadership,
    /// The registry's leadership was lost (`lost`) or won back while no other ICN leads:
    /// noted, the run goes on; from the loss on, leases detect failed nodes.
    RegistryOutage { lost: bool, what: String },
    /// The shell woke up at (or after) `poll_timeout`.
    Timeout,
    /// The operator asked the run to stop (SIGINT/SIGTERM): the first time, stop
    /// issuing and drain; again, stop at once.
    Interrupt,
}

/// How loud a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// What the ICN asks its shell to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Send {
        conn: ConnId,
        msg: Message,
    },
    /// Close the connection (after the frames queued for it).
    Close {
        conn: ConnId,
    },
    Log {
        level: Level,
        line: String,
    },
    /// A TF ended: one `tfs.csv` row.
    TfEnded(TfRow),
    /// An EPN's load, at most once a second per EPN: one `loads.csv` row.
    EpnLoad {
        t_us: u64,
        epn: EpnId,
        free_bytes: u64,
        building: u32,
    },
    /// The run started now (the shell notes the wall-clock time), or goes on now
    /// after a take-over (`resumed`: the run's start stays what it was; a run whose
    /// ICN died in its pre-run is not resumed but starts at the take-over).
    RunStarted {
        resumed: bool,
    },
}

/// What the core is told once, at the start.
pub struct CoreConfig {
    pub run: Checked,
    pub run_id: u64,
    /// First TF id: 0, or above every id reserved in the registry before.
    pub id_base: u64,
    /// The registry's first membership snapshot (ZooKeeper), if it watches one.
    pub registry_members: Option<Membership>,
    /// Measures how long policy updates take, in ns (the shell's clock; simulations
    /// and tests pass one that returns 0, which keeps them deterministic).
    pub stopwatch_ns: fn() -> u64,
    /// Run control: once every node is ready, wait for `Command::Start` (no pre-run
    /// time-out) instead of starting at once.
    pub hold_start: bool,
    /// Taking over this run from a failed ICN (same run id and TF ids).
    pub takeover: Option<Takeover>,
}

/// One registered control connection.
pub(crate) struct Peer {
    pub role: Role,
    pub id: u32,
    pub addr: SocketAddr,
    pub data_addr: String,
    pub ready: bool,
    pub stats: bool,
    /// Last frame from this peer: its lease (heartbeats every 100 ms).
    pub last_seen: Now,
    /// Mid-run (re)join: when it registered.
    pub joined_at: Option<Now>,
    /// A joining FLP: the EPNs (id, data address) it was told about ...
    pub known_epns: Vec<(EpnId, String)>,
    /// ... and those it still has to confirm before it enters the schedule.
    pub awaiting: Vec<EpnId>,
}

impl Peer {
    pub fn name(&self) -> String {
        format!("{} {} ({})", self.role.name(), self.id, self.addr)
    }
}

/// The ICN's whole state.
pub struct IcnCore {
    pub(crate) cfg: CoreConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) now: Now,
    pub(crate) started: Now,
    pub(crate) run_t0: Option<Now>,
    pub(crate) phase: Phase,
    pub(crate) phase_deadline: Option<Now>,
    pub(crate) last_lease_check: Now,
    pub(crate) peers: HashMap<ConnId, Peer>,
    pub(crate) epns: BTreeMap<EpnId, ConnId>,
    pub(crate) flps: BTreeMap<FlpId, ConnId>,
    /// The policy, and the TFs waiting for an EPN (oldest first).
    pub(crate) placer: Placer,
    pub(crate) ledger: Ledger,
    /// Kept apart from the ledger, to check it: rows written per status.
    pub(crate) tally: Tally,
    /// TFs issued so far (the pacing count); a TF's id is `id_base + count`.
    pub(crate) next_tf: u64,
    /// Last membership snapshot from the registry (ZooKeeper), to see who left.
    pub(crate) registry_members: Option<Membership>,
    pub(crate) lost_leadership: bool,
    /// Interrupts received (SIGINT/SIGTERM).
    pub(crate) interrupts: u32,
    /// Unthrottled runs: since when issuing waits for a missing node.
    pub(crate) paused_since: Option<Now>,
    /// The last `pump` stopped at its batch limit with TFs still due.
    pub(crate) more_due: bool,
    /// Unthrottled runs: TFs allowed in flight now (see `window.rs`).
    pub(crate) window: window::Window,
    /// EPNs joining mid-run: the FLPs that still have to confirm a data connection.
    pub(crate) joining: BTreeMap<EpnId, (ConnId, Vec<FlpId>)>,
    pub(crate) membership: Vec<MemberEvent>,
    pub(crate) prerun_s: f64,
    pub(crate) registered_s: f64,
    pub(crate) node_stats: BTreeMap<String, BTreeMap<String, u64>>,
    pub(crate) events: Vec<String>,
    /// Events and membership changes past `MAX_EVENTS`, counted only.
    pub(crate) events_not_kept: u64,
    pub(crate) fatal: Option<String>,
    /// When each EPN's load was last recorded (µs of the run): one row a second.
    pub(crate) load_recorded: BTreeMap<EpnId, u64>,
    /// Each EPN's last load report (for the live status).
    pub(crate) last_load: BTreeMap<EpnId, fanin_sched::EpnLoad>,
    /// The newest membership changes (time s, "EPN 1 lost"), for the live status.
    pub(crate) recent_members: VecDeque<(f64, String)>,
    /// Run control: paused since, and the pauses before (issuing stops meanwhile).
    pub(crate) paused_at: Option<Now>,
    pub(crate) paused_total: Duration,
    /// On-data scheduling: the FLPs' announcements.
    pub(crate) ondata: ondata::OnData,
    /// Taking over: what the returning nodes hold, until the run goes on.
    pub(crate) gathered: Option<takeover::Gathered>,
    /// Re-assignment: TFs without an EPN now whose STFs the FLPs keep (moved off a
    /// lost EPN, or placed again at a take-over); released when they end.
    pub(crate) kept_unplaced: BTreeSet<fanin_sched::TfId>,
    /// Pull mode: the transfer tokens.
    pub(crate) transfers: Option<fanin_sched::TokenManager>,
    /// Pull mode: TFs that ended with transfers under way, and when those stop waiting
    /// for their word (in time order).
    ended_grants: std::collections::VecDeque<(Now, fanin_sched::TfId)>,
    outbox: VecDeque<Action>,
}

impl IcnCore {
    /// A new ICN at time `now`, waiting for registrations until the pre-run time-out.
    pub fn new(mut cfg: CoreConfig, metrics: Arc<Metrics>, now: Now) -> IcnCore {
        let prerun_timeout = Duration::from_secs_f64(cfg.run.cfg.prerun_timeout_s);
        // The live status shows this run's ends by reason; the Prometheus counters go
        // on over a session's runs.
        metrics.new_run();
        let phase_deadline = (!cfg.hold_start).then_some(now + prerun_timeout);
        let window = window::Window::new(&cfg.run);
        let ondata = ondata::OnData::new(cfg.run.cfg.flps);
        let takeover = cfg.takeover.take();
        let r = &cfg.run.cfg;
        let transfers = (r.transfer == crate::config::Transfer::Pull)
            .then(|| fanin_sched::TokenManager::new(r.flp_tokens, r.epn_tokens));
        let mut core = IcnCore {
            placer: Placer::new(cfg.run.cfg.build_policy()),
            registry_members: cfg.registry_members.clone(),
            cfg,
            metrics,
            now,
            started: now,
            run_t0: None,
            phase: Phase::Registering,
            // A held run waits for its nodes as long as run control lets it.
            phase_deadline,
            last_lease_check: now,
            peers: HashMap::new(),
            epns: BTreeMap::new(),
            flps: BTreeMap::new(),
            ledger: Ledger::new(),
            tally: Tally::default(),
            next_tf: 0,
            lost_leadership: false,
            interrupts: 0,
            paused_since: None,
            more_due: false,
            window,
            joining: BTreeMap::new(),
            membership: Vec::new(),
            prerun_s: 0.0,
            registered_s: 0.0,
            node_stats: BTreeMap::new(),
            events: Vec::new(),
            events_not_kept: 0,
            fatal: None,
            load_recorded: BTreeMap::new(),
            last_load: BTreeMap::new(),
            recent_members: VecDeque::new(),
            paused_at: None,
            paused_total: Duration::ZERO,
            ondata,
            gathered: None,
            kept_unplaced: BTreeSet::new(),
            transfers,
            ended_grants: Default::default(),
            outbox: VecDeque::new(),
        };
        if let Some(t) = takeover {
            core.take_over(t);
        }
        core
    }

    /// Feeds one input at time `now` (never earlier than the last one).
    pub fn handle(&mut self, now: Now, input: Input) {
        debug_assert!(now >= self.now, "time went backwards");
        self.now = now.max(self.now);
        match input {
            Input::Registered { conn, peer, reg } => self.on_register(conn, peer, reg),
            Input::Msg { conn, msg } => {
                if let Some(p) = self.peers.get_mut(&conn) {
                    p.last_seen = self.now;
                    self.on_msg(conn, msg);
                } else {
                    // From a connection being closed (refused or dropped).
                    self.metrics.error("ignored_frame");
                }
            }
            Input::Closed { conn, err } => {
                if self.peers.contains_key(&conn) {
                    let why = err.unwrap_or_else(|| "connection closed".into());
                    self.peer_gone(conn, &why);
                }
            }
            Input::SendFailed { conn, why } => {
                if let Some(p) = self.peers.get(&conn) {
                    let line = format!("{}: {why}; dropping the peer", p.name());
                    self.log(Level::Warn, line);
                    self.metrics.error("peer_stuck");
                    self.peer_gone(conn, &why);
                }
            }
            Input::Membership(m) => self.on_membership(m),
            Input::MembershipLost => {
                self.log(
                    Level::Warn,
                    "the registry's membership watch ended; leases take over".into(),
                );
                self.registry_members = None;
            }
            Input::LostLeadership => self.on_lost_leadership(),
            Input::RegistryOutage { lost, what } => {
                if lost {
                    self.registry_members = None;
                }
                let t = self.now_us() as f64 / 1e6;
                let line = format!("t={t:.3}s registry: {what}");
                self.log(Level::Warn, line.clone());
                self.note(line);
            }
            Input::Interrupt => self.on_interrupt(),
            Input::Timeout => self.on_timeout(),
        }
        self.pump();
        self.check_invariants();
    }

    /// The next action to carry out, in the order the core decided them.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.outbox.pop_front()
    }

    /// When the shell must feed `Input::Timeout` next (None: only inputs matter).
    pub fn poll_timeout(&self) -> Option<Now> {
        let prerun = Duration::from_secs_f64(self.cfg.run.cfg.prerun_timeout_s);
        let issue = match self.phase {
            Phase::Running if self.paused_at.is_some() => None,
            Phase::Running if self.more_due => Some(self.now),
            Phase::Running if self.cfg.run.on_data() => self.stale_deadline(),
            Phase::Running if self.cfg.run.paced() => Some(self.deadline_of(self.next_tf)),
            // Unthrottled and waiting for a missing node: until the pre-run time-out.
            Phase::Running => self.paused_since.map(|t| t + prerun),
            _ => None,
        };
        let lease = self
            .leases_active()
            .then_some(self.last_lease_check + LEASE_CHECK);
        // A paused run's length waits for it (its deadline moves on resume).
        let paused_run = self.phase == Phase::Running && self.paused_at.is_some();
        let deadline = self.phase_deadline.filter(|_| !paused_run);
        let grants = self.ended_grants.front().map(|&(at, _)| at);
        [issue, deadline, lease, grants].into_iter().flatten().min()
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Counts an error of the shell's (`errors.NAME`) with the core's.
    pub fn metrics_error(&self, name: &str) {
        self.metrics.error(name);
    }

    /// Why the run could not be run, if it could not.
    pub fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }

    /// (issued, ended, total TFs configured or 0): the `PROGRESS` line.
    pub fn progress(&self) -> (u64, u64, u64) {
        let ended = self.ledger.issued - self.ledger.pending() as u64;
        let total = self.cfg.run.total_tfs.unwrap_or(0);
        (self.ledger.issued, ended, total)
    }

    /// TFs pending at the ICN (issued, not ended).
    pub fn in_flight(&self) -> usize {
        self.ledger.pending()
    }

    /// Microseconds since the run started (0 before; an ICN taking a run over counts
    /// on the run's own clock from the start, as its clock's origin is the run's).
    pub(crate) fn now_us(&self) -> u64 {
        let t0 = self
            .run_t0
            .or(self.gathered.as_ref().map(|_| Duration::ZERO));
        t0.map(|t| self.now.saturating_sub(t).as_micros() as u64)
            .unwrap_or(0)
    }

    pub(crate) fn send(&mut self, conn: ConnId, msg: Message) {
        if self.peers.contains_key(&conn) {
            self.outbox.push_back(Action::Send { conn, msg });
        }
    }

    /// Sends to every FLP of the schedule (on every TF: no collection in between).
    pub(crate) fn send_to_flps(&mut self, msg: Message) {
        for &conn in self.flps.values() {
            let msg = msg.clone();
            self.outbox.push_back(Action::Send { conn, msg });
        }
    }

    /// Sends to a connection the core holds no peer for (a refused registration).
    pub(crate) fn send_raw(&mut self, conn: ConnId, msg: Message) {
        self.outbox.push_back(Action::Send { conn, msg });
    }

    pub(crate) fn close(&mut self, conn: ConnId) {
        self.outbox.push_back(Action::Close { conn });
    }

    /// An event for the summary; past `MAX_EVENTS` only counted (a node that joins and
    /// leaves in a loop must not grow the ICN without bound).
    pub(crate) fn note(&mut self, line: String) {
        if self.events.len() < MAX_EVENTS {
            self.events.push(line);
        } else {
            self.events_not_kept += 1;
        }
    }

    pub(crate) fn log(&mut self, level: Level, line: String) {
        self.outbox.push_back(Action::Log { level, line });
    }

    pub(crate) fn emit(&mut self, action: Action) {
        self.outbox.push_back(action);
    }

    /// The accounting invariants, checked after every input in debug builds.
    fn check_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(self.ledger.invariant_holds(), "ledger sum broken");
        let ended = self.tally.completed + self.tally.incomplete + self.tally.dropped;
        assert_eq!(
            ended + self.ledger.pending() as u64,
            self.ledger.issued,
            "tally and ledger disagree"
        );
        assert!(self.ledger.issued <= self.next_tf, "more TFs than ids");
        assert!(
            self.ondata.sizes.len() <= self.ledger.pending(),
            "sizes kept for TFs that ended"
        );
        for tf in self.placer.waiting() {
            if self.ledger.is_pending(tf) {
                assert_eq!(self.ledger.assigned(tf), None, "waiting TF {tf} assigned");
            }
        }
        for (&epn, conn) in &self.epns {
            let p = self.peers.get(conn).expect("scheduled EPN has a peer");
            assert!(
                p.role == Role::Epn && p.id == epn,
                "EPN table points elsewhere"
            );
        }
        for (&flp, conn) in &self.flps {
            let p = self.peers.get(conn).expect("scheduled FLP has a peer");
            assert!(
                p.role == Role::Flp && p.id == flp,
                "FLP table points elsewhere"
            );
        }
    }
}
