//! The EPN: registers its data address with the ICN, accepts STFs from every FLP,
//! builds TFs and reports each one to the ICN (complete, incomplete, or dropped).

pub mod builder;
pub mod clock;
pub mod core;
pub mod lowat;
pub mod order;
pub mod receiver;
pub mod sink;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fanin_proto::{Message, Role, MAX_ICN_BODY};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::budget::ByteBudget;
use crate::config::check_prepare;
use crate::conn::read_frame;
use crate::join::{incarnations, join_run, lost_icn, node_setup, AbortOnDrop, JoinSpec, NodeError};
use crate::metrics::Metrics;
use crate::registry::{runtime::RegistryOpts, ZkRegistry};
use builder::Builder;
use core::{Action, CompleteOn, Delivery, EpnCore, Input};
use receiver::{BufPool, BuildEvent, DataCtx};
use sink::{OnFailure, SinkCtx, SinkSpec, Sinks};

pub struct EpnOptions {
    /// The ICN's control address; with a registry, the elected ICN is used instead.
    pub icn: Option<SocketAddr>,
    /// Find the ICN through this registry and register there (ZooKeeper).
    pub registry: Option<RegistryOpts>,
    pub id: Option<u32>,
    /// Where FLPs connect (the data network).
    pub data_bind: SocketAddr,
    /// Address announced to FLPs, when `data_bind` is not reachable as is (0.0.0.0, NAT).
    pub advertise: Option<SocketAddr>,
    /// Local address of the control connection (the auxiliary network).
    pub control_bind: Option<IpAddr>,
    /// Build buffer limit in bytes.
    pub build_buffer: u64,
    /// TFs in building at once.
    pub max_building: usize,
    pub metrics_bind: Option<SocketAddr>,
    pub connect_timeout: Duration,
    /// The run secret this node proves (empty: none).
    pub secret: crate::auth::Secret,
    /// Fault injection (the seed's "Goat"): crash (SIGKILL itself) after reporting
    /// this many complete TFs.
    pub die_after_tfs: Option<u64>,
    /// Where built TFs go (none: built and discarded).
    pub sinks: Vec<SinkSpec>,
    pub complete_on: CompleteOn,
    /// Hand TFs to the sinks in TF-id order, giving up the oldest after this many.
    pub in_order: Option<usize>,
    pub on_sink_failure: OnFailure,
    /// Exec sinks lend payload pages to the pipe (only for commands that read(2)).
    pub exec_zero_copy: bool,
    /// After a RunStop, how long the sinks may go without returning a TF (a plug-in that
    /// never returns would hold the EPN): then the EPN leaves them and ends with an error.
    pub sink_stop_wait: Duration,
    /// Long-lived (run control): join run after run until the session's EXIT.
    pub session: bool,
    /// Started again into a run that is going (`--rejoin`): none going, it ends at once.
    pub rejoin: bool,
}

/// `--sink-stop-timeout`'s default, seconds (`EpnOptions::sink_stop_wait`).
pub const SINK_STOP_TIMEOUT_S: f64 = 60.0;

/// Runs the EPN; if it loses the ICN mid-run (its lease expired, the ICN restarted),
/// it joins again under the same id with a fresh build state.
pub async fn run(opts: EpnOptions) -> anyhow::Result<()> {
    let (metrics, reg) = node_setup(
        Role::Epn,
        (opts.id, &[("--control-bind", opts.control_bind)]),
        opts.metrics_bind,
        opts.registry.as_ref(),
    )
    .await?;
    let id = std::cell::Cell::new(opts.id);
    let kept = std::cell::RefCell::new(None);
    let own = crate::join::OwnRun::at_start(reg.as_ref(), opts.session).await;
    if own.over_before_start(Role::Epn, opts.id, opts.rejoin) {
        return Ok(());
    }
    let (o, m, r, idr, k, own) = (&opts, &metrics, reg.as_ref(), &id, &kept, &own);
    incarnations(
        &metrics,
        opts.connect_timeout,
        opts.session,
        move |rejoining| run_once(o, m, idr, r, k, (rejoining, own)),
    )
    .await
}

