//! Prometheus metrics of one node, and the small HTTP server that serves them.
//! Counters also keep a plain snapshot, which FLPs and EPNs send to the ICN at run end.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    /// TF outcomes: labels status, reason.
    tfs: Family<Labels, Counter>,
    /// STF events: labels event (sent, received, dropped, duplicate, late, split, crc_error, ...), reason.
    stfs: Family<Labels, Counter>,
    /// Bytes: label direction (sent, received, completed).
    bytes: Family<Labels, Counter>,
    /// Role-specific totals (split_tfs, duplicate_stfs, ...): label event. A gauge,
    /// because split_tfs can shrink when a late assignment claims an orphan TF.
    events: Family<Labels, Gauge>,
    /// Protocol and peer errors: label kind.
    errors: Family<Labels, Counter>,
    /// Buffer occupancy in bytes: label buffer.
    buffer: Family<Labels, Gauge>,
    buffer_limit: Family<Labels, Gauge>,
    /// Point-in-time values (tfs_in_flight, tfs_building, peers).
    level: Family<Labels, Gauge>,
    latency: Histogram,
    snapshot: Mutex<BTreeMap<String, u64>>,
    /// Endpoints a node adds beside `GET /metrics`: (method, path, handler).
    routes: Mutex<Vec<(&'static str, &'static str, Arc<Route>)>>,
    /// CPU, memory, network, clock and temperature, read at each scrape.
    host: crate::host::HostMetrics,
    /// The counters when this node's current run began (a long-lived node reports
    /// each run's own counts), and that run's id once the node joined one.
    run_base: Mutex<BTreeMap<String, u64>>,
    run_joined: Mutex<Option<u64>>,
    /// The run-control state this node was last told (0: none yet).
    run_state: std::sync::atomic::AtomicU8,
}

/// An STF event's counter and its bytes' counter (`Metrics::stf_counter`).
pub struct StfCounter {
    stfs: Counter,
    bytes: Counter,
    stfs_key: String,
    bytes_key: String,
}

/// A buffer's fill and limit gauges (`Metrics::buffer_gauge`).
pub struct BufferGauge {
    used: Gauge,
    limit: Gauge,
}

impl BufferGauge {
    pub fn set(&self, used: u64, limit: u64) {
        self.used.set(used as i64);
        self.limit.set(limit as i64);
    }
}

/// An endpoint's handler.
pub type Route = Box<dyn Fn(&Request) -> Reply + Send + Sync>;

/// One HTTP request to a node's endpoint (bodies up to `MAX_BODY`).
pub struct Request {
    pub method: String,
    pub path: String,
    /// The `Authorization` header's value, if any.
    pub authorization: Option<String>,
    /// The `Origin` header: a browser sends it with every POST.
    pub origin: Option<String>,
    /// The `Host` header: the server the client addressed.
    pub host: Option<String>,
    /// The `Sec-Fetch-Site` header of a browser (`same-origin`, `cross-site`, ...).
    pub fetch_site: Option<String>,
    pub body: Vec<u8>,
}

impl Request {
    /// A browser's request from another site's page: `Sec-Fetch-Site` says so, or else
    /// an `Origin` that is not this server (`http://` or `https://`, through a TLS
    /// proxy, and the `Host`). Such a page must not change anything here (cross-site
    /// request forgery), secret or not; `fanin ctl`, curl and the live page pass.
    pub fn from_another_site(&self) -> bool {
        if let Some(site) = &self.fetch_site {
            return !matches!(site.to_ascii_lowercase().as_str(), "same-origin" | "none");
        }
        match (&self.origin, &self.host) {
            (None, _) => false,
            (Some(origin), Some(host)) => {
                let origin = origin.trim_end_matches('/').to_ascii_lowercase();
                let authority = origin
                    .strip_prefix("http://")
                    .or_else(|| origin.strip_prefix("https://"));
                authority != Some(host.to_ascii_lowercase().as_str())
            }
            (Some(_), None) => true,
        }
    }
}

/// An endpoint's answer: status line ("200 OK"), content type, body.
pub struct Reply {
    pub status: &'static str,
    pub kind: &'static str,
    pub body: String,
}

