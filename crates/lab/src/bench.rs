//! `fanin bench`: performance measured against a reference in the same invocation.
//! `throughput` runs iperf3 and fanin over the same loopback path and prints the ratio.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fanin_node::RunConfig;
use tokio::process::Command;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// fanin goodput vs iperf3 single-stream goodput on loopback (unthrottled TFs).
    Throughput(ThroughputArgs),
    /// Simulator speed: events/s of the ANTARES 10-string model vs the bare event queue.
    Sim(SimBenchArgs),
    /// Flow-level model speed at ALICE scale (alice-2016): the one-representative-FLP
    /// shortcut vs exact per-STF flows, same TFs; and the fat-tree study's wall time.
    Flow(FlowBenchArgs),
    /// EPN sinks: file writer vs dd, exec pipe vs build-and-discard, and the EPN's CPU
    /// per TF handing TFs to a plug-in vs an exec pipe.
    Sink(crate::bench_sink::SinkBenchArgs),
    /// STF sources: the shared-memory ring against the synthetic source (goodput, FLP
    /// CPU per GB), and the on-data scheduling delay at 1 and 10 kHz.
    Source(crate::bench_source::SourceBenchArgs),
    /// Transports: fanin's data path against ZeroMQ, nng, iperf3 and plain TCP,
    /// throughput and CPU per GB on each side against block size (the seed's Figs. 1, 3, 4).
    Transport(crate::bench_transport::TransportBenchArgs),
    /// One side of a transport measurement (run by `fanin bench transport`).
    #[command(hide = true)]
    TransportPeer(crate::bench_transport::PeerArgs),
    /// A node's metrics: CPU per scrape with and without host metrics, and its share of
    /// one core at a 1 s scrape interval.
    Metrics(crate::bench_metrics::MetricsBenchArgs),
}

#[derive(Args)]
pub struct SimBenchArgs {
    /// Simulated seconds of the 10-string model (TCP, delayed transmission k=8).
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
}

#[derive(Args)]
pub struct ThroughputArgs {
    /// Seconds per measurement (iperf3 and each fanin case).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// STF size.
    #[arg(long, default_value = "8MiB")]
    pub stf_size: String,
    /// Cases as FLPSxEPNS (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1x1,2x4")]
    pub cases: Vec<String>,
    /// Measurements of each kind, interleaved; medians are reported (loopback is noisy).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Where fanin's run results go.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

#[derive(Args)]
pub struct FlowBenchArgs {
    /// Simulated seconds of TF issuing (then 30 s of drain).
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Also run the exact per-STF reference (about a minute of wall time for 60 s).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub exact: bool,
}

fn flow_speed(a: FlowBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.seconds > 0.0 && a.seconds <= 3600.0,
        "--seconds must be within 0..=3600"
    );
    let cfg = fanin_sim::flow::alice::AliceConfig {
        duration_s: a.seconds,
        ..Default::default()
    };
    let run = |aggregate: bool| -> anyhow::Result<(fanin_sim::flow::alice::AliceSummary, f64)> {
        let t = std::time::Instant::now();
        let s = fanin_sim::flow::alice::run(&fanin_sim::flow::alice::AliceConfig {
            aggregate,
            ..cfg.clone()
        })
        .map_err(|e| anyhow::anyhow!(e))?;
        Ok((s, t.elapsed().as_secs_f64()))
    };
    println!(
        "fanin bench flow: alice-2016 (268 FLPs x 1500 EPNs, 20 Gb/s per FLP), round robin, {} simulated s of TFs + {} s drain",
        a.seconds, cfg.drain_s
    );
    let (s, wall) = run(true)?;
    let simulated = a.seconds + cfg.drain_s;
    println!(
        "flow model (one representative FLP): {wall:.2} s wall, {:.1} simulated s per wall s; {} TFs issued, {} completed, invariant {}",
        simulated / wall,
        s.issued,
        s.completed,
        if s.invariant_ok { "ok" } else { "VIOLATED" }
    );
    if a.exact {
        let (e, ewall) = run(false)?;
        println!(
            "reference, exact per-STF flows ({} flows): {ewall:.2} s wall, {:.2} simulated s per wall s; {} completed; same counts: {}",
            e.flows,
            simulated / ewall,
            e.completed,
            e.issued == s.issued && e.completed == s.completed && e.dropped == s.dropped
        );
        println!("shortcut speed-up: {:.1}x", ewall / wall);
    }
    // The fat-tree study's speed: simulated only, nothing written or printed but the time.
    let t = std::time::Instant::now();
    let file = std::path::Path::new("experiments/fattree-thesis.toml");
    match fanin_sim::experiment::fabric::simulate_file(file) {
        Ok(n) => println!(
            "fat tree ({}, {n} runs): {:.2} s wall",
            file.display(),
            t.elapsed().as_secs_f64()
        ),
        Err(e) => println!("fat tree: skipped ({e:#}; run from the repository root)"),
    }
    Ok(())
}

