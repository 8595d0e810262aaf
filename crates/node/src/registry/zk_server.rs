//! A private, throw-away ZooKeeper server for tests: Debian's `zkServer.sh start-foreground`
//! with its own config, data dir and log in a temp dir, on a free 127.0.0.1 port; killed on drop.
//!
//! Std only (no tokio), so any test crate can use it; nothing here runs unless a test calls it.
//! The script is `$FANIN_ZK_SERVER_SH`, else `/usr/share/zookeeper/bin/zkServer.sh`, else
//! `zkServer.sh` on `PATH` (Debian: `apt-get install -y zookeeper`).

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};

const DEBIAN_SCRIPT: &str = "/usr/share/zookeeper/bin/zkServer.sh";
/// Debian's zookeeper.jar has no SLF4J binding (the server logs nothing); with this jar it
/// logs to stderr, which goes to the server's log file in its temp dir.
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
const DEBIAN_CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar";
/// Runs `zkServer.sh start-foreground CFG` (`$1`, `$2`) and SIGKILLs it when its stdin (a pipe
/// from the test process) closes: on `stop`, and when the test process dies without
/// dropping the server (killed by a time-out), so no JVM is left behind. Writes the JVM's
/// pid to `$3`; exits with the JVM's status.
const WRAPPER: &str = r#"exec 3<&0
"$1" start-foreground "$2" </dev/null &
zk=$!
echo "$zk" > "$3"
{ read -r -u 3 _; kill -9 "$zk" 2>/dev/null; } &
watchdog=$!
wait "$zk"
status=$?
kill "$watchdog" 2>/dev/null
exit "$status"
"#;

/// Options of a [`ZkServer`].
#[derive(Clone, Debug)]
pub struct ZkServerOptions {
    /// ZooKeeper's `tickTime`: sessions may last 2 to 20 ticks.
    pub tick_time: Duration,
    /// How long the server may take to start serving (JVM start on a busy machine).
    pub startup_timeout: Duration,
    /// Run the server inside this network namespace (a `fanin testbed` host), listening
    /// on `bind`; `None`: in the caller's namespace.
    pub netns: Option<String>,
    /// Client address to listen on (127.0.0.1 unless inside a namespace).
    pub bind: Ipv4Addr,
}

impl Default for ZkServerOptions {
    fn default() -> Self {
        ZkServerOptions {
            tick_time: Duration::from_millis(200),
            startup_timeout: Duration::from_secs(60),
            netns: None,
            bind: Ipv4Addr::LOCALHOST,
        }
    }
}

/// A running private ZooKeeper server (standalone). Dropping it kills the server and
/// removes its temp dir (kept, and its path printed, when the thread is panicking).
pub struct ZkServer {
    dir: PathBuf,
    port: u16,
    options: ZkServerOptions,
    script: PathBuf,
    child: Option<Child>,
}

impl ZkServer {
    /// Starts a server with the given `tickTime` and waits until it serves requests.
    pub fn start(tick_time: Duration) -> anyhow::Result<ZkServer> {
        ZkServer::start_with(ZkServerOptions {
            tick_time,
            ..ZkServerOptions::default()
        })
    }

    /// Starts a server and waits until it serves requests (a `srvr` four-letter handshake
    /// answered by a serving server, never a fixed sleep). Fails, with the server's log
    /// tail, if it exits or does not serve within `startup_timeout`.
    pub fn start_with(options: ZkServerOptions) -> anyhow::Result<ZkServer> {
        let script = find_script()?;
        let dir = make_temp_dir()?;
        let mut server = ZkServer {
            dir,
            port: 0,
            options,
            script,
            child: None,
        };
        // A free port can be taken between our probe and the server's bind: try a few.
        let mut last_err = None;
        for attempt in 0..3u16 {
            server.port = match server.options.netns {
                // A testbed host's namespace runs nothing else: the usual port is free.
                Some(_) => 2181 + attempt,
                None => free_port()?,
            };
            server.write_config()?;
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap())
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `ADDR:PORT`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        format!("{}:{}", self.options.bind, self.port)
    }