/// What an EPN keeps when it loses its ICN mid-run with a registry: its data port,
/// its FLPs' connections and its builder go on with an ICN that takes the run over.
struct KeptRun {
    run_id: u64,
    listener: Arc<TcpListener>,
    _acceptor: AbortOnDrop<()>,
    build_task: AbortOnDrop<anyhow::Result<()>>,
    b_tx: mpsc::Sender<BuildEvent>,
    /// After a RunStop, how long its sinks may go without returning a TF
    /// (`EpnOptions::sink_stop_wait`), and what they returned so far.
    sink_stop_wait: Duration,
    sink_progress: Arc<std::sync::atomic::AtomicU64>,
    /// The build task's way to the ICN (a new control connection replaces it).
    ctl: tokio::sync::watch::Sender<mpsc::Sender<Message>>,
    /// The ICN is away (the run kept for a take-over): the build task reads it before
    /// every event, so neither a full event queue nor the events queued before it
    /// delay it.
    icn_away: Arc<AtomicBool>,
}

impl KeptRun {
    /// The run ended while this EPN was away, or goes on without it: what it still
    /// builds ends as at a RunStop, and its sinks close (their files and commands
    /// finish) before the EPN goes or joins another run. Sinks stuck longer than
    /// `sink_stop_wait` end the EPN (a plug-in still inside a TF must not be given the
    /// next run's).
    async fn end(mut self) -> Result<(), NodeError> {
        drop(self._acceptor);
        let stop = Message::RunStop {
            run_id: self.run_id,
        };
        let _ = self.b_tx.send(BuildEvent::Control(stop)).await;
        let stop_wait = (&*self.sink_progress, self.sink_stop_wait);
        match until_built(&mut self.build_task, stop_wait).await {
            Ok(Err(e)) => tracing::warn!("EPN: the kept run ended with: {e:#}"),
            Ok(Ok(())) => {}
            Err(stuck) => return Err(NodeError::Fatal(stuck)),
        }
        Ok(())
    }
}

/// Waits for the build task to end after a RunStop (its sinks return every TF and
/// close) for as long as the sinks make progress; Err once they returned nothing for
/// `wait`.
async fn until_built(
    build: &mut AbortOnDrop<anyhow::Result<()>>,
    (progress, wait): (&std::sync::atomic::AtomicU64, Duration),
) -> anyhow::Result<anyhow::Result<()>> {
    use std::sync::atomic::Ordering::Relaxed;
    // Looked at ten times per `wait`: the sinks are left `wait` (+10 %) after their last
    // progress, not up to twice that.
    let (mut seen, mut since) = (progress.load(Relaxed), tokio::time::Instant::now());
    loop {
        match tokio::time::timeout(wait / 10, &mut build.0).await {
            Ok(Ok(r)) => return Ok(r),
            Ok(Err(e)) => return Ok(Err(anyhow::anyhow!("the build task failed: {e}"))),
            Err(_) if progress.load(Relaxed) != seen => {
                (seen, since) = (progress.load(Relaxed), tokio::time::Instant::now());
            }
            Err(_) if since.elapsed() < wait => {}
            Err(_) => anyhow::bail!(
                "its sinks returned no TF for {:.1} s after the run's stop and have not finished (--sink-stop-timeout); leaving them",
                wait.as_secs_f64()
            ),
        }
    }
}

/// Ends the kept run, if any (its run ended: nothing to join).
async fn end_kept(kept: &std::cell::RefCell<Option<KeptRun>>) -> Result<(), NodeError> {
    let k = kept.borrow_mut().take();
    match k {
        Some(k) => k.end().await,
        None => Ok(()),
    }
}