pub async fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Throughput(a) => throughput(a).await,
        BenchCmd::Sim(a) => sim_speed(a),
        BenchCmd::Flow(a) => flow_speed(a),
        BenchCmd::Sink(a) => crate::bench_sink::run(a).await,
        BenchCmd::Source(a) => crate::bench_source::run(a).await,
        BenchCmd::Metrics(a) => crate::bench_metrics::run(a),
        BenchCmd::Transport(a) => crate::bench_transport::run(a).await,
        BenchCmd::TransportPeer(a) => crate::bench_transport::peer::run(a).await,
    }
}

/// The bare event queue in a hold model: `pending` events, each pop schedules one more
/// at a pseudo-random later time. Returns events per second.
fn queue_reference(events: u64, pending: u64) -> f64 {
    use fanin_sim::engine::Queue;
    let mut q: Queue<u64> = Queue::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let next = |x: &mut u64| {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x % 2_000_000
    };
    for i in 0..pending {
        q.at(next(&mut x), i);
    }
    let t = std::time::Instant::now();
    for _ in 0..events {
        let (_, e) = q.pop().expect("hold model keeps events");
        let d = next(&mut x);
        q.after(d, e);
    }
    events as f64 / t.elapsed().as_secs_f64()
}

fn sim_speed(a: SimBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.seconds > 0.0, "--seconds must be positive");
    let cfg = fanin_sim::SimConfig {
        preset: Some("antares-10-string".into()),
        k: Some(8),
        duration_s: a.seconds,
        ..fanin_sim::SimConfig::default()
    };
    println!(
        "fanin bench sim: ANTARES 10-string, TCP, delayed transmission k=8, {} simulated s (+{} s relaxation)",
        a.seconds, cfg.relax_s
    );
    let reference = queue_reference(20_000_000, 10_000);
    println!(
        "reference: bare event queue (hold model, 10000 pending): {:.1} M events/s",
        reference / 1e6
    );
    let t = std::time::Instant::now();
    let w = fanin_sim::simulate(cfg).map_err(|e| anyhow::anyhow!(e))?;
    let wall = t.elapsed().as_secs_f64();
    let eps = w.events() as f64 / wall;
    let simulated = w.end_time() as f64 / 1e9;
    println!(
        "model: {} events in {wall:.2} s wall = {:.1} M events/s ({:.2} of the bare queue)",
        w.events(),
        eps / 1e6,
        eps / reference
    );
    println!(
        "simulated {simulated:.1} s in {wall:.2} s wall: {:.2} simulated s per wall s (target >= 1: 60 s in <= 60 s)",
        simulated / wall
    );
    println!("{}", fanin_sim::SimSummary::of(&w).line());
    Ok(())
}

/// A free loopback port for a server the benches start (the tests' own servers take
/// theirs from 20000 up).
pub fn free_port() -> anyhow::Result<u16> {
    crate::ports::free_loopback_port(12_000..20_000)
}

/// iperf3 single stream over loopback; returns received Gbit/s.
async fn iperf3(seconds: f64) -> anyhow::Result<f64> {
    let port = free_port()?.to_string();
    let mut server = Command::new("iperf3")
        .args(["-s", "-B", "127.0.0.1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting iperf3 (install it: apt-get install iperf3; scripts/test does)")?;
    let secs = format!("{}", seconds.ceil().max(1.0) as u64);
    let mut last_err = String::new();
    for _ in 0..50 {
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port, "-t", &secs, "-J"])
            .output()
            .await
            .context("running the iperf3 client")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if let Some(bps) = v["end"]["sum_received"]["bits_per_second"].as_f64() {
            let _ = server.kill().await;
            return Ok(bps / 1e9);
        }
        last_err = v["error"].as_str().unwrap_or("no JSON result").to_string();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = server.kill().await;
    bail!("iperf3 client failed: {last_err}")
}

