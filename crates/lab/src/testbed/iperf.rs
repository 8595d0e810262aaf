//! The TDR's synthetic benchmark (§2): iperf3 from one testbed host to another, N runs
//! of S seconds, printed as a distribution. Also the capacity reference for experiments.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use clap::Args;

use super::{load, Spec};

#[derive(Args)]
pub struct IperfArgs {
    /// Testbed name.
    #[arg(long, default_value = "pi-cluster")]
    pub name: String,
    /// Sending host (number, 1-based).
    #[arg(long, default_value_t = 2)]
    pub from: u32,
    /// Receiving host.
    #[arg(long, default_value_t = 3)]
    pub to: u32,
    /// Seconds per run (the TDR: 10).
    #[arg(long, default_value_t = 10)]
    pub seconds: u32,
    /// Runs (the TDR: 50).
    #[arg(long, default_value_t = 5)]
    pub repetitions: u32,
}

pub fn run(a: IperfArgs) -> anyhow::Result<()> {
    let s = load(&a.name)?;
    if a.repetitions == 0 || a.seconds == 0 {
        bail!("--repetitions and --seconds must be at least 1");
    }
    println!(
        "iperf3 h{} -> h{} on testbed {}: {} x {} s",
        a.from, a.to, s.name, a.repetitions, a.seconds
    );
    let mut all = Vec::new();
    for r in 0..a.repetitions {
        let m = measure(&s, a.from, a.to, a.seconds)?;
        println!("  run {:>3}: {:.2} Mbit/s", r + 1, m);
        all.push(m);
    }
    print!("{}", distribution(&all));
    Ok(())
}

/// One iperf3 run between two hosts; returns the received goodput in Mbit/s.
pub fn measure(s: &Spec, from: u32, to: u32, seconds: u32) -> anyhow::Result<f64> {
    for h in [from, to] {
        if h == 0 || h > s.hosts {
            bail!("host {h}: testbed {} has hosts 1..={}", s.name, s.hosts);
        }
    }
    if from == to {
        bail!("--from and --to must be different hosts");
    }
    let server_ip = s.data_ip(to).to_string();
    let mut server = Command::new("ip")
        .args(["netns", "exec", &s.host_ns(to), "iperf3", "-s", "-1"])
        .args(["--forceflush", "-B", &server_ip, "-p", "5201"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 (install it: apt-get install iperf3; scripts/test does)")?;
    // Handshake: wait for the server to say it listens.
    let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
    let ready = lines
        .by_ref()
        .any(|l| l.map(|l| l.contains("Server listening")).unwrap_or(false));
    if !ready {
        let _ = server.kill();
        let _ = server.wait();
        bail!("iperf3 server in {} did not start", s.host_ns(to));
    }
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &s.host_ns(from),
            "iperf3",
            "-c",
            &server_ip,
        ])
        .args(["-B", &s.data_ip(from).to_string(), "-p", "5201"])
        .args(["-t", &seconds.to_string(), "-J"])
        .output()
        .context("running the iperf3 client")?;
    let _ = server.kill();
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    match v["end"]["sum_received"]["bits_per_second"].as_f64() {
        Some(bps) => Ok(bps / 1e6),
        None => bail!(
            "iperf3 h{from} -> h{to} failed: {}",
            v["error"].as_str().unwrap_or("no result")
        ),
    }
}

/// Min / median / mean / max and a histogram in 1 Mbit/s bins.
pub fn distribution(v: &[f64]) -> String {
    if v.is_empty() {
        return String::new();
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mean = s.iter().sum::<f64>() / s.len() as f64;
    let mut t = format!(
        "min {:.2}  median {:.2}  mean {:.2}  max {:.2} Mbit/s\n",
        s[0],
        fanin_report::median(&s),
        mean,
        s[s.len() - 1]
    );
    let mut bins: Vec<(i64, usize)> = Vec::new();
    for x in &s {
        let b = x.floor() as i64;
        match bins.last_mut() {
            Some((k, n)) if *k == b => *n += 1,
            _ => bins.push((b, 1)),
        }
    }
    for (b, n) in bins {
        t += &format!("  {b:>5} Mbit/s: {:<3} {}\n", n, "#".repeat(n.min(60)));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_bins_by_megabit() {
        let t = distribution(&[94.2, 93.9, 94.7, 94.1]);
        assert!(t.starts_with("min 93.90  median 94.15"), "{t}");
        assert!(t.contains("   93 Mbit/s: 1 "), "{t}");
        assert!(t.contains("   94 Mbit/s: 3 "), "{t}");
    }
}
