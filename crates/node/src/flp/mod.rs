//! The FLP: registers with the ICN, connects to every EPN it is told about, and for each
//! assignment sends its STF of that TF to the chosen EPN through a bounded send buffer.

pub mod core;
pub mod payload;
pub mod sender;
pub mod source;
mod watch;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use fanin_proto::{EpnEntry, Message, Prepare, Role, Schedule, MAX_ICN_BODY};
use fanin_sched::{EpnId, TfId};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::config::check_prepare;
use crate::conn::{read_frame, ConnError};
use crate::join::{
    incarnations, join_run, leave, lost_icn, node_setup, AbortOnDrop, JoinSpec, Joined, NodeError,
};
use crate::metrics::Metrics;
use crate::registry::{runtime::RegistryOpts, ZkRegistry};
use core::{Action, FlpCore, Input, StfJob, ANNOUNCE_BATCH, QUEUE_PER_EPN};
use sender::{Outgoing, SendCtx};
use source::{Event, Payload, Source, SourceError, SourceSpec};
use watch::{connect_watching, Heard};

pub struct FlpOptions {
    /// The ICN's control address; with a registry, the elected ICN is used instead.
    pub icn: Option<SocketAddr>,
    /// Find the ICN through this registry and register there (ZooKeeper).
    pub registry: Option<RegistryOpts>,
    pub id: Option<u32>,
    /// Local address of the control connection (the auxiliary network).
    pub control_bind: Option<IpAddr>,
    /// Local address of the data connections to EPNs (the data network).
    pub data_bind: Option<IpAddr>,
    /// Send buffer limit in bytes.
    pub send_buffer: u64,
    pub metrics_bind: Option<SocketAddr>,
    pub connect_timeout: Duration,
    /// The run secret this node proves (empty: none).
    pub secret: crate::auth::Secret,
    /// Long-lived (run control): join run after run until the session's EXIT.
    pub session: bool,
    /// Started again into a run that is going (`--rejoin`): none going, it ends at once.
    pub rejoin: bool,
    /// Where the STFs come from (on-data runs; timer runs use synthetic payloads).
    pub source: SourceSpec,
}

impl FlpOptions {
    fn join_spec<'a>(&'a self, registry: Option<&'a ZkRegistry>, run: Option<u64>) -> JoinSpec<'a> {
        JoinSpec {
            run,
            role: Role::Flp,
            icn: self.icn,
            registry,
            control_bind: self.control_bind,
            connect_timeout: self.connect_timeout,
            secret: &self.secret,
            session: self.session,
        }
    }
}