async fn run_once(
    opts: &EpnOptions,
    metrics: &Arc<Metrics>,
    id: &std::cell::Cell<Option<u32>>,
    reg: Option<&ZkRegistry>,
    kept: &std::cell::RefCell<Option<KeptRun>>,
    (rejoining, own): (bool, &crate::join::OwnRun),
) -> Result<(), NodeError> {
    let metrics = metrics.clone();
    let run = kept.borrow().as_ref().map(|k| k.run_id).or(own.get());
    if crate::join::ended_meanwhile(reg, run, Role::Epn, id.get()).await {
        return end_kept(kept).await;
    }
    // A kept run keeps its data port; it is taken only once the ICN answered.
    let kept_port = kept.borrow().as_ref().map(|k| k.listener.clone());
    let listener = match kept_port {
        Some(l) => l,
        None => Arc::new(bind_data(opts.data_bind, rejoining).await?),
    };
    let Some((icn, joined)) = join_epn(opts, id, reg, run, listener.local_addr()?).await? else {
        return end_kept(kept).await;
    };
    own.joined(joined.run_id);
    metrics.joined_run(joined.run_id);
    // Not the run it was in: the kept one ends now, as at a RunStop, its sinks finishing
    // what they took (its acceptor stops before any FLP of the new run can connect:
    // they learn of this EPN only after this answer).
    let taken = kept.borrow_mut().take();
    let (taken, ended) = crate::join::goes_on(taken, |k| k.run_id, &joined);
    if let Some((k, _)) = ended {
        k.end().await?;
    }
    let leader = crate::join::follow_leader(reg).await;
    let mut joined = joined;
    if let Some(k) = taken {
        return resume(k, joined, icn, leader, &metrics, reg, kept).await;
    }
    match start(opts, &mut joined, icn, listener, &metrics).await? {
        Some(k) => follow(k, joined, icn, leader, &metrics, reg, kept).await,
        // Run control ended this run before it started: the next one, or exit.
        None => Ok(joined.leave(Role::Epn, &metrics).await?),
    }
}

/// A new run: the parameters, the data acceptor on `listener`, the build task, and
/// Ready. None: run control ended the run before it started.
async fn start(
    opts: &EpnOptions,
    joined: &mut crate::join::Joined,
    icn: SocketAddr,
    listener: Arc<TcpListener>,
    metrics: &Arc<Metrics>,
) -> Result<Option<KeptRun>, NodeError> {
    let me = joined.me;
    let ctl_tx = joined.ctl.clone();
    let Some(prep) = prerun(&mut joined.rd, me, icn, metrics).await? else {
        return Ok(None);
    };
    let size = check_prepare(&prep, ("--build-buffer", opts.build_buffer))
        .with_context(|| format!("EPN {me}: run parameters from ICN {icn}"))?;
    let budget = Arc::new(ByteBudget::new(opts.build_buffer));
    metrics.set_buffer("epn_build", 0, opts.build_buffer);
    let pool = Arc::new(BufPool::new(budget.clone()));
    let (b_tx, b_rx) = mpsc::channel::<BuildEvent>(4096);
    let ctx = Arc::new(DataCtx {
        me,
        run_id: prep.run_id,
        flps: prep.flps,
        max_stf: size.max(),
        budget: budget.clone(),
        pool: pool.clone(),
        builder: b_tx.clone(),
        metrics: metrics.clone(),
        connected: Default::default(),
        secret: opts.secret.clone(),
        admission: crate::admission::Admission::new(prep.flps as usize),
    });
    let acceptor = AbortOnDrop(tokio::spawn(receiver::accept_loop(listener.clone(), ctx)));
    let sink_progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (core, sinks) = build_core(opts, (me, &prep), &b_tx, &sink_progress, metrics).await?;
    let (ctl_watch, ctl) = tokio::sync::watch::channel(ctl_tx.clone());
    let icn_away = Arc::new(AtomicBool::new(false));
    let shell = BuildShell {
        core,
        sinks,
        ctl,
        budget,
        pool,
        metrics: metrics.clone(),
        icn_away: icn_away.clone(),
        told_away: false,
    };
    let build_task = AbortOnDrop(tokio::spawn(shell.run(b_rx)));
    let ready = Message::Ready {
        role: Role::Epn,
        node_id: me,
        connected: 0,
    };
    ctl_tx.send(ready).await?;
    Ok(Some(KeptRun {
        run_id: prep.run_id,
        listener,
        _acceptor: acceptor,
        build_task,
        b_tx,
        sink_stop_wait: opts.sink_stop_wait,
        sink_progress,
        ctl: ctl_watch,
        icn_away,
    }))
}

