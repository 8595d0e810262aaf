//! The long-lived ICN under run control (`fanin icn --session`): one control port and one
//! HTTP API (`POST /ctl/...`) for a session of runs, each a fresh `IcnCore` held for START.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::Context;
use fanin_proto::{Message, RejectCode, RunState};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::core::{CoreConfig, IcnCore, Input, Phase};
use super::summary::{write_atomic, TfCsv};
use super::{acceptor, queued, say, serve_live, stopwatch_ns, Event, Shell, EVENT_QUEUE};
use crate::auth::Secret;
use crate::config::Checked;
use crate::join::AbortOnDrop;
use crate::metrics::{self, Metrics, Reply, Request};
use crate::runctl::{self, Command};

/// Parses CONFIGURE's body into a checked run configuration.
pub type ParseConfig = Box<dyn Fn(&str) -> anyhow::Result<Checked> + Send>;

/// What happens with a finished run's directory (on a blocking thread of its own, beside
/// the session: drawing a long run's report must not hold up run control).
pub type AfterRun = Arc<dyn Fn(&Path) -> anyhow::Result<()> + Send + Sync>;

pub struct SessionOptions {
    pub control_bind: SocketAddr,
    pub metrics_bind: SocketAddr,
    /// Each run's results go to `DIR/run-N`.
    pub results_dir: PathBuf,
    pub secret: Secret,
    /// The first run's number (default: one above every `run-N` in the results
    /// directory); later runs count up, or take the number CONFIGURE gives.
    pub first_run: Option<u64>,
    /// Configured from the start (else the session starts IDLE).
    pub config: Option<Checked>,
    /// A run configuration from CONFIGURE's body (an experiment file or a config.toml).
    pub parse: ParseConfig,
    /// Called with each finished run's directory (e.g. to draw its report).
    pub after_run: AfterRun,
}

/// Registered connections at once (nodes of the largest run, and rejoining ones).
pub const MAX_MEMBERS: usize = 4096;

/// Registrations held while a run ends, for the next one.
const MAX_HELD: usize = 1024;

/// After EXIT, how long nodes that come back are told the session is over (longer than
/// a node's longest back-off).
const LINGER: Duration = Duration::from_secs(5);

/// One run-control request from the HTTP API, answered on `reply`.
struct CtlRequest {
    cmd: Command,
    query: String,
    body: Vec<u8>,
    reply: oneshot::Sender<Result<String, String>>,
}

/// Runs a session until EXIT (or SIGINT/SIGTERM: the run in progress is stopped and its
/// results written first).
pub async fn session(mut opts: SessionOptions) -> anyhow::Result<()> {
    let listener = TcpListener::bind(opts.control_bind)
        .await
        .with_context(|| format!("ICN control bind {}", opts.control_bind))?;
    let control = listener.local_addr()?;
    std::fs::create_dir_all(&opts.results_dir)
        .with_context(|| format!("results directory {}", opts.results_dir.display()))?;
    let metrics = Metrics::new("icn", None);
    let http = metrics::serve(opts.metrics_bind, metrics.clone()).await?;
    let (ev_tx, mut ev_rx) = mpsc::channel::<Event>(EVENT_QUEUE);
    // Each configured run's lease sets the keepalive of its nodes' connections.
    let (keepalive, idle) = tokio::sync::watch::channel(crate::conn::KEEPALIVE_IDLE);
    let _acceptor = AbortOnDrop(acceptor(
        &opts.secret,
        ((MAX_MEMBERS, MAX_MEMBERS), idle),
        listener,
        ev_tx,
        &metrics,
    ));
    let status = serve_live(&metrics);
    let mut ctl_rx = serve_ctl(&metrics, &opts.secret);
    say(&format!("listening control={control} metrics={http}"));
    tracing::info!(
        "ICN session: run control on http://{http}/ctl/..., results in {}",
        opts.results_dir.display()
    );
    let config = opts.config.take();
    let first = opts
        .first_run
        .unwrap_or_else(|| next_free_run(&opts.results_dir));
    let mut s = Session {
        next_run: first,
        opts,
        metrics,
        status,
        state: RunState::Idle,
        config: None,
        shell: None,
        held: VecDeque::new(),
        last_run: None,
        exit_after_run: false,
        keepalive,
        reports: Vec::new(),
    };
    if let Some(cfg) = config {
        s.configure(cfg, None).map_err(anyhow::Error::msg)?;
    }
    s.publish();
    s.event_loop(&mut ev_rx, &mut ctl_rx).await?;
    s.linger(&mut ev_rx).await;
    // The last runs' reports are drawn before the session ends.
    for report in std::mem::take(&mut s.reports) {
        let _ = report.await;
    }
    Ok(())
}