    /// A registry URL on this server: `zk://ADDR:PORT{path}` (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("zk://{}:{}{}", self.options.bind, self.port, path)
    }

    pub fn tick_time(&self) -> Duration {
        self.options.tick_time
    }

    /// The server's temp dir (config `zoo.cfg`, `data/`, `zookeeper.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server JVM's process id while it runs (for fault injection: SIGSTOP/SIGCONT).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref()?;
        fs::read_to_string(self.dir.join("zookeeper.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Kills the server (SIGKILL, as a crash) and waits for it to exit. Its data dir and
    /// port are kept for [`ZkServer::restart`].
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take()); // the wrapper SIGKILLs the JVM, waits for it and exits
            child
                .wait()
                .context("ZooKeeper server: waiting for the killed server")?;
        }
        Ok(())
    }

    /// Starts the server again on the same data dir and port (after [`ZkServer::stop`];
    /// stops it first if it runs) and waits until it serves.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        let deadline = Instant::now() + self.options.startup_timeout;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return Ok(()),
                // The old socket may linger a moment; retry on the same port.
                Err(e) if Instant::now() < deadline => {
                    eprintln!(
                        "ZooKeeper restart on port {} failed, retrying: {e:#}",
                        self.port
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.join("zookeeper.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let data = self.dir.join("data");
        fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        let tick = self.options.tick_time.as_millis().max(1);
        let cfg = format!(
            "tickTime={tick}\n\
             dataDir={data}\n\
             clientPort={port}\n\
             clientPortAddress={bind}\n\
             maxClientCnxns=0\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=*\n\
             preAllocSize=1024\n\
             forceSync=no\n\
             autopurge.purgeInterval=0\n",
            data = data.display(),
            port = self.port,
            bind = self.options.bind,
        );
        let path = self.dir.join("zoo.cfg");
        fs::write(&path, cfg).with_context(|| format!("writing {}", path.display()))
    }

    fn spawn_and_wait(&mut self) -> anyhow::Result<()> {
        let log_path = self.spawn()?;
        self.wait_serving(&log_path)
    }

    /// Starts `zkServer.sh start-foreground` (in the namespace, if any) with its output
    /// to the log, whose path it returns.
    fn spawn(&mut self) -> anyhow::Result<PathBuf> {
        let log_path = self.dir.join("zookeeper.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut jvm_flags = String::from("-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1");
        if Path::new(SLF4J_SIMPLE).exists() {
            // The last -cp wins: the Debian class path plus a logger binding.
            jvm_flags.push_str(&format!(" -cp {DEBIAN_CLASSPATH}:{SLF4J_SIMPLE}"));
        }
        let pid_file = self.dir.join("zookeeper.pid");
        fs::remove_file(&pid_file).ok();
        let mut cmd = match &self.options.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "bash"]);
                c
            }
            None => Command::new("bash"),
        };
        let child = cmd
            .arg("-c")
            .arg(WRAPPER)
            .arg("fanin-zk-server")
            .arg(&self.script)
            .arg(self.dir.join("zoo.cfg"))
            .arg(&pid_file)
            .current_dir(&self.dir)
            // Upstream scripts honour these; Debian's zkEnv.sh fixes them but nothing is
            // written there in start-foreground mode with a config of our own.
            .env("ZOOCFGDIR", &self.dir)
            .env("ZOO_LOG_DIR", &self.dir)
            .env("ZOOPIDFILE", self.dir.join("zookeeper_server.pid"))
            .env("JMXDISABLE", "true")
            .env("JVMFLAGS", jvm_flags)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("ZooKeeper server: starting {}", self.script.display()))?;
        self.child = Some(child);
        Ok(log_path)
    }

    /// Waits until the server serves; one that exits first, or does not serve within
    /// the start-up time-out, is an error with the log's tail.
    fn wait_serving(&mut self, log_path: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.options.startup_timeout;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait()? {
                self.child = None;
                bail!(
                    "ZooKeeper server on {}:{} exited during start-up ({status}); log {}:\n{}",
                    self.options.bind,
                    self.port,
                    log_path.display(),
                    self.log_tail(30)
                );
            }
            if self.serving() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop().ok();
                bail!(
                    "ZooKeeper server on {}:{} did not serve within {:?}; log {}:\n{}",
                    self.options.bind,
                    self.port,
                    self.options.startup_timeout,
                    log_path.display(),
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// True when the server answers `srvr` as a serving standalone server.
    fn serving(&self) -> bool {
        if let Some(ns) = &self.options.netns {
            // Only reachable from inside the namespace: ask from there (bash's /dev/tcp).
            let probe = format!(
                "exec 3<>/dev/tcp/{}/{} && printf srvr >&3 && timeout 2 cat <&3",
                self.options.bind, self.port
            );
            return Command::new("ip")
                .args(["netns", "exec", ns, "bash", "-c", &probe])
                .stderr(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("Mode: standalone"))
                .unwrap_or(false);
        }
        let addr = SocketAddr::from((self.options.bind, self.port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        if s.write_all(b"srvr").is_err() {
            return false;
        }
        let mut reply = String::new();
        s.read_to_string(&mut reply).ok();
        reply.contains("Mode: standalone")
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.stop().ok();
        if std::thread::panicking() {
            eprintln!("ZooKeeper server files kept in {}", self.dir.display());
        } else {
            fs::remove_dir_all(&self.dir).ok();
        }
    }
}

/// The `zkServer.sh` to start servers with, or a one-line error saying how to install it.
pub fn find_script() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("FANIN_ZK_SERVER_SH") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "ZooKeeper server script FANIN_ZK_SERVER_SH={} does not exist",
            p.display()
        );
    }
    if Path::new(DEBIAN_SCRIPT).is_file() {
        return Ok(PathBuf::from(DEBIAN_SCRIPT));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("zkServer.sh");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    bail!(
        "ZooKeeper server script not found: no {DEBIAN_SCRIPT} and no zkServer.sh on PATH \
         (install Debian's package: apt-get install -y zookeeper, or set FANIN_ZK_SERVER_SH)"
    )
}

fn free_port() -> anyhow::Result<u16> {
    let l =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

/// Removes the directories of servers whose owning process is gone (it was killed
/// before it could clean up): `fanin-zk-<pid>-...` with no process `<pid>`.
fn sweep_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("fanin-zk-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            fs::remove_dir_all(e.path()).ok();
        }
    }
}

fn make_temp_dir() -> anyhow::Result<PathBuf> {
    static N: AtomicU32 = AtomicU32::new(0);
    sweep_stale(&std::env::temp_dir());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "fanin-zk-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir().join(name);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod sweep_tests {
    use super::*;

    #[test]
    fn only_the_dirs_of_dead_owners_are_swept() {
        let base = std::env::temp_dir().join(format!("fanin-sweep-{}", std::process::id()));
        let mine = base.join(format!("fanin-zk-{}-0-1", std::process::id()));
        let dead = base.join("fanin-zk-4194999-0-1"); // above any Linux pid
        let other = base.join("something-else");
        for d in [&mine, &dead, &other] {
            fs::create_dir_all(d.join("data")).unwrap();
        }
        sweep_stale(&base);
        assert!(mine.exists() && other.exists());
        assert!(!dead.exists());
        fs::remove_dir_all(&base).unwrap();
    }
}
