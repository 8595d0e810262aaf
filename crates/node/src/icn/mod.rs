//! The ICN's tokio shell: binds the control port, takes leadership and TF ids from the
//! registry, and moves bytes and time in and out of the pure `core::IcnCore`.

pub mod core;
mod held;
pub mod ledger;
mod peer;
pub mod run_state;
mod session;
pub mod summary;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fanin_proto::Message;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::config::Checked;
use crate::metrics::{self, Metrics, Reply, Request};
use crate::registry::runtime::{RegistryOpts, RUN};
use core::{Action, CoreConfig, IcnCore, Input, Level, Phase};
use summary::{Summary, TfCsv};

pub use peer::{ConnId, Event};
pub use session::{session, SessionOptions, MAX_MEMBERS as SESSION_MAX_NODES};

pub struct IcnOptions {
    pub run: Checked,
    /// The run secret every FLP and EPN must prove (empty: none).
    pub secret: crate::auth::Secret,
    pub control_bind: SocketAddr,
    pub metrics_bind: Option<SocketAddr>,
    pub results_dir: Option<PathBuf>,
    /// Print `PROGRESS issued ended total` lines on stdout (read by `fanin run`).
    pub progress: bool,
    pub run_id: u64,
    /// ZooKeeper: elect this ICN (a standby waits), take TF ids from the high-water mark,
    /// and learn of nodes whose session expired.
    pub registry: Option<RegistryOpts>,
}

/// Events (frames, connections) queued from the connection tasks to the ICN task.
const EVENT_QUEUE: usize = 4096;

/// TF ids one ICN reserves at once when the run length is not known in advance.
const ID_BLOCK: u64 = 1 << 32;

/// Frames held back at most while the rows file cannot be written: half a control
/// queue, so that sending them at once never fills a healthy peer's. At the limit the
/// ICN gives up holding: what waits goes out, except the Releases and Abandons
/// (counted `frees_not_sent`; FLPs keep those STFs until the run stops).
const MAX_HELD: usize = crate::conn::CONTROL_QUEUE / 2;

/// Binds the control port, prints `listening control=ADDR metrics=ADDR`, runs one
/// run to its end and returns its summary (also written to the results directory).
pub async fn run(opts: IcnOptions) -> anyhow::Result<Summary> {
    let listener = TcpListener::bind(opts.control_bind)
        .await
        .with_context(|| format!("ICN control bind {}", opts.control_bind))?;
    let control = listener.local_addr()?;
    // Checked before anything else (a standby too, before it waits to be elected).
    prepare_results(&opts)?;
    let mut lead = Leadership::take(&opts, control).await?;
    // Taken from here on, before `listening` says it leads: a launcher's SIGTERM right
    // after that line stops the run instead of killing the ICN.
    use tokio::signal::unix::{signal, SignalKind};
    let signals = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    );
    let metrics = Metrics::new("icn", None);
    let metrics_addr = match opts.metrics_bind {
        Some(b) => Some(metrics::serve(b, metrics.clone()).await?),
        None => None,
    };
    let metrics_shown = metrics_addr.map(|a| a.to_string());
    say(&format!(
        "listening control={control} metrics={}",
        metrics_shown.as_deref().unwrap_or("-")
    ));
    let cfg = &opts.run.cfg;
    tracing::info!(
        "ICN on {control}: waiting for {} FLPs and {} EPNs (policy {})",
        cfg.flps,
        cfg.epns,
        cfg.policy
    );
    let (ev_tx, ev_rx) = mpsc::channel::<Event>(EVENT_QUEUE);
    let acceptor = start_acceptor(&opts, listener, ev_tx, &metrics);
    let status = serve_live(&metrics);
    let mut shell = shell_for(&opts, &mut lead, metrics, status)?;
    let result = shell.event_loop(ev_rx, &mut lead, signals).await;
    acceptor.abort();
    result?;
    lead.end_run().await?;
    shell.finish(opts.results_dir.as_deref())
}