struct Session {
    opts: SessionOptions,
    /// The keepalive idle time of every node's control connection (from the lease).
    keepalive: tokio::sync::watch::Sender<Duration>,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<String>>,
    state: RunState,
    config: Option<Checked>,
    /// The run being configured or run (None while IDLE and after EXIT).
    shell: Option<Shell>,
    /// Registrations that came while a run was ending, for the next run.
    held: VecDeque<Event>,
    /// The number the next run gets.
    next_run: u64,
    /// The last finished run, for the status.
    last_run: Option<serde_json::Value>,
    exit_after_run: bool,
    /// `after_run` of finished runs, still at work.
    reports: Vec<tokio::task::JoinHandle<()>>,
}

impl Session {
    async fn event_loop(
        &mut self,
        ev_rx: &mut mpsc::Receiver<Event>,
        ctl_rx: &mut mpsc::Receiver<CtlRequest>,
    ) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        while self.state != RunState::Exit {
            let far = Instant::now() + Duration::from_secs(3600);
            let wake = self.shell.as_ref().and_then(|sh| {
                let t = sh.core.poll_timeout()?;
                Some(sh.origin + t)
            });
            tokio::select! {
                Some(req) = ctl_rx.recv() => {
                    let answer = self.on_ctl(req.cmd, &req.query, &req.body);
                    match &answer {
                        Ok(m) => tracing::info!("ICN: {}: {m}", req.cmd.name()),
                        Err(why) => tracing::warn!("ICN: {} refused: {why}", req.cmd.name()),
                    }
                    let _ = req.reply.send(answer);
                    self.publish();
                }
                ev = ev_rx.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
                _ = tokio::time::sleep_until(wake.unwrap_or(far)) => {
                    for ev in queued(ev_rx) {
                        self.on_event(ev);
                    }
                    if let Some(sh) = self.shell.as_mut() {
                        sh.feed(Input::Timeout);
                    }
                }
                _ = tick.tick() => {
                    if let Some(sh) = self.shell.as_mut() {
                        sh.every_tick();
                    }
                    self.publish();
                }
                _ = sigint.recv() => self.on_signal(),
                _ = sigterm.recv() => self.on_signal(),
            }
            self.after_step();
        }
        self.publish();
        Ok(())
    }

    /// SIGINT/SIGTERM: stop the run in progress and exit after it (a second signal
    /// stops it at once); without one, exit now.
    fn on_signal(&mut self) {
        let cmd = match self.state {
            RunState::Running | RunState::Paused => Command::Stop,
            _ => Command::Exit,
        };
        self.exit_after_run = true;
        if let Err(why) = self.on_ctl(cmd, "", &[]) {
            tracing::warn!("ICN: on signal, {}: {why}", cmd.name());
        }
    }

    /// One run-control command: Ok(what was done), or why not (nothing changed).
    fn on_ctl(&mut self, cmd: Command, query: &str, body: &[u8]) -> Result<String, String> {
        let to = runctl::next(self.state, cmd)?;
        match cmd {
            Command::Configure => {
                let text = std::str::from_utf8(body)
                    .map_err(|_| "configure: the configuration is not UTF-8".to_string())?;
                let cfg = (self.opts.parse)(text).map_err(|e| format!("configure: {e:#}"))?;
                self.configure(cfg, run_number(query)?)
            }
            Command::Start => {
                let dir = self.run_dir(self.next_run);
                let sh = self.shell.as_mut().expect("a configured session has a run");
                sh.core.startable()?;
                // The rows file first: START's own actions (the run's start, TFs that
                // end as they are issued) go into it.
                sh.tfs_csv = Some(start_results(&dir, &sh.core)?);
                let done = sh
                    .command(Command::Start)
                    .inspect_err(|_| sh.tfs_csv = None)?;
                self.state = to;
                Ok(done)
            }
            Command::Pause | Command::Resume | Command::Stop => {
                let sh = self.shell.as_mut().expect("a running session has a run");
                let done = sh.command(cmd)?;
                // After STOP the state is RUNNING (draining) until the results are written.
                self.state = match cmd {
                    Command::Stop => RunState::Running,
                    _ => to,
                };
                Ok(done)
            }
            Command::Exit => {
                if let Some(mut sh) = self.shell.take() {
                    sh.cancel(true);
                }
                self.state = to;
                Ok("the session ends".into())
            }
        }
    }

    /// New run parameters: a run configured but not started is replaced (its nodes
    /// are stopped and join the new one).
    fn configure(&mut self, cfg: Checked, run: Option<u64>) -> Result<String, String> {
        if let Some(n) = run {
            if n >= u64::MAX / 2 {
                return Err(format!("configure: run number {n} is too large"));
            }
            if n < self.next_run {
                return Err(format!(
                    "configure: run number {n} was used already (the next is {})",
                    self.next_run
                ));
            }
            self.next_run = n;
        }
        if let Some(mut sh) = self.shell.take() {
            sh.cancel(false);
        }
        let what = format!(
            "run {} configured: {} FLPs, {} EPNs, policy {}, {} Hz, STF {}",
            self.next_run,
            cfg.cfg.flps,
            cfg.cfg.epns,
            cfg.cfg.policy,
            cfg.cfg.rate_hz,
            cfg.stf_size
        );
        let idle = crate::conn::keepalive_idle(cfg.cfg.lease_ms);
        self.keepalive.send_replace(idle);
        self.config = Some(cfg);
        self.state = RunState::Configured;
        self.new_run();
        Ok(what)
    }

    /// A fresh core for the next run, held until START; held registrations join it.
    fn new_run(&mut self) {
        let cfg = self.config.clone().expect("configured");
        let core = IcnCore::new(
            CoreConfig {
                run: cfg,
                run_id: self.next_run,
                id_base: 0,
                registry_members: None,
                stopwatch_ns,
                hold_start: true,
                takeover: None,
            },
            self.metrics.clone(),
            Duration::ZERO,
        );
        let mut sh = Shell::new(core, None, false, self.status.clone());
        for ev in self.held.drain(..) {
            sh.on_event(ev);
        }
        self.shell = Some(sh);
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Registered { .. } => self.on_register(ev),
            Event::Closed { conn, .. } if self.held_at(conn).is_some() => {
                self.held.remove(self.held_at(conn).expect("checked"));
            }
            ev => {
                if let Some(sh) = self.shell.as_mut() {
                    sh.on_event(ev);
                }
            }
        }
    }

    /// Where a held registration of `conn` is, if one is.
    fn held_at(&self, conn: super::ConnId) -> Option<usize> {
        self.held
            .iter()
            .position(|e| matches!(e, Event::Registered { conn: c, .. } if *c == conn))
    }

    /// A node registers: into the run being configured or run; held while a run ends;
    /// refused while IDLE (it waits) and after EXIT (it exits).
    fn on_register(&mut self, ev: Event) {
        let ending = |sh: &Shell| matches!(sh.core.phase(), Phase::Stopping | Phase::Done);
        let refuse = match (&self.state, &mut self.shell) {
            (RunState::Exit, _) => (RejectCode::SessionOver, "the session has ended (EXIT)"),
            (_, None) => (
                RejectCode::Idle,
                "no run is configured (IDLE): waiting for run control to configure one",
            ),
            (_, Some(sh)) if ending(sh) && self.held.len() < MAX_HELD => {
                self.held.push_back(ev);
                return;
            }
            (_, Some(sh)) if !ending(sh) => return sh.on_event(ev),
            _ => (RejectCode::Busy, "too many nodes waiting for the next run"),
        };
        if let Event::Registered { tx, peer, .. } = ev {
            let (code, reason) = refuse;
            tracing::debug!("ICN: {peer} refused: {reason}");
            self.metrics.error("rejected");
            let _ = tx.try_send(Message::Reject {
                code,
                reason: reason.into(),
            });
            // Dropping the connection flushes the Reject, then closes.
        }
    }

    /// A run that reached its end: its results written, the next one configured (or
    /// the session ends).
    fn after_step(&mut self) {
        let done = self
            .shell
            .as_ref()
            .is_some_and(|sh| sh.core.phase() == Phase::Done);
        if !done {
            return;
        }
        let mut sh = self.shell.take().expect("checked");
        let n = sh.core.run_number();
        if sh.core.started() {
            self.finish_run(sh, n);
            self.next_run = n + 1;
        } else {
            let why = sh.core.fatal().unwrap_or("ended").to_string();
            tracing::warn!("ICN: run {n} could not start ({why}); its nodes join it again");
            sh.cancel(false);
        }
        if self.exit_after_run {
            self.state = RunState::Exit;
            // Nodes waiting for the next run are told the session is over.
            for ev in std::mem::take(&mut self.held) {
                self.on_register(ev);
            }
            return;
        }
        self.state = RunState::Configured;
        self.new_run();
    }

    fn finish_run(&mut self, sh: Shell, n: u64) {
        let dir = self.run_dir(n);
        match sh.finish(Some(&dir)) {
            Ok(s) => {
                self.last_run = Some(json!({
                    "run_number": n,
                    "dir": dir.display().to_string(),
                    "issued": s.issued,
                    "completed": s.completed,
                    "incomplete": s.incomplete,
                    "dropped": s.dropped,
                    "invariant_ok": s.invariant_ok,
                    "stopped": s.interrupted,
                }));
                say(&format!(
                    "RUN_END {n} issued {} completed {} incomplete {} dropped {} invariant_ok {}",
                    s.issued, s.completed, s.incomplete, s.dropped, s.invariant_ok
                ));
            }
            Err(e) => {
                tracing::error!("ICN: run {n}: {e:#}");
                self.last_run = Some(json!({
                    "run_number": n,
                    "dir": dir.display().to_string(),
                    "error": format!("{e:#}"),
                }));
            }
        }
        let after_run = self.opts.after_run.clone();
        self.reports.retain(|r| !r.is_finished());
        self.reports.push(tokio::task::spawn_blocking(move || {
            if let Err(e) = after_run(&dir) {
                tracing::warn!("ICN: run {n}: {e:#}");
            }
        }));
    }

    fn run_dir(&self, n: u64) -> PathBuf {
        self.opts.results_dir.join(format!("run-{n}"))
    }

    /// The live status: the run's, with the session's state, run number and last run.
    fn publish(&mut self) {
        let mut st = match self.shell.as_mut() {
            Some(sh) => sh.status_json(),
            None => json!({}),
        };
        let number = self
            .shell
            .as_ref()
            .map(|s| s.core.run_number())
            .unwrap_or(self.next_run);
        st["session"] = json!(true);
        st["state"] = json!(self.state.name());
        st["run_number"] = json!(number);
        st["last_run"] = self.last_run.clone().unwrap_or(serde_json::Value::Null);
        if let Some(c) = &self.config {
            st["config"] = json!({
                "flps": c.cfg.flps, "epns": c.cfg.epns, "policy": c.cfg.policy.to_string(),
                "rate_hz": c.cfg.rate_hz, "stf_size": c.stf_size.to_string(),
            });
        }
        *self.status.lock().unwrap() = st.to_string();
        self.metrics.set_run_state(self.state, number);
    }

    /// After EXIT: nodes that come back are told the session is over, for a moment.
    async fn linger(&mut self, ev_rx: &mut mpsc::Receiver<Event>) {
        self.shell = None;
        let until = Instant::now() + LINGER;
        while let Ok(Some(ev)) = tokio::time::timeout_at(until, ev_rx.recv()).await {
            if matches!(ev, Event::Registered { .. }) {
                self.on_register(ev);
            }
        }
    }
}

