//! `fanin run`: starts an ICN, the EPNs and the FLPs as separate local processes for each
//! configuration and repetition of an experiment, shows progress, and prints the table.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use fanin_node::{RunConfig, Summary};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::experiment::{self, Experiment};
use crate::table::{self, RunRow};
use crate::RunOverrides;

#[derive(Args)]
pub struct RunArgs {
    /// Experiment file (TOML). Without one, the embedded default experiment runs.
    pub file: Option<PathBuf>,
    /// Directory under which each run's results are written.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Repetitions per configuration (overrides the file's `repetitions`).
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// Run only the configurations with these labels (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    #[command(flatten)]
    pub overrides: RunOverrides,
}

pub async fn run(a: RunArgs) -> anyhow::Result<()> {
    let mut exp: Experiment = match &a.file {
        Some(p) => experiment::load(p)?,
        None => experiment::parse(experiment::DEFAULT, "default")?,
    };
    if !a.only.is_empty() {
        exp.configs.retain(|c| a.only.contains(&c.label));
        if exp.configs.is_empty() {
            bail!("--only {:?}: no configuration has those labels", a.only);
        }
    }
    for c in &mut exp.configs {
        a.overrides.apply(&mut c.run);
        c.run
            .check()
            .with_context(|| format!("configuration {}", c.label))?;
    }
    let reps = a.repetitions.unwrap_or(exp.repetitions);
    if reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    let root = a
        .results
        .join(format!("{}-{}", timestamp(), sanitize(&exp.name)));
    let single = exp.configs.len() == 1 && reps == 1;
    println!(
        "fanin run: experiment {:?}: {} configuration(s) x {reps} repetition(s); results in {}",
        exp.name,
        exp.configs.len(),
        root.display()
    );
    if !exp.description.is_empty() {
        println!("  {}", exp.description.trim());
    }
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (ci, c) in exp.configs.iter().enumerate() {
        let mut done: Vec<Summary> = Vec::new();
        for r in 0..reps {
            let dir = if single {
                root.clone()
            } else {
                root.join(format!("c{:02}-r{:02}", ci + 1, r + 1))
            };
            let prefix = format!(
                "[{}/{}] {} rep {}",
                ci + 1,
                exp.configs.len(),
                c.label,
                r + 1
            );
            match run_one(&c.run, &dir, &prefix).await {
                Ok(s) => {
                    println!(
                        "{prefix}: issued {} completed {} incomplete {} dropped {} loss {:.2} % goodput {:.3} Gbit/s pre-run {:.2} s invariant {} valid {}{}",
                        s.issued,
                        s.completed,
                        s.incomplete,
                        s.dropped,
                        s.loss_pct,
                        s.goodput_gbps,
                        s.prerun_s,
                        if s.invariant_ok { "ok" } else { "VIOLATED" },
                        s.valid,
                        s.invalid_reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
                    );
                    for e in &s.events {
                        println!("{prefix}:   {e}");
                    }
                    if !s.invariant_ok {
                        failures.push(format!("{prefix}: accounting invariant violated"));
                    }
                    done.push(s);
                }
                Err(e) => {
                    println!("{prefix}: FAILED: {e:#}");
                    failures.push(format!("{prefix}: {e:#}"));
                }
            }
        }
        if !done.is_empty() {
            // Long runs (TDR Table 19: 3 minutes) compare with the published long-run loss.
            let long = c.run.duration_s.unwrap_or(0.0) >= 120.0;
            let published = if long {
                c.published_long_loss_pct.or(c.published_loss_pct)
            } else {
                c.published_loss_pct
            };
            rows.push(RunRow::from_summaries(&c.label, &done, published));
        }
    }
    println!();
    let text = table::render(&rows);
    print!("{text}");
    std::fs::create_dir_all(&root)?;
    std::fs::write(root.join("table.txt"), &text)?;
    std::fs::write(root.join("table.csv"), table::csv(&rows))?;
    println!("\nresults: {}", root.display());
    if !failures.is_empty() {
        bail!("{} run(s) failed: {}", failures.len(), failures.join("; "));
    }
    Ok(())
}

