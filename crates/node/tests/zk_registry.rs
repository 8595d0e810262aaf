//! ZooKeeper registry against a real, private ZooKeeper server per test (Debian's zkServer.sh):
//! membership watches, crash and expiry recovery, server restarts, leader election, TF-id blocks.
//!
//! Each test starts its own server (`ZkServer`, tickTime 200 ms) and fails, naming the
//! reason, if it cannot. `child_process` is not a test of its own: tests run this binary
//! again as a member or leader process, then SIGKILL it, or SIGSTOP it for longer than the
//! session time-out so that the server expires its session while it cannot heartbeat.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fanin_node::registry::zk_server::ZkServer;
use fanin_node::registry::{
    diff, Change, Member, Membership, RegistryError, RegistryUrl, Role, ZkRegistry,
};
use tokio::sync::watch;

const TICK: Duration = Duration::from_millis(200);
/// Session time-out of the registries under test (10 ticks).
const SESSION: Duration = Duration::from_secs(2);
/// How late past its session time-out an expiry may be seen: the server expires sessions
/// on its ticks, and a loaded 2-core CI machine delays its JVM and our watcher.
const EXPIRY_SLACK: Duration = Duration::from_secs(4);
/// Upper bound for anything that should happen "promptly".
const PROMPT: Duration = Duration::from_secs(10);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_test_writer()
        .try_init();
}

fn start_server() -> ZkServer {
    init_tracing();
    match ZkServer::start(TICK) {
        Ok(s) => s,
        Err(e) => panic!("cannot start the test ZooKeeper server: {e:#}"),
    }
}