impl Reply {
    pub fn ok(kind: &'static str, body: String) -> Reply {
        Reply {
            status: "200 OK",
            kind,
            body,
        }
    }
}

/// The largest request body a node reads (a run configuration fits many times over).
pub const MAX_BODY: usize = 256 << 10;

/// The longest one HTTP exchange may take, reply included (a client that never reads
/// holds its place no longer).
const HTTP_EXCHANGE: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest request head (request line and headers).
const MAX_HEAD: usize = 16 * 1024;

/// Content type of plain text and of Prometheus's exposition format.
pub const TEXT: &str = "text/plain; version=0.0.4";

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Metrics {
    pub fn new(role: &str, node_id: Option<u32>) -> Arc<Metrics> {
        let mut const_labels = vec![(
            std::borrow::Cow::Borrowed("role"),
            std::borrow::Cow::Owned(role.to_string()),
        )];
        if let Some(id) = node_id {
            const_labels.push((
                std::borrow::Cow::Borrowed("node"),
                std::borrow::Cow::Owned(id.to_string()),
            ));
        }
        let mut registry = Registry::with_prefix_and_labels("fanin", const_labels.into_iter());
        let m = Metrics {
            tfs: Family::default(),
            stfs: Family::default(),
            bytes: Family::default(),
            errors: Family::default(),
            events: Family::default(),
            buffer: Family::default(),
            buffer_limit: Family::default(),
            level: Family::default(),
            latency: Histogram::new(exponential_buckets(0.0001, 2.0, 20)),
            routes: Mutex::new(Vec::new()),
            run_state: Default::default(),
            run_base: Mutex::new(BTreeMap::new()),
            run_joined: Mutex::new(None),
            host: Default::default(),
            snapshot: Mutex::new(BTreeMap::new()),
            registry: Registry::default(),
        };
        registry.register(
            "tfs",
            "Timeframes by final status and reason",
            m.tfs.clone(),
        );
        registry.register("stfs", "STF events by kind and reason", m.stfs.clone());
        registry.register("bytes", "Payload bytes by direction", m.bytes.clone());
        registry.register(
            "protocol_errors",
            "Malformed frames, bad peers and rejected requests",
            m.errors.clone(),
        );
        registry.register("events", "Role-specific event totals", m.events.clone());
        registry.register(
            "buffer_bytes",
            "Bytes held in a bounded buffer",
            m.buffer.clone(),
        );
        registry.register(
            "buffer_limit_bytes",
            "Configured limit of a bounded buffer",
            m.buffer_limit.clone(),
        );
        registry.register(
            "level",
            "Current counts (in flight, building, peers)",
            m.level.clone(),
        );
        m.host.register(&mut registry);
        if role == "icn" {
            registry.register(
                "tf_latency_seconds",
                "TF latency from issue to acknowledgement at the ICN",
                m.latency.clone(),
            );
        }
        Arc::new(Metrics { registry, ..m })
    }

    /// Adds `n` to a snapshot counter (a key seen before costs no allocation).
    fn bump(&self, key: &str, n: u64) {
        let mut snap = self.snapshot.lock().unwrap();
        match snap.get_mut(key) {
            Some(v) => *v += n,
            None => drop(snap.insert(key.to_string(), n)),
        }
    }

    pub fn tf(&self, status: &str, reason: &str) {
        self.tfs
            .get_or_create(&labels(&[("status", status), ("reason", reason)]))
            .inc();
        self.bump(&format!("tfs.{status}.{reason}"), 1);
    }

    pub fn stf(&self, event: &str, reason: &str, n: u64) {
        let reason = if reason.is_empty() { "none" } else { reason };
        self.stfs
            .get_or_create(&labels(&[("event", event), ("reason", reason)]))
            .inc_by(n);
        let key = if reason.is_empty() || reason == "none" {
            format!("stfs.{event}")
        } else {
            format!("stfs.{event}.{reason}")
        };
        self.bump(&key, n);
    }

    pub fn bytes(&self, direction: &str, n: u64) {
        self.bytes
            .get_or_create(&labels(&[("direction", direction)]))
            .inc_by(n);
        self.bump(&format!("bytes.{direction}"), n);
    }

    /// Sets the total of a role-specific event.
    pub fn set_event_total(&self, event: &str, total: u64) {
        self.events
            .get_or_create(&labels(&[("event", event)]))
            .set(total as i64);
        self.snapshot
            .lock()
            .unwrap()
            .insert(format!("events.{event}"), total);
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&labels(&[("kind", kind)])).inc();
        self.bump(&format!("errors.{kind}"), 1);
    }

    /// Handles for counting STFs with `event` (no reason) and their bytes in
    /// `direction` once per STF, without building labels and keys each time.
    pub fn stf_counter(&self, event: &str, direction: &str) -> StfCounter {
        let stfs = labels(&[("event", event), ("reason", "none")]);
        StfCounter {
            stfs: self.stfs.get_or_create(&stfs).clone(),
            bytes: self
                .bytes
                .get_or_create(&labels(&[("direction", direction)]))
                .clone(),
            stfs_key: format!("stfs.{event}"),
            bytes_key: format!("bytes.{direction}"),
        }
    }

    /// One STF of `n` bytes, counted as `stf(event, "", 1)` and `bytes(direction, n)`.
    pub fn count_stf(&self, c: &StfCounter, n: u64) {
        c.stfs.inc();
        c.bytes.inc_by(n);
        self.bump(&c.stfs_key, 1);
        self.bump(&c.bytes_key, n);
    }

    /// Handles for setting `buffer`'s gauges often (see `set_buffer`).
    pub fn buffer_gauge(&self, buffer: &str) -> BufferGauge {
        let l = labels(&[("buffer", buffer)]);
        BufferGauge {
            used: self.buffer.get_or_create(&l).clone(),
            limit: self.buffer_limit.get_or_create(&l).clone(),
        }
    }

    pub fn set_buffer(&self, buffer: &str, used: u64, limit: u64) {
        self.buffer_gauge(buffer).set(used, limit);
    }

    /// The run-control state and run number, as the ICN last told them: gauges
    /// `level{what="run_state"}` (1 IDLE .. 5 EXIT) and `level{what="run_number"}`.
    pub fn set_run_state(&self, state: fanin_proto::RunState, run_number: u64) {
        let old = self
            .run_state
            .swap(state as u8, std::sync::atomic::Ordering::Relaxed);
        self.set_level("run_state", state as u64);
        self.set_level("run_number", run_number);
        if old != state as u8 {
            tracing::info!("run {run_number}: {}", state.name());
        }
    }

    /// The run-control state last set, if any.
    pub fn run_state(&self) -> Option<fanin_proto::RunState> {
        let v = self.run_state.load(std::sync::atomic::Ordering::Relaxed);
        fanin_proto::RunState::from_u8(v).ok()
    }

    pub fn set_level(&self, what: &str, v: u64) {
        self.level
            .get_or_create(&labels(&[("what", what)]))
            .set(v as i64);
    }

    pub fn observe_latency(&self, seconds: f64) {
        self.latency.observe(seconds);
    }

    /// Counter values by flat name (`stfs.sent`, `errors.bad_magic`, ...).
    /// A new run begins for a long-lived node: its counters from now on are the run's.
    pub fn new_run(&self) {
        let now = self.snapshot.lock().unwrap().clone();
        *self.run_base.lock().unwrap() = now;
    }

    /// The node joined run `run_id`: if that is another run than the one it was in, a
    /// new run begins for its counters (a node that lost its ICN as run N ended and
    /// joined run N+1 reports N+1's counts alone). Joining the same run again (a rejoin,
    /// a take-over) goes on counting.
    pub fn joined_run(&self, run_id: u64) {
        let mut joined = self.run_joined.lock().unwrap();
        if joined.is_some_and(|r| r != run_id) {
            self.new_run();
        }
        *joined = Some(run_id);
    }

    /// Counter values since the current run began (all of them for a one-run node).
    pub fn run_snapshot(&self) -> Vec<(String, u64)> {
        let base = self.run_base.lock().unwrap();
        let since = |k: &String, v: u64| v.saturating_sub(base.get(k).copied().unwrap_or(0));
        let now = self.snapshot.lock().unwrap();
        now.iter().map(|(k, v)| (k.clone(), since(k, *v))).collect()
    }

    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.snapshot
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    pub fn counter(&self, key: &str) -> u64 {
        self.snapshot.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Serves `METHOD path` with `f` from now on (the ICN's live page and status, the
    /// EPN's burst trigger), replacing an earlier handler of the same endpoint.
    pub fn route(&self, method: &'static str, path: &'static str, f: Route) {
        let mut routes = self.routes.lock().unwrap();
        routes.retain(|(m, p, _)| (*m, *p) != (method, path));
        routes.push((method, path, Arc::new(f)));
    }

    /// The Prometheus text, host gauges read now.
    pub fn render(&self) -> String {
        self.host.refresh();
        self.render_only()
    }

    /// The Prometheus text as it stands (host gauges as last read).
    pub fn render_only(&self) -> String {
        let mut s = String::new();
        encode(&mut s, &self.registry).expect("writing to a String cannot fail");
        s
    }
}

/// Binds the metrics endpoint and serves `GET /metrics` until the process ends.
pub async fn serve(bind: SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|e| anyhow::anyhow!("metrics bind {bind}: {e}"))?;
    let local = listener.local_addr()?;
    // Connections being served share an admission pool (64 places, 32 per source, with
    // `MAX_BODY` what strangers can make a node hold): a newcomer evicts the oldest, of
    // its own source first, so idle connections never keep an operator's request out.
    let pool = crate::admission::Admission::new(0);
    let log = Arc::new(crate::admission::LogLimit::new(10));
    tokio::spawn(async move {
        loop {
            let (s, peer, mut ticket) = pool.accept(&listener, "metrics port", &metrics).await;
            let (m, log) = (metrics.clone(), log.clone());
            tokio::spawn(async move {
                let exchange = tokio::time::timeout(HTTP_EXCHANGE, answer(s, peer, m, &log));
                tokio::select! {
                    _ = exchange => {}
                    _ = &mut ticket.evicted => {}
                }
            });
        }
    });
    Ok(local)
}