/// The core of the run this ICN leads (new, or taken over), in its shell with its rows.
fn shell_for(
    opts: &IcnOptions,
    lead: &mut Leadership,
    metrics: Arc<Metrics>,
    status: Arc<std::sync::Mutex<String>>,
) -> anyhow::Result<Shell> {
    // Taking a run over, its time axis goes on: the shell's clock counts from its start.
    let takeover = lead.claim.as_mut().and_then(|c| c.takeover.take());
    let run_id = lead.claim.as_ref().map_or(opts.run_id, |c| c.state.run_id);
    let elapsed = takeover.as_ref().map_or(Duration::ZERO, |t| t.elapsed);
    let origin = Instant::now()
        .checked_sub(elapsed)
        .unwrap_or_else(Instant::now);
    let tfs_csv = match (&opts.results_dir, lead.claim.as_mut()) {
        (_, Some(c)) => c.csv.take(),
        (Some(d), None) => Some(TfCsv::create(d)?),
        (None, None) => None,
    };
    let core = IcnCore::new(
        CoreConfig {
            run: opts.run.clone(),
            run_id,
            id_base: lead.id_base,
            registry_members: lead.members.as_ref().map(|m| m.borrow().clone()),
            stopwatch_ns,
            hold_start: false,
            takeover,
        },
        metrics,
        origin.elapsed(),
    );
    let mut shell = Shell::new(core, tfs_csv, opts.progress, status);
    shell.origin = origin;
    shell.run_start_unix_us = lead
        .claim
        .as_ref()
        .and_then(|c| c.started_unix_us)
        .unwrap_or(0);
    shell.carry_out(); // what the take-over decided already (its log lines)
    Ok(shell)
}

/// The results directory made and the configuration written into it, or a clear error.
fn prepare_results(opts: &IcnOptions) -> anyhow::Result<()> {
    if let Some(dir) = &opts.results_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("results directory {}", dir.display()))?;
        summary::write_atomic(&dir.join("config.toml"), &toml::to_string(&opts.run.cfg)?)?;
    }
    Ok(())
}

/// The task admitting FLPs and EPNs that prove the run secret.
fn start_acceptor(
    opts: &IcnOptions,
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    metrics: &Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    let cfg = &opts.run.cfg;
    // Members: every node of the run, plus room for rejoining ones whose old
    // connection has not closed yet.
    let nodes = (cfg.flps + cfg.epns) as usize;
    let places = (nodes * 2 + 16, nodes);
    let (_, idle) = tokio::sync::watch::channel(crate::conn::keepalive_idle(cfg.lease_ms));
    acceptor(&opts.secret, (places, idle), listener, events, metrics)
}

/// The acceptor task for `places` (registered connections at most, and the nodes the
/// handshake pool expects), their keepalive following `idle`.
fn acceptor(
    secret: &crate::auth::Secret,
    (places, idle): (
        (usize, usize),
        tokio::sync::watch::Receiver<std::time::Duration>,
    ),
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    metrics: &Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    if secret.is_empty() {
        tracing::warn!(
            "ICN: no run secret (--secret-file or FANIN_SECRET): any process that reaches this port can join the run"
        );
    }
    let secret = Arc::new(secret.clone());
    tokio::spawn(peer::accept_loop(
        listener,
        events,
        metrics.clone(),
        places,
        secret,
        idle,
    ))
}