/// One above the highest `run-N` in `dir` (1 in an empty one).
fn next_free_run(dir: &Path) -> u64 {
    let names = std::fs::read_dir(dir).into_iter().flatten().flatten();
    names
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("run-")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .map_or(1, |n| n.saturating_add(1))
}

/// `run=N` from CONFIGURE's query string, if given.
fn run_number(query: &str) -> Result<Option<u64>, String> {
    for kv in query.split('&') {
        if let Some(v) = kv.strip_prefix("run=") {
            return match v.parse() {
                // Run 0 would mark a ring's STFs as scheduled by no run.
                Ok(0) => Err("configure: run numbers start at 1".into()),
                Ok(n) => Ok(Some(n)),
                Err(_) => Err(format!("configure: run number {v:?} is not a number")),
            };
        }
    }
    Ok(None)
}

/// The run's directory with its configuration, and its `tfs.csv` (before START: a
/// directory that cannot be written refuses the start).
fn start_results(dir: &Path, core: &IcnCore) -> Result<TfCsv, String> {
    if dir.exists() {
        return Err(format!(
            "results directory {} exists already: configure another run number",
            dir.display()
        ));
    }
    let made = std::fs::create_dir_all(dir)
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(toml::to_string(&core.config().cfg)?))
        .and_then(|t| write_atomic(&dir.join("config.toml"), &t))
        .and_then(|()| TfCsv::create(dir));
    made.map_err(|e| format!("results directory {}: {e:#}", dir.display()))
}

