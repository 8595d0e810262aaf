//! `fanin bench transport`: the seed's message-queue benchmark (paper 003, Figs. 1, 3,
//! 4) with real peers: throughput and CPU per GB on each side against block size.
//!
//! Each measurement is two processes of this binary (`fanin bench transport-peer`), or
//! iperf3 itself, on loopback or across a shaped testbed link, untuned or with the
//! seed's Table II kernel buffers. The rows go to a CSV and three plots per network.

mod fanin_path;
mod libs;
mod net;
pub mod peer;
mod report;
mod thread_cpu;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use fanin_sched::parse_bytes;

pub use peer::{PeerArgs, Transport};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetKind {
    /// Both peers on 127.0.0.1 (tuned: in a namespace of their own, needs root).
    Loopback,
    /// Two testbed hosts across a shaped link through a bridge (needs root).
    Testbed,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tuning {
    /// The kernel's defaults.
    Untuned,
    /// The seed's Table II: TCP buffers 4096 87380 16777216, MTU 9000, txqueuelen 50000.
    Tuned,
}

#[derive(Args)]
pub struct TransportBenchArgs {
    /// A few seconds: loopback, untuned, 4 block sizes, 256 MiB per measurement.
    #[arg(long)]
    pub quick: bool,
    /// Block sizes (default: 4 KiB to 64 MiB in powers of 4, and 50 MB).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Transports (default: all).
    #[arg(long, value_delimiter = ',')]
    pub transports: Vec<Transport>,
    /// Networks (default: loopback and testbed; --quick: loopback).
    #[arg(long, value_delimiter = ',')]
    pub nets: Vec<NetKind>,
    /// Kernel tunings (default: both; --quick: untuned).
    #[arg(long, value_delimiter = ',')]
    pub tunings: Vec<Tuning>,
    /// Bytes per measurement (rounded up to whole blocks, at least 4 blocks).
    #[arg(long)]
    pub bytes: Option<String>,
    /// Line rate of the testbed link.
    #[arg(long, default_value = "10gbit")]
    pub rate: String,
    /// Measurements of each case; medians are reported.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Where the CSV and the plots go.
    #[arg(long, default_value = "results/bench-transport")]
    pub out: PathBuf,
}

/// One measured case (medians over the repeats); NaN where it could not be measured.
#[derive(Debug, Clone)]
pub struct Row {
    pub net: NetKind,
    pub tuning: Tuning,
    pub transport: Transport,
    pub block: u64,
    pub gbit_s: f64,
    pub send_cpu_s_per_gb: f64,
    pub recv_cpu_s_per_gb: f64,
    /// Why a value is missing.
    pub note: String,
}

/// The plan with every default filled in.
struct Plan {
    sizes: Vec<u64>,
    transports: Vec<Transport>,
    nets: Vec<NetKind>,
    tunings: Vec<Tuning>,
    bytes: u64,
}

fn plan(a: &TransportBenchArgs) -> anyhow::Result<Plan> {
    let sizes = if !a.sizes.is_empty() {
        a.sizes
            .iter()
            .map(|s| parse_bytes(s).map_err(|e| anyhow::anyhow!("--sizes {s:?}: {e}")))
            .collect::<anyhow::Result<Vec<u64>>>()?
    } else if a.quick {
        vec![4 << 10, 64 << 10, 1 << 20, 16 << 20]
    } else {
        let mut v: Vec<u64> = (0..8).map(|i| 4096u64 << (2 * i)).collect();
        v.push(50_000_000);
        v.sort_unstable();
        v
    };
    for &s in &sizes {
        anyhow::ensure!(
            (1..=1 << 30).contains(&s),
            "--sizes: {s} B is outside 1 B..=1 GiB"
        );
    }
    let default_bytes = if a.quick { 256 << 20 } else { 1 << 30 };
    let bytes = match &a.bytes {
        Some(b) => parse_bytes(b).map_err(|e| anyhow::anyhow!("--bytes {b:?}: {e}"))?,
        None => default_bytes,
    };
    anyhow::ensure!(bytes > 0, "--bytes must be more than 0");
    anyhow::ensure!(
        (1..=15).contains(&a.repeat),
        "--repeat must be within 1..=15"
    );
    Ok(Plan {
        sizes,
        transports: or(&a.transports, a.quick, &Transport::ALL, &Transport::ALL),
        nets: or(
            &a.nets,
            a.quick,
            &[NetKind::Loopback],
            &[NetKind::Loopback, NetKind::Testbed],
        ),
        tunings: or(
            &a.tunings,
            a.quick,
            &[Tuning::Untuned],
            &[Tuning::Untuned, Tuning::Tuned],
        ),
        bytes,
    })
}

/// The list given, or the default for a quick or a full run.
fn or<T: Clone>(given: &[T], quick: bool, quick_default: &[T], full_default: &[T]) -> Vec<T> {
    match (given.is_empty(), quick) {
        (false, _) => given.to_vec(),
        (true, true) => quick_default.to_vec(),
        (true, false) => full_default.to_vec(),
    }
}

pub async fn run(a: TransportBenchArgs) -> anyhow::Result<()> {
    let p = plan(&a)?;
    let rate = crate::testbed::spec::parse_rate(&a.rate).context("--rate")?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    if !libs::BUILT {
        println!("zeromq, nng: not built in (build with --features fanin/peers; needs libzmq3-dev and libnng-dev)");
    }
    let repeat = a.repeat;
    let rows = tokio::task::spawn_blocking(move || measure_all(&p, rate, repeat))
        .await
        .context("bench thread")??;
    report::write(&a.out, &rows)?;
    print!("{}", report::leads(&rows));
    println!("wrote {} and its plots", a.out.join(report::CSV).display());
    Ok(())
}

fn measure_all(p: &Plan, rate_bps: u64, repeat: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    println!(
        "{:<9} {:<8} {:<9} {:>10} {:>9} {:>13} {:>13}  note",
        "net", "tuning", "peer", "block", "Gbit/s", "send CPU s/GB", "recv CPU s/GB"
    );
    for &kind in &p.nets {
        for &tuning in &p.tunings {
            let place = match net::Place::set_up(kind, tuning, rate_bps) {
                Ok(place) => place,
                Err(e) => {
                    println!("{kind:?} {tuning:?}: not measured: {e:#}");
                    continue;
                }
            };
            for &block in &p.sizes {
                let blocks = p.bytes.div_ceil(block).max(4);
                for &t in &p.transports {
                    let mut row = net::measure_median(&place, t, block, blocks, repeat);
                    (row.net, row.tuning) = (kind, tuning);
                    println!("{}", report::line(&row));
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}
