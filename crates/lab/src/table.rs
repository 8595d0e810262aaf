//! The results table, shaped like the TDR's Tables 13 and 18: one row per configuration,
//! means over repetitions, published values beside ours when the experiment has them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use fanin_node::Summary;

#[derive(Debug, Clone)]
pub struct RunRow {
    pub label: String,
    pub flps: u32,
    pub epns: u32,
    pub stf_size: String,
    pub rate_hz: f64,
    /// The load-balancing policy (shown when the rows differ in it).
    pub policy: String,
    pub runs: usize,
    pub issued: f64,
    pub completed: f64,
    pub lost: f64,
    pub loss_pct: f64,
    pub incomplete: f64,
    pub dropped: f64,
    pub split: f64,
    pub goodput_gbps: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub valid: usize,
    pub invariant_ok: bool,
    pub published_loss_pct: Option<f64>,
    /// Means over the runs' injected faults, when the experiment has `[[fault]]`s.
    pub faults: Option<FaultCols>,
    /// Published throughput (MB/s), shown beside ours when given.
    pub published_mb_s: Option<f64>,
}

/// Fail-over figures of a configuration: means over every fault of every repetition.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultCols {
    /// Mean detection time per kind of fault (`stop`, `kill`, `goat`).
    pub detect_ms: BTreeMap<String, f64>,
    pub rejoin_ms: Option<f64>,
    pub reassigned: f64,
    pub dropped_at_loss: f64,
}

impl FaultCols {
    pub fn from_runs(runs: &[Vec<crate::faults::FaultResult>]) -> Option<FaultCols> {
        let all: Vec<&crate::faults::FaultResult> = runs.iter().flatten().collect();
        if all.is_empty() {
            return None;
        }
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let per_run = |f: &dyn Fn(&crate::faults::FaultResult) -> u64| {
            all.iter().map(|r| f(r)).sum::<u64>() as f64 / runs.len().max(1) as f64
        };
        let mut detect_ms = BTreeMap::new();
        for kind in all.iter().map(|r| r.action.clone()) {
            if detect_ms.contains_key(&kind) {
                continue;
            }
            let v: Vec<f64> = all
                .iter()
                .filter(|r| r.action == kind)
                .filter_map(|r| r.detect_ms)
                .collect();
            if let Some(m) = mean(v) {
                detect_ms.insert(kind, m);
            }
        }
        Some(FaultCols {
            detect_ms,
            rejoin_ms: mean(all.iter().filter_map(|r| r.rejoin_ms).collect()),
            reassigned: per_run(&|r| r.reassigned),
            dropped_at_loss: per_run(&|r| r.dropped_at_loss),
        })
    }
}

impl RunRow {
    pub fn from_summary(label: &str, s: &Summary, published: Option<f64>) -> RunRow {
        Self::from_summaries(label, std::slice::from_ref(s), published)
    }