/// `POST /ctl/<command>` on the HTTP port, for holders of the run-control token.
fn serve_ctl(metrics: &Arc<Metrics>, secret: &Secret) -> mpsc::Receiver<CtlRequest> {
    let (tx, rx) = mpsc::channel(16);
    if secret.is_empty() {
        tracing::warn!("ICN: no run secret: anyone who reaches the HTTP port can control runs");
    }
    for cmd in Command::ALL {
        let (tx, secret, m) = (tx.clone(), secret.clone(), Arc::downgrade(metrics));
        let route = move |req: &Request| ctl_reply(&tx, &secret, &m, cmd, req);
        metrics.route("POST", cmd.path(), Box::new(route));
    }
    rx
}

const JSON: &str = "application/json";

fn ctl_reply(
    tx: &mpsc::Sender<CtlRequest>,
    secret: &Secret,
    metrics: &Weak<Metrics>,
    cmd: Command,
    req: &Request,
) -> Reply {
    let answer = |status, v: serde_json::Value| Reply {
        status,
        kind: JSON,
        body: v.to_string(),
    };
    if !secret.allows_ctl(req.authorization.as_deref()) {
        if let Some(m) = metrics.upgrade() {
            m.error("ctl_unauthorized");
        }
        let why = "run control needs the token of the run secret (Authorization: Bearer TOKEN, see fanin ctl)";
        return answer("401 Unauthorized", json!({"ok": false, "error": why}));
    }
    let (reply, rx) = oneshot::channel();
    let query = req
        .path
        .split_once('?')
        .map(|(_, q)| q.to_string())
        .unwrap_or_default();
    let sent = tx.blocking_send(CtlRequest {
        cmd,
        query,
        body: req.body.clone(),
        reply,
    });
    match (sent, rx.blocking_recv()) {
        (Ok(()), Ok(Ok(m))) => answer("200 OK", json!({"ok": true, "message": m})),
        (Ok(()), Ok(Err(why))) => answer("409 Conflict", json!({"ok": false, "error": why})),
        _ => answer(
            "503 Service Unavailable",
            json!({"ok": false, "error": "the session has ended"}),
        ),
    }
}
