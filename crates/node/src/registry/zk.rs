//! The ZooKeeper registry backend: one session per [`ZkRegistry`] (replaced on expiry, every
//! member then re-registered), membership watches, ICN leader election and the TF-id high-water mark.
//!
//! Layout under the URL's base path `/PATH` (persistent nodes created on demand):
//!
//! ```text
//! /PATH/<run>/epn/<id>   ephemeral, data = the EPN's address (UTF-8)
//! /PATH/<run>/flp/<id>   ephemeral, data = the FLP's address
//! /PATH/<run>/icn        ephemeral, data = the leading ICN's control address
//! /PATH/<run>/tf_hwm     persistent, data = decimal TF-id high-water mark
//! /PATH/<run>/state      persistent, data = the run's identity (see `icn::run_state`)
//! ```
//!
//! **Sessions.** A supervisor task watches the session state. The session is *lost* when it
//! expires or closes, or when it stayed disconnected for 3/5 of the negotiated session
//! timeout (the client needs up to 2/5 to notice a silent connection, so that is about one
//! session timeout after the last contact, when the server expires it too). Then the
//! supervisor opens a new session (retrying with backoff for ever), publishes it, and
//! re-registers every member registered through this registry, under the same ids.
//!
//! **Stale znodes.** A member znode that already exists when registering is:
//! - owned by the current session: kept if its address is the same, else deleted and created
//!   again (so every address change is a delete + create that watchers see);
//! - owned by an earlier session of this registry (it was abandoned while the server still
//!   held it, e.g. across a server restart): deleted (version-checked) and created again;
//! - owned by any other session (a crashed earlier process with the same id whose session
//!   has not expired yet, or a live duplicate): waited for with a watch until it vanishes;
//!   `register` gives up after the operation time-out with [`RegistryError::IdTaken`],
//!   background re-registration waits for as long as it takes.
//!
//! **Leader election.** [`ZkRegistry::elect`] creates the ephemeral `/PATH/<run>/icn`; a standby
//! watches it and tries again when it disappears. ZooKeeper fences a lost leader: the leader
//! znode lives exactly as long as its session, and a session the server expired can no
//! longer write, so [`Leadership::reserve_tf_ids`] (which only uses the leader's own session)
//! fails once another ICN could have been elected.
//!
//! **TF ids.** `tf_hwm` only grows, by compare-and-set (`setData` with the version read), so
//! blocks from any number of clients never overlap and a new leader continues above every id
//! ever reserved. A connection lost during the `setData` may waste a block (a gap), never
//! repeat one.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::{sleep, sleep_until, Instant};
use tracing::{debug, info, warn};
use zookeeper_client as zkc;

use super::{Member, Membership, Registered, RegistryError, RegistryUrl, Result, Role};

/// How many earlier session ids a registry remembers as its own.
const OLD_SESSIONS: usize = 64;
/// Pause between retries of an operation that failed with a lost connection.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

fn persistent() -> zkc::CreateOptions<'static> {
    zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all())
}

fn ephemeral() -> zkc::CreateOptions<'static> {
    zkc::CreateMode::Ephemeral.with_acls(zkc::Acls::anyone_all())
}

/// What to do after a ZooKeeper error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// The session is gone: retry on the next one.
    Session,
    /// The connection is (being) re-established: retry soon on the same session.
    Transient,
    /// Retrying will not help.
    Fatal,
}

fn classify(e: &zkc::Error) -> Class {
    use zkc::Error::*;
    match e {
        SessionExpired | SessionMoved | ClientClosed => Class::Session,
        ConnectionLoss | Timeout | Throttled | NoHosts => Class::Transient,
        _ => Class::Fatal,
    }
}

/// One ZooKeeper session and its client.
struct Session {
    client: zkc::Client,
    id: i64,
    generation: u64,
}

impl Session {
    fn new(client: zkc::Client, generation: u64) -> Session {
        Session {
            id: client.session_id().0,
            client,
            generation,
        }
    }
}

struct Inner {
    url: RegistryUrl,
    servers: String,
    requested_timeout: Duration,
    op_timeout: Duration,
    /// The current session; replaced (new generation) by the supervisor when it is lost.
    session: watch::Sender<Arc<Session>>,
    /// The current session's generation alone: watching it does not keep a session alive.
    generation: watch::Sender<u64>,
    /// Registered members: znode path -> address.
    members: Mutex<BTreeMap<String, String>>,
    /// Ids of this registry's earlier sessions (their znodes are ours to delete).
    old_sessions: Mutex<VecDeque<i64>>,
    /// Serialises "is it still a member? create its znode" against deregistration.
    reg_lock: tokio::sync::Mutex<()>,
    /// Resolves (with an error) when the last handle is dropped.
    shutdown: watch::Receiver<()>,
}

/// Dropped with the last [`ZkRegistry`] handle: stops every background task, which drops
/// the client and so closes the session (its ephemeral znodes vanish at once).
struct ShutdownGuard {
    _tx: watch::Sender<()>,
}

/// A registry on a ZooKeeper ensemble. Cheap to clone; the session is closed when the last
/// clone (and the last [`Leadership`]) is dropped.
#[derive(Clone)]
pub struct ZkRegistry {
    inner: Arc<Inner>,
    _guard: Arc<ShutdownGuard>,
}