/// Follows the ICN until the run ends for this EPN. Losing the ICN with a registry,
/// the run is kept for an ICN that takes it over.
async fn follow(
    mut k: KeptRun,
    mut joined: crate::join::Joined,
    icn: SocketAddr,
    mut leader: Option<tokio::sync::watch::Receiver<Option<String>>>,
    metrics: &Arc<Metrics>,
    reg: Option<&ZkRegistry>,
    kept: &std::cell::RefCell<Option<KeptRun>>,
) -> Result<(), NodeError> {
    let me = joined.me;
    let ended = follow_icn(&mut joined.rd, &mut k, me, &mut leader, icn).await;
    match ended {
        Ended::Stopped => {
            // Its hold on the control connection goes first: leaving closes it.
            drop(k);
            Ok(joined.leave(Role::Epn, metrics).await?)
        }
        Ended::SinkFailed(e) => Err(NodeError::Fatal(e)),
        Ended::LostIcn(e) => keep(k, kept, reg, lost_icn(Role::Epn, me, icn, e, metrics)).await,
        Ended::NotLeader(other) => {
            let err = crate::join::not_leading(Role::Epn, me, icn, &other);
            keep(k, kept, reg, err).await
        }
    }
}

/// The ICN is lost: with a registry the run is kept for an ICN that takes it over (its
/// build time-outs wait meanwhile); without one it is ended as at a RunStop, so its
/// sinks hand on what they hold and close before the next incarnation opens them again
/// (a tap's port, a plug-in's one thread). `err` says why.
async fn keep(
    k: KeptRun,
    kept: &std::cell::RefCell<Option<KeptRun>>,
    reg: Option<&ZkRegistry>,
    err: NodeError,
) -> Result<(), NodeError> {
    match reg {
        Some(_) => {
            k.icn_away.store(true, Ordering::Release);
            *kept.borrow_mut() = Some(k);
        }
        None => k.end().await?,
    }
    Err(err)
}

/// Resumes a kept run with the ICN that took it over: tells what it builds and the
/// reports not released, takes the run parameters, and is ready.
async fn resume(
    k: KeptRun,
    mut joined: crate::join::Joined,
    icn: SocketAddr,
    leader: Option<tokio::sync::watch::Receiver<Option<String>>>,
    metrics: &Arc<Metrics>,
    reg: Option<&ZkRegistry>,
    kept: &std::cell::RefCell<Option<KeptRun>>,
) -> Result<(), NodeError> {
    match take_part(&k, &mut joined, icn, metrics).await {
        Ok(true) => follow(k, joined, icn, leader, metrics, reg, kept).await,
        Ok(false) => {
            k.end().await?; // stopped during the take-over
            Ok(joined.leave(Role::Epn, metrics).await?)
        }
        Err(e) => {
            // The run stays kept for the next ICN (this one may have died meanwhile).
            *kept.borrow_mut() = Some(k);
            Err(e)
        }
    }
}