/// Control frames as they arrive, read by a task of their own, so the run loop can also
/// wait for sends, connections and heartbeats (reading a frame is not cancel-safe).
fn read_control(
    mut rd: tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> (
    AbortOnDrop<()>,
    mpsc::Receiver<Result<Option<Message>, ConnError>>,
) {
    let (frames_tx, frames) = mpsc::channel(1024);
    let reader = AbortOnDrop(tokio::spawn(async move {
        loop {
            let f = read_frame(&mut rd, MAX_ICN_BODY).await;
            let end = !matches!(f, Ok(Some(_)));
            if frames_tx.send(f).await.is_err() || end {
                return;
            }
        }
    }));
    (reader, frames)
}

/// The most one turn of the loop takes from the source, in bytes: a source that reads
/// or checks its payloads (a replay, the CRC) never holds up the senders, which share
/// the loop's thread, for long.
const TAKE_BYTES: u64 = 8 << 20;

/// Runs the FLP; if it loses the ICN mid-run (its lease expired, the ICN restarted),
/// it joins again under the same id.
pub async fn run(opts: FlpOptions) -> anyhow::Result<()> {
    let binds = [
        ("--control-bind", opts.control_bind),
        ("--data-bind", opts.data_bind),
    ];
    let (metrics, reg) = node_setup(
        Role::Flp,
        (opts.id, &binds),
        opts.metrics_bind,
        opts.registry.as_ref(),
    )
    .await?;
    let id = std::cell::Cell::new(opts.id);
    let kept = std::cell::RefCell::new(None);
    let own = crate::join::OwnRun::at_start(reg.as_ref(), opts.session).await;
    if own.over_before_start(Role::Flp, opts.id, opts.rejoin) {
        return Ok(());
    }
    let (o, m, r, idr, k, own) = (&opts, &metrics, reg.as_ref(), &id, &kept, &own);
    let res = incarnations(
        &metrics,
        opts.connect_timeout,
        opts.session,
        move |_rejoining| run_once(o, m, idr, r, k, own),
    )
    .await;
    // Given up with a run kept: what the ICN released goes back (the rest stays for
    // whichever FLP attaches next, as after a crash).
    abandon_kept(&kept, false).await;
    res
}

/// What an FLP keeps when it loses its ICN mid-run: its run (STFs, data connections,
/// source) goes on with an ICN that takes the run over (with a registry); else it ends
/// once the next ICN answers, which tells whether the run is over.
struct KeptRun {
    run_id: u64,
    shell: Shell,
    done: mpsc::Receiver<(StfJob, bool)>,
}

/// Gives the kept run up, if any (`over`: its run ended, so what it scheduled goes too).
async fn abandon_kept(kept: &std::cell::RefCell<Option<KeptRun>>, over: bool) {
    let k = kept.borrow_mut().take();
    if let Some(k) = k {
        k.shell.abandon(over).await;
    }
}

async fn run_once(
    opts: &FlpOptions,
    metrics: &Arc<Metrics>,
    id: &std::cell::Cell<Option<u32>>,
    reg: Option<&ZkRegistry>,
    kept: &std::cell::RefCell<Option<KeptRun>>,
    own: &crate::join::OwnRun,
) -> Result<(), NodeError> {
    let run = kept.borrow().as_ref().map(|k| k.run_id).or(own.get());
    let joined = match crate::join::ended_meanwhile(reg, run, Role::Flp, id.get()).await {
        true => None,
        false => join_run(&opts.join_spec(reg, run), id, |_| Ok(String::new())).await?,
    };
    // Its run is over: nothing to join.
    let Some((icn, mut joined)) = joined else {
        abandon_kept(kept, true).await;
        return Ok(());
    };
    own.joined(joined.run_id);
    metrics.joined_run(joined.run_id);
    // The run it kept goes on only with an ICN that took that run over.
    let taken = kept.borrow_mut().take();
    let (taken, ended) = crate::join::goes_on(taken, |k| k.run_id, &joined);
    if let Some((k, over)) = ended {
        k.shell.abandon(over).await;
    }
    let leader = crate::join::follow_leader(reg).await;
    let started = match taken {
        Some(mut k) => match resume(&mut k, &mut joined, icn, metrics).await {
            Ok(true) => Some((k.shell, k.done)),
            Ok(false) => {
                k.shell.abandon(true).await; // stopped during the take-over
                None
            }
            Err(e) => {
                // The run stays kept for the next ICN (this one may have died meanwhile).
                *kept.borrow_mut() = Some(k);
                return Err(e);
            }
        },
        None => start(opts, &mut joined, icn, metrics).await?,
    };
    let Some((mut shell, mut done)) = started else {
        return Ok(joined.leave(Role::Flp, metrics).await?);
    };
    let run_id = shell.ctx.run_id;
    let result = shell.run(joined, &mut done, icn, leader, metrics).await;
    if matches!(result, Err(NodeError::LostIcn(_))) {
        *kept.borrow_mut() = Some(KeptRun {
            run_id,
            shell,
            done,
        });
    } else if result.is_err() {
        shell.abandon(false).await; // whichever run comes next hears the rest again
    }
    result
}

/// Resumes a kept run with the ICN that took it over: tells what it holds, takes the
/// run parameters and EPN list, connects to the EPNs it does not reach, and is ready.
async fn resume(
    k: &mut KeptRun,
    joined: &mut Joined,
    icn: SocketAddr,
    metrics: &Arc<Metrics>,
) -> Result<bool, NodeError> {
    let me = joined.me;
    let lost = |e: &dyn std::fmt::Display| crate::join::lost_in_takeover(Role::Flp, me, icn, e);
    // The source waits for the new ICN's RunStart (it would drop announcements before).
    k.shell.source_live = false;
    let held = k.shell.core.held();
    tracing::info!(
        "FLP {me}: ICN {icn} took run {} over; it holds {} STFs",
        k.run_id,
        held.len()
    );
    for chunk in held.chunks(fanin_proto::HELD_BATCH) {
        let msg = Message::StfsHeld(chunk.to_vec());
        joined.ctl.send(msg).await.map_err(|e| lost(&e))?;
    }
    let prep = prerun(joined, me, icn, metrics).await;
    let Some((_, list)) = prep.map_err(|e| lost(&format!("{e:#}")))? else {
        return Ok(false);
    };
    // EPNs it does not reach, or that came back elsewhere (restarted meanwhile).
    let shell = &k.shell;
    let unreached: Vec<EpnEntry> = list
        .iter()
        .filter(|e| !shell.core.reaches(e.epn_id) || shell.addrs.get(&e.epn_id) != Some(&e.addr))
        .cloned()
        .collect();
    for e in &unreached {
        let stream = match connect_watching(&mut joined.rd, metrics, k.shell.connect(e)).await {
            Heard::Connected(r) => r.map_err(|err| lost(&format!("{err:#}")))?,
            Heard::RunStop => {
                tracing::info!("FLP {me}: run stopped while connecting to EPN {}", e.epn_id);
                return Ok(false);
            }
            Heard::Closed => return Err(lost(&"the ICN closed the connection")),
            Heard::Failed(err) => return Err(lost_icn(Role::Flp, me, icn, Some(err), metrics)),
        };
        k.shell.start_sender(e.epn_id, stream);
        k.shell.addrs.insert(e.epn_id, e.addr.clone());
        k.shell.core.connected_anew(e.epn_id);
    }
    let ready = Message::Ready {
        role: Role::Flp,
        node_id: me,
        connected: list.len() as u32,
    };
    joined.ctl.send(ready).await.map_err(|e| lost(&e))?;
    Ok(true)
}

/// A new run: the parameters and EPN list, the source, a data connection to every EPN
/// (each confirmed by a handshake), and Ready. None: run control ended it first.
async fn start(
    opts: &FlpOptions,
    joined: &mut Joined,
    icn: SocketAddr,
    metrics: &Arc<Metrics>,
) -> Result<Option<(Shell, mpsc::Receiver<(StfJob, bool)>)>, NodeError> {
    let me = joined.me;
    let Some((prep, list)) = prerun(joined, me, icn, metrics).await? else {
        // Run control ended this run before it started: the next one, or exit.
        return Ok(None);
    };
    let size = check_prepare(&prep, ("--send-buffer", opts.send_buffer))
        .with_context(|| format!("FLP {me}: run parameters from ICN {icn}"))?;
    let ctx = Arc::new(SendCtx {
        me,
        run_id: prep.run_id,
        crc: prep.crc,
        pattern: payload::Pattern::new(prep.seed, me),
        metrics: metrics.clone(),
        secret: opts.secret.clone(),
    });
    let on_data = prep.schedule == Schedule::OnData;
    // A timer run makes synthetic payloads itself (`open` refuses other sources for it).
    let source = Source::open(&opts.source, me, &prep, size).map_err(NodeError::Fatal)?;
    let earlier = source.freed_at_open();
    if earlier > 0 {
        tracing::warn!("FLP {me}: {earlier} STFs in its source were scheduled by an earlier run that is over: freed (run_over), not announced into run {}", prep.run_id);
        metrics.stf("freed", "run_over", earlier);
    }
    let source = on_data.then_some(source);
    let epns: Vec<EpnId> = list.iter().map(|e| e.epn_id).collect();
    let core = FlpCore::new(
        me,
        (size, prep.seed, prep.retain, on_data),
        opts.send_buffer,
        &epns,
        metrics.clone(),
    )
    .with_pull(prep.pull);
    let (mut shell, done_rx) = Shell::new(core, ctx, source, opts.data_bind);
    // Connect to every EPN and confirm each connection with a handshake.
    for e in &list {
        let stream = match connect_watching(&mut joined.rd, metrics, shell.connect(e)).await {
            Heard::Connected(r) => r.map_err(|err| not_connected(me, err))?,
            Heard::RunStop => {
                tracing::info!("FLP {me}: run stopped while connecting to EPN {}", e.epn_id);
                return Ok(None);
            }
            Heard::Closed => {
                let e = format!("FLP {me}: ICN {icn} closed the connection before the run");
                return Err(NodeError::LostIcn(e));
            }
            Heard::Failed(err) => return Err(lost_icn(Role::Flp, me, icn, Some(err), metrics)),
        };
        shell.start_sender(e.epn_id, stream);
        shell.addrs.insert(e.epn_id, e.addr.clone());
    }
    tracing::info!("FLP {me}: connected to {} EPNs", shell.senders.len());
    let connected = shell.senders.len() as u32;
    let ready = Message::Ready {
        role: Role::Flp,
        node_id: me,
        connected,
    };
    joined.ctl.send(ready).await?;
    Ok(Some((shell, done_rx)))
}

/// An EPN this FLP could not reach before the run: join again, or give up if trying
/// again cannot help.
fn not_connected(me: u32, err: anyhow::Error) -> NodeError {
    match err.downcast_ref::<sender::EpnRefused>() {
        // An EPN still leaving the run before: it joins this one soon.
        Some(r) if r.code == fanin_proto::RejectCode::WrongRun => {
            NodeError::LostIcn(format!("FLP {me}: {err:#}"))
        }
        // A wrong secret, an unknown id: trying again cannot help.
        Some(r) if !r.code.transient() => NodeError::Fatal(err),
        // The EPN may be frozen or dying (the ICN will see it soon), or still holding
        // our old connection: leave, and join again.
        _ => NodeError::LostIcn(format!("FLP {me}: {err:#}")),
    }
}

/// Pre-run: the run parameters and the EPN list, in either order (None: run control
/// stopped the run before it started).
async fn prerun(
    joined: &mut Joined,
    me: u32,
    icn: SocketAddr,
    metrics: &Metrics,
) -> anyhow::Result<Option<(Prepare, Vec<EpnEntry>)>> {
    let mut prep: Option<Prepare> = None;
    let mut list: Option<Vec<EpnEntry>> = None;
    loop {
        if let (Some(p), Some(l)) = (&prep, &list) {
            return Ok(Some((p.clone(), l.clone())));
        }
        match read_frame(&mut joined.rd, MAX_ICN_BODY).await? {
            Some(Message::Prepare(p)) => prep = Some(p),
            Some(Message::EpnList(l)) => list = Some(l),
            Some(Message::RunState { state, run_number }) => {
                metrics.set_run_state(state, run_number)
            }
            Some(Message::RunStop { .. }) => return Ok(None),
            Some(other) => {
                tracing::warn!("FLP {me}: ignoring {:?} before the run", other.msg_type())
            }
            None => bail!("ICN {icn} closed the connection before the run"),
        }
    }
}

/// FLP heartbeat (a LoadReport) period.
const HEARTBEAT: Duration = Duration::from_millis(100);

/// How long an FLP waits at run end for its send queues to drain.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// The FLP's tokio shell: control frames, sender tasks and data connections in and out
/// of the core.
struct Shell {
    core: FlpCore,
    ctx: Arc<SendCtx>,
    senders: HashMap<EpnId, mpsc::Sender<Outgoing>>,
    /// Each EPN's data address when this FLP connected (one restarted elsewhere differs).
    addrs: HashMap<EpnId, String>,
    tasks: Vec<AbortOnDrop<()>>,
    /// Sender tasks hand finished jobs back here.
    done_tx: mpsc::Sender<(StfJob, bool)>,
    data_bind: Option<IpAddr>,
    /// On-data: the source, taking STFs from RunStart until it ends ...
    source: Option<Source>,
    source_live: bool,
    /// The source was started (a run taken over does not start it again) ...
    source_started: bool,
    /// ... and how it ended, if it did (told again to an ICN that takes over).
    source_end: Option<(bool, String)>,
    /// ... unless the send buffer has no room for its next STF (until room is freed).
    held: bool,
    /// The payloads of the STFs the core holds, with their CRCs.
    store: HashMap<TfId, (Payload, Option<u32>)>,
    delay: ScheduleDelay,
}

/// On-data: from an STF's announcement to its TF's Assign arriving here (the ICN's
/// scheduling and one control round trip), reported in the run-end counters.
#[derive(Default)]
struct ScheduleDelay {
    announced: HashMap<TfId, std::time::Instant>,
    us: Option<hdrhistogram::Histogram<u64>>,
}

impl ScheduleDelay {
    fn announced(&mut self, tf: TfId) {
        self.announced.insert(tf, std::time::Instant::now());
    }

    fn assigned(&mut self, tf: TfId) {
        if let Some(t) = self.announced.remove(&tf) {
            let h = self.us.get_or_insert_with(|| {
                hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds")
            });
            let _ = h.record((t.elapsed().as_micros() as u64).clamp(1, 60_000_000));
        }
    }

    fn report(&self, metrics: &Metrics) {
        if let Some(h) = &self.us {
            metrics.set_event_total("schedule_delay_p50_us", h.value_at_quantile(0.5));
            metrics.set_event_total("schedule_delay_p99_us", h.value_at_quantile(0.99));
            metrics.set_event_total("schedule_delay_count", h.len());
        }
    }
}

type Connected = (EpnId, anyhow::Result<TcpStream>);

impl Shell {
    /// The shell of a run, and where its sender tasks hand finished jobs back.
    fn new(
        core: FlpCore,
        ctx: Arc<SendCtx>,
        source: Option<Source>,
        data_bind: Option<IpAddr>,
    ) -> (Shell, mpsc::Receiver<(StfJob, bool)>) {
        let (done_tx, done_rx) = mpsc::channel(QUEUE_PER_EPN);
        let shell = Shell {
            core,
            ctx,
            senders: HashMap::new(),
            addrs: HashMap::new(),
            tasks: Vec::new(),
            done_tx,
            data_bind,
            source,
            source_live: false,
            source_started: false,
            source_end: None,
            held: false,
            store: HashMap::new(),
            delay: ScheduleDelay::default(),
        };
        (shell, done_rx)
    }

    async fn connect(&self, e: &EpnEntry) -> anyhow::Result<TcpStream> {
        let addr: SocketAddr = e
            .addr
            .parse()
            .with_context(|| format!("EPN {} data address {:?}", e.epn_id, e.addr))?;
        sender::connect_epn(&self.ctx, e.epn_id, addr, self.data_bind).await
    }

    /// A sender task for a new connection (it replaces an earlier one to the same EPN).
    fn start_sender(&mut self, epn: EpnId, stream: TcpStream) {
        let (tx, rx) = mpsc::channel(QUEUE_PER_EPN);
        let task = sender::send_loop(self.ctx.clone(), epn, stream, rx, self.done_tx.clone());
        self.tasks.push(AbortOnDrop(tokio::spawn(task)));
        self.senders.insert(epn, tx);
    }

    async fn run(
        &mut self,
        joined: Joined,
        done: &mut mpsc::Receiver<(StfJob, bool)>,
        icn: SocketAddr,
        mut leader: Option<tokio::sync::watch::Receiver<Option<String>>>,
        metrics: &Arc<Metrics>,
    ) -> Result<(), NodeError> {
        let me = self.ctx.me;
        let Joined {
            rd, ctl, writer, ..
        } = joined;
        let (reader, mut frames) = read_control(rd);
        // EPNs that joined mid-run: data connections being set up.
        let (conn_tx, mut conns) = mpsc::channel::<Connected>(64);
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let room = self.core.room();
            let taking = self.source_live && !self.held;
            // Ended sends first: an STF whose TF the ICN released is then freed before
            // the next Assign is judged against the buffer (the ICN's window counts on it).
            let input = if let Ok((job, ok)) = done.try_recv() {
                Input::Sent { job, ok }
            } else {
                tokio::select! {
                    f = frames.recv() => match f.unwrap_or(Ok(None)) {
                        Ok(Some(m)) => Input::Control(m),
                        Ok(None) => return Err(lost_icn(Role::Flp, me, icn, None, metrics)),
                        Err(e) => return Err(lost_icn(Role::Flp, me, icn, Some(e), metrics)),
                    },
                    Some((job, ok)) = done.recv() => Input::Sent { job, ok },
                    Some((epn, res)) = conns.recv() => self.connected(epn, res),
                    _ = heartbeat.tick() => Input::Heartbeat,
                    other = crate::join::leader_moved(leader.as_mut(), icn) => {
                        return Err(crate::join::not_leading(Role::Flp, me, icn, &other));
                    }
                    ev = next_stf(self.source.as_mut(), room), if taking => self.take_stfs(ev),
                }
            };
            if !matches!(input, Input::Flush | Input::Heartbeat) {
                self.held = false; // room may have been freed: ask the source again
            }
            if let Input::Control(Message::Assign { tf_id, .. }) = &input {
                self.delay.assigned(*tf_id);
            }
            if let Input::Control(Message::RunStart { run_id, elapsed_us }) = &input {
                tracing::info!("FLP {me}: run {run_id} started ({elapsed_us} µs ago)");
                if let Some(ended) = self.run_started(*elapsed_us) {
                    self.feed(ended, &ctl, &conn_tx).await;
                }
            }
            if self.feed(input, &ctl, &conn_tx).await {
                tracing::info!("FLP {me}: run stopping; flushing send queues");
                self.flush(done, &ctl, &conn_tx).await;
                self.delay.report(metrics);
                drop(reader);
                return Ok(leave(ctl, writer, me, Role::Flp, metrics).await?);
            }
        }
    }

    /// The core is done with `tf`: its payload goes, and the source gets its slot back.
    fn free(&mut self, tf: TfId) {
        self.store.remove(&tf);
        self.delay.announced.remove(&tf);
        if let Some(s) = self.source.as_mut() {
            s.free(tf);
        }
    }

    /// Its run goes on no more here (`Input::RunLost`).
    async fn abandon(mut self, over: bool) {
        self.give_back(over).await;
    }

    /// The senders are stopped and waited for (none reads a payload after), then the
    /// core says which STFs are freed (`Input::RunLost`).
    async fn give_back(&mut self, over: bool) {
        self.senders.clear();
        for mut t in std::mem::take(&mut self.tasks) {
            t.0.abort();
            let _ = (&mut t.0).await;
        }
        self.core.handle(Input::RunLost { over });
        while let Some(action) = self.core.poll_action() {
            match action {
                Action::Free(tf) => self.free(tf),
                other => debug_assert!(false, "a lost run asked for {other:?}"),
            }
        }
    }

    /// RunStart: the source starts where the run is. In a run taken over it runs (or
    /// ended) already: it goes on, and an ended one is told to the new ICN again.
    fn run_started(&mut self, elapsed_us: u64) -> Option<Input> {
        if let Some(s) = self.source.as_mut() {
            if !self.source_started {
                s.start(Duration::from_micros(elapsed_us));
                self.source_started = true;
            }
            self.source_live = self.source_end.is_none();
        }
        let (ok, detail) = self.source_end.clone()?;
        Some(Input::SourceEnded { ok, detail })
    }

    /// Feeds one input and carries out the actions; true when the run stopped. Jobs a
    /// sender cannot take come back at once as failed sends.
    async fn feed(
        &mut self,
        input: Input,
        ctl: &mpsc::Sender<Message>,
        conn_tx: &mpsc::Sender<Connected>,
    ) -> bool {
        let mut next = Some(input);
        let mut failed = Vec::new(); // allocates only when a sender is gone
        let mut stopped = false;
        while let Some(input) = next.take().or_else(|| failed.pop()) {
            self.core.handle(input);
            while let Some(action) = self.core.poll_action() {
                match action {
                    Action::Control(m) => {
                        let _ = ctl.send(m).await; // a closed control connection shows as a lost ICN
                    }
                    Action::ControlLossy(m) => {
                        let _ = ctl.try_send(m); // a full control queue skips one
                    }
                    Action::Queue(job) => {
                        if !self.queue(job) {
                            failed.push(Input::Sent { job, ok: false });
                        }
                    }
                    Action::Connect(e) => {
                        self.addrs.insert(e.epn_id, e.addr.clone());
                        self.connect_later(e, conn_tx)
                    }
                    Action::Stop => stopped = true,
                    Action::Free(tf) => self.free(tf),
                    Action::Scheduled(tf) => {
                        if let Some(s) = self.source.as_mut() {
                            s.scheduled(tf);
                        }
                    }
                }
            }
        }
        stopped
    }

    /// An STF job to its sender; false when its sender is gone. (The core counts the
    /// jobs, so a sender's queue is never full.)
    fn queue(&mut self, job: StfJob) -> bool {
        let (payload, crc) = match self.store.get(&job.tf) {
            Some((p, crc)) => (p.clone(), *crc),
            None if self.source.is_none() => (Payload::Synthetic, None),
            None => {
                // Never the pattern in place of a user's bytes: a failed send.
                tracing::error!("FLP {}: no payload for TF {}", self.ctx.me, job.tf);
                self.ctx.metrics.error("payload_missing");
                return false;
            }
        };
        let out = Outgoing { job, payload, crc };
        let sent = self.senders.get(&job.epn).map(|tx| tx.try_send(out));
        matches!(sent, Some(Ok(())))
    }

    /// Takes an STF from the source, and every other one ready at once (up to a
    /// frame's worth, and `TAKE_BYTES`), into the core; then what to feed: the
    /// announcement, or the source's end (after the announcement).
    fn take_stfs(&mut self, first: Result<Event, SourceError>) -> Input {
        let mut ev = Some(first);
        let mut taken = 0;
        for _ in 0..ANNOUNCE_BATCH {
            let Some(e) = ev.take() else { break };
            if let Ok(Event::Stf(p)) = &e {
                taken += p.info.size;
            }
            if let Some(end) = self.source_event(e) {
                return end;
            }
            if self.held || taken >= TAKE_BYTES {
                break;
            }
            let room = self.core.room();
            ev = poll_now(next_stf(self.source.as_mut(), room));
        }
        Input::Flush
    }

    fn fail_source(&self, line: String) -> (bool, String) {
        tracing::error!("{line}");
        self.ctx.metrics.error("source_failed");
        (false, line)
    }

    /// One source event: None when it was an STF (taken) or a hold, else its end.
    fn source_event(&mut self, ev: Result<Event, SourceError>) -> Option<Input> {
        let me = self.ctx.me;
        let (ok, detail) = match ev {
            // The EPNs refuse a frame over the run's stf_size: never send one.
            Ok(Event::Stf(p)) if p.info.size > self.core.stf_max() => {
                let (tf, size, max) = (p.info.tf_id, p.info.size, self.core.stf_max());
                self.fail_source(format!(
                    "FLP {me}: source: the STF of TF {tf} is {size} bytes, over the run's stf_size ({max} bytes at most)"
                ))
            }
            Ok(Event::Stf(p)) => {
                let fits = self.core.has_room(p.info.size);
                assert!(
                    fits,
                    "a source yielded an STF larger than the room it was given"
                );
                let crc = p
                    .payload
                    .slice()
                    .filter(|_| self.ctx.crc)
                    .map(crc32c::crc32c);
                self.store.insert(p.info.tf_id, (p.payload, crc));
                self.delay.announced(p.info.tf_id);
                self.core.handle(Input::Produced(p.info));
                return None;
            }
            Ok(Event::Held(size)) if size > self.core.stf_max() => {
                let max = self.core.stf_max();
                self.fail_source(format!(
                    "FLP {me}: source: the next STF is {size} bytes, over the run's stf_size ({max} bytes at most)"
                ))
            }
            Ok(Event::Held(size)) if size > self.core.limit() => {
                let limit = self.core.limit();
                let line = format!(
                    "FLP {me}: source: an STF of {size} bytes is over --send-buffer {limit}: it can never be sent"
                );
                self.fail_source(line)
            }
            Ok(Event::Held(size)) => {
                self.held = !self.core.has_room(size);
                return None;
            }
            Ok(Event::Ended(why)) => (true, why),
            Err(SourceError(line)) => self.fail_source(line),
        };
        tracing::info!("FLP {me}: source ended: {detail}");
        self.source_live = false;
        self.source_end = Some((ok, detail.clone()));
        Some(Input::SourceEnded { ok, detail })
    }

    fn connected(&mut self, epn: EpnId, res: anyhow::Result<TcpStream>) -> Input {
        let me = self.ctx.me;
        match res {
            Ok(stream) => {
                self.start_sender(epn, stream);
                tracing::info!("FLP {me}: connected to EPN {epn}, which joined mid-run");
                Input::Connected { epn, ok: true }
            }
            Err(e) => {
                tracing::warn!("FLP {me}: EPN {epn} joined mid-run but is unreachable: {e:#}");
                Input::Connected { epn, ok: false }
            }
        }
    }

    /// Connects to an EPN in the background; the result comes back through `conn_tx`.
    fn connect_later(&self, e: EpnEntry, conn_tx: &mpsc::Sender<Connected>) {
        let (ctx, conn_tx, bind) = (self.ctx.clone(), conn_tx.clone(), self.data_bind);
        tokio::spawn(async move {
            let res = match e.addr.parse::<SocketAddr>() {
                Ok(addr) => sender::connect_epn(&ctx, e.epn_id, addr, bind).await,
                Err(_) => Err(anyhow::anyhow!(
                    "EPN {} data address {:?} is not HOST:PORT",
                    e.epn_id,
                    e.addr
                )),
            };
            let _ = conn_tx.send((e.epn_id, res)).await;
        });
    }

    /// Senders end when their queue is empty; a stalled one fails within STALL_TIMEOUT
    /// per STF, so the wait is bounded. Finished jobs are taken in meanwhile (senders
    /// wait for room to hand them back), and what the core says of them goes out.
    async fn flush(
        &mut self,
        done: &mut mpsc::Receiver<(StfJob, bool)>,
        ctl: &mpsc::Sender<Message>,
        conn_tx: &mpsc::Sender<Connected>,
    ) {
        self.senders.clear();
        let mut tasks = std::mem::take(&mut self.tasks);
        let deadline = tokio::time::sleep(FLUSH_TIMEOUT);
        tokio::pin!(deadline);
        let ended = {
            let wait = async {
                for t in tasks.iter_mut() {
                    let _ = (&mut t.0).await;
                }
            };
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    _ = &mut wait => break true,
                    Some((job, ok)) = done.recv() => {
                        self.feed(Input::Sent { job, ok }, ctl, conn_tx).await;
                    }
                    _ = &mut deadline => break false,
                }
            }
        };
        if ended {
            // Every sender handed its last jobs back before it ended: they are queued,
            // and each may free a slot (a TF released while it was sent).
            while let Ok((job, ok)) = done.try_recv() {
                self.feed(Input::Sent { job, ok }, ctl, conn_tx).await;
            }
            return;
        }
        tracing::warn!(
            "FLP {}: send queues not flushed within {FLUSH_TIMEOUT:?}",
            self.ctx.me
        );
        self.ctx.metrics.error("flush_timeout");
        // What the ICN released goes back once the stalled sends are stopped.
        self.tasks = tasks;
        self.give_back(false).await;
    }
}

