//! `fanin bench metrics`: what a node pays for its host metrics, as CPU per scrape and as
//! a share of one core at a 1 s scrape interval, beside a scrape without them.
//!
//! The TDR found Metricbeat taking up to 65 % of a Raspberry Pi's CPU for the same job.

use clap::Args;
use fanin_node::metrics::Metrics;

#[derive(Args)]
pub struct MetricsBenchArgs {
    /// Scrapes measured (each kind).
    #[arg(long, default_value_t = 2000)]
    pub scrapes: u32,
}

/// CPU time of the calling thread, in µs.
fn thread_cpu_us() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e6 + t.tv_nsec as f64 / 1e3
}

/// (CPU µs, wall µs) per call of `f` over `n` calls, and the last call's bytes. Wall
/// time shows what CPU time hides: a read of /proc or /sys that sleeps.
fn cpu_per(n: u32, mut f: impl FnMut() -> usize) -> (f64, f64, usize) {
    let (t0, w0) = (thread_cpu_us(), std::time::Instant::now());
    let mut bytes = 0;
    for _ in 0..n {
        bytes = f();
    }
    let wall = w0.elapsed().as_secs_f64() * 1e6;
    ((thread_cpu_us() - t0) / n as f64, wall / n as f64, bytes)
}

pub fn run(a: MetricsBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.scrapes > 0, "--scrapes must be at least 1");
    // An EPN's metrics after a run: the families a scrape encodes.
    let m = Metrics::new("epn", Some(0));
    for (status, reason) in [("complete", "none"), ("incomplete", "build_timeout")] {
        m.tf(status, reason);
    }
    m.set_buffer("epn_build", 1 << 20, 1 << 30);
    let (plain, plain_wall, plain_bytes) = cpu_per(a.scrapes, || m.render_only().len());
    let (host, host_wall, host_bytes) = cpu_per(a.scrapes, || m.render().len());
    println!(
        "fanin bench metrics: {} scrapes of an EPN's metrics, CPU of the scraping thread (wall)",
        a.scrapes
    );
    println!(
        "without host metrics: {plain:>8.1} µs per scrape ({plain_wall:.1} µs wall, {plain_bytes} bytes)"
    );
    println!(
        "with host metrics:    {host:>8.1} µs per scrape ({host_wall:.1} µs wall, {host_bytes} bytes), ratio {:.2}",
        host / plain.max(1e-9)
    );
    println!(
        "at a 1 s scrape interval: {:.4} % of one core (Metricbeat on the TDR's Raspberry Pi: up to 65 %)",
        host / 1e4
    );
    Ok(())
}