/// Reads one request (5 s at most), answers it on a blocking thread (reading /proc and
/// /sys, or waiting for the ICN, may sleep) and closes the connection. A malformed or
/// unfinished request is counted and logged (`log`: at most 10 lines a second).
async fn answer(
    mut s: tokio::net::TcpStream,
    peer: SocketAddr,
    m: Arc<Metrics>,
    log: &crate::admission::LogLimit,
) {
    let limit = std::time::Duration::from_secs(5);
    let read = tokio::time::timeout(limit, read_request(&mut s));
    let reply = match read.await {
        Ok(Ok(Some(req))) => match tokio::task::spawn_blocking(move || respond(&m, &req)).await {
            Ok(r) => r,
            Err(_) => return,
        },
        Ok(Ok(None)) => return, // connected and left without a byte (a port probe)
        Ok(Err(why)) => {
            m.error("http_bad_request");
            log.warn(|| format!("metrics port: {peer}: {why}"));
            Reply {
                status: "400 Bad Request",
                kind: TEXT,
                body: format!("{why}\n"),
            }
        }
        Err(_) => {
            m.error("http_timeout");
            log.warn(|| format!("metrics port: {peer}: no whole request within {limit:?}"));
            return;
        }
    };
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.status,
        reply.kind,
        reply.body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(reply.body.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// The request line, the headers fanin uses and a body of `Content-Length` bytes; None
/// when the connection closed before its first byte.
async fn read_request(s: &mut tokio::net::TcpStream) -> Result<Option<Request>, String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("request head over {MAX_HEAD} bytes"));
        }
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 && buf.is_empty() {
            return Ok(None);
        }
        if n == 0 {
            return Err("connection closed in the request head".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut req = parse_head(&head)?;
    let want = content_length(&head)?;
    let mut body = buf.split_off(head_end);
    while body.len() < want {
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed in the request body".into());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(want);
    req.body = body;
    Ok(Some(req))
}

fn parse_head(head: &str) -> Result<Request, String> {
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = match (words.next(), words.next()) {
        (Some(m), Some(p)) => (m.to_string(), p.to_string()),
        _ => return Err("no request line".into()),
    };
    let owned = |name| header(head, name).map(str::to_string);
    Ok(Request {
        method,
        path,
        authorization: owned("authorization"),
        origin: owned("origin"),
        host: owned("host"),
        fetch_site: owned("sec-fetch-site"),
        body: Vec::new(),
    })
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn content_length(head: &str) -> Result<usize, String> {
    let Some(v) = header(head, "content-length") else {
        return Ok(0);
    };
    let n: usize = v.parse().map_err(|_| format!("Content-Length {v:?}"))?;
    if n > MAX_BODY {
        return Err(format!("request body of {n} bytes is over {MAX_BODY}"));
    }
    Ok(n)
}

/// The answer to one request: `GET /metrics`, a route, or 404 naming what is served.
fn respond(m: &Metrics, req: &Request) -> Reply {
    // A query string does not change the endpoint (`/?token=..` opens the live page).
    let path = req.path.split(['?', '#']).next().unwrap_or("");
    if (req.method.as_str(), path) == ("GET", "/metrics") {
        return Reply::ok(TEXT, m.render());
    }
    if req.method != "GET" && req.from_another_site() {
        m.error("cross_origin");
        let origin = req.origin.as_deref().unwrap_or("another site");
        let why = format!("a page from {origin} may not change anything here");
        return Reply {
            status: "403 Forbidden",
            kind: "application/json",
            body: serde_json::json!({"ok": false, "error": why}).to_string(),
        };
    }
    // The handler runs without the lock: a run-control command may wait for the ICN.
    let route = m
        .routes
        .lock()
        .unwrap()
        .iter()
        .find(|(me, p, _)| (*me, *p) == (req.method.as_str(), path))
        .map(|(_, _, f)| f.clone());
    match route {
        Some(f) => f(req),
        None => {
            let mut here = vec!["GET /metrics".to_string()];
            let routes = m.routes.lock().unwrap();
            here.extend(routes.iter().map(|(me, p, _)| format!("{me} {p}")));
            Reply {
                status: "404 Not Found",
                kind: TEXT,
                body: format!("served here: {}\n", here.join(", ")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A node's counters begin again when it joins another run, not when it joins the
    /// same run again.
    #[test]
    fn counters_are_each_runs_own_however_the_node_came_to_it() {
        let m = super::Metrics::new("flp", Some(0));
        let sent = |m: &super::Metrics| {
            let s = m.run_snapshot();
            s.iter()
                .find(|(k, _)| k == "stfs.sent")
                .map_or(0, |(_, v)| *v)
        };
        m.joined_run(1);
        m.stf("sent", "", 5);
        m.joined_run(1); // lost the ICN mid-run, joined the same run again
        m.stf("sent", "", 2);
        assert_eq!(sent(&m), 7);
        m.joined_run(2); // lost it as run 1 ended, joined run 2
        assert_eq!(sent(&m), 0);
        m.stf("sent", "", 3);
        assert_eq!(sent(&m), 3);
    }

    /// A malformed request gets its 400 and is counted; a port probe (connected, closed
    /// without a byte) is neither.
    #[tokio::test]
    async fn a_malformed_request_is_counted() {
        let m = super::Metrics::new("epn", Some(0));
        let at = super::serve("127.0.0.1:0".parse().unwrap(), m.clone())
            .await
            .unwrap();
        let reply = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            drop(std::net::TcpStream::connect(at).unwrap());
            let mut s = std::net::TcpStream::connect(at).unwrap();
            s.write_all(b"NONSENSE\r\n\r\n").unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).unwrap();
            reply
        });
        let reply = reply.await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
        assert_eq!(m.counter("errors.http_bad_request"), 1);
    }

    /// 100 connections that never speak hold the metrics port: a request still gets
    /// its answer at once, not after their 5 s read time-out.
    #[tokio::test]
    async fn idle_connections_never_keep_a_request_out() {
        let m = super::Metrics::new("epn", Some(0));
        let at = super::serve("127.0.0.1:0".parse().unwrap(), m)
            .await
            .unwrap();
        let idle: Vec<std::net::TcpStream> = (0..100)
            .map(|_| std::net::TcpStream::connect(at).unwrap())
            .collect();
        let reply = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(at).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
                .unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut got = String::new();
            let _ = s.read_to_string(&mut got);
            got
        });
        let got = reply.await.unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
        drop(idle);
    }

    use super::*;

    /// A page from another site cannot POST here (cross-site request forgery), with or
    /// without a run secret; a request without `Origin` (fanin ctl, curl) or from this
    /// server's own page is served.
    #[test]
    fn a_page_from_another_site_changes_nothing() {
        let m = Metrics::new("icn", None);
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = calls.clone();
        let handler = move |_: &Request| {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Reply::ok(TEXT, "done".into())
        };
        m.route("POST", "/ctl/exit", Box::new(handler));
        let post = |origin: Option<&str>, host: &str| Request {
            method: "POST".into(),
            path: "/ctl/exit".into(),
            authorization: None,
            origin: origin.map(str::to_string),
            host: Some(host.into()),
            fetch_site: None,
            body: Vec::new(),
        };
        let fetched = |site: &str| Request {
            fetch_site: Some(site.into()),
            ..post(Some("http://10.0.0.1:9100"), "10.0.0.1:9100")
        };
        let status = |r: Request| respond(&m, &r).status;
        let here = "10.0.0.1:9100";
        assert_eq!(
            status(post(Some("http://evil.example"), here)),
            "403 Forbidden"
        );
        assert_eq!(
            status(post(Some("http://10.0.0.1:9101"), here)),
            "403 Forbidden"
        );
        assert_eq!(status(post(Some("null"), here)), "403 Forbidden");
        assert_eq!(status(fetched("cross-site")), "403 Forbidden");
        assert_eq!(status(fetched("same-site")), "403 Forbidden");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(m.counter("errors.cross_origin"), 5);
        assert_eq!(status(post(None, here)), "200 OK");
        assert_eq!(status(post(Some("http://10.0.0.1:9100"), here)), "200 OK");
        assert_eq!(
            status(post(Some("HTTP://LocalHost:9100/"), "localhost:9100")),
            "200 OK"
        );
        assert_eq!(
            status(post(Some("http://[::1]:9100"), "[::1]:9100")),
            "200 OK"
        );
        assert_eq!(
            status(post(Some("https://icn.example"), "icn.example")),
            "200 OK"
        );
        assert_eq!(status(fetched("same-origin")), "200 OK");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 6);
        // Reading is no change: a GET from another site is served as any.
        let get = Request {
            method: "GET".into(),
            path: "/nothing".into(),
            ..post(Some("http://evil.example"), here)
        };
        assert_eq!(status(get), "404 Not Found");
        assert_eq!(m.counter("errors.cross_origin"), 5);
    }

    #[test]
    fn an_stf_counter_counts_as_stf_and_bytes_do() {
        let m = Metrics::new("epn", Some(0));
        let c = m.stf_counter("received", "received");
        m.count_stf(&c, 100);
        m.stf("received", "", 1);
        m.bytes("received", 50);
        m.count_stf(&c, 100);
        let snap: BTreeMap<String, u64> = m.snapshot().into_iter().collect();
        assert_eq!(snap.get("stfs.received"), Some(&3));
        assert_eq!(snap.get("bytes.received"), Some(&250));
        let mut text = String::new();
        encode(&mut text, &m.registry).unwrap();
        let line = |what: &str| text.lines().find(|l| l.contains(what)).map(str::to_string);
        let stfs = line("stfs_total{").unwrap();
        assert!(
            stfs.contains("event=\"received\"") && stfs.ends_with(" 3"),
            "{text}"
        );
        let bytes = line("bytes_total{").unwrap();
        assert!(bytes.ends_with(" 250"), "{text}");
    }
}
