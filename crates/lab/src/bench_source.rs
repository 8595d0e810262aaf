//! `fanin bench source`: what taking STFs from a source costs, beside a reference measured
//! in the same invocation: goodput and FLP CPU per GB through the shared-memory ring
//! against the synthetic source, and the on-data scheduling delay at 1 and 10 kHz.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use fanin_node::config::{ByteSize, ScheduleKind};
use fanin_node::icn::summary::Summary;
use fanin_node::RunConfig;

use crate::bench_sink::case;
use crate::node_plan::{NodePlan, SourceEntry};

/// The FLP's send buffer in every case (and the ring's size).
const FLP_BUFFER: u64 = 256 << 20;

#[derive(Args)]
pub struct SourceBenchArgs {
    /// Seconds per case.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// STF size of the goodput cases (one FLP, one EPN, unthrottled).
    #[arg(long, default_value = "4MiB")]
    pub stf_size: String,
    /// Pairs of goodput cases, synthetic and ring alternating; the medians are compared
    /// (one 5 s case on this 2-core VM varies by a quarter from one to the next).
    #[arg(long, default_value_t = 3)]
    pub repetitions: u32,
    /// TF rates (Hz) of the scheduling-delay cases.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub rates: Vec<f64>,
    /// Where the runs go.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

pub async fn run(a: SourceBenchArgs) -> anyhow::Result<()> {
    let stf =
        fanin_sched::parse_bytes(&a.stf_size).map_err(|e| anyhow::anyhow!("--stf-size: {e}"))?;
    anyhow::ensure!(
        (1..=FLP_BUFFER / 2).contains(&stf),
        "--stf-size must be within 1 B..=128 MiB (two fit the FLP's 256 MiB buffer)"
    );
    anyhow::ensure!(a.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(
        (1..=100).contains(&a.repetitions),
        "--repetitions must be within 1..=100"
    );
    anyhow::ensure!(
        a.rates
            .iter()
            .all(|r| r.is_finite() && (1.0..=1e6).contains(r)),
        "--rates must be within 1..=1000000 Hz"
    );
    let root = a
        .results
        .join(format!("{}-bench-source", fanin_report::timestamp()));
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let root = std::path::absolute(&root)?;
    println!(
        "fanin bench source: 1 FLP -> 1 EPN, on-data, STF {}, results {}",
        a.stf_size,
        root.display()
    );
    let mut lines = goodput_lines(&a, &root, stf).await?;
    for &rate in &a.rates {
        let s = case(
            &root,
            &format!("delay-{rate}"),
            &delay_config(&a, rate),
            NodePlan::default(),
        )
        .await?;
        lines.push(delay_line(rate, &s));
    }
    std::fs::write(root.join("bench.txt"), lines.join("\n") + "\n")?;
    println!("\n{}", lines.join("\n"));
    Ok(())
}

/// Synthetic and ring cases, alternating: their median goodput and FLP CPU per GB.
async fn goodput_lines(a: &SourceBenchArgs, root: &Path, stf: u64) -> anyhow::Result<Vec<String>> {
    let cfg = goodput_config(a);
    let (mut synthetic, mut shm) = (Vec::new(), Vec::new());
    for r in 1..=a.repetitions {
        let name = format!("synthetic-{r}");
        synthetic.push(case(root, &name, &cfg, NodePlan::default()).await?);
        let shm_name = format!("shm-{r}");
        let run = |ring: String| {
            let plan = NodePlan {
                sources: vec![SourceEntry {
                    spec: format!("shm:{ring}"),
                    flps: None,
                }],
                ..NodePlan::default()
            };
            case(root, &shm_name, &cfg, plan)
        };
        shm.push(with_ring(stf, run).await?);
    }
    let goodput = |v: &[Summary]| median(v.iter().map(|s| s.goodput_gbps));
    let cpu = |v: &[Summary]| median(v.iter().map(flp_cpu_s_per_gb));
    let (g_shm, g_syn) = (goodput(&shm), goodput(&synthetic));
    let (c_shm, c_syn) = (cpu(&shm), cpu(&synthetic));
    let n = a.repetitions;
    Ok(vec![
        format!(
            "goodput  shm {g_shm:>7.2} Gbit/s  synthetic {g_syn:>7.2} Gbit/s  ratio {:.3} (target 0.9; medians of {n})",
            g_shm / g_syn
        ),
        format!(
            "FLP CPU  shm {c_shm:>7.3} s/GB    synthetic {c_syn:>7.3} s/GB    ratio {:.3} (synthetic / shm; medians of {n})",
            c_syn / c_shm.max(1e-9)
        ),
    ])
}

/// Runs `f` while a read-out thread fills a fresh ring as fast as the FLP frees it: as
/// many slots of the STF size as the FLP's send buffer holds STFs (the synthetic source
/// may have as many in flight). The payload is written once per slot, then the slots
/// are committed in place, as a DMA read-out would (its copy is not the FLP's cost).
async fn with_ring<F, Fut>(stf: u64, f: F) -> anyhow::Result<Summary>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Summary>>,
{
    let name = format!("fanin-bench-{}", std::process::id());
    let slot = stf.div_ceil(4096) * 4096;
    let slots = (FLP_BUFFER / slot).clamp(2, 4096);
    let mut w = fanin_shm::Writer::create(&name, slots, slot)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let readout = std::thread::spawn(move || {
        let mut tf = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            let fill = |b: &mut [u8]| {
                if tf < slots {
                    b.iter_mut()
                        .enumerate()
                        .for_each(|(i, x)| *x = (i * 31) as u8);
                }
            };
            match w.write_with(tf, stf, false, fill) {
                Ok(true) => tf += 1,
                Ok(false) => std::thread::sleep(std::time::Duration::from_millis(1)),
                Err(e) => return Err(e),
            }
        }
        w.close();
        w.unlink()
    });
    let res = f(name).await;
    stop.store(true, Ordering::Relaxed);
    readout
        .join()
        .map_err(|_| anyhow::anyhow!("the read-out thread panicked"))??;
    res
}

fn goodput_config(a: &SourceBenchArgs) -> RunConfig {
    RunConfig {
        flps: 1,
        epns: 1,
        rate_hz: 0.0,
        tfs: None,
        duration_s: Some(a.seconds),
        stf_size: a.stf_size.clone(),
        schedule: ScheduleKind::OnData,
        crc: false,
        build_timeout_ms: 10_000,
        flp_buffer: ByteSize(FLP_BUFFER),
        epn_buffer: ByteSize(1 << 30),
        ..RunConfig::default()
    }
}

/// Small STFs on the FLP's clock at `rate` Hz: the scheduling delay, not the network.
fn delay_config(a: &SourceBenchArgs, rate: f64) -> RunConfig {
    RunConfig {
        rate_hz: rate,
        stf_size: "4KiB".into(),
        ..goodput_config(a)
    }
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn flp_event(s: &Summary, key: &str) -> f64 {
    let v = s.nodes.get("FLP 0").and_then(|c| c.get(key)).copied();
    v.unwrap_or(0) as f64
}

fn flp_cpu_s_per_gb(s: &Summary) -> f64 {
    let gb = s.completed_bytes as f64 / 1e9;
    flp_event(s, "events.cpu_us") / 1e6 / gb.max(1e-9)
}

fn delay_line(rate: f64, s: &Summary) -> String {
    format!(
        "scheduling delay at {:>5} Hz (announcement -> Assign at the FLP, {} TFs): p50 {:.0} µs  p99 {:.0} µs",
        rate,
        flp_event(s, "events.schedule_delay_count"),
        flp_event(s, "events.schedule_delay_p50_us"),
        flp_event(s, "events.schedule_delay_p99_us"),
    )
}
