//! A real Prometheus server (Debian's `prometheus`, installed by scripts/test) scrapes a
//! running cluster every second; the host and TF series are queried back from it.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// The first value of an instant query, once Prometheus has one (within 60 s).
fn query(prom: SocketAddr, promql_encoded: &str) -> f64 {
    query_until(prom, promql_encoded, |_| true)
}

/// The first value of an instant query that `ok` accepts (within 60 s).
fn query_until(prom: SocketAddr, promql_encoded: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let path = format!("/api/v1/query?query={promql_encoded}");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let body = http_get(prom, &path).unwrap_or_default();
        // {"status":"success","data":{"resultType":"vector","result":[{"metric":{..},"value":[t,"v"]}]}}
        if let Some(v) = body
            .split("\"value\":[")
            .nth(1)
            .and_then(|r| r.split('"').nth(1))
            .and_then(|v| v.parse().ok())
        {
            if ok(v) {
                return v;
            }
        }
        assert!(
            Instant::now() < until,
            "no result for {promql_encoded}: {body}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn start_prometheus(dir: &Path, targets: &[String]) -> (Proc, SocketAddr) {
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing: run scripts/test, which installs Debian's prometheus"
    );
    let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let cfg = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: fanin\n    static_configs:\n      - targets: [{}]\n",
        list.join(", ")
    );
    std::fs::write(dir.join("prometheus.yml"), cfg).unwrap();
    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let proc = Proc::spawn(
        "prometheus",
        Command::new(PROMETHEUS)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap()),
    );
    (proc, web)
}

fn mem_total_bytes() -> f64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: f64 = m
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    kb * 1024.0
}

#[test]
fn a_real_prometheus_scrapes_host_and_tf_series_from_every_node() {
    let dir = tempfile::tempdir().unwrap();
    // A run that lasts until the test stops it (however long Prometheus takes to start).
    let toml = "[run]\nflps = 1\nepns = 1\nrate_hz = 50\nduration_s = 600\nstf_size = \"64KiB\"\n";
    let mut icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let (epn_m, flp_m) = (free_port(), free_port());
    let epn_metrics = format!("127.0.0.1:{epn_m}");
    let flp_metrics = format!("127.0.0.1:{flp_m}");
    let _epn = spawn_epn(dir.path(), icn.control, 0, &["--metrics", &epn_metrics]);
    let _flp = spawn_flp_with(dir.path(), icn.control, 0, &["--metrics", &flp_metrics]);
    let targets = [icn.metrics.to_string(), epn_metrics, flp_metrics];
    let (_prom, web) = start_prometheus(dir.path(), &targets);

    // fanin_host_memory_bytes{kind="total",role="epn"}: the EPN's host, read back.
    let mem = query(
        web,
        "fanin_host_memory_bytes%7Bkind%3D%22total%22%2Crole%3D%22epn%22%7D",
    );
    assert_eq!(mem, mem_total_bytes());
    // up{job="fanin"} summed: all three nodes are scraped.
    // (each target's first scrape may come up to a second after the others)
    let up = query_until(web, "sum(up%7Bjob%3D%22fanin%22%7D)", |v| v >= 3.0);
    assert_eq!(up, 3.0);
    // The ICN's completed TFs, growing while the run goes on.
    let q = "sum(fanin_tfs_total%7Brole%3D%22icn%22%2Cstatus%3D%22complete%22%7D)";
    let first = query(web, q);
    let later = query_until(web, q, |v| v > first);
    assert!(later > first, "the TF count must grow between scrapes");
    let cpu = query(web, "fanin_process_cpu_seconds%7Brole%3D%22flp%22%7D");
    assert!(cpu > 0.0, "the FLP's CPU time: {cpu}");
    icn.proc.signal(libc::SIGINT);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!(s["invariant_ok"], true, "{s}");
}