/// The ICN's place in the registry (ZooKeeper): leadership, its TF ids, the membership
/// watch. Without a registry: ids from 0, nothing to watch, leadership never lost.
struct Leadership {
    /// Held for the run: dropping it gives the leadership up.
    _lead: Option<crate::registry::Leadership>,
    /// Resolves once when the leadership is lost; None after (or without a registry).
    lost: Option<BoxFuture<()>>,
    /// After a loss: winning the election again (the run goes on), or why not (another
    /// ICN leads, or a take-over cannot be ruled out).
    reelect: Option<BoxFuture<Result<crate::registry::Leadership, String>>>,
    /// When the leadership was lost (for the outage's length).
    lost_at: Option<Instant>,
    members: Option<tokio::sync::watch::Receiver<crate::registry::Membership>>,
    registry: Option<crate::registry::ZkRegistry>,
    control: String,
    id_base: u64,
    /// The run this ICN leads in the registry (new, or taken over from a failed ICN).
    claim: Option<run_state::Claim>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// After the leadership was lost (the session expired, or the registry was unreachable
/// for most of the session time-out): this ICN leads again once the registry is back and
/// no other ICN took over, and the run goes on; if another ICN leads, or a take-over
/// cannot be ruled out, the run ends here (the error says which).
async fn reelect(
    r: crate::registry::ZkRegistry,
    control: String,
    version: Option<i32>,
) -> Result<crate::registry::Leadership, String> {
    let lead = elect_again(r, control)
        .await
        .map_err(|other| format!("the ICN at {other} leads now"))?;
    // Elected again: unless another ICN took the run over meanwhile (and died too).
    let mut read = lead.run_state().await;
    for _ in 1..STATE_READS {
        if read.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        read = lead.run_state().await;
    }
    let read = read
        .map(|s| s.map(|(_, v)| v))
        .map_err(|e| format!("{e:#}"));
    may_lead_again(version, read).map(|()| lead)
}

/// Reads of the run's state a re-elected ICN tries before it gives the run up.
const STATE_READS: usize = 5;

/// Whether an ICN elected again may go on with its run: only when the run's state is
/// still the version it wrote. A state it cannot read, or that is gone, may hide a
/// take-over (going on would issue that ICN's ids again), so the run ends here. The
/// error says why, as a sentence.
fn may_lead_again(mine: Option<i32>, read: Result<Option<i32>, String>) -> Result<(), String> {
    let unsure = |why: String| Err(format!("{why}, so a take-over cannot be ruled out"));
    match (mine, read) {
        (_, Err(e)) => unsure(format!("the run's state cannot be read ({e})")),
        (None, _) => Ok(()),
        (Some(m), Ok(Some(v))) if m == v => Ok(()),
        (Some(_), Ok(Some(_))) => Err("another ICN took the run over meanwhile".into()),
        (Some(_), Ok(None)) => unsure("the run's state is gone from the registry".into()),
    }
}

async fn elect_again(
    r: crate::registry::ZkRegistry,
    control: String,
) -> Result<crate::registry::Leadership, String> {
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        match r.leader(RUN).await {
            Ok(Some(other)) if other != control => return Err(other),
            // None, our own znode of the expired session, or no answer: try to lead.
            _ => {}
        }
        let elect = tokio::time::timeout(Duration::from_secs(1), r.elect(RUN, &control));
        if let Ok(Ok(lead)) = elect.await {
            return Ok(lead);
        }
        if attempt.is_multiple_of(25) {
            tracing::warn!("ICN: the registry is still out of reach; the run goes on");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Leadership {
    async fn take(opts: &IcnOptions, control: SocketAddr) -> anyhow::Result<Leadership> {
        let mut l = Leadership {
            _lead: None,
            lost: None,
            reelect: None,
            lost_at: None,
            members: None,
            registry: None,
            control: control.to_string(),
            id_base: 0,
            claim: None,
        };
        let Some(r) = &opts.registry else {
            return Ok(l);
        };
        let r = r.connect().await?;
        // Become the leader first (a standby waits here), then take ids.
        let leader = r.leader(RUN).await.ok().flatten();
        if let Some(other) = &leader {
            tracing::info!("ICN: standby; the ICN at {other} leads, waiting for leadership");
        }
        let waited = leader.is_some();
        let lead = r.elect(RUN, &control.to_string()).await?;
        tracing::info!("ICN: elected leader in registry {}", r.url());
        let block = opts.run.total_tfs.unwrap_or(ID_BLOCK);
        let fresh = async { Ok((opts.run_id, lead.reserve_tf_ids(block).await?.start)) };
        let results = opts.results_dir.as_deref();
        let claim = run_state::claim(&lead, results, waited, fresh).await?;
        l.id_base = claim.state.id_base;
        l.claim = Some(claim);
        l.members = Some(r.watch(RUN).await?);
        l.lost = Some(Box::pin(lead.lost()));
        l._lead = Some(lead);
        l.registry = Some(r);
        Ok(l)
    }

    /// The run ended: marked so in the registry (an ICN that another deposed is fenced:
    /// an error, and no summary). A session lost as the run ended, before or while it
    /// is marked, is an outage like any other: lead again first, then mark it.
    async fn end_run(&mut self) -> anyhow::Result<()> {
        if self.reelect.is_none() && self._lead.as_ref().is_some_and(|l| !l.is_leader()) {
            self.start_reelect(); // lost before the loop heard of it
        }
        for _ in 0..2 {
            if !self.lead_again().await? {
                return Ok(()); // the registry out of reach: the summary goes unmarked
            }
            let (Some(c), Some(l)) = (self.claim.as_mut(), self._lead.as_ref()) else {
                return Ok(());
            };
            let run = c.state.run_id;
            match c.end(l).await {
                Ok(()) => return Ok(()),
                Err(run_state::NotMarked::Deposed(e)) => anyhow::bail!(
                    "fenced: this ICN lost the lead of run {run} to another ICN, which goes on with it ({e})"
                ),
                Err(run_state::NotMarked::Lost(e)) => {
                    tracing::warn!("ICN: lost the registry session marking run {run} ended ({e}); leading again first");
                    self.start_reelect();
                }
            }
        }
        anyhow::bail!("fenced: the registry session was lost again as the run ended; this ICN writes no summary")
    }

    /// Starts winning the election again, as after any loss of the lead.
    fn start_reelect(&mut self) {
        if let Some(r) = self.registry.clone() {
            let version = self.claim.as_ref().map(|c| c.version);
            self.lost = None;
            self.reelect = Some(Box::pin(reelect(r, self.control.clone(), version)));
        }
    }

    /// Waits (10 s at most) for a re-election under way: true when this ICN leads (or
    /// none was under way), false when the registry stays out of reach; an error when
    /// another ICN leads or a take-over cannot be ruled out.
    async fn lead_again(&mut self) -> anyhow::Result<bool> {
        let Some(again) = self.reelect.take() else {
            return Ok(true);
        };
        match tokio::time::timeout(Duration::from_secs(10), again).await {
            Ok(Ok(lead)) => {
                self._lead = Some(lead);
                Ok(true)
            }
            Ok(Err(why)) => anyhow::bail!("fenced: {why}; this one writes no summary"),
            Err(_) => {
                // Nobody could be elected without the registry either.
                tracing::warn!(
                    "ICN: the registry is still out of reach at the run's end; writing the summary"
                );
                Ok(false)
            }
        }
    }

    /// The next registry input for the core (pending forever without a registry).
    async fn next(&mut self) -> Input {
        let lost = async {
            match self.lost.as_mut() {
                Some(f) => f.await,
                None => std::future::pending().await,
            }
        };
        let changed = async {
            match self.members.as_mut() {
                Some(m) => m.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let reelected = async {
            match self.reelect.as_mut() {
                Some(f) => f.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = lost => {
                self.lost = None;
                self.lost_at = Some(Instant::now());
                let r = self.registry.clone().expect("a leadership has a registry");
                let version = self.claim.as_ref().map(|c| c.version);
                self.reelect = Some(Box::pin(reelect(r, self.control.clone(), version)));
                Input::RegistryOutage {
                    lost: true,
                    what: "lost the registry leadership (session ended); the run goes on while no other ICN leads, leases detect failed nodes".into(),
                }
            }
            again = reelected => {
                self.reelect = None;
                let secs = self.lost_at.take().map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
                match again {
                    Ok(lead) => {
                        self.lost = Some(Box::pin(lead.lost()));
                        self._lead = Some(lead);
                        Input::RegistryOutage {
                            lost: false,
                            what: format!("leads again in the registry after {secs:.1} s; the run went on"),
                        }
                    }
                    Err(why) => {
                        tracing::warn!("ICN: does not lead again: {why}");
                        Input::LostLeadership
                    }
                }
            }
            ok = changed => match (ok, self.members.as_mut()) {
                (true, Some(m)) => Input::Membership(m.borrow_and_update().clone()),
                _ => {
                    self.members = None;
                    Input::MembershipLost
                }
            },
        }
    }
}

/// One control connection's sending half: dropping it closes the connection.
struct Conn {
    tx: mpsc::Sender<Message>,
    _kill: oneshot::Sender<()>,
}

/// The shell around the core: connections, the result rows, the progress lines.
struct Shell {
    origin: Instant,
    core: IcnCore,
    conns: HashMap<ConnId, Conn>,
    /// Connections a send failed on: later sends to them are skipped until the core,
    /// told of the failure, closes them.
    failed: std::collections::HashSet<ConnId>,
    tfs_csv: Option<TfCsv>,
    /// Frames held back while the rows before them cannot reach the rows file.
    held: held::Held,
    /// The rows file refused the last write (logged once per outage).
    rows_failing: bool,
    progress: bool,
    run_start_unix_us: u64,
    /// (time s, TFs completed) a second ago and the TF rate since, for the live status.
    rate: ((f64, u64), f64),
    /// The live status JSON, served at `GET /status` on the metrics port.
    status: Arc<std::sync::Mutex<String>>,
}

/// The events already queued (at most a queue's worth): frames that came before a
/// deadline count before it, so a busy ICN does not end the lease of a node whose
/// heartbeat waits in its queue.
fn queued(ev_rx: &mut mpsc::Receiver<Event>) -> impl Iterator<Item = Event> + '_ {
    std::iter::from_fn(|| ev_rx.try_recv().ok()).take(EVENT_QUEUE)
}

/// The ICN's live page: it polls `/status` and `/metrics` every second.
const LIVE_PAGE: &str = include_str!("live/page.html");

/// Serves the live page at `GET /` and its status at `GET /status`.
fn serve_live(metrics: &Metrics) -> Arc<std::sync::Mutex<String>> {
    let status = Arc::new(std::sync::Mutex::new(String::from("{}")));
    let s = status.clone();
    let json = move |_: &Request| Reply::ok("application/json", s.lock().unwrap().clone());
    metrics.route("GET", "/status", Box::new(json));
    let page = |_: &Request| Reply::ok("text/html; charset=utf-8", LIVE_PAGE.to_string());
    metrics.route("GET", "/", Box::new(page));
    status
}

impl Shell {
    fn new(
        core: IcnCore,
        tfs_csv: Option<TfCsv>,
        progress: bool,
        status: Arc<std::sync::Mutex<String>>,
    ) -> Shell {
        Shell {
            origin: Instant::now(),
            core,
            conns: HashMap::new(),
            failed: Default::default(),
            tfs_csv,
            held: held::Held::new(MAX_HELD),
            rows_failing: false,
            progress,
            run_start_unix_us: 0,
            rate: ((0.0, 0), 0.0),
            status,
        }
    }

    /// Publishes the live status (`GET /status`).
    fn publish_status(&mut self) {
        let st = self.status_json();
        *self.status.lock().unwrap() = st.to_string();
    }

    /// The core's status with the completion rate over the last second or so.
    fn status_json(&mut self) -> serde_json::Value {
        let mut st = self.core.status();
        let now = (
            st["t_s"].as_f64().unwrap_or(0.0),
            st["completed"].as_u64().unwrap_or(0),
        );
        let ((t0, c0), rate) = &mut self.rate;
        if now.0 - *t0 >= 1.0 {
            *rate = now.1.saturating_sub(*c0) as f64 / (now.0 - *t0);
            (*t0, *c0) = now;
        }
        st["rate_hz"] = serde_json::json!(*rate);
        st
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    async fn event_loop(
        &mut self,
        mut ev_rx: mpsc::Receiver<Event>,
        lead: &mut Leadership,
        (mut sigint, mut sigterm): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
    ) -> anyhow::Result<()> {
        let mut progress = tokio::time::interval(Duration::from_millis(250));
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while self.core.phase() != Phase::Done {
            let far = Instant::now() + Duration::from_secs(3600);
            let wake = self.core.poll_timeout().map(|t| self.origin + t);
            tokio::select! {
                ev = ev_rx.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
                _ = tokio::time::sleep_until(wake.unwrap_or(far)) => {
                    for ev in queued(&mut ev_rx) {
                        self.on_event(ev);
                    }
                    self.feed(Input::Timeout)
                }
                _ = progress.tick() => {
                    self.print_progress();
                    self.publish_status();
                    self.every_tick();
                }
                input = lead.next() => self.feed(input),
                _ = sigint.recv() => self.feed(Input::Interrupt),
                _ = sigterm.recv() => self.feed(Input::Interrupt),
            }
        }
        self.print_progress();
        self.publish_status();
        match self.core.fatal() {
            Some(msg) => anyhow::bail!("{msg}"),
            None => Ok(()),
        }
    }

    fn on_event(&mut self, ev: Event) {
        let input = match ev {
            Event::Registered {
                conn,
                peer,
                reg,
                tx,
                kill,
            } => {
                self.conns.insert(conn, Conn { tx, _kill: kill });
                Input::Registered { conn, peer, reg }
            }
            Event::Msg { conn, msg } => Input::Msg { conn, msg },
            Event::Closed { conn, err } => {
                self.conns.remove(&conn);
                self.failed.remove(&conn);
                Input::Closed { conn, err }
            }
        };
        self.feed(input);
    }

    /// A run-control command to the core, then its actions carried out.
    fn command(&mut self, cmd: crate::runctl::Command) -> Result<String, String> {
        let done = self.core.command(self.now(), cmd);
        self.carry_out();
        done
    }

    /// Ends a run that never started (its nodes are told, EXIT first when the session
    /// ends); dropping the connections afterwards flushes what was queued to them.
    fn cancel(&mut self, exit: bool) {
        self.core.cancel(exit);
        self.carry_out();
        self.conns.clear();
    }

    /// Feeds one input, then carries out every action.
    fn feed(&mut self, input: Input) {
        self.core.handle(self.now(), input);
        self.carry_out();
    }

    /// Carries out the core's pending actions; a failed send comes back as an input,
    /// whose actions are carried out in turn.
    fn carry_out(&mut self) {
        let mut failed = VecDeque::new(); // allocates only when a send fails
        loop {
            while let Some(action) = self.core.poll_action() {
                self.act(action, &mut failed);
            }
            let Some(f) = failed.pop_front() else {
                return;
            };
            self.core.handle(self.now(), f);
        }
    }

    /// A frame to a connection; a failure to queue it comes back as an input. A TF's
    /// STFs are freed only once its row is in the file: a frame that frees them
    /// (Release, Abandon), and every later frame to its connection, waits until the
    /// rows are.
    fn send(&mut self, conn: ConnId, msg: Message, failed: &mut VecDeque<Input>) {
        if !self.held.must_wait(conn, &msg) {
            return failed.extend(self.deliver(conn, msg));
        }
        // The common case: nothing waits, and the rows reach the file at once.
        if self.held.is_empty() && self.commit_rows() {
            return failed.extend(self.deliver(conn, msg));
        }
        let Err(msg) = self.held.push(conn, msg) else {
            return self.send_held(failed);
        };
        if self.commit_rows() {
            // The file takes the rows again: what waits goes, and this frame after it.
            self.release_held(false, failed);
            return self.send(conn, msg, failed);
        }
        // Held too long: what waits goes out without its frees, and so does this frame.
        tracing::error!("ICN: {MAX_HELD} frames held back for the rows file: sent without their Releases and Abandons");
        self.release_held(true, failed);
        match held::frees(&msg) {
            true => self.core.metrics_error("frees_not_sent"),
            false => failed.extend(self.deliver(conn, msg)),
        }
    }

    /// The frames held back go out once the rows before them are in the file. While
    /// they cannot be and the run is stopping, they go out without their frees (RunStop
    /// among them; the FLPs free every STF the run scheduled then).
    fn send_held(&mut self, failed: &mut VecDeque<Input>) {
        if self.held.is_empty() {
            return;
        }
        if self.commit_rows() {
            self.release_held(false, failed);
        } else if matches!(self.core.phase(), Phase::Stopping | Phase::Done) {
            let n = self.release_held(true, failed);
            tracing::warn!("ICN: the run stops: {n} Releases and Abandons held back are not sent");
        }
    }

    /// Sends every frame held, in order, without the frees if `drop_frees` (counted
    /// `frees_not_sent`): how many were left out.
    fn release_held(&mut self, drop_frees: bool, failed: &mut VecDeque<Input>) -> usize {
        let (frames, left_out) = self.held.take(drop_frees);
        for (conn, msg) in frames {
            failed.extend(self.deliver(conn, msg));
        }
        (0..left_out).for_each(|_| self.core.metrics_error("frees_not_sent"));
        left_out
    }

    /// Every 250 ms: frames held back go out if the rows file takes the rows now.
    fn retry_held(&mut self) {
        let mut failed = VecDeque::new();
        self.send_held(&mut failed);
        for f in failed {
            self.feed(f);
        }
    }

    /// A frame onto its connection's queue now.
    fn deliver(&mut self, conn: ConnId, msg: Message) -> Option<Input> {
        if self.failed.contains(&conn) {
            return None;
        }
        let c = self.conns.get(&conn)?;
        let why = match c.tx.try_send(msg) {
            Ok(()) => return None,
            Err(mpsc::error::TrySendError::Full(_)) => "control queue full (peer not reading)",
            Err(mpsc::error::TrySendError::Closed(_)) => "connection closed",
        };
        self.failed.insert(conn);
        Some(Input::SendFailed {
            conn,
            why: why.into(),
        })
    }

    fn act(&mut self, action: Action, failed: &mut VecDeque<Input>) {
        match action {
            Action::Send { conn, msg } => self.send(conn, msg, failed),
            Action::Close { conn } => {
                self.conns.remove(&conn);
                self.failed.remove(&conn);
            }
            Action::Log { level, line } => match level {
                Level::Info => tracing::info!("ICN: {line}"),
                Level::Warn => tracing::warn!("ICN: {line}"),
                Level::Error => tracing::error!("ICN: {line}"),
            },
            Action::TfEnded(row) => {
                if let Some(Err(e)) = self.tfs_csv.as_mut().map(|csv| csv.row(&row)) {
                    tracing::error!("ICN: writing tfs.csv: {e}");
                }
            }
            Action::EpnLoad {
                t_us,
                epn,
                free_bytes,
                building,
            } => {
                let csv = self.tfs_csv.as_mut();
                if let Some(Err(e)) = csv.map(|c| c.load(t_us, epn, free_bytes, building)) {
                    tracing::error!("ICN: writing loads.csv: {e}");
                }
            }
            Action::RunStarted { resumed } => {
                let now = run_state::unix_us();
                if !resumed {
                    self.run_start_unix_us = now;
                    let noted = self.tfs_csv.as_ref().map(|c| c.run_started(now));
                    if let Some(Err(e)) = noted {
                        tracing::error!("ICN: writing the run's start: {e:#}");
                    }
                }
                if self.progress {
                    say(&format!("STARTED {now}"));
                }
            }
        }
    }

    /// A Release frees STFs: the rows written before it reach the file first. False
    /// when they cannot: the Release is held back (the STFs stay kept, never lost) and
    /// tried again with the next one or within 250 ms.
    fn commit_rows(&mut self) -> bool {
        let done = self.tfs_csv.as_mut().map(|c| c.commit());
        self.rows_written(done)
    }

    /// Every 250 ms: the rows and loads to their files (a failure is told as any
    /// commit's), then the frames held back if the rows are in.
    fn every_tick(&mut self) {
        let done = self.tfs_csv.as_mut().map(|c| c.flush());
        self.rows_written(done);
        self.retry_held();
    }

    /// Whether the rows reached the file; an outage is logged and counted
    /// (`rows_not_written`) once when it starts, and its end once.
    fn rows_written(&mut self, done: Option<std::io::Result<()>>) -> bool {
        match (done, self.rows_failing) {
            (Some(Err(e)), false) => {
                tracing::error!(
                    "ICN: writing tfs.csv: {e}; Releases and Abandons wait until the rows are in"
                );
                self.core.metrics_error("rows_not_written");
                self.rows_failing = true;
                false
            }
            (Some(Err(_)), true) => false,
            (_, true) => {
                tracing::info!("ICN: tfs.csv takes the rows again");
                self.rows_failing = false;
                true
            }
            (_, false) => true,
        }
    }

    fn print_progress(&self) {
        if self.progress {
            let (issued, ended, total) = self.core.progress();
            say(&format!("PROGRESS {issued} {ended} {total}"));
        }
    }

    /// Ends the run: the last rows and the summary to the results directory, the counts
    /// to the log.
    fn finish(mut self, results_dir: Option<&std::path::Path>) -> anyhow::Result<Summary> {
        let mut summary = self.core.finish(self.now());
        let mut failed = VecDeque::new(); // the run is over: nothing more to do about them
        while let Some(action) = self.core.poll_action() {
            self.act(action, &mut failed);
        }
        self.send_held(&mut failed); // the last frames held back (the run is Done)
        summary.run_start_unix_us = self.run_start_unix_us;
        // The counts reach the log even when the results directory is gone or full.
        log_counts(&summary);
        let rows = self.tfs_csv.take().map_or(Ok(()), |csv| csv.finish());
        let written = rows.and_then(|()| match results_dir {
            Some(dir) => summary.write(dir),
            None => Ok(()),
        });
        if let Err(e) = written {
            // The result is not lost: it goes to stdout, and the exit says why.
            let json = serde_json::to_string(&summary).unwrap_or_default();
            say(&format!("SUMMARY {json}"));
            return Err(e.context("the summary is on stdout (SUMMARY line)"));
        }
        Ok(summary)
    }
}

/// A line for the launcher on stdout; a closed stdout (the launcher is gone) is no
/// reason to stop, let alone to panic.
fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn log_counts(summary: &Summary) {
    let by_reason = |m: &BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    tracing::info!(
        "ICN: issued={} completed={} incomplete={} [{}] dropped={} [{}] invariant_ok={}",
        summary.issued,
        summary.completed,
        summary.incomplete,
        by_reason(&summary.incomplete_by_reason),
        summary.dropped,
        by_reason(&summary.dropped_by_reason),
        summary.invariant_ok
    );
    if !summary.invariant_ok {
        tracing::error!(
            "ICN: accounting invariant violated: issued {} != completed {} + incomplete {} + dropped {}",
            summary.issued,
            summary.completed,
            summary.incomplete,
            summary.dropped
        );
    }
}

/// The shell's clock for timing policy updates (ns since first use).
fn stopwatch_ns() -> u64 {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::icn::ledger::TfRow;
    use fanin_proto::{Reason, TfStatus};
    use std::sync::atomic::Ordering;
    use summary::TestDisk;

    /// An ICN elected again goes on only over the state version it wrote: a read that
    /// fails (a flaky link right after the outage) may hide a take-over, as may a state
    /// that is gone, so neither lets it lead again.
    #[test]
    fn a_re_elected_icn_goes_on_only_over_its_own_state() {
        assert_eq!(may_lead_again(Some(3), Ok(Some(3))), Ok(()));
        assert_eq!(may_lead_again(None, Ok(None)), Ok(()));
        let taken = may_lead_again(Some(3), Ok(Some(4))).unwrap_err();
        assert!(taken.contains("took the run over"), "{taken}");
        let unread = may_lead_again(Some(3), Err("connection loss".into())).unwrap_err();
        assert!(
            unread.contains("cannot be read (connection loss), so a take-over"),
            "{unread}"
        );
        assert!(may_lead_again(Some(3), Ok(None)).is_err());
    }

    /// An ICN shell whose rows go to `disk`, with one control connection (id 5).
    fn shell(disk: TestDisk) -> (Shell, mpsc::Receiver<Message>, Arc<Metrics>) {
        let run = crate::config::RunConfig::default().check().unwrap();
        let metrics = Metrics::new("icn", None);
        let core = IcnCore::new(
            CoreConfig {
                run,
                run_id: 1,
                id_base: 0,
                registry_members: None,
                stopwatch_ns: || 0,
                hold_start: false,
                takeover: None,
            },
            metrics.clone(),
            Duration::ZERO,
        );
        let csv = TfCsv::to_writer(Box::new(disk), std::path::Path::new("results"));
        let status = Arc::new(std::sync::Mutex::new(String::new()));
        let mut sh = Shell::new(core, Some(csv), false, status);
        let (tx, rx) = mpsc::channel(16);
        let (kill, _) = oneshot::channel();
        sh.conns.insert(5, Conn { tx, _kill: kill });
        (sh, rx, metrics)
    }

    fn ended(tf_id: u64) -> Action {
        Action::TfEnded(TfRow {
            tf_id,
            epn: Some(0),
            issued_us: 0,
            ended_us: 1000,
            status: TfStatus::Complete,
            reason: Reason::None,
        })
    }

    /// The run is over (Done): with the rows in the file a Release still goes out (one
    /// made just before RunStop); with the rows file full, only what is not a free.
    #[test]
    fn at_the_runs_end_a_release_goes_out_unless_its_row_cannot_be_written() {
        let disk = TestDisk::full(usize::MAX);
        let full = disk.full.clone();
        full.store(false, Ordering::Relaxed);
        let (mut sh, mut rx, _) = shell(disk);
        sh.core.cancel(false);
        assert_eq!(sh.core.phase(), Phase::Done);
        let mut failed = VecDeque::new();
        sh.act(ended(1), &mut failed);
        sh.send(5, Message::Release { tf_id: 1 }, &mut failed);
        assert_eq!(rx.try_recv().ok(), Some(Message::Release { tf_id: 1 }));
        full.store(true, Ordering::Relaxed);
        sh.act(ended(2), &mut failed);
        sh.send(5, Message::Release { tf_id: 2 }, &mut failed);
        let stop = Message::RunStop { run_id: 1 };
        sh.send(5, stop.clone(), &mut failed);
        let sent: Vec<Message> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(sent, [stop], "the Release without its row is left out");
    }

    #[test]
    fn a_release_waits_for_its_row_and_goes_out_once_the_rows_file_takes_it() {
        let disk = TestDisk::full(usize::MAX);
        let (full, got) = (disk.full.clone(), disk.got.clone());
        let (mut sh, mut rx, metrics) = shell(disk);
        let mut failed = VecDeque::new();
        for tf_id in [1, 2] {
            sh.act(ended(tf_id), &mut failed);
            sh.act(
                Action::Send {
                    conn: 5,
                    msg: Message::Release { tf_id },
                },
                &mut failed,
            );
        }
        assert!(rx.try_recv().is_err(), "no row in the file: no Release");
        let assign = Message::Assign {
            tf_id: 1,
            epn_id: 0,
        };
        sh.send(5, assign.clone(), &mut failed);
        assert!(
            rx.try_recv().is_err(),
            "behind the Releases to the same peer"
        );
        let (tx, mut other) = mpsc::channel(16);
        let (kill, _killed) = oneshot::channel();
        sh.conns.insert(6, Conn { tx, _kill: kill });
        sh.send(6, assign.clone(), &mut failed);
        assert_eq!(
            other.try_recv().ok(),
            Some(assign.clone()),
            "another peer's: at once"
        );
        sh.every_tick();
        assert!(rx.try_recv().is_err(), "the disk is still full");
        let outages = metrics.counter("errors.rows_not_written");
        assert_eq!(outages, 1, "one outage, counted once");
        full.store(false, Ordering::Relaxed);
        sh.retry_held();
        let sent: Vec<Message> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        let releases = [1, 2].map(|tf_id| Message::Release { tf_id });
        assert_eq!(sent, [&releases[..], &[assign]].concat(), "all, in order");
        let rows = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        assert_eq!(rows.lines().count(), 2, "their rows first: {rows}");
        assert!(failed.is_empty());
        sh.act(ended(3), &mut failed);
        let release = Message::Release { tf_id: 3 };
        sh.send(5, release.clone(), &mut failed);
        assert_eq!(rx.try_recv().ok(), Some(release), "at once, as before");
    }
}