/// Runs one configuration once and returns its summary.
pub async fn run_one(cfg: &RunConfig, dir: &Path, prefix: &str) -> anyhow::Result<Summary> {
    let checked = cfg.check()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cfg_path = dir.join("config.toml");
    std::fs::write(&cfg_path, toml::to_string(cfg)?)?;
    let exe = std::env::current_exe().context("locating the fanin binary")?;
    let log = |name: &str| -> anyhow::Result<Stdio> {
        Ok(std::fs::File::create(dir.join(name))
            .with_context(|| format!("creating {name}"))?
            .into())
    };
    let mut icn = Command::new(&exe)
        .args([
            "icn",
            "--control",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--progress",
        ])
        .arg("--config")
        .arg(&cfg_path)
        .arg("--results-dir")
        .arg(dir)
        .args(["--run-id", &crate::clock_run_id().to_string()])
        .stdout(Stdio::piped())
        .stderr(log("icn.log")?)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the ICN")?;
    let mut lines = BufReader::new(icn.stdout.take().expect("piped")).lines();
    let first = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
        .await
        .map_err(|_| anyhow::anyhow!("ICN did not report its address within 15 s"))??;
    let control = match first
        .as_deref()
        .and_then(|l| l.strip_prefix("listening control="))
    {
        Some(rest) => rest.split_whitespace().next().unwrap_or("").to_string(),
        None => bail!("ICN failed to start: {}", last_line(&dir.join("icn.log"))),
    };
    let mut nodes: Vec<(String, Child)> = Vec::new();
    for i in 0..cfg.epns {
        let child = Command::new(&exe)
            .args(["epn", "--icn", &control, "--id", &i.to_string()])
            .args(["--data-bind", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .args(["--build-buffer", &cfg.epn_buffer])
            .stdout(Stdio::null())
            .stderr(log(&format!("epn-{i}.log"))?)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting an EPN")?;
        nodes.push((format!("EPN {i}"), child));
    }
    for i in 0..cfg.flps {
        let child = Command::new(&exe)
            .args(["flp", "--icn", &control, "--id", &i.to_string()])
            .args(["--metrics", "127.0.0.1:0", "--send-buffer", &cfg.flp_buffer])
            .stdout(Stdio::null())
            .stderr(log(&format!("flp-{i}.log"))?)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting an FLP")?;
        nodes.push((format!("FLP {i}"), child));
    }

    let bar = match checked.total_tfs {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} TFs ended {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(prefix.to_string());
    let limit = checked.configured_duration.unwrap_or_default()
        + Duration::from_secs_f64(cfg.prerun_timeout_s)
        + checked.drain_timeout()
        + Duration::from_secs(60);
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() == 4 && f[0] == "PROGRESS" {
                if let (Ok(issued), Ok(ended)) = (f[1].parse::<u64>(), f[2].parse::<u64>()) {
                    bar.set_position(ended);
                    bar.set_message(format!("(issued {issued})"));
                }
            }
        }
    };
    let timed_out = tokio::time::timeout(limit, read).await.is_err();
    bar.finish_and_clear();
    if timed_out {
        let _ = icn.kill().await;
        bail!("run did not finish within {limit:?}; see {}", dir.display());
    }
    let status = icn.wait().await?;
    // Every node leaves by itself after RunStop; give them a moment, then insist.
    for (name, child) in &mut nodes {
        match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
            Ok(Ok(st)) if st.success() => {}
            Ok(Ok(st)) => {
                let logname = name.to_lowercase().replace(' ', "-") + ".log";
                println!(
                    "{prefix}: {name} exited with {st}: {}",
                    last_line(&dir.join(logname))
                );
            }
            _ => {
                let _ = child.kill().await;
                println!("{prefix}: {name} did not exit after the run; killed");
            }
        }
    }
    let summary_path = dir.join("summary.json");
    if !summary_path.exists() {
        bail!(
            "ICN exited with {status} and no summary: {}",
            last_line(&dir.join("icn.log"))
        );
    }
    let s: Summary = serde_json::from_str(&std::fs::read_to_string(&summary_path)?)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    Ok(s)
}

fn last_line(p: &Path) -> String {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("(no output in {})", p.display()))
}

/// A name safe as a directory name: letters, digits, `-` and `_`; anything else `_`.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// UTC `YYYYMMDD-HHMMSS-mmm` (civil-from-days, Howard Hinnant's algorithm).
pub fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}-{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}