/// The source's next STF (never resolves without a source).
async fn next_stf(source: Option<&mut Source>, room: u64) -> Result<Event, SourceError> {
    match source {
        Some(s) => s.next(room).await,
        None => std::future::pending().await,
    }
}

/// Polls a future once: its output if it is ready now (a source's futures are
/// cancel-safe, so dropping a pending one loses nothing).
fn poll_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FLP 0's sending context in run 1.
    fn send_ctx(metrics: &Arc<Metrics>) -> Arc<SendCtx> {
        Arc::new(SendCtx {
            me: 0,
            run_id: 1,
            crc: false,
            pattern: super::payload::Pattern::new(1, 0),
            metrics: metrics.clone(),
            secret: crate::auth::Secret::new(b"test"),
        })
    }

    /// A shell with no source, connected to EPN 0 only in name, sending 1 KiB STFs.
    fn shell() -> (Shell, mpsc::Receiver<(StfJob, bool)>) {
        let metrics = Metrics::new("flp", Some(0));
        let size = fanin_sched::StfSize::Fixed(1024);
        let core = FlpCore::new(0, (size, 1, false, false), 64 << 10, &[0], metrics.clone());
        Shell::new(core, send_ctx(&metrics), None, None)
    }

    /// A sender that hands its last job back and ends at once: the flush must take that
    /// job, whichever it sees first, the job or the sender's end (20 tries).
    #[tokio::test]
    async fn a_flush_takes_the_jobs_a_sender_handed_back_before_it_ended() {
        for _ in 0..20 {
            let (mut sh, mut done) = shell();
            let (ctl, _ctl_rx) = mpsc::channel(64);
            let (conn_tx, _conns) = mpsc::channel(64);
            sh.core.handle(Input::Control(Message::Assign {
                tf_id: 7,
                epn_id: 0,
            }));
            let job = std::iter::from_fn(|| sh.core.poll_action())
                .find_map(|a| match a {
                    Action::Queue(job) => Some(job),
                    _ => None,
                })
                .expect("the STF queued for EPN 0");
            assert_eq!(sh.core.buffered(), 1024);
            let done_tx = sh.done_tx.clone();
            let sender = tokio::spawn(async move {
                let _ = done_tx.send((job, true)).await;
            });
            tokio::task::yield_now().await;
            sh.tasks.push(AbortOnDrop(sender));
            sh.flush(&mut done, &ctl, &conn_tx).await;
            assert_eq!(sh.core.buffered(), 0, "the sent STF is freed");
        }
    }

    /// An on-data shell reading the ring `name` (STFs of up to 4 KiB), sending to EPN 0.
    /// Run `run_id`'s Prepare: on-data, 4 KiB STFs, re-sending.
    fn ring_prep(run_id: u64) -> Prepare {
        Prepare {
            run_id,
            flps: 1,
            build_timeout_ms: 1000,
            crc: false,
            size: fanin_proto::SizeWire {
                kind: 1,
                a: 4096,
                b: 0,
                c: 0,
            },
            seed: 1,
            retain: true,
            schedule: Schedule::OnData,
            rate_mhz: 0,
            tfs: 100,
            pull: false,
        }
    }

    fn ring_shell(name: &str) -> (Shell, Arc<Metrics>) {
        let metrics = Metrics::new("flp", Some(0));
        let size = fanin_sched::StfSize::Fixed(4096);
        let spec = SourceSpec::Shm { name: name.into() };
        let source = Source::open(&spec, 0, &ring_prep(1), size).expect("the ring opens");
        let core = FlpCore::new(0, (size, 1, true, true), 64 << 10, &[0], metrics.clone());
        let ctx = send_ctx(&metrics);
        (Shell::new(core, ctx, Some(source), None).0, metrics)
    }

    /// A ring of 4 slots holding `tfs` (100 bytes each), and run 1's FLP shell on it,
    /// which took them all.
    async fn ring_taken(name: &str, tfs: &[u64]) -> (fanin_shm::Writer, Shell, Arc<Metrics>) {
        let mut w = fanin_shm::Writer::create(name, 4, 4096).unwrap();
        for &tf in tfs {
            assert!(w.write(tf, &[tf as u8; 100], false).unwrap());
        }
        let (mut sh, metrics) = ring_shell(name);
        sh.source.as_mut().unwrap().start(Duration::ZERO);
        for _ in tfs {
            let ev = next_stf(sh.source.as_mut(), sh.core.room()).await;
            assert!(sh.source_event(ev).is_none(), "an STF, taken");
        }
        (w, sh, metrics)
    }

    /// An FLP of run 1 takes TFs 7 to 9 from its ring and the run schedules 7 and 8;
    /// then the FLP dies before any Release. A successor in the same run hears all three
    /// again; one in the next run frees 7 and 8 (their TFs ended in run 1) and hears 9.
    #[tokio::test]
    async fn stfs_a_dead_flps_run_scheduled_go_back_to_that_run_only() {
        let name = format!("fanin-test-dead-flp-{}", std::process::id());
        let (w, mut sh, _) = ring_taken(&name, &[7, 8, 9]).await;
        let (ctl, _ctl_rx) = mpsc::channel(64);
        let (conn_tx, _conns) = mpsc::channel(64);
        sh.feed(Input::Flush, &ctl, &conn_tx).await;
        for tf_id in [7, 8] {
            let assign = Message::Assign { tf_id, epn_id: 0 };
            sh.feed(Input::Control(assign), &ctl, &conn_tx).await;
        }
        drop(sh); // killed: nothing released
        let spec = SourceSpec::Shm { name: name.clone() };
        let size = fanin_sched::StfSize::Fixed(4096);
        let freed = |run| {
            Source::open(&spec, 0, &ring_prep(run), size)
                .unwrap()
                .freed_at_open()
        };
        assert_eq!(freed(1), 0, "run 1 goes on: its STFs stay");
        assert_eq!(freed(2), 2, "run 2: run 1's TFs 7 and 8 are over");
        let mut again = fanin_shm::Reader::attach(&name).unwrap();
        let left: Vec<u64> = std::iter::from_fn(|| again.poll().unwrap())
            .map(|s| s.tf_id)
            .collect();
        assert_eq!(left, [9]);
        w.unlink().unwrap();
    }

    /// How the run of `left_in_the_ring` ends for its FLP.
    #[derive(Debug, Clone, Copy)]
    enum RunEnd {
        /// Its ICN is lost and the run is over (true) or joined afresh (false).
        Lost(bool),
        /// RunStop arrives; the sends never end, so the flush times out.
        Stopped,
    }

    /// TFs 7 to 10 in a ring; the shell took all four. TF 7 was released while its STF
    /// was being sent, TF 8 is queued for EPN 0, TF 9 only announced, TF 10 assigned to
    /// an EPN this FLP does not reach (dropped, not released). Then the run ends: which
    /// TFs does the ring still hold, and how many STFs were counted dropped, and why?
    async fn left_in_the_ring(end: RunEnd) -> (Vec<u64>, Vec<(String, u64)>) {
        let name = format!("fanin-test-run-end-{}-{end:?}", std::process::id());
        let (w, mut sh, metrics) = ring_taken(&name, &[7, 8, 9, 10]).await;
        sh.core.handle(Input::Flush);
        for (tf_id, epn_id) in [(7, 0), (8, 0), (10, 5)] {
            sh.core
                .handle(Input::Control(Message::Assign { tf_id, epn_id }));
        }
        sh.core
            .handle(Input::Control(Message::Release { tf_id: 7 }));
        let queued = std::iter::from_fn(|| sh.core.poll_action())
            .filter(|a| matches!(a, Action::Queue(_)))
            .count();
        assert_eq!(
            queued, 2,
            "TFs 7 and 8 went to their sender, which never hands back"
        );
        sh.tasks
            .push(AbortOnDrop(tokio::spawn(std::future::pending())));
        match end {
            RunEnd::Lost(over) => sh.abandon(over).await,
            RunEnd::Stopped => {
                sh.core
                    .handle(Input::Control(Message::RunStop { run_id: 1 }));
                while let Some(action) = sh.core.poll_action() {
                    match action {
                        Action::Free(tf) => sh.free(tf),
                        other => assert!(matches!(other, Action::Stop), "{other:?}"),
                    }
                }
                sh.give_back(false).await; // what a flush that timed out does
                drop(sh); // its reader lets go of the ring
            }
        }
        let mut again = fanin_shm::Reader::attach(&name).unwrap();
        let left = std::iter::from_fn(|| again.poll().unwrap()).map(|s| s.tf_id);
        let left = left.collect();
        w.unlink().unwrap();
        let dropped = ["dropped.icn_lost", "freed.run_stopped"]
            .map(|r| (r.to_string(), metrics.counter(&format!("stfs.{r}"))));
        (left, dropped.into_iter().filter(|(_, n)| *n > 0).collect())
    }

    fn counted(reason: &str, n: u64) -> Vec<(String, u64)> {
        vec![(reason.to_string(), n)]
    }

    #[tokio::test]
    async fn a_lost_run_gives_back_what_it_released_and_when_over_what_it_scheduled() {
        let (left, dropped) = left_in_the_ring(RunEnd::Lost(true)).await;
        let why = "only the TF never scheduled goes on to the next run";
        assert_eq!(left, [9], "{why}");
        let why = "TFs 8 and 10, scheduled in the lost run, counted icn_lost";
        assert_eq!(dropped, counted("dropped.icn_lost", 2), "{why}");
        let (left, dropped) = left_in_the_ring(RunEnd::Lost(false)).await;
        let why = "the run joined afresh hears them again";
        assert_eq!(left, [8, 9, 10], "{why}");
        assert_eq!(dropped, []);
    }

    #[tokio::test]
    async fn a_stopped_run_gives_back_what_it_scheduled_and_keeps_the_rest() {
        let (left, dropped) = left_in_the_ring(RunEnd::Stopped).await;
        let why = "only the TF never scheduled goes on to the next run";
        assert_eq!(left, [9], "{why}");
        let why = "TFs 8 and 10, scheduled but never released, counted run_stopped";
        assert_eq!(dropped, counted("freed.run_stopped", 2), "{why}");
    }
}