async fn throughput(a: ThroughputArgs) -> anyhow::Result<()> {
    let cases = parse_cases(&a.cases)?;
    anyhow::ensure!(a.repeat >= 1, "--repeat must be at least 1");
    // Every case's configuration checked before the first measurement, under the flag.
    for &(flps, epns) in &cases {
        throughput_config(&a, flps, epns)
            .check()
            .map_err(|e| anyhow::anyhow!("--seconds, --stf-size or --cases: {e:#}"))?;
    }
    println!(
        "fanin bench throughput: {} s per measurement, STF size {}, {} interleaved repetitions, medians",
        a.seconds, a.stf_size, a.repeat
    );
    let root = a
        .results
        .join(format!("{}-bench-throughput", fanin_report::timestamp()));
    let mut reference = Vec::new();
    let mut fanin: Vec<Vec<(f64, f64)>> = vec![Vec::new(); cases.len()];
    for r in 0..a.repeat {
        let g = iperf3(a.seconds).await?;
        println!("[{}] iperf3 single stream, loopback: {g:.2} Gbit/s", r + 1);
        reference.push(g);
        for (i, &(flps, epns)) in cases.iter().enumerate() {
            let cfg = throughput_config(&a, flps, epns);
            let dir = root.join(format!("{flps}x{epns}-r{}", r + 1));
            let s = crate::cluster::run_one(&cfg, &dir, &format!("fanin {flps}->{epns}")).await?;
            anyhow::ensure!(
                s.invariant_ok,
                "{flps}->{epns}: accounting invariant violated"
            );
            println!(
                "[{}] fanin {flps}->{epns}: {:.2} Gbit/s, loss {:.2} %, {} TFs",
                r + 1,
                s.goodput_gbps,
                s.loss_pct,
                s.issued
            );
            fanin[i].push((s.goodput_gbps, s.loss_pct));
        }
    }
    let lines = throughput_lines(&cases, &fanin, &reference);
    std::fs::create_dir_all(&root)?;
    std::fs::write(root.join("bench.txt"), lines.join("\n") + "\n")?;
    println!("\n{}", lines.join("\n"));
    println!("results: {}", root.display());
    Ok(())
}

/// `--cases`: FLPSxEPNS each (e.g. 2x4).
fn parse_cases(cases: &[String]) -> anyhow::Result<Vec<(u32, u32)>> {
    cases
        .iter()
        .map(|c| {
            c.split_once('x')
                .and_then(|(f, e)| Some((f.parse::<u32>().ok()?, e.parse::<u32>().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--cases: {c:?} is not FLPSxEPNS (e.g. 2x4)"))
        })
        .collect()
}

/// One unthrottled case of `flps` FLPs and `epns` EPNs for `--seconds`.
fn throughput_config(a: &ThroughputArgs, flps: u32, epns: u32) -> RunConfig {
    RunConfig {
        flps,
        epns,
        rate_hz: 0.0,
        tfs: None,
        duration_s: Some(a.seconds),
        stf_size: a.stf_size.clone(),
        crc: false,
        // Measure the transport, not time-outs: a generous build time-out.
        build_timeout_ms: 10_000,
        max_inflight: 16 * epns as u64,
        flp_buffer: fanin_node::config::ByteSize(1 << 30),
        epn_buffer: fanin_node::config::ByteSize(2 << 30),
        ..RunConfig::default()
    }
}

/// The table: per case, the median iperf3 and fanin goodput, their ratio, the worst
/// loss and every fanin run; then every iperf3 run.
fn throughput_lines(
    cases: &[(u32, u32)],
    fanin: &[Vec<(f64, f64)>],
    reference: &[f64],
) -> Vec<String> {
    let iperf = median(reference.to_vec());
    let mut lines = vec![format!(
        "{:<10} {:>14} {:>14} {:>8} {:>8}   {}",
        "FLPs->EPNs", "iperf3 Gbit/s", "fanin Gbit/s", "ratio", "loss %", "each fanin run (Gbit/s)"
    )];
    for (i, &(flps, epns)) in cases.iter().enumerate() {
        let g = median(fanin[i].iter().map(|x| x.0).collect());
        let loss = fanin[i].iter().map(|x| x.1).fold(0.0, f64::max);
        let all: Vec<String> = fanin[i].iter().map(|x| format!("{:.2}", x.0)).collect();
        lines.push(format!(
            "{:<10} {:>14.2} {:>14.2} {:>8.3} {:>8.2}   {}",
            format!("{flps}->{epns}"),
            iperf,
            g,
            g / iperf,
            loss,
            all.join(" ")
        ));
    }
    let all_ref: Vec<String> = reference.iter().map(|g| format!("{g:.2}")).collect();
    lines.push(format!("each iperf3 run (Gbit/s): {}", all_ref.join(" ")));
    lines
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    fanin_report::median(&v)
}