async fn connect(server: &ZkServer) -> ZkRegistry {
    let url = RegistryUrl::parse(&server.url("/fanin-test")).unwrap();
    ZkRegistry::connect(&url, SESSION)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn epn(id: u32, addr: &str) -> Member {
    Member::new(Role::Epn, id, addr)
}

fn flp(id: u32, addr: &str) -> Member {
    Member::new(Role::Flp, id, addr)
}

/// Waits until the published snapshot satisfies `pred`; returns it.
async fn wait_until(
    rx: &mut watch::Receiver<Membership>,
    within: Duration,
    what: &str,
    pred: impl Fn(&Membership) -> bool,
) -> Membership {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        {
            let m = rx.borrow_and_update();
            if pred(&m) {
                return m.clone();
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("membership watch ended while waiting for {what}"),
            Err(_) => panic!(
                "timed out after {within:?} waiting for {what}; last snapshot {:?}",
                *rx.borrow()
            ),
        }
    }
}

/// The owner session of a znode, read with a plain client.
async fn owner_of(server: &ZkServer, path: &str) -> Option<i64> {
    let c = zookeeper_client::Client::connect(&server.connect_string())
        .await
        .unwrap();
    match c.get_data(path).await {
        Ok((_, stat)) => Some(stat.ephemeral_owner),
        Err(zookeeper_client::Error::NoNode) => None,
        Err(e) => panic!("get {path}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_joins_and_leaves_with_addresses() {
    let server = start_server();
    let watcher = connect(&server).await;
    let nodes = connect(&server).await;
    let mut rx = watcher.watch("run1").await.unwrap();
    assert!(rx.borrow_and_update().is_empty());

    nodes
        .register("run1", epn(1, "10.0.0.11:5555"))
        .await
        .unwrap();
    nodes
        .register("run1", flp(0, "10.0.0.20:6000"))
        .await
        .unwrap();
    let m1 = wait_until(&mut rx, PROMPT, "EPN 1 and FLP 0", |m| {
        m.epns.len() == 1 && m.flps.len() == 1
    })
    .await;
    assert_eq!(m1.addr(Role::Epn, 1), Some("10.0.0.11:5555"));
    assert_eq!(m1.addr(Role::Flp, 0), Some("10.0.0.20:6000"));
    assert_eq!(
        diff(&Membership::default(), &m1),
        vec![
            Change::Joined(epn(1, "10.0.0.11:5555")),
            Change::Joined(flp(0, "10.0.0.20:6000"))
        ]
    );

    // Registering the same member again is a no-op; with a new address, a restart.
    nodes
        .register("run1", epn(1, "10.0.0.11:5555"))
        .await
        .unwrap();
    nodes
        .register("run1", epn(1, "10.0.0.11:7777"))
        .await
        .unwrap();
    let m2 = wait_until(&mut rx, PROMPT, "EPN 1's new address", |m| {
        m.addr(Role::Epn, 1) == Some("10.0.0.11:7777")
    })
    .await;
    assert_eq!(
        diff(&m1, &m2),
        vec![
            Change::Left(epn(1, "10.0.0.11:5555")),
            Change::Joined(epn(1, "10.0.0.11:7777"))
        ]
    );

    // An explicit leave, and a leave by closing the session (dropping the registry).
    nodes
        .register("run1", epn(2, "10.0.0.12:5555"))
        .await
        .unwrap();
    wait_until(&mut rx, PROMPT, "EPN 2", |m| m.epns.contains_key(&2)).await;
    nodes.deregister("run1", Role::Epn, 1).await.unwrap();
    let m3 = wait_until(&mut rx, PROMPT, "EPN 1 leaving", |m| {
        !m.epns.contains_key(&1)
    })
    .await;
    assert_eq!(m3.addr(Role::Epn, 2), Some("10.0.0.12:5555"));
    let closed = Instant::now();
    drop(nodes);
    wait_until(&mut rx, PROMPT, "everyone leaving", |m| m.is_empty()).await;
    assert!(
        closed.elapsed() < SESSION,
        "a closed session's znodes vanish at once, took {:?}",
        closed.elapsed()
    );

    // Other runs are separate.
    let other = watcher.watch("run2").await.unwrap();
    assert!(other.borrow().is_empty());
}

/// Run by the tests below as a separate process (`FANIN_ZK_CHILD=member|leader`); a no-op
/// when run as a test. `member` registers EPN 7 and waits to be killed. `leader` is elected
/// for run `ld`, reserves two TF-id blocks, waits for `lost()`, checks that it can no longer
/// reserve, and exits. It prints `CHILD <event>` lines for the parent.
#[test]
#[ignore = "helper process for other tests"]
fn child_process() {
    let Ok(mode) = std::env::var("FANIN_ZK_CHILD") else {
        return;
    };
    if mode == "server" {
        let server = ZkServer::start(TICK).unwrap();
        println!("CHILD server {}", server.pid().unwrap());
        loop {
            std::thread::park();
        }
    }
    let url = RegistryUrl::parse(&std::env::var("FANIN_ZK_CHILD_URL").unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let reg = ZkRegistry::connect(&url, SESSION).await.unwrap();
        match mode.as_str() {
            "member" => {
                reg.register("child", epn(7, "child:7")).await.unwrap();
                println!("CHILD registered {:#x}", reg.session_id());
                std::future::pending::<()>().await;
            }
            "leader" => {
                let l = reg.elect("ld", "icn-child:7000").await.unwrap();
                let a = l.reserve_tf_ids(100).await.unwrap();
                let b = l.reserve_tf_ids(100).await.unwrap();
                println!(
                    "CHILD elected {}..{} {}..{}",
                    a.start, a.end, b.start, b.end
                );
                tokio::time::timeout(Duration::from_secs(60), l.lost())
                    .await
                    .expect("lost() within 60 s");
                assert!(!l.is_leader());
                let err = l.reserve_tf_ids(100).await.unwrap_err().to_string();
                assert!(
                    err.contains("leadership") && err.contains("/ld/icn"),
                    "{err}"
                );
                println!("CHILD lost");
            }
            other => panic!("unknown FANIN_ZK_CHILD={other}"),
        }
    });
}

/// A child process of this test binary and the `CHILD ...` lines it prints.
struct ChildProc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl ChildProc {
    fn spawn(server: &ZkServer, mode: &str) -> ChildProc {
        ChildProc::spawn_url(&server.url("/fanin-test"), mode)
    }

    fn spawn_url(url: &str, mode: &str) -> ChildProc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "child_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FANIN_ZK_CHILD", mode)
            .env("FANIN_ZK_CHILD_URL", url)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the child process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The first line also carries the harness's "test child_process ... ".
                if let Some(i) = line.find("CHILD ") {
                    if tx.send(line[i + 6..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        ChildProc { child, lines }
    }

    /// The next `CHILD` line (blocking; call from `block_in_place`).
    fn line(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("no line from the child process within {within:?}: {e}"))
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.child.id());
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_member_vanishes_within_the_session_timeout() {
    let server = start_server();
    let watcher = connect(&server).await;
    let mut rx = watcher.watch("child").await.unwrap();

    let mut child = ChildProc::spawn(&server, "member");
    tokio::task::block_in_place(|| child.line(Duration::from_secs(30)));
    let m = wait_until(&mut rx, PROMPT, "the child's EPN 7", |m| {
        m.epns.contains_key(&7)
    })
    .await;
    let child_incarnation = m.epns[&7].incarnation;

    // The same EPN restarts at once (new process, new address) while its dead session lives on.
    child.child.kill().unwrap();
    let killed = Instant::now();
    child.child.wait().unwrap();
    let restarted = connect(&server).await;
    restarted
        .register("child", epn(7, "child:7-again"))
        .await
        .unwrap();
    let waited = killed.elapsed();

    let before = Membership {
        epns: [(7, m.epns[&7].clone())].into_iter().collect(),
        ..Membership::default()
    };
    let after = wait_until(&mut rx, PROMPT, "the restarted EPN 7", |m| {
        m.addr(Role::Epn, 7) == Some("child:7-again")
    })
    .await;
    assert_ne!(after.epns[&7].incarnation, child_incarnation);
    assert_eq!(
        diff(&before, &after),
        vec![
            Change::Left(epn(7, "child:7")),
            Change::Joined(epn(7, "child:7-again"))
        ]
    );

    // The dead session's znode went only when the server expired it: about one session
    // time-out after the kill (expiry is checked every tick), not at once.
    let timeout = watcher.session_timeout();
    println!(
        "crashed member: znode replaced {waited:?} after SIGKILL (session time-out {timeout:?})"
    );
    assert!(
        waited >= timeout / 2,
        "replaced after {waited:?}: too early for an expiry of {timeout:?}"
    );
    assert!(
        waited <= timeout + EXPIRY_SLACK,
        "replaced after {waited:?}, session time-out {timeout:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_member_expires_then_reregisters_under_the_same_id() {
    let server = start_server();
    let watcher = connect(&server).await;
    let mut rx = watcher.watch("child").await.unwrap();
    let child = ChildProc::spawn(&server, "member");
    let line = tokio::task::block_in_place(|| child.line(Duration::from_secs(30)));
    let old_session = i64::from_str_radix(line.trim_start_matches("registered 0x"), 16).unwrap();
    let before = wait_until(&mut rx, PROMPT, "the child's EPN 7", |m| {
        m.epns.contains_key(&7)
    })
    .await;
    assert_eq!(
        owner_of(&server, "/fanin-test/child/epn/7").await,
        Some(old_session)
    );

    // Stopped, the child cannot heartbeat: the server expires its session and its znode.
    child.signal("-STOP");
    let stopped = Instant::now();
    wait_until(&mut rx, PROMPT, "EPN 7 expiring", |m| {
        !m.epns.contains_key(&7)
    })
    .await;
    let gone = stopped.elapsed();
    let timeout = watcher.session_timeout();
    println!("stopped member: znode gone {gone:?} after SIGSTOP (session time-out {timeout:?})");
    assert!(
        gone >= timeout / 2 && gone <= timeout + EXPIRY_SLACK,
        "gone after {gone:?}"
    );

    // Continued, it finds its session expired, opens a new one and registers again.
    child.signal("-CONT");
    let continued = Instant::now();
    let after = wait_until(&mut rx, PROMPT, "EPN 7 re-registered", |m| {
        m.epns.contains_key(&7)
    })
    .await;
    println!(
        "stopped member: re-registered {:?} after SIGCONT",
        continued.elapsed()
    );
    assert_eq!(after.addr(Role::Epn, 7), Some("child:7"));
    assert_ne!(after.epns[&7].incarnation, before.epns[&7].incarnation);
    let owner = owner_of(&server, "/fanin-test/child/epn/7").await;
    assert!(
        owner.is_some_and(|o| o != old_session),
        "owner {owner:?}, old session {old_session:#x}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_duplicate_id_is_refused_naming_the_znode() {
    let server = start_server();
    let a = connect(&server).await;
    let b = connect(&server).await;
    a.register("dup", epn(9, "first")).await.unwrap();
    let started = Instant::now();
    let err = b.register("dup", epn(9, "second")).await.unwrap_err();
    assert!(matches!(err, RegistryError::IdTaken { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("/fanin-test/dup/epn/9") && msg.contains("`first`") && !msg.contains('\n'),
        "{msg}"
    );
    assert!(started.elapsed() >= b.op_timeout() - Duration::from_millis(100));
    // b does not keep trying in the background: once a leaves, nothing takes its place.
    let mut rx = b.watch("dup").await.unwrap();
    drop(a);
    wait_until(&mut rx, PROMPT, "EPN 9 leaving", |m| m.is_empty()).await;
    tokio::time::sleep(TICK * 3).await;
    assert!(rx.borrow().is_empty());
}

/// Restarts the server (same data dir and port) with `outage` between stop and start,
/// during a watch; the watch continues and members stay or come back.
async fn watch_across_a_server_restart(outage: Duration) {
    let mut server = start_server();
    let watcher = connect(&server).await;
    let node = connect(&server).await;
    let mut rx = watcher.watch("zkr").await.unwrap();
    node.register("zkr", epn(1, "e1")).await.unwrap();
    wait_until(&mut rx, PROMPT, "EPN 1", |m| m.epns.contains_key(&1)).await;

    tokio::task::block_in_place(|| server.stop()).unwrap();
    tokio::time::sleep(outage).await;
    let restart = Instant::now();
    tokio::task::block_in_place(|| server.restart()).unwrap_or_else(|e| panic!("{e:#}"));
    println!(
        "server restarted after {outage:?} down, in {:?}",
        restart.elapsed()
    );

    node.register("zkr", epn(2, "e2")).await.unwrap();
    node.register("zkr", flp(0, "f0")).await.unwrap();
    let m = wait_until(
        &mut rx,
        PROMPT,
        "EPN 1, EPN 2 and FLP 0 after the restart",
        |m| m.epns.contains_key(&1) && m.epns.contains_key(&2) && m.flps.contains_key(&0),
    )
    .await;
    assert_eq!(m.addr(Role::Epn, 1), Some("e1"));
    // Every member znode belongs to the node's current session (stale ones were replaced).
    for path in [
        "/fanin-test/zkr/epn/1",
        "/fanin-test/zkr/epn/2",
        "/fanin-test/zkr/flp/0",
    ] {
        let deadline = Instant::now() + PROMPT;
        while owner_of(&server, path).await != Some(node.session_id()) {
            assert!(
                Instant::now() < deadline,
                "{path} not owned by the current session"
            );
            tokio::time::sleep(TICK).await;
        }
    }
    node.deregister("zkr", Role::Epn, 1).await.unwrap();
    wait_until(&mut rx, PROMPT, "EPN 1 leaving after the restart", |m| {
        !m.epns.contains_key(&1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_continues_across_a_quick_server_restart() {
    watch_across_a_server_restart(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_continues_across_a_server_outage_longer_than_the_session() {
    watch_across_a_server_restart(SESSION + Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_when_the_leaders_session_expires() {
    let server = start_server();
    let icn_b = connect(&server).await;
    let observer = connect(&server).await;
    assert_eq!(observer.leader("ld").await.unwrap(), None);
    let mut leader_rx = observer.watch_leader("ld").await.unwrap();

    // The leader is another process: it reserves 0..100 and 100..200.
    let child = ChildProc::spawn(&server, "leader");
    let line = tokio::task::block_in_place(|| child.line(Duration::from_secs(30)));
    assert_eq!(line, "elected 0..100 100..200");
    assert_eq!(
        observer.leader("ld").await.unwrap().as_deref(),
        Some("icn-child:7000")
    );

    let standby = tokio::spawn({
        let icn_b = icn_b.clone();
        async move { icn_b.elect("ld", "icn-b:7000").await }
    });
    tokio::time::sleep(TICK * 3).await;
    assert!(
        !standby.is_finished(),
        "the standby must wait while the leader lives"
    );

    // The leader stops (no heartbeats): its session expires and the standby takes over.
    child.signal("-STOP");
    let stopped = Instant::now();
    let b = tokio::time::timeout(PROMPT, standby)
        .await
        .expect("standby elected")
        .unwrap()
        .unwrap();
    let took = stopped.elapsed();
    let timeout = icn_b.session_timeout();
    println!("standby elected {took:?} after the leader stopped (session time-out {timeout:?})");
    assert!(took <= timeout + EXPIRY_SLACK, "took {took:?}");
    assert!(b.is_leader());
    assert_eq!(b.addr(), "icn-b:7000");
    let deadline = tokio::time::Instant::now() + PROMPT;
    while leader_rx.borrow_and_update().as_deref() != Some("icn-b:7000") {
        tokio::time::timeout_at(deadline, leader_rx.changed())
            .await
            .expect("leader watch shows icn-b")
            .unwrap();
    }
    assert_eq!(
        observer.leader("ld").await.unwrap().as_deref(),
        Some("icn-b:7000")
    );
    // The new leader continues above every id the old one reserved.
    assert_eq!(b.reserve_tf_ids(50).await.unwrap(), 200..250);

    // Continued, the old leader learns it lost (lost() fires, it can no longer reserve).
    child.signal("-CONT");
    let line = tokio::task::block_in_place(|| child.line(PROMPT));
    assert_eq!(line, "lost");

    // Another standby; the leader resigns and it takes over at once.
    let icn_c = connect(&server).await;
    let again = tokio::spawn({
        let icn_c = icn_c.clone();
        async move { icn_c.elect("ld", "icn-c:7000").await }
    });
    tokio::time::sleep(TICK * 2).await;
    assert!(!again.is_finished());
    let resigned = Instant::now();
    b.resign().await.unwrap();
    let c = tokio::time::timeout(PROMPT, again)
        .await
        .expect("elected")
        .unwrap()
        .unwrap();
    assert!(
        resigned.elapsed() < timeout,
        "a resignation hands over at once"
    );
    assert!(c.is_leader());
    assert_eq!(c.reserve_tf_ids(10).await.unwrap(), 250..260);

    // Dropping the leader's registry closes its session: lost() fires for its clones too.
    let lost = c.lost();
    drop(icn_c);
    drop(c);
    tokio::time::timeout(PROMPT, lost)
        .await
        .expect("lost() after the registry closed");
    let closed = Instant::now();
    while leader_rx.borrow_and_update().is_some() {
        tokio::time::timeout_at(deadline, leader_rx.changed())
            .await
            .expect("leader watch shows none")
            .unwrap();
    }
    assert!(
        closed.elapsed() < timeout,
        "a closed session's leader znode vanishes at once"
    );
    assert_eq!(observer.leader("ld").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tf_id_blocks_never_overlap_and_continue_above_every_reservation() {
    let server = start_server();
    let regs = [connect(&server).await, connect(&server).await];
    let mut tasks = Vec::new();
    for (i, reg) in regs.iter().enumerate() {
        for t in 0..4 {
            let reg = reg.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..20 {
                    got.push(
                        reg.reserve_tf_ids("hwm", 10 + (i * 4 + t) as u64)
                            .await
                            .unwrap(),
                    );
                }
                got
            }));
        }
    }
    let mut ranges = Vec::new();
    for t in tasks {
        ranges.extend(t.await.unwrap());
    }
    ranges.sort_by_key(|r| r.start);
    let mut next = 0;
    for r in &ranges {
        assert_eq!(r.start, next, "blocks overlap or leave a gap: {ranges:?}");
        next = r.end;
    }
    let total: u64 = (0..8u64).map(|k| 20 * (10 + k)).sum();
    assert_eq!(next, total);
    let starts: BTreeSet<u64> = ranges.iter().map(|r| r.start).collect();
    assert_eq!(starts.len(), ranges.len());

    // A later client (a new leader after everyone else is gone) continues above them.
    drop(regs);
    let later = connect(&server).await;
    assert_eq!(
        later.reserve_tf_ids("hwm", 5).await.unwrap(),
        total..total + 5
    );
    assert!(later.reserve_tf_ids("hwm", 0).await.is_err());
    // Runs have separate counters.
    assert_eq!(later.reserve_tf_ids("other", 5).await.unwrap(), 0..5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_server_and_the_bad_part() {
    init_tracing();
    // Nothing listens on this port: connecting fails after the operation time-out.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = RegistryUrl::parse(&format!("zk://127.0.0.1:{port}/x")).unwrap();
    let err = ZkRegistry::connect(&url, Duration::from_millis(500))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("ZooKeeper 127.0.0.1:{port}: cannot connect")) && !err.contains('\n'),
        "{err}"
    );

    let server = start_server();
    let reg = connect(&server).await;
    let err = reg
        .register("a/b", epn(1, "x"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(err, "invalid run name `a/b`: it contains `/`");
    assert!(reg.watch("").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_test_process_leaves_no_server_behind() {
    init_tracing();
    let child = ChildProc::spawn_url("zk://unused:1/x", "server");
    let line = tokio::task::block_in_place(|| child.line(Duration::from_secs(60)));
    let pid: u32 = line.strip_prefix("server ").unwrap().parse().unwrap();
    let proc_dir = format!("/proc/{pid}");
    assert!(
        std::path::Path::new(&proc_dir).exists(),
        "the server JVM {pid} runs"
    );
    drop(child); // SIGKILL: the child cannot drop its ZkServer
    let deadline = Instant::now() + PROMPT;
    while std::path::Path::new(&proc_dir).exists() {
        assert!(
            Instant::now() < deadline,
            "ZooKeeper JVM {pid} outlived the killed test process"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