impl fmt::Debug for ZkRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkRegistry")
            .field("url", &self.inner.url.to_string())
            .field("session", &format_args!("{:#x}", self.session_id()))
            .finish()
    }
}

impl ZkRegistry {
    /// Connects (retrying for the operation time-out, `max(3 x session_timeout, 5 s)`),
    /// creates the base path if missing, and starts the session supervisor.
    pub async fn connect(url: &RegistryUrl, session_timeout: Duration) -> Result<ZkRegistry> {
        let (shutdown_tx, shutdown_rx) = watch::channel(());
        let servers = url.connect_string();
        let op_timeout = (session_timeout * 3).max(Duration::from_secs(5));
        let deadline = Instant::now() + op_timeout;
        let client = loop {
            match open_client(&servers, session_timeout).await {
                Ok(c) => break c,
                Err(e) if Instant::now() >= deadline => {
                    return Err(RegistryError::Connect {
                        servers,
                        reason: format!("{e} (gave up after {:.1} s)", op_timeout.as_secs_f64()),
                    })
                }
                Err(e) => {
                    debug!(%servers, error = %e, "ZooKeeper connect failed; retrying");
                    sleep(RETRY_PAUSE).await;
                }
            }
        };
        let session = Arc::new(Session::new(client, 0));
        info!(
            %servers,
            session = %format_args!("{:#x}", session.id),
            timeout_ms = session.client.session_timeout().as_millis() as u64,
            "ZooKeeper session open"
        );
        let inner = Arc::new(Inner {
            url: url.clone(),
            servers,
            requested_timeout: session_timeout,
            op_timeout,
            session: watch::channel(session).0,
            generation: watch::channel(0).0,
            members: Mutex::new(BTreeMap::new()),
            old_sessions: Mutex::new(VecDeque::new()),
            reg_lock: tokio::sync::Mutex::new(()),
            shutdown: shutdown_rx,
        });
        let base = inner.url.path.clone();
        inner
            .retry("create", &base, |s| mkdir(s, base.clone()))
            .await?;
        tokio::spawn(supervise(inner.clone()));
        Ok(ZkRegistry {
            inner,
            _guard: Arc::new(ShutdownGuard { _tx: shutdown_tx }),
        })
    }

    /// The URL this registry was opened with.
    pub fn url(&self) -> &RegistryUrl {
        &self.inner.url
    }

    /// The current session's id (changes when a lost session is replaced).
    pub fn session_id(&self) -> i64 {
        self.inner.session.borrow().id
    }

    /// The session time-out the server granted (it clamps the requested one to
    /// 2..20 x its tickTime).
    pub fn session_timeout(&self) -> Duration {
        self.inner.session.borrow().client.session_timeout()
    }

    /// How long a foreground operation retries through lost connections and sessions.
    pub fn op_timeout(&self) -> Duration {
        self.inner.op_timeout
    }

    /// Registers `member` in `run`: the ephemeral znode `/PATH/<run>/<epn|flp>/<id>` holding
    /// its address. From then on it is re-registered on every new session, until
    /// [`ZkRegistry::deregister`] or the registry is dropped. See the module doc for stale znodes.
    pub async fn register(&self, run: &str, member: Member) -> Result<()> {
        check_run(run)?;
        let path = self.inner.member_path(run, member.role, member.id);
        self.inner
            .members
            .lock()
            .unwrap()
            .insert(path.clone(), member.addr.clone());
        let deadline = Instant::now() + self.inner.op_timeout;
        match ensure_member(&self.inner, &path, &member.addr, Mode::Foreground(deadline)).await {
            Ok(()) => {
                info!(servers = %self.inner.servers, %path, addr = %member.addr, "registered {member}");
                Ok(())
            }
            Err(e) => {
                let mut members = self.inner.members.lock().unwrap();
                if members.get(&path) == Some(&member.addr) {
                    members.remove(&path);
                }
                Err(e)
            }
        }
    }