    /// Means over repetitions; `valid` counts the valid runs; the max latency is the max.
    pub fn from_summaries(label: &str, runs: &[Summary], published: Option<f64>) -> RunRow {
        assert!(!runs.is_empty());
        let n = runs.len() as f64;
        let mean = |f: &dyn Fn(&Summary) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let s0 = &runs[0];
        RunRow {
            label: label.to_string(),
            flps: s0.flps,
            epns: s0.epns,
            stf_size: s0.stf_size.clone(),
            policy: s0.policy.clone(),
            rate_hz: s0.rate_hz,
            runs: runs.len(),
            issued: mean(&|s| s.issued as f64),
            completed: mean(&|s| s.completed as f64),
            lost: mean(&|s| s.lost as f64),
            loss_pct: mean(&|s| s.loss_pct),
            incomplete: mean(&|s| s.incomplete as f64),
            dropped: mean(&|s| s.dropped as f64),
            split: mean(&|s| s.split as f64),
            goodput_gbps: mean(&|s| s.goodput_gbps),
            p50: mean(&|s| s.latency_ms.p50),
            p99: mean(&|s| s.latency_ms.p99),
            max: runs.iter().map(|s| s.latency_ms.max).fold(0.0, f64::max),
            valid: runs.iter().filter(|s| s.valid).count(),
            invariant_ok: runs.iter().all(|s| s.invariant_ok),
            published_loss_pct: published,
            faults: None,
            published_mb_s: None,
        }
    }
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The optional columns a table has: those some row fills.
struct Columns {
    published_loss: bool,
    mb_s: bool,
    faults: bool,
    /// The policy when it varies between rows (a sweep over policies).
    policy: bool,
}

pub fn render(rows: &[RunRow]) -> String {
    let cols = Columns {
        published_loss: rows.iter().any(|r| r.published_loss_pct.is_some()),
        mb_s: rows.iter().any(|r| r.published_mb_s.is_some()),
        faults: rows.iter().any(|r| r.faults.is_some()),
        policy: rows.iter().any(|r| r.policy != rows[0].policy),
    };
    let mut cells: Vec<Vec<String>> = vec![head(&cols)];
    cells.extend(rows.iter().map(|r| row(r, &cols)));
    fanin_report::align(&cells)
}

fn head(cols: &Columns) -> Vec<String> {
    let mut head = vec![
        "#",
        "FLPs",
        "EPNs",
        "STF size (B)",
        "rate Hz",
        "issued",
        "completed",
        "lost",
        "loss %",
        "incompl.",
        "dropped",
        "split",
        "Gbit/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "valid",
        "invariant",
    ];
    if cols.mb_s {
        head.extend(["MB/s", "published MB/s"]);
    }
    if cols.faults {
        head.extend(["detect ms", "rejoin ms", "re-assigned", "dropped at loss"]);
    }
    if cols.published_loss {
        head.push("published loss %");
    }
    if cols.policy {
        head.insert(5, "policy");
    }
    head.iter().map(|s| s.to_string()).collect()
}

fn row(r: &RunRow, cols: &Columns) -> Vec<String> {
    let or_dash = |v: Option<f64>, digits: usize| {
        v.map(|x| format!("{x:.digits$}"))
            .unwrap_or_else(|| "-".into())
    };
    let mut c = vec![
        r.label.clone(),
        r.flps.to_string(),
        r.epns.to_string(),
        r.stf_size.clone(),
        num(r.rate_hz),
        num(r.issued),
        num(r.completed),
        num(r.lost),
        format!("{:.2}", r.loss_pct),
        num(r.incomplete),
        num(r.dropped),
        num(r.split),
        format!("{:.3}", r.goodput_gbps),
        format!("{:.2}", r.p50),
        format!("{:.2}", r.p99),
        format!("{:.2}", r.max),
        format!("{}/{}", r.valid, r.runs),
        if r.invariant_ok { "ok" } else { "VIOLATED" }.to_string(),
    ];
    if cols.policy {
        c.insert(5, r.policy.clone());
    }
    if cols.mb_s {
        c.push(format!("{:.2}", r.goodput_gbps * 1e3 / 8.0));
        c.push(or_dash(r.published_mb_s, 2));
    }
    if cols.faults {
        match &r.faults {
            Some(f) => c.extend([
                f.detect_ms
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                or_dash(f.rejoin_ms, 0),
                num(f.reassigned),
                num(f.dropped_at_loss),
            ]),
            None => c.extend(["-".into(), "-".into(), "-".into(), "-".into()]),
        }
    }
    if cols.published_loss {
        c.push(or_dash(r.published_loss_pct, 2));
    }
    c
}

pub fn print_runs(rows: &[RunRow]) {
    print!("{}", render(rows));
}

/// Rows back from `table.csv` (the columns `csv` writes), for re-plotting.
pub fn from_csv(text: &str) -> anyhow::Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        // The label and the size are quoted and may hold commas and quotes.
        let f = fanin_report::csv_fields(line);
        anyhow::ensure!(
            f.len() >= 20,
            "table.csv line {}: {} columns, expected 20",
            n + 1,
            f.len()
        );
        let num = |i: usize| -> anyhow::Result<f64> {
            f[i].parse().map_err(|_| {
                anyhow::anyhow!("table.csv line {}: column {} is not a number", n + 1, i + 1)
            })
        };
        rows.push(RunRow {
            label: f[0].clone(),
            flps: num(1)? as u32,
            epns: num(2)? as u32,
            stf_size: f[3].clone(),
            rate_hz: num(4)?,
            policy: String::new(), // not in table.csv (plots do not need it)
            runs: num(5)? as usize,
            issued: num(6)?,
            completed: num(7)?,
            lost: num(8)?,
            loss_pct: num(9)?,
            incomplete: num(10)?,
            dropped: num(11)?,
            split: num(12)?,
            goodput_gbps: num(13)?,
            p50: num(14)?,
            p99: num(15)?,
            max: num(16)?,
            valid: num(17)? as usize,
            invariant_ok: f[18] == "true",
            published_loss_pct: f[19].parse().ok(),
            faults: None,
            published_mb_s: None,
        });
    }
    Ok(rows)
}

pub fn csv(rows: &[RunRow]) -> String {
    let mut out = String::from("label,flps,epns,stf_size,rate_hz,runs,issued,completed,lost,loss_pct,incomplete,dropped,split,goodput_gbps,latency_p50_ms,latency_p99_ms,latency_max_ms,valid_runs,invariant_ok,published_loss_pct\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{:.4},{},{},{},{:.4},{:.3},{:.3},{:.3},{},{},{}",
            fanin_report::csv_quoted(&r.label),
            r.flps,
            r.epns,
            fanin_report::csv_quoted(&r.stf_size),
            r.rate_hz,
            r.runs,
            r.issued,
            r.completed,
            r.lost,
            r.loss_pct,
            r.incomplete,
            r.dropped,
            r.split,
            r.goodput_gbps,
            r.p50,
            r.p99,
            r.max,
            r.valid,
            r.invariant_ok,
            r.published_loss_pct
                .map(|p| p.to_string())
                .unwrap_or_default()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: &str, policy: &str) -> RunRow {
        RunRow {
            label: label.into(),
            flps: 2,
            epns: 6,
            stf_size: "1MiB".into(),
            rate_hz: 200.0,
            policy: policy.into(),
            runs: 1,
            issued: 10.0,
            completed: 10.0,
            lost: 0.0,
            loss_pct: 0.0,
            incomplete: 0.0,
            dropped: 0.0,
            split: 0.0,
            goodput_gbps: 1.0,
            p50: 1.0,
            p99: 1.0,
            max: 1.0,
            valid: 1,
            invariant_ok: true,
            published_loss_pct: None,
            faults: None,
            published_mb_s: None,
        }
    }

    #[test]
    fn the_policy_column_appears_when_policies_differ() {
        let same = render(&[row("a", "reinit"), row("b", "reinit")]);
        assert!(!same.contains("policy"), "{same}");
        let both = render(&[row("a", "reinit"), row("b", "least-loaded")]);
        let header = both.lines().next().unwrap();
        assert!(header.contains("policy"), "{both}");
        assert!(
            both.contains("least-loaded") && both.contains("reinit"),
            "{both}"
        );
    }
}