/// The EPN's part of a take-over: its reports go to the new ICN from now on; it tells
/// what it holds, takes the run parameters and is ready. False: run control stopped.
async fn take_part(
    k: &KeptRun,
    joined: &mut crate::join::Joined,
    icn: SocketAddr,
    metrics: &Arc<Metrics>,
) -> Result<bool, NodeError> {
    let me = joined.me;
    let lost = |e: &dyn std::fmt::Display| crate::join::lost_in_takeover(Role::Epn, me, icn, e);
    // First the new connection, then the snapshot: a report made in between is in both
    // (the ICN takes it once), none is in neither.
    let _ = k.ctl.send(joined.ctl.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let asked = k.b_tx.send(BuildEvent::Held(tx)).await.is_ok();
    let Some((building, reports)) = (if asked { rx.await.ok() } else { None }) else {
        return Err(NodeError::Fatal(anyhow::anyhow!(
            "EPN {me}: the build task ended while the ICN was away"
        )));
    };
    tracing::info!(
        "EPN {me}: ICN {icn} took run {} over; {} TFs building, {} reports not released",
        k.run_id,
        building.len(),
        reports.len()
    );
    for msg in core::tfs_held(&building, &reports) {
        joined.ctl.send(msg).await.map_err(|e| lost(&e))?;
    }
    let prep = prerun(&mut joined.rd, me, icn, metrics).await;
    if prep.map_err(|e| lost(&format!("{e:#}")))?.is_none() {
        return Ok(false);
    }
    let ready = Message::Ready {
        role: Role::Epn,
        node_id: me,
        connected: 0,
    };
    joined.ctl.send(ready).await.map_err(|e| lost(&e))?;
    k.icn_away.store(false, Ordering::Release);
    Ok(true)
}

/// Joins the run, announcing the data address FLPs reach `local` by.
async fn join_epn(
    opts: &EpnOptions,
    id: &std::cell::Cell<Option<u32>>,
    registry: Option<&ZkRegistry>,
    run: Option<u64>,
    local: SocketAddr,
) -> Result<Option<(SocketAddr, crate::join::Joined)>, NodeError> {
    let spec = JoinSpec {
        run,
        role: Role::Epn,
        icn: opts.icn,
        registry,
        control_bind: opts.control_bind,
        connect_timeout: opts.connect_timeout,
        secret: &opts.secret,
        session: opts.session,
    };
    join_run(&spec, id, |ctl| {
        Ok(match opts.advertise {
            Some(a) => a,
            None if !local.ip().is_unspecified() => local,
            // Bound to all interfaces: announce the address we reach the ICN from.
            None => SocketAddr::new(ctl.local_addr()?.ip(), local.port()),
        }
        .to_string())
    })
    .await
}

/// The builder of one run, with its sinks when it has any.
async fn build_core(
    opts: &EpnOptions,
    (me, prep): (u32, &fanin_proto::Prepare),
    b_tx: &mpsc::Sender<BuildEvent>,
    progress: &Arc<std::sync::atomic::AtomicU64>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<(EpnCore<Vec<u8>>, Option<Sinks>)> {
    let timeout_us = prep.build_timeout_ms as u64 * 1000;
    let builder = Builder::<Vec<u8>>::new(me, prep.flps, timeout_us, opts.max_building);
    if opts.sinks.is_empty() {
        let core = EpnCore::new(builder, opts.die_after_tfs, metrics.clone()).with_pull(prep.pull);
        return Ok((core, None));
    }
    let sink_ctx = SinkCtx {
        run_id: prep.run_id,
        epn: me,
        metrics: metrics.clone(),
        on_failure: opts.on_sink_failure,
        exec_zero_copy: opts.exec_zero_copy,
        progress: progress.clone(),
    };
    let sinks = Sinks::start(&opts.sinks, sink_ctx, b_tx.clone())
        .await
        .with_context(|| format!("EPN {me}"))?;
    let delivery = Delivery {
        complete_on: opts.complete_on,
        in_order: opts.in_order,
    };
    let core = EpnCore::new(builder.with_hand_off(), opts.die_after_tfs, metrics.clone())
        .with_pull(prep.pull);
    Ok((core.with_delivery(delivery), Some(sinks)))
}

/// How an EPN's run ended.
enum Ended {
    /// RunStop, and the build task reported every TF.
    Stopped,
    /// A sink cannot go on: the EPN leaves the run.
    SinkFailed(anyhow::Error),
    /// The control connection ended (with the error, if any).
    LostIcn(Option<crate::conn::ConnError>),
    /// The registry names another ICN as the leader (this one may be frozen).
    NotLeader(String),
}

/// Forwards the ICN's frames to the build task until the run ends; after a RunStop,
/// waits for the build task while its sinks make progress (`until_built`).
async fn follow_icn(
    rd: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    k: &mut KeptRun,
    me: u32,
    leader: &mut Option<tokio::sync::watch::Receiver<Option<String>>>,
    icn: SocketAddr,
) -> Ended {
    loop {
        let frame = tokio::select! {
            f = read_frame(rd, MAX_ICN_BODY) => f,
            other = crate::join::leader_moved(leader.as_mut(), icn) => return Ended::NotLeader(other),
            // The build task ends early only when a sink cannot go on.
            r = &mut k.build_task.0 => return Ended::SinkFailed(match r {
                Ok(Err(e)) => e,
                Ok(Ok(())) => anyhow::anyhow!("EPN {me}: the build task ended mid-run"),
                Err(e) => anyhow::anyhow!("EPN {me}: the build task failed: {e}"),
            }),
        };
        match frame {
            Ok(Some(m)) => {
                let stop = matches!(m, Message::RunStop { .. });
                let _ = k.b_tx.send(BuildEvent::Control(m)).await;
                if stop {
                    let stop_wait = (&*k.sink_progress, k.sink_stop_wait);
                    return match until_built(&mut k.build_task, stop_wait).await {
                        Ok(Ok(())) => Ended::Stopped,
                        Ok(Err(e)) => Ended::SinkFailed(e),
                        Err(stuck) => Ended::SinkFailed(stuck.context(format!("EPN {me}"))),
                    };
                }
            }
            Ok(None) => return Ended::LostIcn(None),
            Err(e) => return Ended::LostIcn(Some(e)),
        }
    }
}

/// Pre-run: waits for the run parameters (None: run control stopped the run before it
/// started).
async fn prerun(
    rd: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    me: u32,
    icn: SocketAddr,
    metrics: &Metrics,
) -> anyhow::Result<Option<fanin_proto::Prepare>> {
    loop {
        match read_frame(rd, MAX_ICN_BODY).await? {
            Some(Message::Prepare(p)) => return Ok(Some(p)),
            Some(Message::RunState { state, run_number }) => {
                metrics.set_run_state(state, run_number)
            }
            Some(Message::RunStop { .. }) => return Ok(None),
            Some(other) => {
                tracing::warn!("EPN {me}: ignoring {:?} before Prepare", other.msg_type())
            }
            None => anyhow::bail!("ICN {icn} closed the connection before the run"),
        }
    }
}

/// Binds the data port. Rejoining on a fixed port, the previous incarnation's listener
/// may take a moment to close: retry for a second.
async fn bind_data(addr: SocketAddr, rejoining: bool) -> anyhow::Result<TcpListener> {
    let mut tries = if rejoining { 20 } else { 1 };
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) if tries > 1 && e.kind() == std::io::ErrorKind::AddrInUse => {
                tries -= 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("EPN data bind {addr}"))),
        }
    }
}