    /// Removes a member registered through this registry (its znode is deleted if this
    /// session holds it) and stops re-registering it.
    pub async fn deregister(&self, run: &str, role: Role, id: u32) -> Result<()> {
        check_run(run)?;
        let path = self.inner.member_path(run, role, id);
        let _lock = self.inner.reg_lock.lock().await;
        self.inner.members.lock().unwrap().remove(&path);
        let p = path.clone();
        self.inner
            .retry("delete", &path, move |s| {
                let p = p.clone();
                async move {
                    match s.client.get_data(&p).await {
                        Ok((_, stat)) if stat.ephemeral_owner == s.id => {
                            match s.client.delete(&p, Some(stat.version)).await {
                                Ok(()) | Err(zkc::Error::NoNode) => Ok(()),
                                Err(e) => Err(e),
                            }
                        }
                        Ok(_) | Err(zkc::Error::NoNode) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            })
            .await?;
        info!(servers = %self.inner.servers, %path, "deregistered");
        Ok(())
    }

    /// Watches `run`'s membership. Returns once the first full snapshot (both roles, with
    /// addresses) was read; a background task then publishes a new snapshot whenever it
    /// changes. It re-arms its watches on every event, after errors, reconnections and
    /// session replacement, and stops when the receiver (and its clones) are dropped.
    /// Compare snapshots with [`super::diff`].
    pub async fn watch(&self, run: &str) -> Result<watch::Receiver<Membership>> {
        check_run(run)?;
        let (tx, rx) = watch::channel(Membership::default());
        let (first_tx, first_rx) = oneshot::channel();
        tokio::spawn(watch_membership(
            self.inner.clone(),
            run.to_string(),
            tx,
            first_tx,
        ));
        match tokio::time::timeout(self.inner.op_timeout, first_rx).await {
            Ok(Ok(())) => Ok(rx),
            _ => Err(self.inner.other(format!(
                "no membership snapshot of {} within {:.1} s",
                self.inner.run_path(run),
                self.inner.op_timeout.as_secs_f64()
            ))),
        }
    }

    /// The current leader ICN's address for `run`, if one is elected.
    pub async fn leader(&self, run: &str) -> Result<Option<String>> {
        check_run(run)?;
        self.text(self.inner.leader_path(run)).await
    }

    /// `run`'s state znode (see `icn::run_state`), if any ICN wrote one.
    pub async fn run_state(&self, run: &str) -> Result<Option<String>> {
        check_run(run)?;
        self.text(self.inner.state_path(run)).await
    }

    /// A znode's data as text (None: no such znode), retried across lost connections.
    async fn text(&self, path: String) -> Result<Option<String>> {
        let p = path.clone();
        self.inner
            .retry("get", &path, move |s| {
                let p = p.clone();
                async move {
                    match s.client.get_data(&p).await {
                        Ok((data, _)) => Ok(Some(utf8(&data))),
                        Err(zkc::Error::NoNode) => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            })
            .await
    }

    /// Watches `run`'s leader: the current ICN's address, `None` while there is none.
    /// Returns after the first read; the task stops when the receivers are dropped.
    pub async fn watch_leader(&self, run: &str) -> Result<watch::Receiver<Option<String>>> {
        check_run(run)?;
        let (tx, rx) = watch::channel(None);
        let (first_tx, first_rx) = oneshot::channel();
        tokio::spawn(watch_leader(
            self.inner.clone(),
            self.inner.leader_path(run),
            tx,
            first_tx,
        ));
        match tokio::time::timeout(self.inner.op_timeout, first_rx).await {
            Ok(Ok(())) => Ok(rx),
            _ => Err(self.inner.other(format!(
                "could not read {} within {:.1} s",
                self.inner.leader_path(run),
                self.inner.op_timeout.as_secs_f64()
            ))),
        }
    }

    /// Becomes `run`'s leader ICN, advertising `addr`: creates the ephemeral
    /// `/PATH/<run>/icn`. While another ICN leads, waits (a watch, no polling) until its
    /// znode disappears, then tries again; returns only when elected (or on a fatal error).
    /// A leader znode of an earlier session of this registry is deleted at once.
    pub async fn elect(&self, run: &str, addr: &str) -> Result<Leadership> {
        check_run(run)?;
        let inner = &self.inner;
        let path = inner.leader_path(run);
        let mut sessions = inner.session.subscribe();
        let mut shutdown = inner.shutdown.clone();
        let mut announced = None;
        loop {
            let s = sessions.borrow_and_update().clone();
            let outcome = try_elect(inner, &s, run, &path, addr).await;
            match outcome {
                Ok(Elect::Again) => {}
                Ok(Elect::Won) => {
                    info!(servers = %inner.servers, %path, %addr, "elected leader");
                    return Ok(Leadership {
                        registry: self.clone(),
                        run: run.to_string(),
                        path,
                        addr: addr.to_string(),
                        session: Arc::downgrade(&s),
                        session_id: s.id,
                        generation: s.generation,
                        state: s.client.state_watcher(),
                    });
                }
                Ok(Elect::Standby(leader, watcher)) => {
                    if announced.as_ref() != Some(&leader) {
                        info!(servers = %inner.servers, %path, %leader, "standing by: another ICN leads");
                        announced = Some(leader);
                    }
                    drop(s);
                    tokio::select! {
                        ev = watcher.changed() => debug!(?ev, "leader znode changed"),
                        _ = sessions.changed() => {}
                        _ = shutdown.changed() => return Err(inner.closed()),
                    }
                }
                Err(e) => match classify(&e) {
                    Class::Fatal => return Err(inner.zk_err("create", &path, e)),
                    Class::Session => {
                        drop(s);
                        tokio::select! {
                            _ = sessions.changed() => {}
                            _ = shutdown.changed() => return Err(inner.closed()),
                        }
                    }
                    Class::Transient => sleep(RETRY_PAUSE).await,
                },
            }
        }
    }

    /// Reserves `block` TF ids for `run`: advances the persistent counter
    /// `/PATH/<run>/tf_hwm` by compare-and-set and returns the ids it skipped over. Blocks
    /// never overlap, whoever reserves them. Prefer [`Leadership::reserve_tf_ids`] in an ICN.
    pub async fn reserve_tf_ids(&self, run: &str, block: u64) -> Result<Range<u64>> {
        check_run(run)?;
        check_block(block)?;
        let path = self.inner.hwm_path(run);
        let run_path = self.inner.run_path(run);
        let deadline = Instant::now() + self.inner.op_timeout;
        let mut sessions = self.inner.session.subscribe();
        loop {
            let s = sessions.borrow_and_update().clone();
            match reserve_once(&s, &path, &run_path, block).await {
                Ok(Some(range)) => return Ok(range),
                Ok(None) => continue,
                Err(Reserve::Corrupt(value)) => {
                    return Err(RegistryError::Corrupt {
                        servers: self.inner.servers.clone(),
                        path,
                        value,
                    })
                }
                Err(Reserve::Zk(e)) => {
                    let class = classify(&e);
                    if class == Class::Fatal || Instant::now() >= deadline {
                        return Err(self.inner.zk_err("set", &path, e));
                    }
                    drop(s);
                    self.inner.pause(class, &mut sessions, deadline).await?;
                }
            }
        }
    }
}

/// This ICN's leadership of a run. Drop it (or [`Leadership::resign`]) when the ICN stops.
pub struct Leadership {
    registry: ZkRegistry,
    run: String,
    path: String,
    addr: String,
    session: Weak<Session>,
    session_id: i64,
    generation: u64,
    state: zkc::StateWatcher,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("path", &self.path)
            .field("addr", &self.addr)
            .field("session", &format_args!("{:#x}", self.session_id))
            .finish()
    }
}

impl Leadership {
    pub fn run(&self) -> &str {
        &self.run
    }

    /// The address this leader advertises.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The id of the session holding the leader znode.
    pub fn session_id(&self) -> i64 {
        self.session_id
    }

    /// True while the session that won the election is the registry's current one and
    /// has not ended. Once false, it never becomes true again.
    pub fn is_leader(&self) -> bool {
        self.registry.inner.session.borrow().generation == self.generation
            && !self.state.peek_state().is_terminated()
    }

    /// Resolves when this leadership is lost: the session that holds the leader znode
    /// expired, was closed, or was abandoned after being disconnected for about the session
    /// timeout. The ICN must then stop acting as leader (it may `elect` again as a standby).
    /// The future owns what it needs (`'static`), so it can be spawned or kept in a select loop.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        // Holds nothing that keeps the session open, and also fires when the registry closes.
        let mut generations = self.registry.inner.generation.subscribe();
        let mut shutdown = self.registry.inner.shutdown.clone();
        let mut state = self.state.clone();
        let generation = self.generation;
        async move {
            loop {
                if *generations.borrow_and_update() != generation
                    || state.peek_state().is_terminated()
                {
                    return;
                }
                tokio::select! {
                    r = generations.changed() => if r.is_err() { return },
                    s = state.changed() => if s.is_terminated() { return },
                    _ = shutdown.changed() => return,
                }
            }
        }
    }

    /// Reserves `block` TF ids (see [`ZkRegistry::reserve_tf_ids`]) through the leader's own
    /// session only: it fails once the leadership is lost, so a deposed ICN cannot reserve.
    pub async fn reserve_tf_ids(&self, block: u64) -> Result<Range<u64>> {
        check_block(block)?;
        let inner = &self.registry.inner;
        let path = inner.hwm_path(&self.run);
        let run_path = inner.run_path(&self.run);
        let deadline = Instant::now() + inner.op_timeout;
        loop {
            let s = match self.session.upgrade() {
                Some(s) if self.is_leader() => s,
                _ => return Err(self.not_leader()),
            };
            match reserve_once(&s, &path, &run_path, block).await {
                Ok(Some(range)) => return Ok(range),
                Ok(None) => continue,
                Err(Reserve::Corrupt(value)) => {
                    return Err(RegistryError::Corrupt {
                        servers: inner.servers.clone(),
                        path,
                        value,
                    })
                }
                Err(Reserve::Zk(e)) => match classify(&e) {
                    Class::Transient if Instant::now() < deadline => sleep(RETRY_PAUSE).await,
                    Class::Session => return Err(self.not_leader()),
                    _ => return Err(inner.zk_err("set", &path, e)),
                },
            }
        }
    }

    /// The run's state znode `/PATH/<run>/state` (its data and version), read through
    /// the leader's own session.
    pub async fn run_state(&self) -> Result<Option<(String, i32)>> {
        let path = self.registry.inner.state_path(&self.run);
        let s = self.own_session()?;
        match s.client.get_data(&path).await {
            Ok((data, stat)) => Ok(Some((utf8(&data), stat.version))),
            Err(zkc::Error::NoNode) => Ok(None),
            Err(e) => Err(self.registry.inner.zk_err("get", &path, e)),
        }
    }

    /// Writes the run's state znode through the leader's own session: created when
    /// `version` is None, else only over that version. So it fails once the leadership
    /// is lost, or after another leader wrote it: a deposed ICN is fenced.
    pub async fn set_run_state(&self, data: &str, version: Option<i32>) -> Result<i32> {
        let inner = &self.registry.inner;
        let path = inner.state_path(&self.run);
        let s = self.own_session()?;
        let Some(v) = version else {
            let made = s.client.create(&path, data.as_bytes(), &persistent()).await;
            let made = match made {
                Err(zkc::Error::NoNode) => {
                    let run_path = inner.run_path(&self.run);
                    let _ = s.client.mkdir(&run_path, &persistent()).await;
                    s.client.create(&path, data.as_bytes(), &persistent()).await
                }
                other => other,
            };
            return match made {
                Ok((stat, _)) => Ok(stat.version),
                Err(e) => Err(inner.zk_err("create", &path, e)),
            };
        };
        match s.client.set_data(&path, data.as_bytes(), Some(v)).await {
            Ok(stat) => Ok(stat.version),
            Err(e) => Err(inner.zk_err("set", &path, e)),
        }
    }

    fn own_session(&self) -> Result<Arc<Session>> {
        match self.session.upgrade() {
            Some(s) if self.is_leader() => Ok(s),
            _ => Err(self.not_leader()),
        }
    }

    /// Gives the leadership up: deletes the leader znode if this session still holds it,
    /// so a standby takes over at once instead of after the session time-out.
    pub async fn resign(self) -> Result<()> {
        let Some(s) = self.session.upgrade() else {
            return Ok(());
        };
        if s.generation != self.registry.inner.session.borrow().generation {
            return Ok(());
        }
        let inner = &self.registry.inner;
        match s.client.get_data(&self.path).await {
            Ok((_, stat)) if stat.ephemeral_owner == s.id => {
                match s.client.delete(&self.path, Some(stat.version)).await {
                    Ok(()) | Err(zkc::Error::NoNode) | Err(zkc::Error::BadVersion) => {}
                    Err(e) => return Err(inner.zk_err("delete", &self.path, e)),
                }
            }
            Ok(_) | Err(zkc::Error::NoNode) => {}
            Err(e) => return Err(inner.zk_err("get", &self.path, e)),
        }
        info!(servers = %inner.servers, path = %self.path, "resigned leadership");
        Ok(())
    }

    fn not_leader(&self) -> RegistryError {
        self.registry.inner.other(format!(
            "{}: leadership of session {:#x} lost (fenced)",
            self.path, self.session_id
        ))
    }
}

impl Inner {
    fn run_path(&self, run: &str) -> String {
        format!("{}/{run}", self.url.path)
    }

    fn member_path(&self, run: &str, role: Role, id: u32) -> String {
        format!("{}/{run}/{}/{id}", self.url.path, role.dir())
    }

    fn leader_path(&self, run: &str) -> String {
        format!("{}/{run}/icn", self.url.path)
    }

    fn state_path(&self, run: &str) -> String {
        format!("{}/{run}/state", self.url.path)
    }

    fn hwm_path(&self, run: &str) -> String {
        format!("{}/{run}/tf_hwm", self.url.path)
    }

    fn zk_err(&self, op: &'static str, path: &str, source: zkc::Error) -> RegistryError {
        RegistryError::Zk {
            servers: self.servers.clone(),
            op,
            path: path.to_string(),
            source,
        }
    }

    fn other(&self, what: String) -> RegistryError {
        RegistryError::Other {
            servers: self.servers.clone(),
            what,
        }
    }

    fn closed(&self) -> RegistryError {
        RegistryError::Closed {
            servers: self.servers.clone(),
        }
    }

    fn was_ours(&self, owner: i64) -> bool {
        owner != 0 && self.old_sessions.lock().unwrap().contains(&owner)
    }

    fn is_member(&self, path: &str, addr: &str) -> bool {
        self.members.lock().unwrap().get(path).map(String::as_str) == Some(addr)
    }

    /// Waits before retrying after an error of class `class` (not `Fatal`): for the next
    /// session, or a short pause. Errors when the deadline passes or the registry closes.
    async fn pause(
        &self,
        class: Class,
        sessions: &mut watch::Receiver<Arc<Session>>,
        deadline: Instant,
    ) -> Result<()> {
        let mut shutdown = self.shutdown.clone();
        let wait = async {
            match class {
                Class::Session => {
                    sessions.changed().await.ok();
                }
                _ => sleep(RETRY_PAUSE).await,
            }
        };
        tokio::select! {
            _ = wait => Ok(()),
            _ = sleep_until(deadline) => Ok(()),
            _ = shutdown.changed() => Err(self.closed()),
        }
    }

    /// Runs `f` on the current session, retrying through lost connections and sessions
    /// until the operation time-out.
    async fn retry<T, F, Fut>(&self, op: &'static str, path: &str, mut f: F) -> Result<T>
    where
        F: FnMut(Arc<Session>) -> Fut,
        Fut: Future<Output = Result<T, zkc::Error>>,
    {
        let deadline = Instant::now() + self.op_timeout;
        let mut sessions = self.session.subscribe();
        loop {
            let s = sessions.borrow_and_update().clone();
            match f(s).await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let class = classify(&e);
                    if class == Class::Fatal || Instant::now() >= deadline {
                        return Err(self.zk_err(op, path, e));
                    }
                    debug!(servers = %self.servers, %path, error = %e, "{op} failed; retrying");
                    self.pause(class, &mut sessions, deadline).await?;
                }
            }
        }
    }
}

async fn open_client(servers: &str, timeout: Duration) -> Result<zkc::Client, zkc::Error> {
    zkc::Client::connector()
        .with_session_timeout(timeout)
        .connect(servers)
        .await
}

async fn mkdir(s: Arc<Session>, path: String) -> Result<(), zkc::Error> {
    s.client.mkdir(&path, &persistent()).await
}

fn utf8(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn check_run(run: &str) -> Result<()> {
    let bad = |reason| {
        Err(RegistryError::Invalid {
            what: "run name",
            value: run.to_string(),
            reason,
        })
    };
    if run.is_empty() {
        return bad("it is empty");
    }
    if run == "." || run == ".." {
        return bad("it is a relative path segment");
    }
    if run.contains('/') {
        return bad("it contains `/`");
    }
    if run.chars().any(|c| c.is_control()) {
        return bad("it contains a control character");
    }
    Ok(())
}

fn check_block(block: u64) -> Result<()> {
    if block == 0 {
        return Err(RegistryError::Invalid {
            what: "TF id block",
            value: "0".into(),
            reason: "it must be at least 1",
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Session supervision

/// Resolves with the reason when `s` is lost (see the module doc).
async fn session_lost(s: &Session) -> String {
    let grace = s.client.session_timeout() * 3 / 5;
    let mut watcher = s.client.state_watcher();
    let mut state = watcher.peek_state();
    loop {
        match state {
            st if st.is_terminated() => return format!("session {st}"),
            zkc::SessionState::Disconnected => {
                match tokio::time::timeout(grace, watcher.changed()).await {
                    Ok(st) => state = st,
                    Err(_) => return format!("disconnected for {} ms", grace.as_millis()),
                }
            }
            _ => state = watcher.changed().await,
        }
    }
}

async fn supervise(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.clone();
    loop {
        let old = inner.session.borrow().clone();
        let why = tokio::select! {
            why = session_lost(&old) => why,
            _ = shutdown.changed() => return,
        };
        warn!(
            servers = %inner.servers,
            session = %format_args!("{:#x}", old.id),
            "ZooKeeper session lost ({why}); opening a new one"
        );
        {
            let mut olds = inner.old_sessions.lock().unwrap();
            olds.push_back(old.id);
            if olds.len() > OLD_SESSIONS {
                olds.pop_front();
            }
        }
        let generation = old.generation + 1;
        drop(old);
        let mut backoff = Duration::from_millis(50);
        let client = loop {
            tokio::select! {
                r = open_client(&inner.servers, inner.requested_timeout) => match r {
                    Ok(c) => break c,
                    Err(e) => debug!(servers = %inner.servers, error = %e, "ZooKeeper reconnect failed; retrying"),
                },
                _ = shutdown.changed() => return,
            }
            tokio::select! {
                _ = sleep(backoff) => {}
                _ = shutdown.changed() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        };
        let session = Arc::new(Session::new(client, generation));
        let members: Vec<(String, String)> = inner
            .members
            .lock()
            .unwrap()
            .iter()
            .map(|(p, a)| (p.clone(), a.clone()))
            .collect();
        info!(
            servers = %inner.servers,
            session = %format_args!("{:#x}", session.id),
            members = members.len(),
            "new ZooKeeper session; re-registering members"
        );
        // Publish the old session's replacement (dropping the registry's reference to the
        // old client, which closes it once the tasks still using it let go).
        inner.session.send_replace(session);
        inner.generation.send_replace(generation);
        for (path, addr) in members {
            let inner = inner.clone();
            tokio::spawn(async move {
                if let Err(e) =
                    ensure_member(&inner, &path, &addr, Mode::Background(generation)).await
                {
                    warn!(servers = %inner.servers, %path, error = %e, "re-registration stopped");
                }
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// Member znodes

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `register`: give up at the deadline.
    Foreground(Instant),
    /// Re-registration on session `generation`: retry until done, superseded or closed.
    Background(u64),
}

enum Create {
    /// The znode holds our address on the current session.
    Done,
    /// Retry at once (the znode changed under us).
    Again,
    /// Another session holds it: wait for this watch.
    Foreign {
        owner: i64,
        addr: String,
        watcher: zkc::OneshotWatcher,
    },
    /// A persistent znode sits at a member's path.
    NotEphemeral,
}

/// Makes `path` an ephemeral znode of the current session holding `addr`.
async fn ensure_member(inner: &Inner, path: &str, addr: &str, mode: Mode) -> Result<()> {
    let mut sessions = inner.session.subscribe();
    let mut shutdown = inner.shutdown.clone();
    let mut waiting_since: Option<Instant> = None;
    loop {
        let s = sessions.borrow_and_update().clone();
        if let Mode::Background(generation) = mode {
            if s.generation != generation {
                return Ok(()); // the next session's re-registration takes over
            }
        }
        let outcome = {
            let _lock = inner.reg_lock.lock().await;
            if !inner.is_member(path, addr) {
                return Ok(()); // deregistered (or registered again with another address)
            }
            try_create_member(inner, &s, path, addr).await
        };
        let deadline = match mode {
            Mode::Foreground(d) => Some(d),
            Mode::Background(_) => None,
        };
        let expired = deadline.is_some_and(|d| Instant::now() >= d);
        match outcome {
            Ok(Create::Done) => return Ok(()),
            Ok(Create::Again) => continue,
            Ok(Create::NotEphemeral) => {
                return Err(inner.other(format!(
                    "{path} is a persistent znode, not a member registration: delete it"
                )))
            }
            Ok(Create::Foreign {
                owner,
                addr: theirs,
                watcher,
            }) => {
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if expired {
                    return Err(RegistryError::IdTaken {
                        servers: inner.servers.clone(),
                        path: path.to_string(),
                        owner,
                        addr: theirs,
                        waited_s: since.elapsed().as_secs_f64(),
                    });
                }
                if since.elapsed().is_zero() || matches!(mode, Mode::Background(_)) {
                    warn!(
                        servers = %inner.servers, %path, owner = %format_args!("{owner:#x}"), addr = %theirs,
                        "znode held by another session; waiting for it to vanish"
                    );
                }
                drop(s);
                let far = Instant::now() + Duration::from_secs(3600);
                tokio::select! {
                    _ = watcher.changed() => {}
                    _ = sessions.changed() => {}
                    _ = sleep_until(deadline.unwrap_or(far)) => {}
                    _ = shutdown.changed() => return Err(inner.closed()),
                }
            }
            Err(e) => {
                let class = classify(&e);
                if class == Class::Fatal || expired {
                    return Err(inner.zk_err("create", path, e));
                }
                debug!(servers = %inner.servers, %path, error = %e, "registration failed; retrying");
                drop(s);
                let d = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
                inner.pause(class, &mut sessions, d).await?;
            }
        }
    }
}

async fn try_create_member(
    inner: &Inner,
    s: &Session,
    path: &str,
    addr: &str,
) -> Result<Create, zkc::Error> {
    match s.client.create(path, addr.as_bytes(), &ephemeral()).await {
        Ok(_) => return Ok(Create::Done),
        Err(zkc::Error::NoNode) => {
            let parent = &path[..path.rfind('/').unwrap()];
            s.client.mkdir(parent, &persistent()).await?;
            return Ok(Create::Again);
        }
        Err(zkc::Error::NodeExists) => {}
        Err(e) => return Err(e),
    }
    let (data, stat, watcher) = match s.client.get_and_watch_data(path).await {
        Ok(x) => x,
        Err(zkc::Error::NoNode) => return Ok(Create::Again),
        Err(e) => return Err(e),
    };
    let owner = stat.ephemeral_owner;
    if owner == 0 {
        return Ok(Create::NotEphemeral);
    }
    if owner == s.id && data == addr.as_bytes() {
        return Ok(Create::Done);
    }
    if owner == s.id || inner.was_ours(owner) {
        // Ours: with an old address, or from an earlier session the server still holds.
        info!(
            servers = %inner.servers, %path, owner = %format_args!("{owner:#x}"),
            "deleting our own stale znode"
        );
        return match s.client.delete(path, Some(stat.version)).await {
            Ok(()) | Err(zkc::Error::NoNode) | Err(zkc::Error::BadVersion) => Ok(Create::Again),
            Err(e) => Err(e),
        };
    }
    Ok(Create::Foreign {
        owner,
        addr: utf8(&data),
        watcher,
    })
}

// ---------------------------------------------------------------------------------------
// Watches

/// Keeps `tx` at the latest membership of the run at `inner.run_path(run)`.
async fn watch_membership(
    inner: Arc<Inner>,
    run: String,
    tx: watch::Sender<Membership>,
    first: oneshot::Sender<()>,
) {
    let mut first = Some(first);
    let mut sessions = inner.session.subscribe();
    let mut shutdown = inner.shutdown.clone();
    let run_path = inner.run_path(&run);
    let mut pause = RETRY_PAUSE;
    loop {
        let s = sessions.borrow_and_update().clone();
        match scan_membership(&s, &run_path).await {
            Ok((snapshot, epn_watch, flp_watch)) => {
                pause = RETRY_PAUSE;
                let changed = tx.send_if_modified(|cur| {
                    if *cur == snapshot {
                        return false;
                    }
                    *cur = snapshot;
                    true
                });
                if changed {
                    let m = tx.borrow();
                    debug!(path = %run_path, epns = m.epns.len(), flps = m.flps.len(), "membership changed");
                }
                if let Some(f) = first.take() {
                    f.send(()).ok();
                }
                drop(s);
                tokio::select! {
                    ev = epn_watch.changed() => debug!(?ev, "EPN watch fired"),
                    ev = flp_watch.changed() => debug!(?ev, "FLP watch fired"),
                    _ = sessions.changed() => {}
                    _ = tx.closed() => return,
                    _ = shutdown.changed() => return,
                }
            }
            Err(e) => {
                let session_gone = classify(&e) == Class::Session;
                debug!(servers = %inner.servers, path = %run_path, error = %e, "membership scan failed; retrying");
                drop(s);
                tokio::select! {
                    _ = sleep(pause), if !session_gone => {}
                    _ = sessions.changed() => {}
                    _ = tx.closed() => return,
                    _ = shutdown.changed() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Reads both roles' children (arming a child watch on each directory) and their addresses.
async fn scan_membership(
    s: &Session,
    run_path: &str,
) -> Result<(Membership, zkc::OneshotWatcher, zkc::OneshotWatcher), zkc::Error> {
    let mut snapshot = Membership::default();
    let mut watchers = Vec::with_capacity(2);
    for role in Role::ALL {
        let dir = format!("{run_path}/{}", role.dir());
        let (children, _, watcher) = match s.client.get_and_watch_children(&dir).await {
            Ok(x) => x,
            Err(zkc::Error::NoNode) => {
                s.client.mkdir(&dir, &persistent()).await?;
                s.client.get_and_watch_children(&dir).await?
            }
            Err(e) => return Err(e),
        };
        watchers.push(watcher);
        let mut ids = Vec::with_capacity(children.len());
        for child in &children {
            match child.parse::<u32>() {
                Ok(id) if id.to_string() == *child => ids.push(id),
                _ => warn!(%dir, %child, "ignoring a znode that is not a member id"),
            }
        }
        // Requests are sent when the futures are created: all reads are in flight at once.
        let reads: Vec<_> = ids
            .iter()
            .map(|id| s.client.get_data(&format!("{dir}/{id}")))
            .collect();
        let members = snapshot.of_mut(role);
        for (id, read) in ids.into_iter().zip(reads) {
            match read.await {
                Ok((data, stat)) => {
                    members.insert(
                        id,
                        Registered {
                            addr: utf8(&data),
                            incarnation: stat.czxid,
                        },
                    );
                }
                // Gone since the listing: the child watch has fired already.
                Err(zkc::Error::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
    }
    let flp = watchers.pop().unwrap();
    let epn = watchers.pop().unwrap();
    Ok((snapshot, epn, flp))
}

/// Keeps `tx` at the address in the leader znode `path` (`None` while absent).
async fn watch_leader(
    inner: Arc<Inner>,
    path: String,
    tx: watch::Sender<Option<String>>,
    first: oneshot::Sender<()>,
) {
    let mut first = Some(first);
    let mut sessions = inner.session.subscribe();
    let mut shutdown = inner.shutdown.clone();
    loop {
        let s = sessions.borrow_and_update().clone();
        let read = async {
            match s.client.get_and_watch_data(&path).await {
                Ok((data, _, w)) => Ok((Some(utf8(&data)), w)),
                Err(zkc::Error::NoNode) => match s.client.check_and_watch_stat(&path).await? {
                    (None, w) => Ok((None, w)),
                    (Some(_), _) => Err(zkc::Error::ConnectionLoss), // created meanwhile: read again
                },
                Err(e) => Err(e),
            }
        }
        .await;
        match read {
            Ok((leader, watcher)) => {
                tx.send_if_modified(|cur| {
                    if *cur == leader {
                        return false;
                    }
                    info!(%path, leader = ?leader, "leader changed");
                    *cur = leader;
                    true
                });
                if let Some(f) = first.take() {
                    f.send(()).ok();
                }
                drop(s);
                tokio::select! {
                    _ = watcher.changed() => {}
                    _ = sessions.changed() => {}
                    _ = tx.closed() => return,
                    _ = shutdown.changed() => return,
                }
            }
            Err(e) => {
                let session_gone = classify(&e) == Class::Session;
                drop(s);
                tokio::select! {
                    _ = sleep(RETRY_PAUSE), if !session_gone => {}
                    _ = sessions.changed() => {}
                    _ = tx.closed() => return,
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Leader election

enum Elect {
    /// This session holds the leader znode.
    Won,
    /// The znode changed under us: try again at once.
    Again,
    /// Another ICN (this address) leads: wait for the watch.
    Standby(String, zkc::OneshotWatcher),
}

/// One election attempt on session `s`.
async fn try_elect(
    inner: &Inner,
    s: &Session,
    run: &str,
    path: &str,
    addr: &str,
) -> Result<Elect, zkc::Error> {
    match s.client.create(path, addr.as_bytes(), &ephemeral()).await {
        Ok(_) => return Ok(Elect::Won),
        Err(zkc::Error::NoNode) => {
            s.client.mkdir(&inner.run_path(run), &persistent()).await?;
            return Ok(Elect::Again);
        }
        Err(zkc::Error::NodeExists) => {}
        Err(e) => return Err(e),
    }
    let (data, stat, watcher) = match s.client.get_and_watch_data(path).await {
        Ok(x) => x,
        Err(zkc::Error::NoNode) => return Ok(Elect::Again),
        Err(e) => return Err(e),
    };
    let owner = stat.ephemeral_owner;
    if owner == s.id && data == addr.as_bytes() {
        return Ok(Elect::Won); // a create whose reply was lost
    }
    if owner == s.id || inner.was_ours(owner) {
        info!(servers = %inner.servers, %path, owner = %format_args!("{owner:#x}"), "deleting a leader znode of ours");
        return match s.client.delete(path, Some(stat.version)).await {
            Ok(()) | Err(zkc::Error::NoNode) | Err(zkc::Error::BadVersion) => Ok(Elect::Again),
            Err(e) => Err(e),
        };
    }
    Ok(Elect::Standby(utf8(&data), watcher))
}

// ---------------------------------------------------------------------------------------
// TF-id high-water mark

enum Reserve {
    Zk(zkc::Error),
    Corrupt(String),
}

impl From<zkc::Error> for Reserve {
    fn from(e: zkc::Error) -> Self {
        Reserve::Zk(e)
    }
}

/// One compare-and-set attempt: `Ok(None)` = lost a race, try again.
async fn reserve_once(
    s: &Session,
    path: &str,
    run_path: &str,
    block: u64,
) -> Result<Option<Range<u64>>, Reserve> {
    match s.client.get_data(path).await {
        Ok((data, stat)) => {
            let text = utf8(&data);
            let cur: u64 = text
                .trim()
                .parse()
                .map_err(|_| Reserve::Corrupt(text.clone()))?;
            let next = cur
                .checked_add(block)
                .ok_or_else(|| Reserve::Corrupt(text.clone()))?;
            match s
                .client
                .set_data(path, next.to_string().as_bytes(), Some(stat.version))
                .await
            {
                Ok(_) => Ok(Some(cur..next)),
                Err(zkc::Error::BadVersion) | Err(zkc::Error::NoNode) => Ok(None),
                Err(e) => Err(e.into()),
            }
        }
        Err(zkc::Error::NoNode) => match s
            .client
            .create(path, block.to_string().as_bytes(), &persistent())
            .await
        {
            Ok(_) => Ok(Some(0..block)),
            Err(zkc::Error::NodeExists) => Ok(None),
            Err(zkc::Error::NoNode) => {
                s.client.mkdir(run_path, &persistent()).await?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}
