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
    routes: Mutex<Vec<(&'static str, &'static str, Route)>>,
    /// CPU, memory, network, clock and temperature, read at each scrape.
    host: crate::host::HostMetrics,
}

/// An endpoint's handler: (content type, body).
pub type Route = Box<dyn Fn() -> (&'static str, String) + Send + Sync>;

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

    fn bump(&self, key: String, n: u64) {
        *self.snapshot.lock().unwrap().entry(key).or_default() += n;
    }

    pub fn tf(&self, status: &str, reason: &str) {
        self.tfs
            .get_or_create(&labels(&[("status", status), ("reason", reason)]))
            .inc();
        self.bump(format!("tfs.{status}.{reason}"), 1);
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
        self.bump(key, n);
    }

    pub fn bytes(&self, direction: &str, n: u64) {
        self.bytes
            .get_or_create(&labels(&[("direction", direction)]))
            .inc_by(n);
        self.bump(format!("bytes.{direction}"), n);
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
        self.bump(format!("errors.{kind}"), 1);
    }

    pub fn set_buffer(&self, buffer: &str, used: u64, limit: u64) {
        self.buffer
            .get_or_create(&labels(&[("buffer", buffer)]))
            .set(used as i64);
        self.buffer_limit
            .get_or_create(&labels(&[("buffer", buffer)]))
            .set(limit as i64);
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
        routes.push((method, path, f));
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
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let m = metrics.clone();
            tokio::spawn(async move {
                let mut req = Vec::with_capacity(512);
                let mut buf = [0u8; 1024];
                let read = async {
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
                        let n = s.read(&mut buf).await?;
                        if n == 0 {
                            break;
                        }
                        req.extend_from_slice(&buf[..n]);
                    }
                    Ok::<_, std::io::Error>(())
                };
                if tokio::time::timeout(std::time::Duration::from_secs(5), read)
                    .await
                    .is_err()
                {
                    return;
                }
                // Reading /proc and /sys may sleep: off the runtime's threads.
                let line = String::from_utf8_lossy(&req).into_owned();
                let answer = tokio::task::spawn_blocking(move || respond(&m, &line)).await;
                let Ok((status, kind, body)) = answer else {
                    return;
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(local)
}

/// (status, content type, body) for one request line.
fn respond(m: &Metrics, line: &str) -> (&'static str, &'static str, String) {
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    if (method, path) == ("GET", "/metrics") {
        return ("200 OK", TEXT, m.render());
    }
    let routes = m.routes.lock().unwrap();
    match routes.iter().find(|(me, p, _)| (*me, *p) == (method, path)) {
        Some((_, _, f)) => {
            let (kind, body) = f();
            ("200 OK", kind, body)
        }
        None => {
            let mut here = vec!["GET /metrics".to_string()];
            here.extend(routes.iter().map(|(me, p, _)| format!("{me} {p}")));
            (
                "404 Not Found",
                TEXT,
                format!("served here: {}\n", here.join(", ")),
            )
        }
    }
}
