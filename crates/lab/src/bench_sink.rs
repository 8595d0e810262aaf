//! `fanin bench sink`: what handing built TFs on costs, each figure beside a reference
//! measured in the same invocation: the file writer against `dd` to the same disk, an
//! `exec` pipe against build-and-discard, and a plug-in's CPU per TF against a pipe's.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use fanin_node::icn::summary::Summary;
use fanin_node::RunConfig;

use crate::node_plan::{EpnSetup, NodePlan, SinkEntry};

const CAT: &str = "exec:cat > /dev/null";

#[derive(Args)]
pub struct SinkBenchArgs {
    /// Seconds per unthrottled case and per paced CPU case.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// STF size (one FLP, one EPN).
    #[arg(long, default_value = "4MiB")]
    pub stf_size: String,
    /// Bytes the file writer and dd each write.
    #[arg(long, default_value = "2GiB")]
    pub write: String,
    /// TF rate of the CPU comparison (plug-in, exec pipe, discard).
    #[arg(long, default_value_t = 100.0)]
    pub rate_hz: f64,
    /// Where the runs (and the files written, removed afterwards) go.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

/// A plug-in that takes every TF and touches nothing: the cost of the hand-off alone.
const NULL_PLUGIN: &str =
    "int fanin_init(int c, const char *const *v) { (void)c; (void)v; return 0; }\n\
    int fanin_tf(const void *tf) { (void)tf; return 0; }\n\
    void fanin_cleanup(void) {}\n";

pub async fn run(a: SinkBenchArgs) -> anyhow::Result<()> {
    let stf =
        fanin_sched::parse_bytes(&a.stf_size).map_err(|e| anyhow::anyhow!("--stf-size: {e}"))?;
    let write = fanin_sched::parse_bytes(&a.write).map_err(|e| anyhow::anyhow!("--write: {e}"))?;
    anyhow::ensure!(
        stf > 0 && write >= stf,
        "--write must hold at least one STF"
    );
    anyhow::ensure!(
        a.seconds > 0.0 && a.rate_hz > 0.0,
        "--seconds and --rate-hz must be positive"
    );
    let root = a
        .results
        .join(format!("{}-bench-sink", fanin_report::timestamp()));
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let root = std::path::absolute(&root)?;
    println!(
        "fanin bench sink: 1 FLP -> 1 EPN, STF {}, results {}",
        a.stf_size,
        root.display()
    );
    let mut lines = Vec::new();

    let dd = dd_gbps(&root, write)?;
    let tfs = write / stf;
    let file = case(
        &root,
        "file",
        &unthrottled(&a, Some(tfs)),
        plan(&["file:tfs,rotate=1GiB"], false),
    )
    .await?;
    remove_written(&root.join("file"))?;
    lines.push(ratio_line(
        "file writer vs dd (fdatasync)",
        file.goodput_gbps,
        dd,
        0.9,
    ));

    let discard = case(&root, "discard", &unthrottled(&a, None), plan(&[], false)).await?;
    for (name, zero_copy, what) in [
        ("exec", false, "exec (cat > /dev/null) vs discard"),
        ("exec-zc", true, "exec zero-copy (cat) vs discard"),
    ] {
        let cfg = unthrottled(&a, None);
        let exec = case(&root, name, &cfg, plan(&[CAT], zero_copy)).await?;
        let g = (exec.goodput_gbps, discard.goodput_gbps);
        lines.push(ratio_line(what, g.0, g.1, 0.8));
    }

    lines.extend(cpu_per_tf(&a, &root).await?);
    std::fs::write(root.join("bench.txt"), lines.join("\n") + "\n")?;
    println!("\n{}", lines.join("\n"));
    Ok(())
}

/// The EPN's CPU per TF at the same paced rate: discard, a plug-in, an exec pipe.
async fn cpu_per_tf(a: &SinkBenchArgs, root: &Path) -> anyhow::Result<Vec<String>> {
    let lib = null_plugin(root)?;
    let paced = paced(a);
    let plugin_spec = format!("plugin:{}", lib.display());
    let cpu = [
        (
            "discard",
            case(root, "cpu-discard", &paced, plan(&[], false)).await?,
        ),
        (
            "plugin (no copy)",
            case(root, "cpu-plugin", &paced, plan(&[&plugin_spec], false)).await?,
        ),
        (
            "exec pipe",
            case(root, "cpu-exec", &paced, plan(&[CAT], false)).await?,
        ),
        (
            "exec pipe, zero-copy",
            case(root, "cpu-exec-zc", &paced, plan(&[CAT], true)).await?,
        ),
    ];
    let per_tf: Vec<(&str, f64)> = cpu
        .iter()
        .map(|(n, s)| (*n, epn_cpu_us_per_tf(s)))
        .collect();
    let mut lines = vec![format!(
        "EPN CPU per TF at {} Hz (its process and its children):",
        a.rate_hz
    )];
    for (n, us) in &per_tf {
        lines.push(format!("  {n:<22} {us:>10.1} µs"));
    }
    let plugin = per_tf[1].1.max(1e-9);
    lines.push(format!(
        "  exec pipe / plug-in: {:.2}, zero-copy: {:.2}",
        per_tf[2].1 / plugin,
        per_tf[3].1 / plugin
    ));
    Ok(lines)
}

fn ratio_line(what: &str, fanin: f64, reference: f64, target: f64) -> String {
    format!(
        "{what:<36} fanin {fanin:>7.2} Gbit/s  reference {reference:>7.2} Gbit/s  ratio {:.3} (target {target})",
        fanin / reference
    )
}

fn unthrottled(a: &SinkBenchArgs, tfs: Option<u64>) -> RunConfig {
    RunConfig {
        flps: 1,
        epns: 1,
        rate_hz: 0.0,
        tfs,
        duration_s: if tfs.is_some() { None } else { Some(a.seconds) },
        stf_size: a.stf_size.clone(),
        crc: false,
        build_timeout_ms: 10_000,
        max_inflight: 64,
        flp_buffer: fanin_node::config::ByteSize(1 << 30),
        epn_buffer: fanin_node::config::ByteSize(1 << 30),
        ..RunConfig::default()
    }
}

fn paced(a: &SinkBenchArgs) -> RunConfig {
    RunConfig {
        rate_hz: a.rate_hz,
        duration_s: Some(a.seconds),
        tfs: None,
        ..unthrottled(a, None)
    }
}

/// One run with these sinks on its EPN; its summary, checked.
/// These sinks on every EPN; exec sinks lend their pages if `zero_copy`.
fn plan(sinks: &[&str], zero_copy: bool) -> NodePlan {
    NodePlan {
        sources: Vec::new(),
        sinks: sinks
            .iter()
            .map(|s| SinkEntry {
                spec: s.to_string(),
                epns: None,
            })
            .collect(),
        setup: EpnSetup {
            exec_zero_copy: zero_copy,
            ..Default::default()
        },
    }
}

/// One run with this node plan; its summary, checked (every TF accounted, none lost).
pub(crate) async fn case(
    root: &Path,
    name: &str,
    cfg: &RunConfig,
    plan: NodePlan,
) -> anyhow::Result<Summary> {
    let dir = root.join(name);
    let (s, _) = crate::cluster::run_on(cfg, &dir, name, None, &[], &plan, None).await?;
    anyhow::ensure!(s.invariant_ok, "{name}: accounting invariant violated");
    anyhow::ensure!(
        s.lost == 0,
        "{name}: {} TFs lost ({:?})",
        s.lost,
        s.dropped_by_reason
    );
    println!("{name}: {} TFs, {:.2} Gbit/s", s.completed, s.goodput_gbps);
    Ok(s)
}

fn epn_cpu_us_per_tf(s: &Summary) -> f64 {
    let cpu = s
        .nodes
        .get("EPN 0")
        .and_then(|c| c.get("events.cpu_us"))
        .copied();
    cpu.unwrap_or(0) as f64 / s.completed.max(1) as f64
}

/// `dd` writing `bytes` of zeros to the results disk, synced before it ends: Gbit/s.
fn dd_gbps(root: &Path, bytes: u64) -> anyhow::Result<f64> {
    let out = root.join("dd.bin");
    let count = bytes.div_ceil(1 << 20);
    let t = Instant::now();
    let st = std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", out.display()))
        .args([
            "bs=1M",
            &format!("count={count}"),
            "conv=fdatasync",
            "status=none",
        ])
        .status()
        .context("running dd")?;
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&out);
    anyhow::ensure!(st.success(), "dd failed ({st})");
    let gbps = (count << 20) as f64 * 8.0 / secs / 1e9;
    println!("dd: {} MiB in {secs:.2} s, {gbps:.2} Gbit/s", count);
    Ok(gbps)
}

/// Removes the TF files a case wrote (they can be large).
fn remove_written(run: &Path) -> anyhow::Result<()> {
    for entry in walk(run)? {
        if entry.extension().is_some_and(|e| e == "fanin") {
            std::fs::remove_file(&entry)?;
        }
    }
    Ok(())
}

fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

/// Builds the null plug-in with `cc`.
fn null_plugin(root: &Path) -> anyhow::Result<PathBuf> {
    let src = root.join("null_plugin.c");
    std::fs::write(&src, NULL_PLUGIN)?;
    let lib = root.join("libnull_plugin.so");
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .context("running cc (install gcc; scripts/test does)")?;
    anyhow::ensure!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(lib)
}
