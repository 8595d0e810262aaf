//! How an FLP or EPN joins a run and leaves it: connect to the ICN (with retries),
//! register, await the acknowledgement; at the end, report counters and close.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::bail;
use fanin_proto::{
    DecodeError, Message, NodeStats, Nonce, Register, RejectCode, Role, MAX_CONTROL_BODY,
    MAX_ICN_BODY,
};
use tokio::io::BufReader;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::auth::Secret;
use crate::conn::{connect_retry, read_frame_within, spawn_writer, write_msg, ConnError};
use crate::metrics::Metrics;

/// Runs a node (FLP or EPN) one incarnation after another: `once(rejoining)` runs until
/// the run ends for this node. After losing the ICN mid-run the node joins again (up to
/// `MAX_REJOINS` times); while the ICN cannot be reached (yet) it tries again within
/// `connect_timeout`. Any other error ends the node. A long-lived node (`session`) joins
/// the next run after each one, waits while the ICN is IDLE, and ends on EXIT.
pub async fn incarnations<F, Fut>(
    metrics: &Metrics,
    connect_timeout: Duration,
    session: bool,
    mut once: F,
) -> anyhow::Result<()>
where
    F: FnMut(bool) -> Fut,
    Fut: std::future::Future<Output = Result<(), NodeError>>,
{
    let mut rejoins = 0;
    let mut runs = 0u32;
    let mut since = tokio::time::Instant::now();
    let mut backoff = BACKOFF_MIN;
    let mut idle_waits = 0u64;
    loop {
        let began = tokio::time::Instant::now();
        match once(rejoins > 0 || runs > 0).await {
            Ok(()) if session && metrics.run_state() != Some(fanin_proto::RunState::Exit) => {
                runs += 1;
                (rejoins, backoff, since) = (0, BACKOFF_MIN, tokio::time::Instant::now());
                metrics.new_run();
            }
            Ok(()) => return Ok(()),
            Err(NodeError::SessionOver(e)) => {
                tracing::info!("{e}");
                return Ok(());
            }
            Err(NodeError::IcnIdle(e)) if session => {
                // Alive but IDLE: wait as long as it lasts (one line now and then).
                idle_waits += 1;
                if idle_waits % 30 == 1 {
                    tracing::info!("{e}; waiting for a run that takes this node");
                }
                tokio::time::sleep(BACKOFF_MAX).await;
                since = tokio::time::Instant::now();
            }
            Err(NodeError::LostIcn(e)) if rejoins < MAX_REJOINS => {
                rejoins += 1;
                metrics.error("rejoin");
                // A node that keeps losing its run at once waits longer each time.
                if began.elapsed() > LONG_INCARNATION {
                    backoff = BACKOFF_MIN;
                }
                tracing::warn!("{e}; joining again in {} ms", backoff.as_millis());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                since = tokio::time::Instant::now();
            }
            Err(NodeError::IcnUnreachable(e)) if since.elapsed() < connect_timeout => {
                tracing::info!("{e}; trying again in {} ms", backoff.as_millis());
                metrics.error("join_retry");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// What an FLP or EPN sets up once, before its first incarnation: its local addresses
/// checked (`binds`: flag and address), its metrics (served at `metrics_bind`) and its
/// registry session, if any.
pub async fn node_setup(
    role: Role,
    (id, binds): (Option<u32>, &[(&str, Option<std::net::IpAddr>)]),
    metrics_bind: Option<SocketAddr>,
    registry: Option<&crate::registry::runtime::RegistryOpts>,
) -> anyhow::Result<(std::sync::Arc<Metrics>, Option<crate::registry::ZkRegistry>)> {
    for (flag, ip) in binds {
        crate::conn::check_local_ip(flag, *ip)?;
    }
    let name = role.name();
    let metrics = Metrics::new(&name.to_lowercase(), id);
    if let Some(b) = metrics_bind {
        let a = crate::metrics::serve(b, metrics.clone()).await?;
        tracing::info!("{name} metrics on http://{a}/metrics");
    }
    let reg = match registry {
        Some(r) => Some(r.connect().await?),
        None => None,
    };
    Ok((metrics, reg))
}

/// The ICN to join: the one elected in the registry, else the given address.
pub async fn locate_icn(
    reg: Option<&crate::registry::ZkRegistry>,
    icn: Option<SocketAddr>,
    within: Duration,
) -> anyhow::Result<SocketAddr> {
    match (reg, icn) {
        (Some(r), _) => crate::registry::runtime::find_icn(r, within).await,
        (None, Some(a)) => Ok(a),
        (None, None) => bail!("give the ICN's address (--icn) or a registry (--registry)"),
    }
}

/// Does a kept run end once an ICN answered a Register? `None`: it goes on, as that ICN
/// took this very run over (`resume` for the run kept). `Some(over)`: it ends and a new
/// one starts; `over` unless the same run answered (joined afresh). The one rule for
/// the runtime's nodes and the simulator's.
pub fn kept_run_ends(resume: bool, answered_run: u64, kept_run: u64) -> Option<bool> {
    let goes_on = resume && answered_run == kept_run;
    (!goes_on).then_some(answered_run != kept_run)
}

/// A kept run, once an ICN answered: the one that goes on, or the one that ends, with
/// whether its run is over (`kept_run_ends`; the caller ends it before anything else).
pub fn goes_on<K>(
    kept: Option<K>,
    run_of: impl Fn(&K) -> u64,
    joined: &Joined,
) -> (Option<K>, Option<(K, bool)>) {
    let Some(k) = kept else {
        return (None, None);
    };
    match kept_run_ends(joined.resume, joined.run_id, run_of(&k)) {
        None => (Some(k), None),
        Some(over) => (None, Some((k, over))),
    }
}

/// A registered node's control connection.
pub struct Joined {
    pub me: u32,
    pub run_id: u64,
    /// The ICN took this run over from a failed one: keep what you hold, and tell.
    pub resume: bool,
    /// Local address of the control connection (unique per incarnation of the node).
    pub local: std::net::SocketAddr,
    pub rd: BufReader<OwnedReadHalf>,
    pub ctl: mpsc::Sender<Message>,
    pub writer: JoinHandle<()>,
}

/// How long a listener may take to send its Challenge, and the ICN its answer.
pub const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// Why a join failed: the ICN refused (permanently or not), or anything on the way.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("ICN {icn} refused this {role}: {reason}")]
    Refused {
        icn: SocketAddr,
        role: &'static str,
        code: RejectCode,
        reason: String,
    },
    /// The ICN speaks another protocol (version or magic): final.
    #[error("{0}")]
    Foreign(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl JoinError {
    /// Will trying again help? Only a refusal that says so is final.
    pub fn transient(&self) -> bool {
        match self {
            JoinError::Refused { code, .. } => code.transient(),
            JoinError::Foreign(_) => false,
            JoinError::Other(_) => true,
        }
    }
}

/// The ICN's first frame, its Challenge: the nonce to prove the run secret on.
async fn challenge(rd: &mut BufReader<OwnedReadHalf>, icn: SocketAddr) -> Result<Nonce, JoinError> {
    match read_frame_within(rd, MAX_CONTROL_BODY, HANDSHAKE_WITHIN).await {
        Ok(Some(Message::Challenge { nonce })) => Ok(nonce),
        Ok(other) => Err(anyhow::anyhow!("ICN {icn}: expected Challenge, got {other:?}").into()),
        // Another build of fanin (or not fanin): trying again will not help.
        Err(e @ ConnError::Decode(DecodeError::Version { .. } | DecodeError::BadMagic(_))) => {
            Err(JoinError::Foreign(format!(
                "ICN {icn}: {e} (a node and its ICN must speak the same protocol version)"
            )))
        }
        Err(e) => Err(anyhow::anyhow!("ICN {icn}: {e}").into()),
    }
}

/// Connects to the ICN, answers its challenge and registers. `data_addr` is computed
/// from the connected control socket (an EPN bound to 0.0.0.0 announces the address it
/// reaches the ICN from).
pub async fn join(
    spec: &JoinSpec<'_>,
    icn: SocketAddr,
    id: Option<u32>,
    connect_timeout: Duration,
    data_addr: impl FnOnce(&TcpStream) -> anyhow::Result<String>,
) -> Result<Joined, JoinError> {
    let role = spec.role;
    let what = format!("{} control connection to ICN", role.name());
    let ctl = connect_retry(icn, spec.control_bind, connect_timeout, &what).await?;
    crate::conn::keepalive(&ctl, crate::conn::KEEPALIVE_IDLE);
    let data_addr = data_addr(&ctl)?;
    let local = ctl.local_addr().map_err(anyhow::Error::from)?;
    let (rd, mut wr) = ctl.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let nonce = challenge(&mut rd, icn).await?;
    let mut reg = Register {
        role,
        node_id: id,
        data_addr,
        proof: [0; 32],
    };
    reg.proof = spec.secret.prove_register(&nonce, &reg);
    write_msg(&mut wr, &Message::Register(reg))
        .await
        .map_err(|e| anyhow::anyhow!("ICN {icn}: {e}"))?;
    let answer = read_frame_within(&mut rd, MAX_ICN_BODY, Duration::from_secs(30)).await;
    let (me, run_id, resume) = match answer {
        Ok(Some(Message::RegisterAck {
            node_id,
            run_id,
            resume,
        })) => {
            spec.secret.warn_if_none(role);
            (node_id, run_id, resume)
        }
        Ok(Some(Message::Reject { code, reason })) => {
            return Err(JoinError::Refused {
                icn,
                role: role.name(),
                code,
                reason,
            })
        }
        Ok(other) => {
            return Err(anyhow::anyhow!("ICN {icn}: expected RegisterAck, got {other:?}").into())
        }
        Err(e) => return Err(anyhow::anyhow!("ICN {icn}: {e}").into()),
    };
    let (ctl, writer) = spawn_writer(wr, format!("ICN {icn}"));
    Ok(Joined {
        me,
        run_id,
        resume,
        local,
        rd,
        ctl,
        writer,
    })
}

/// A node that belongs to run `run_id` (kept across an ICN loss, or going when the node
/// started): did that run end meanwhile, says the registry? Then there is nothing to
/// join, and the node's run is over.
pub async fn ended_meanwhile(
    reg: Option<&crate::registry::ZkRegistry>,
    run_id: Option<u64>,
    role: Role,
    id: Option<u32>,
) -> bool {
    let (Some(r), Some(run_id)) = (reg, run_id) else {
        return false;
    };
    let ended = crate::icn::run_state::ended(r, run_id).await;
    if ended {
        let (name, me) = (role.name(), id.unwrap_or_default());
        tracing::info!("{name} {me}: run {run_id} ended while this {name} was away");
    }
    ended
}

/// How often a joining node asks the registry whether its run ended.
const RUN_END_POLL: Duration = Duration::from_millis(500);

/// Resolves with `run_id` once the registry marks that run ended; never without a
/// registry or a run.
async fn run_ends(reg: Option<&crate::registry::ZkRegistry>, run_id: Option<u64>) -> u64 {
    let (Some(r), Some(run_id)) = (reg, run_id) else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(RUN_END_POLL).await;
        if crate::icn::run_state::ended(r, run_id).await {
            return run_id;
        }
    }
}

/// The run a node belongs to: the one going in the registry when it started (a node
/// restarted mid-run learns its run so), then each one it joined. Its end leaves the
/// node nothing to join. A long-lived node (`--session`) belongs to no one run.
pub struct OwnRun {
    run: std::cell::Cell<Option<u64>>,
    /// The registry answered at start that no run is going (not: it gave no answer).
    none_going: bool,
    session: bool,
}

impl OwnRun {
    pub async fn at_start(reg: Option<&crate::registry::ZkRegistry>, session: bool) -> OwnRun {
        let said = match reg.filter(|_| !session) {
            Some(r) => crate::icn::run_state::going(r).await,
            None => None,
        };
        OwnRun {
            run: std::cell::Cell::new(said.flatten()),
            none_going: said == Some(None),
            session,
        }
    }

    pub fn get(&self) -> Option<u64> {
        self.run.get()
    }

    /// A node started again into its run (`--rejoin`, as a launcher restarts a node it
    /// killed) while the registry answers that no run is going: its run is over, so it
    /// has nothing to join (said once). A registry that gave no answer proves nothing:
    /// the node joins as usual. A node started for the next run has no `--rejoin`.
    pub fn over_before_start(&self, role: Role, id: Option<u32>, rejoin: bool) -> bool {
        let over = rejoin && self.none_going;
        if over {
            let me = id.map_or(String::new(), |i| format!(" {i}"));
            tracing::info!(
                "{}{me}: started again into its run (--rejoin), but the registry says no run is going: nothing to rejoin",
                role.name()
            );
        }
        over
    }

    pub fn joined(&self, run_id: u64) {
        if !self.session {
            self.run.set(Some(run_id));
        }
    }
}

/// The leader znode to follow, with a registry: an ICN that no longer leads is left.
pub async fn follow_leader(
    reg: Option<&crate::registry::ZkRegistry>,
) -> Option<tokio::sync::watch::Receiver<Option<String>>> {
    let r = reg?;
    match r.watch_leader(crate::registry::runtime::RUN).await {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!("registry: cannot watch the leader: {e}");
            None
        }
    }
}

/// Resolves when the leader znode names another ICN than `icn` (never without one).
pub async fn leader_moved(
    leader: Option<&mut tokio::sync::watch::Receiver<Option<String>>>,
    icn: SocketAddr,
) -> String {
    let Some(rx) = leader else {
        return std::future::pending().await;
    };
    let me = icn.to_string();
    loop {
        if let Some(other) = rx.borrow_and_update().clone().filter(|a| *a != me) {
            return other;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// The node left an ICN the registry no longer names as the leader.
pub fn not_leading(role: Role, me: u32, icn: SocketAddr, other: &str) -> NodeError {
    let name = role.name();
    NodeError::LostIcn(format!(
        "{name} {me}: ICN {icn} no longer leads (the registry names {other})"
    ))
}

/// The handshake with an ICN taking the run over failed: the node tries again, its
/// run still kept.
pub fn lost_in_takeover(
    role: Role,
    me: u32,
    icn: SocketAddr,
    e: &dyn std::fmt::Display,
) -> NodeError {
    let name = role.name();
    NodeError::LostIcn(format!("{name} {me}: ICN {icn} during the take-over: {e}"))
}

/// Who joins, and where: the ICN's address or the registry that names it.
pub struct JoinSpec<'a> {
    pub role: Role,
    pub icn: Option<SocketAddr>,
    pub registry: Option<&'a crate::registry::ZkRegistry>,
    pub control_bind: Option<IpAddr>,
    pub connect_timeout: Duration,
    pub secret: &'a Secret,
    /// Long-lived (run control): a run that cannot take this node now (full, not
    /// registering, not this id) is waited out, not an end.
    pub session: bool,
    /// The run this node belongs to, when it knows one (kept across an ICN loss, or
    /// going in the registry when the node started): joining ends when that run does.
    pub run: Option<u64>,
}

/// One incarnation's way in: find the ICN, connect and register (under the id of the
/// previous incarnation, if any), keep the id, and register in the registry. Every
/// failure but a final refusal is `IcnUnreachable`: the caller tries again (first join
/// and rejoin alike) within the connect time-out. None: the node's run is over, so there
/// is nothing to join: the registry says its run (`spec.run`) ended meanwhile (no ICN
/// may be left to answer), or the ICN refused it as its run is stopping.
pub async fn join_run(
    spec: &JoinSpec<'_>,
    id: &std::cell::Cell<Option<u32>>,
    data_addr: impl FnOnce(&TcpStream) -> anyhow::Result<String>,
) -> Result<Option<(SocketAddr, Joined)>, NodeError> {
    tokio::select! {
        biased; // a join that made it is kept
        joined = join_once(spec, id, data_addr) => joined,
        run = run_ends(spec.registry, spec.run) => {
            let (name, me) = (spec.role.name(), id.get().unwrap_or_default());
            tracing::info!("{name} {me}: run {run} ended while this {name} was joining");
            Ok(None)
        }
    }
}

async fn join_once(
    spec: &JoinSpec<'_>,
    id: &std::cell::Cell<Option<u32>>,
    data_addr: impl FnOnce(&TcpStream) -> anyhow::Result<String>,
) -> Result<Option<(SocketAddr, Joined)>, NodeError> {
    let reg = spec.registry;
    let icn = locate_icn(reg, spec.icn, spec.connect_timeout).await?;
    let attempt = match reg {
        Some(_) => REGISTRY_CONNECT_ATTEMPT.min(spec.connect_timeout),
        None => spec.connect_timeout,
    };
    let joined = match join(spec, icn, id.get(), attempt, data_addr).await {
        Ok(j) => j,
        Err(
            e @ JoinError::Refused {
                code: RejectCode::RunOver,
                ..
            },
        ) if !spec.session => {
            tracing::info!("{e:#}: this {} has nothing to join", spec.role.name());
            return Ok(None);
        }
        Err(e) => return Err(refused(e, spec.session)),
    };
    id.set(Some(joined.me));
    if let Some(r) = reg {
        crate::registry::runtime::register(r, spec.role, joined.me, joined.local);
    }
    let name = spec.role.name();
    tracing::info!("{name} {}: registered for run {}", joined.me, joined.run_id);
    Ok(Some((icn, joined)))
}

/// What a failed join means for the node: wait (a long-lived node between runs), try
/// again, end cleanly (the session is over) or end with the error.
fn refused(e: JoinError, session: bool) -> NodeError {
    match &e {
        JoinError::Refused {
            code: RejectCode::Idle,
            ..
        } => NodeError::IcnIdle(format!("{e:#}")),
        JoinError::Refused {
            code: RejectCode::SessionOver,
            ..
        } => NodeError::SessionOver(format!("{e:#}")),
        JoinError::Refused {
            code:
                RejectCode::RunFull
                | RejectCode::WrongPhase
                | RejectCode::UnknownId
                | RejectCode::RunOver
                | RejectCode::IdInUse,
            ..
        } if session => NodeError::IcnIdle(format!("{e:#}")),
        _ if e.transient() => NodeError::IcnUnreachable(format!("{e:#}")),
        _ => NodeError::Fatal(e.into()),
    }
}

impl Joined {
    /// Run end: sends this node's counters to the ICN and closes the connection.
    pub async fn leave(self, role: Role, metrics: &Metrics) -> anyhow::Result<()> {
        leave(self.ctl, self.writer, self.me, role, metrics).await
    }
}

/// Run end, for a node that took its `Joined` apart: counters to the ICN, then close.
/// An ICN that closed the connection first (it stopped waiting for this node at the
/// run's end) is a warning, not an error: the run ended, and a long-lived node goes on
/// to the next one.
pub async fn leave(
    ctl: mpsc::Sender<Message>,
    writer: JoinHandle<()>,
    me: u32,
    role: Role,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    metrics.set_event_total("cpu_us", crate::host::process_cpu_us());
    let stats = Message::NodeStats(NodeStats {
        role,
        node_id: me,
        counters: metrics.run_snapshot(),
    });
    if ctl.send(stats).await.is_err() {
        tracing::warn!(
            "{} {me}: the ICN closed the connection before this node's counters reached it (it stopped waiting at the run's end)",
            role.name()
        );
    }
    drop(ctl);
    let _ = writer.await;
    Ok(())
}

/// How one incarnation of a node ended, when it did not finish its run: what
/// `incarnations` does next depends on which.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The control connection ended mid-run: the node may join again (same id).
    #[error("{0}")]
    LostIcn(String),
    /// The ICN could not be reached (yet): try again within the connect time-out.
    #[error("{0}")]
    IcnUnreachable(String),
    /// Run control: the ICN has no run configured yet (IDLE).
    #[error("{0}")]
    IcnIdle(String),
    /// Run control: the session is over (EXIT); the node ends cleanly.
    #[error("{0}")]
    SessionOver(String),
    /// Anything else ends the node.
    #[error(transparent)]
    Fatal(#[from] anyhow::Error),
}

/// Errors of the node's own I/O end it.
macro_rules! fatal_from {
    ($($t:ty),*) => {$(
        impl From<$t> for NodeError {
            fn from(e: $t) -> Self {
                NodeError::Fatal(e.into())
            }
        }
    )*};
}
fatal_from!(std::io::Error, ConnError, mpsc::error::SendError<Message>);

/// With a registry, how long one attempt to reach the elected ICN may take before the
/// node asks the registry again (a new ICN may have been elected meanwhile).
pub const REGISTRY_CONNECT_ATTEMPT: Duration = Duration::from_secs(1);

/// An incarnation that lasted this long was a run, not a failed attempt: back-off resets.
const LONG_INCARNATION: Duration = Duration::from_secs(10);

/// Back-off between attempts to join: doubling from the first to the last.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How many times a node joins again after losing the ICN mid-run.
pub const MAX_REJOINS: u32 = 100;

/// The error for a control connection that ended mid-run (`None`: closed cleanly).
pub fn lost_icn(
    role: Role,
    me: u32,
    icn: SocketAddr,
    err: Option<ConnError>,
    metrics: &Metrics,
) -> NodeError {
    match err {
        None => NodeError::LostIcn(format!(
            "{} {me}: ICN {icn} closed the control connection mid-run",
            role.name()
        )),
        Some(e) => {
            metrics.error(e.kind());
            NodeError::LostIcn(format!(
                "{} {me}: control connection to ICN {icn}: {e}",
                role.name()
            ))
        }
    }
}

/// Aborts a task when dropped, so a node leaving a run early leaves no task behind.
pub struct AbortOnDrop<T>(pub JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose id another connection holds (perhaps a dead host's, until keepalive
    /// closes it) tries again: a session node waits as for a full run, a one-run node
    /// within its connect time-out.
    #[test]
    fn an_id_held_elsewhere_is_waited_for() {
        let held = || JoinError::Refused {
            icn: "127.0.0.1:1".parse().unwrap(),
            role: "FLP",
            code: RejectCode::IdInUse,
            reason: "FLP id 0 is already registered".into(),
        };
        assert!(matches!(refused(held(), true), NodeError::IcnIdle(_)));
        assert!(matches!(
            refused(held(), false),
            NodeError::IcnUnreachable(_)
        ));
    }

    /// The ICN stopped waiting at the run's end and closed: the node's run still ends
    /// well (a long-lived node goes on to the next run instead of dying).
    #[tokio::test]
    async fn leaving_after_the_icn_closed_ends_the_run_well() {
        let metrics = Metrics::new("epn", Some(0));
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let writer = tokio::spawn(async {});
        assert!(leave(tx, writer, 0, Role::Epn, &metrics).await.is_ok());
    }
}