/// The build task: data-connection events and control frames through the core, every
/// 20 ms a tick; reports to the ICN, buffers back to the pool.
struct BuildShell {
    core: EpnCore<Vec<u8>>,
    sinks: Option<Sinks>,
    /// The current control connection (replaced when an ICN takes the run over).
    ctl: tokio::sync::watch::Receiver<mpsc::Sender<Message>>,
    budget: Arc<ByteBudget>,
    pool: Arc<BufPool>,
    metrics: Arc<Metrics>,
    /// Set while the ICN is away (`KeptRun::icn_away`), and what the core was told.
    icn_away: Arc<AtomicBool>,
    told_away: bool,
}

impl BuildShell {
    /// Ends at run stop, or with an error when a sink cannot go on.
    async fn run(mut self, rx: mpsc::Receiver<BuildEvent>) -> anyhow::Result<()> {
        let r = self.build(rx).await;
        if let Some(sinks) = self.sinks.take() {
            // Closing the sinks waits for their files and commands.
            let _ = tokio::task::spawn_blocking(move || sinks.close()).await;
        }
        r
    }

    async fn build(&mut self, mut rx: mpsc::Receiver<BuildEvent>) -> anyhow::Result<()> {
        let mut clock = TaskClock::new();
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let input = tokio::select! {
                ev = rx.recv() => match ev {
                    Some(BuildEvent::Stf { tf, flp, target, payload }) => {
                        let bytes = payload.len() as u64;
                        Input::Stf { tf, flp, target, bytes, payload }
                    }
                    Some(BuildEvent::Lost { tf, flp, reason }) => Input::Lost { tf, flp, reason },
                    Some(BuildEvent::FlpGone { flp }) => Input::FlpGone { flp },
                    Some(BuildEvent::Control(m)) => Input::Control(m),
                    Some(BuildEvent::Delivered { tf, outcome, stfs }) => {
                        Input::Delivered { tf, outcome, stfs }
                    }
                    Some(BuildEvent::SinkFatal(msg)) => anyhow::bail!("EPN sink: {msg}"),
                    Some(BuildEvent::Held(tx)) => {
                        self.follow_icn(&mut clock);
                        let _ = tx.send(self.core.held());
                        continue;
                    }
                    None => return Ok(()),
                },
                _ = tick.tick() => {
                    publish(self.core.builder(), &self.budget, &self.metrics);
                    let free_bytes = self.budget.limit().saturating_sub(self.budget.used());
                    Input::Tick { free_bytes }
                }
            };
            self.follow_icn(&mut clock);
            self.core.handle(clock.now_us(), input);
            if self.carry_out().await? {
                publish(self.core.builder(), &self.budget, &self.metrics);
                return Ok(());
            }
        }
    }

    /// The ICN went away (the build clock stops, the core holds back what it builds) or
    /// an ICN took the run over (the clock goes on; the core goes on at its RunStart).
    fn follow_icn(&mut self, clock: &mut TaskClock) {
        let away = self.icn_away.load(Ordering::Acquire);
        if away == self.told_away {
            return;
        }
        self.told_away = away;
        clock.stop(away);
        if away {
            self.core.handle(clock.now_us(), Input::IcnLost);
        }
    }

    /// Carries out the core's actions; true when the run stopped, an error when the
    /// sinks are gone (their TFs would never get a verdict).
    async fn carry_out(&mut self) -> anyhow::Result<bool> {
        while let Some(action) = self.core.poll_action() {
            match action {
                // A transfer's end matters to this ICN only: without one, it is moot.
                Action::Control(Message::StfReceived { .. }) if self.ctl.borrow().is_closed() => {}
                Action::Control(m) => {
                    let ctl = self.ctl.borrow().clone();
                    if ctl.send(m).await.is_err() {
                        tracing::warn!("EPN: control connection gone; report not sent");
                    }
                }
                Action::ControlLossy(m) => {
                    let ctl = self.ctl.borrow().clone();
                    let _ = ctl.try_send(m); // a full control queue skips one report
                }
                Action::Free(buf) => {
                    self.budget.release(buf.len() as u64);
                    self.pool.put(buf);
                }
                Action::Deliver(built) => {
                    let sinks = self
                        .sinks
                        .as_ref()
                        .expect("TFs are handed on only to sinks");
                    anyhow::ensure!(sinks.send(built), "EPN sinks: the sink thread is gone");
                }
                Action::Die { complete } => {
                    tracing::warn!("EPN: goat: dying after {complete} complete TFs");
                    // SAFETY: kill and getpid have no memory-safety preconditions.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
                Action::Stopped => return Ok(true),
            }
        }
        Ok(false)
    }
}

/// The build task's clock on this process's time (`clock::BuildClock`).
struct TaskClock {
    t0: Instant,
    clock: clock::BuildClock,
}

impl TaskClock {
    fn new() -> TaskClock {
        TaskClock {
            t0: Instant::now(),
            clock: clock::BuildClock::default(),
        }
    }

    fn ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    fn stop(&mut self, away: bool) {
        self.clock.stop(away, self.ns());
    }

    fn now_us(&self) -> u64 {
        self.clock.now_us(self.ns())
    }
}

fn publish(b: &Builder<Vec<u8>>, budget: &ByteBudget, metrics: &Metrics) {
    metrics.set_level("tfs_building", b.building() as u64);
    metrics.set_buffer("epn_build", budget.used(), budget.limit());
    for (name, v) in b.counters.named() {
        metrics.set_event_total(name, v);
    }
    metrics.set_event_total("build_buffer_peak_bytes", budget.peak());
}
