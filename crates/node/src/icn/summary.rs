//! The result of one run: `summary.json`, `summary.csv` and the per-TF `tfs.csv`.
//! Built from the ICN's ledger and the counters every node sends at run end.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::ledger::{Ledger, TfRow};
use crate::config::Checked;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// A node leaving or (re)joining the schedule during the run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MemberEvent {
    /// Seconds since the run started (ICN clock).
    pub t_s: f64,
    /// `EPN 3`, `FLP 0`.
    pub node: String,
    /// `lost`, `joining`, `rejoined`.
    pub kind: String,
    /// Lost EPN: TFs moved to other EPNs, and TFs dropped because none could take them.
    pub reassigned: u64,
    pub dropped: u64,
    pub detail: String,
    /// Time the policy took to take the change in (µs): re-initialization rebuilds its
    /// whole table, blacklist and whitelist only mark the EPN.
    #[serde(default)]
    pub policy_us: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub run_id: u64,
    pub flps: u32,
    pub epns: u32,
    pub rate_hz: f64,
    pub stf_size: String,
    pub policy: String,
    pub issued: u64,
    pub completed: u64,
    pub incomplete: u64,
    pub dropped: u64,
    /// issued - completed.
    pub lost: u64,
    pub loss_pct: f64,
    pub incomplete_by_reason: BTreeMap<String, u64>,
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// TFs an EPN saw STFs of without being their builder, or with an inconsistent FLP set.
    pub split: u64,
    pub duplicate_stfs: u64,
    pub crc_errors: u64,
    /// TFs re-assigned to another EPN because theirs died (zero-loss mode).
    #[serde(default)]
    pub reassigned: u64,
    pub completed_bytes: u64,
    pub goodput_gbps: f64,
    /// Achieved run duration: first issue to last issue plus one period.
    pub duration_s: f64,
    pub configured_duration_s: Option<f64>,
    /// First issue to last TF ended.
    pub active_s: f64,
    pub rate_hz_achieved: f64,
    pub latency_ms: Latency,
    /// Time from ICN start until the run started (all registered and connected).
    pub prerun_s: f64,
    /// Time the run spent paused (run control), left out of `duration_s`.
    #[serde(default)]
    pub paused_s: f64,
    pub invariant_ok: bool,
    pub valid: bool,
    pub invalid_reason: Option<String>,
    /// Counters each FLP and EPN reported at run end ("EPN 3" -> name -> value).
    pub nodes: BTreeMap<String, BTreeMap<String, u64>>,
    /// Node failures and other notable events during the run.
    pub events: Vec<String>,
    /// Nodes leaving and (re)joining the schedule, with times.
    #[serde(default)]
    pub membership: Vec<MemberEvent>,
    /// Times the policy rebuilt its table (re-initialization policy).
    #[serde(default)]
    pub policy_resets: u64,
    /// Wall-clock start of the run (µs since the UNIX epoch), to line up faults.
    #[serde(default)]
    pub run_start_unix_us: u64,
    /// The run was stopped early by the operator (SIGINT/SIGTERM); `events` says how
    /// far it got.
    #[serde(default)]
    pub interrupted: bool,
    /// The name of the results directory the summary is written in (the run's name in
    /// `fanin run`'s sweeps: `c01-r01`, or the experiment's directory for a single run).
    #[serde(default)]
    pub run: String,
    /// TFs the configuration asked for, when known in advance (`tfs`, or a paced
    /// duration): a run that issued fewer ended short.
    #[serde(default)]
    pub planned_tfs: Option<u64>,
}

/// The ICN's own count of what it did, kept apart from the ledger: TF ids handed out
/// and rows written per status. The invariant is checked against both.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub ids: u64,
    pub completed: u64,
    pub incomplete: u64,
    pub dropped: u64,
}

impl Tally {
    /// One more row with this status.
    pub fn count(&mut self, status: fanin_proto::TfStatus) {
        use fanin_proto::TfStatus::*;
        match status {
            Complete => self.completed += 1,
            Incomplete => self.incomplete += 1,
            Dropped => self.dropped += 1,
        }
    }
}

fn sum_counter(nodes: &BTreeMap<String, BTreeMap<String, u64>>, key: &str) -> u64 {
    // Values come from peers: saturate rather than overflow.
    nodes
        .values()
        .filter_map(|c| c.get(key))
        .fold(0u64, |a, &v| a.saturating_add(v))
}

/// issued = completed + incomplete + dropped, where "issued" is the number of TF ids
/// handed out and each term the number of TFs that ended so, counted both by the ledger
/// and by the rows the ICN wrote; and nothing left pending.
fn invariant_ok(ledger: &Ledger, tally: &Tally) -> bool {
    ledger.pending() == 0
        && ledger.invariant_holds()
        && tally.ids == ledger.issued
        && tally.completed == ledger.completed
        && tally.incomplete == ledger.incomplete_total()
        && tally.dropped == ledger.dropped_total()
        && tally.ids == tally.completed + tally.incomplete + tally.dropped
}

/// Fewer TFs issued than planned, said as such.
fn short_of(issued: u64, planned: Option<u64>) -> Option<String> {
    planned
        .filter(|p| issued < *p)
        .map(|p| format!("the run ended after issuing {issued} of {p} TFs"))
}

/// Why a run is not valid: a broken invariant, fewer TFs issued than planned, a loss
/// over the configured bound, or
/// (paced) an achieved duration outside the TDR's +-1 % of the configured one.
fn invalid_reason(
    cfg: &Checked,
    invariant_ok: bool,
    issued: u64,
    loss_pct: f64,
    duration_s: f64,
    configured: Option<f64>,
) -> Option<String> {
    if !invariant_ok {
        return Some("accounting invariant violated".to_string());
    }
    if let Some(why) = short_of(issued, cfg.total_tfs) {
        return Some(why);
    }
    if loss_pct > cfg.cfg.max_loss_pct {
        return Some(format!(
            "loss {loss_pct:.2} % is over max_loss_pct {} %",
            cfg.cfg.max_loss_pct
        ));
    }
    match (cfg.paced(), configured) {
        (true, Some(c)) if (duration_s - c).abs() > 0.01 * c => Some(format!(
            "achieved duration {duration_s:.3} s is outside +-1 % of {c:.3} s"
        )),
        _ => None,
    }
}

/// Counts by reason, keyed by the reasons' names.
fn reason_names(m: &BTreeMap<fanin_proto::Reason, u64>) -> BTreeMap<String, u64> {
    m.iter().map(|(r, n)| (r.name().to_string(), *n)).collect()
}

/// `x / over`, or 0 when `over` is not positive (nothing issued, no time).
fn per(x: f64, over: f64) -> f64 {
    if over > 0.0 {
        x / over
    } else {
        0.0
    }
}

/// The run's issuing time (first to last issue, plus one period when paced, less the
/// pauses) and its active time (first issue to the last TF's end), in seconds.
fn spans(cfg: &Checked, ledger: &Ledger, paused_s: f64) -> (f64, f64) {
    let first = ledger.first_issue_us.unwrap_or(0);
    let last_issue = ledger.last_issue_us.unwrap_or(first);
    let period = if cfg.paced() {
        1.0 / cfg.cfg.rate_hz
    } else {
        0.0
    };
    let duration_s = if ledger.issued == 0 {
        0.0
    } else {
        ((last_issue - first) as f64 / 1e6 + period - paused_s).max(0.0)
    };
    let active_s = ledger
        .last_end_us
        .map(|e| e.saturating_sub(first) as f64 / 1e6)
        .unwrap_or(0.0);
    (duration_s, active_s)
}

impl Summary {
    pub fn build(
        run_id: u64,
        cfg: &Checked,
        ledger: &Ledger,
        tally: &Tally,
        (prerun_s, paused_s): (f64, f64),
        nodes: BTreeMap<String, BTreeMap<String, u64>>,
        events: Vec<String>,
    ) -> Summary {
        let (duration_s, active_s) = spans(cfg, ledger, paused_s);
        let incomplete = ledger.incomplete_total();
        let dropped = ledger.dropped_total();
        let lost = ledger.issued - ledger.completed;
        let invariant_ok = invariant_ok(ledger, tally);
        let configured = cfg.configured_duration.map(|d| d.as_secs_f64());
        let loss_pct = per(100.0 * lost as f64, ledger.issued as f64);
        let invalid_reason = invalid_reason(
            cfg,
            invariant_ok,
            ledger.issued,
            loss_pct,
            duration_s,
            configured,
        );
        Summary {
            run_id,
            flps: cfg.cfg.flps,
            epns: cfg.cfg.epns,
            rate_hz: cfg.cfg.rate_hz,
            stf_size: cfg.stf_size.to_string(),
            policy: cfg.cfg.policy.to_string(),
            issued: ledger.issued,
            completed: ledger.completed,
            incomplete,
            dropped,
            lost,
            loss_pct,
            incomplete_by_reason: reason_names(&ledger.incomplete),
            dropped_by_reason: reason_names(&ledger.dropped),
            split: sum_counter(&nodes, "events.split_tfs"),
            duplicate_stfs: sum_counter(&nodes, "events.duplicate_stfs"),
            crc_errors: sum_counter(&nodes, "events.crc_errors"),
            reassigned: ledger.reassigned,
            completed_bytes: ledger.completed_bytes,
            goodput_gbps: per(ledger.completed_bytes as f64 * 8.0, active_s) / 1e9,
            duration_s,
            configured_duration_s: configured,
            active_s,
            rate_hz_achieved: per(ledger.issued as f64, duration_s),
            latency_ms: Latency {
                p50: ledger.latency_ms(0.5),
                p99: ledger.latency_ms(0.99),
                max: ledger.latency_max_ms(),
            },
            prerun_s,
            paused_s,
            invariant_ok,
            valid: invalid_reason.is_none(),
            invalid_reason,
            nodes,
            events,
            membership: Vec::new(),
            policy_resets: 0,
            run_start_unix_us: 0,
            interrupted: false,
            run: String::new(),
            planned_tfs: cfg.total_tfs,
        }
    }

    /// Why the run ended before it issued what it planned, unless the operator stopped it.
    /// (Its events, printed with the run, say what ended it.)
    pub fn ended_short(&self) -> Option<String> {
        short_of(self.issued, self.planned_tfs).filter(|_| !self.interrupted)
    }

    pub const CSV_HEADER: &'static str = "run,run_id,flps,epns,rate_hz,stf_size,policy,issued,completed,incomplete,dropped,lost,loss_pct,split,duplicate_stfs,crc_errors,goodput_gbps,duration_s,rate_hz_achieved,latency_p50_ms,latency_p99_ms,latency_max_ms,prerun_s,invariant_ok,valid";

    pub fn csv_row(&self) -> String {
        format!(
            "\"{}\",{},{},{},{},\"{}\",{},{},{},{},{},{},{:.4},{},{},{},{:.4},{:.4},{:.3},{:.3},{:.3},{:.3},{:.3},{},{}",
            self.run.replace('"', "'"),
            self.run_id,
            self.flps,
            self.epns,
            self.rate_hz,
            self.stf_size,
            self.policy,
            self.issued,
            self.completed,
            self.incomplete,
            self.dropped,
            self.lost,
            self.loss_pct,
            self.split,
            self.duplicate_stfs,
            self.crc_errors,
            self.goodput_gbps,
            self.duration_s,
            self.rate_hz_achieved,
            self.latency_ms.p50,
            self.latency_ms.p99,
            self.latency_ms.max,
            self.prerun_s,
            self.invariant_ok,
            self.valid
        )
    }

    /// The summary's files in a results directory.
    pub const JSON_FILE: &'static str = "summary.json";
    pub const CSV_FILE: &'static str = "summary.csv";

    /// `summary.json` and `summary.csv` in `dir`, each written whole or not at all (a
    /// temporary file renamed into place); `run` becomes the directory's name.
    pub fn write(&mut self, dir: &Path) -> anyhow::Result<()> {
        let run = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        self.write_as(dir, &run.unwrap_or_default())
    }

    /// The same with the run named `run` (a simulation: its name, not its stamped
    /// directory's, so that the same seed writes the same bytes).
    pub fn write_as(&mut self, dir: &Path, run: &str) -> anyhow::Result<()> {
        self.run = run.to_string();
        let json = serde_json::to_string_pretty(self)? + "\n";
        write_atomic(&dir.join(Self::JSON_FILE), &json)?;
        let csv = format!("{}\n{}\n", Self::CSV_HEADER, self.csv_row());
        write_atomic(&dir.join(Self::CSV_FILE), &csv)
    }
}

/// Creates `path`; the error names it.
fn create(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

/// Writes `path` through a temporary file beside it and a rename: readers see the old
/// file or the whole new one. The error names the path.
pub fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("writing {}: {e}", path.display())
    })
}

/// One `tfs.csv` row read back.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvTf {
    pub epn: Option<u32>,
    pub issue_s: f64,
    pub ack_s: f64,
    pub latency_ms: f64,
    pub status: String,
}

/// The lines of a file, decoded lossily; none if it cannot be opened.
fn lines(p: &Path) -> impl Iterator<Item = String> {
    use std::io::BufRead;
    let f = std::fs::File::open(p).ok();
    f.into_iter().flat_map(|f| {
        std::io::BufReader::new(f)
            .split(b'\n')
            .map_while(Result::ok)
            .map(|l| String::from_utf8_lossy(&l).into_owned())
    })
}

/// Where `TfCsv` writes: its files (a test's writer can fail on cue).
type Sink = Box<dyn Write + Send>;

/// A rows file for tests: takes nothing while `full` (a full disk), then at most
/// `per_write` bytes a write into `got`.
#[cfg(test)]
pub struct TestDisk {
    pub full: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub got: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    per_write: usize,
}

#[cfg(test)]
impl TestDisk {
    /// A disk full for now.
    pub fn full(per_write: usize) -> TestDisk {
        TestDisk {
            full: std::sync::Arc::new(true.into()),
            got: Default::default(),
            per_write,
        }
    }
}

#[cfg(test)]
impl Write for TestDisk {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.full.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::other("no space left on device"));
        }
        let n = b.len().min(self.per_write);
        self.got.lock().unwrap().extend_from_slice(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rows pending for the file at most (about a million TFs' rows).
const MAX_PENDING: usize = 64 << 20;
/// Rows pending before `TfCsv::row` writes them out without waiting for a commit.
const WRITE_AT: usize = 64 << 10;

/// Streams one row per ended TF to `tfs.csv`, and each EPN's load once a second to
/// `loads.csv` (memory stays flat however long the run).
pub struct TfCsv {
    out: Sink,
    /// Rows not in the file yet, whole, in order: a failed or partial write loses none
    /// (a Release waits for them: `commit`). At most `MAX_PENDING` bytes.
    pending: Vec<u8>,
    loads: std::io::BufWriter<Sink>,
    /// After a take-over the rows go to a file of their own, `tfs.csv` at the end.
    file: std::path::PathBuf,
}

impl TfCsv {
    pub const HEADER: &'static str = "tf_id,epn,issue_time_s,ack_time_s,latency_ms,status,reason";

    pub fn create(dir: &Path) -> anyhow::Result<TfCsv> {
        let out = Box::new(create(&dir.join("tfs.csv"))?);
        let f = create(&dir.join("loads.csv"))?;
        let mut loads = std::io::BufWriter::new(Box::new(f) as Sink);
        writeln!(loads, "time_s,epn,free_bytes,building")?;
        Ok(TfCsv {
            out,
            pending: format!("{}\n", Self::HEADER).into_bytes(),
            loads,
            file: dir.join("tfs.csv"),
        })
    }

    /// Taking a run over: this ICN's rows go to `dir/name`, starting with every row
    /// the failed ICNs wrote (the next take-over reads this one file); loads go on.
    pub fn resume(dir: &Path, name: &str, rows: &[TfRow]) -> anyhow::Result<TfCsv> {
        let file = dir.join(name);
        let mut text = format!("{}\n", Self::HEADER);
        for r in rows {
            text.push_str(&Self::line(r));
            text.push('\n');
        }
        let mut out = create(&file)?;
        out.write_all(text.as_bytes())
            .with_context(|| format!("writing {}", file.display()))?;
        let loads = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join("loads.csv"))
            .with_context(|| format!("opening {}", dir.join("loads.csv").display()))?;
        Ok(TfCsv {
            out: Box::new(out),
            pending: Vec::new(),
            loads: std::io::BufWriter::new(Box::new(loads)),
            file,
        })
    }

    /// Rows to `out` (loads go nowhere), as if to `dir/tfs.csv`: for tests.
    #[cfg(test)]
    pub fn to_writer(out: Sink, dir: &Path) -> TfCsv {
        TfCsv {
            out,
            pending: Vec::new(),
            loads: std::io::BufWriter::new(Box::new(std::io::sink())),
            file: dir.join("tfs.csv"),
        }
    }

    /// Every row of a rows file a crashed ICN may have left: only whole lines count
    /// (the last may be cut), and a line that is not a row is skipped.
    pub fn read_rows(path: &Path) -> std::io::Result<Vec<TfRow>> {
        let text = std::fs::read_to_string(path)?;
        Ok(text
            .split_inclusive('\n')
            .skip(1)
            .filter(|l| l.ends_with('\n'))
            .filter_map(TfRow::parse)
            .collect())
    }

    /// The run started at `unix_us`: noted beside the rows, for an ICN taking it over.
    pub fn run_started(&self, unix_us: u64) -> anyhow::Result<()> {
        let dir = self.file.parent().unwrap_or(Path::new("."));
        let file = dir.join(super::run_state::RUN_START_FILE);
        write_atomic(&file, &format!("{unix_us}\n"))
    }

    /// The rows written so far reach the file (the kernel) before a Release leaves:
    /// a TF is never freed by its FLPs without its row (a group commit).
    pub fn commit(&mut self) -> std::io::Result<()> {
        self.write_out()
    }

    /// Writes what is pending, keeping whatever the file did not take.
    fn write_out(&mut self) -> std::io::Result<()> {
        while !self.pending.is_empty() {
            match self.out.write(&self.pending) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => drop(self.pending.drain(..n)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.flush()
    }

    /// One `loads.csv` row: an EPN's load report at `t_us` of the run.
    pub fn load(
        &mut self,
        t_us: u64,
        epn: u32,
        free_bytes: u64,
        building: u32,
    ) -> std::io::Result<()> {
        let t = t_us as f64 / 1e6;
        writeln!(self.loads, "{t:.3},{epn},{free_bytes},{building}")
    }

    /// Queues a row; it reaches the file with the next commit (or once 64 KiB wait; a
    /// failure then keeps it, and the next commit reports it). While the file takes
    /// nothing, at most `MAX_PENDING` bytes of rows wait; beyond, a row is dropped,
    /// with this error.
    pub fn row(&mut self, r: &TfRow) -> std::io::Result<()> {
        if self.pending.len() >= MAX_PENDING {
            let why = format!(
                "{MAX_PENDING} bytes of rows wait for the file: row of TF {} dropped",
                r.tf_id
            );
            return Err(std::io::Error::other(why));
        }
        self.pending.extend_from_slice(Self::line(r).as_bytes());
        self.pending.push(b'\n');
        if self.pending.len() >= WRITE_AT {
            let _ = self.write_out();
        }
        Ok(())
    }

    /// One row as `tfs.csv` holds it (without the line end).
    pub fn line(r: &TfRow) -> String {
        let epn = r.epn.map(|e| e.to_string()).unwrap_or_default();
        format!(
            "{},{},{:.6},{:.6},{:.3},{},{}",
            r.tf_id,
            epn,
            r.issued_us as f64 / 1e6,
            r.ended_us as f64 / 1e6,
            r.ended_us.saturating_sub(r.issued_us) as f64 / 1e3,
            r.status.name(),
            r.reason.name()
        )
    }

    /// Writes buffered rows out (every 250 ms), so a crashed ICN leaves its record.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.write_out()?;
        self.loads.flush()
    }

    /// The last rows out; after a take-over the rows file becomes the run's `tfs.csv`.
    /// The error names the file.
    pub fn finish(mut self) -> anyhow::Result<()> {
        let file = self.file.clone();
        let named = |f: &Path, e: std::io::Error| anyhow::anyhow!("writing {}: {e}", f.display());
        self.write_out().map_err(|e| named(&file, e))?;
        let loads = file.with_file_name("loads.csv");
        self.loads.flush().map_err(|e| named(&loads, e))?;
        let tfs = file.with_file_name("tfs.csv");
        if file != tfs {
            std::fs::rename(&file, &tfs).map_err(|e| {
                anyhow::anyhow!("renaming {} to {}: {e}", file.display(), tfs.display())
            })?;
        }
        Ok(())
    }

    /// Every row of `dir/tfs.csv`, as written above, streamed; rows it cannot read are
    /// left out (a crashed ICN may leave half a line, or any bytes). Empty without one.
    pub fn rows(dir: &Path) -> impl Iterator<Item = CsvTf> {
        lines(&dir.join("tfs.csv")).skip(1).filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Some(CsvTf {
                epn: f.get(1)?.parse().ok(),
                issue_s: f.get(2)?.parse().ok()?,
                ack_s: f.get(3)?.parse().ok()?,
                latency_ms: f.get(4)?.parse().ok()?,
                status: f.get(5)?.to_string(),
            })
        })
    }

    /// Every row of `dir/loads.csv` (time s, EPN, free bytes, TFs building), streamed.
    pub fn loads(dir: &Path) -> impl Iterator<Item = (f64, u32, u64, u32)> {
        lines(&dir.join("loads.csv")).skip(1).filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
            ))
        })
    }

    /// (issue time in s, status) of every TF in `dir/tfs.csv`.
    pub fn read(dir: &Path) -> Vec<(f64, String)> {
        TfCsv::rows(dir).map(|r| (r.issue_s, r.status)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunConfig;
    use fanin_proto::{Reason, TfStatus};
    use std::sync::atomic::Ordering;

    #[test]
    fn rows_wait_whole_while_the_file_takes_nothing_and_all_arrive_after() {
        let disk = TestDisk::full(100);
        let (full, got) = (disk.full.clone(), disk.got.clone());
        let mut csv = TfCsv::to_writer(Box::new(disk), Path::new("results"));
        let row = |tf_id| TfRow {
            tf_id,
            epn: Some(1),
            issued_us: tf_id * 1000,
            ended_us: tf_id * 1000 + 500,
            status: TfStatus::Complete,
            reason: Reason::None,
        };
        let rows = 3000; // over 64 KiB: written out (and refused) on the way
        for tf in 0..rows {
            csv.row(&row(tf)).expect("kept");
        }
        assert!(csv.commit().is_err(), "the full file refuses them");
        assert!(got.lock().unwrap().is_empty());
        full.store(false, Ordering::Relaxed);
        csv.commit().expect("the file takes them now");
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        let back: Vec<u64> = (text.lines())
            .map(|l| TfRow::parse(l).expect("a whole row").tf_id)
            .collect();
        assert_eq!(
            back,
            (0..rows).collect::<Vec<_>>(),
            "every row, once, in order"
        );
    }

    fn paced_run(last_issue_us: u64) -> Summary {
        lossy_run(last_issue_us, 0, 1.0)
    }

    /// 100 TFs at 100 Hz, the last issued at `last_issue_us`; the first `lost` end
    /// incomplete.
    fn lossy_run(last_issue_us: u64, lost: u64, max_loss_pct: f64) -> Summary {
        let cfg = RunConfig {
            rate_hz: 100.0,
            tfs: Some(100),
            duration_s: None,
            stf_size: "1KiB".into(),
            max_loss_pct,
            ..RunConfig::default()
        }
        .check()
        .unwrap();
        let mut l = Ledger::new();
        for tf in 0..100u64 {
            // Evenly spaced up to `last_issue_us`.
            let t = last_issue_us * tf / 99;
            l.issue(tf, 0, t);
            let (status, reason) = if tf < lost {
                (TfStatus::Incomplete, Reason::BuildTimeout)
            } else {
                (TfStatus::Complete, Reason::None)
            };
            l.report(tf, 0, status, reason, 1024, t + 500);
        }
        let tally = Tally {
            ids: 100,
            completed: 100 - lost,
            incomplete: lost,
            ..Tally::default()
        };
        Summary::build(1, &cfg, &l, &tally, (0.1, 0.0), BTreeMap::new(), vec![])
    }

    #[test]
    fn a_run_that_ended_short_of_its_length_is_never_valid() {
        let cfg = RunConfig {
            rate_hz: 100.0,
            tfs: Some(100),
            duration_s: None,
            stf_size: "1KiB".into(),
            ..RunConfig::default()
        }
        .check()
        .unwrap();
        let mut l = Ledger::new();
        for tf in 0..40u64 {
            l.issue(tf, 0, tf * 10_000);
            l.report(
                tf,
                0,
                TfStatus::Complete,
                Reason::None,
                1024,
                tf * 10_000 + 500,
            );
        }
        let tally = Tally {
            ids: 40,
            completed: 40,
            ..Tally::default()
        };
        let mut s = Summary::build(1, &cfg, &l, &tally, (0.1, 0.0), BTreeMap::new(), vec![]);
        assert_eq!(s.loss_pct, 0.0, "nothing issued was lost ...");
        assert!(!s.valid, "... but the run is not what was asked for");
        let why = s.invalid_reason.clone().unwrap();
        assert!(why.contains("ended after issuing 40 of 100 TFs"), "{why}");
        assert!(s.ended_short().is_some());
        s.interrupted = true;
        assert!(
            s.ended_short().is_none(),
            "the operator's stop is no failure"
        );
    }

    #[test]
    fn a_run_that_lost_more_than_its_bound_is_invalid_and_says_so() {
        let s = lossy_run(990_000, 2, 1.0);
        assert!(s.invariant_ok && !s.valid);
        let why = s.invalid_reason.unwrap();
        assert!(
            why.contains("loss 2.00 % is over max_loss_pct 1 %"),
            "{why}"
        );
        let s = lossy_run(990_000, 1, 1.0);
        assert!(s.valid, "{:?}", s.invalid_reason);
        let s = lossy_run(990_000, 98, 100.0);
        assert!(s.valid, "a loss-measuring run: {:?}", s.invalid_reason);
    }

    #[test]
    fn a_run_within_one_percent_of_its_duration_is_valid() {
        let s = paced_run(990_000); // 0.99 s + one 10 ms period = 1.000 s
        assert!((s.duration_s - 1.0).abs() < 1e-9);
        assert!(s.valid && s.invariant_ok, "{:?}", s.invalid_reason);
        assert!((s.rate_hz_achieved - 100.0).abs() < 1e-6);
        assert_eq!(s.loss_pct, 0.0);
    }

    #[test]
    fn a_run_that_took_too_long_is_invalid_with_the_reason() {
        let s = paced_run(1_010_000); // 1.02 s: 2 % late
        assert!(!s.valid);
        assert!(s.invalid_reason.unwrap().contains("outside +-1 %"));
        assert!(s.invariant_ok);
    }

    #[test]
    fn pending_tfs_violate_the_invariant() {
        let cfg = RunConfig::default().check().unwrap();
        let mut l = Ledger::new();
        l.issue(0, 0, 0);
        let tally = Tally {
            ids: 1,
            ..Tally::default()
        };
        let s = Summary::build(1, &cfg, &l, &tally, (0.0, 0.0), BTreeMap::new(), vec![]);
        assert!(!s.invariant_ok && !s.valid);
    }

    #[test]
    fn a_tf_ended_without_a_row_or_an_id_never_issued_violates_the_invariant() {
        let cfg = RunConfig::default().check().unwrap();
        let mut l = Ledger::new();
        l.issue(0, 0, 0);
        l.report(0, 0, TfStatus::Complete, Reason::None, 1, 1);
        let right = Tally {
            ids: 1,
            completed: 1,
            ..Tally::default()
        };
        let build = |t: &Tally| Summary::build(1, &cfg, &l, t, (0.0, 0.0), BTreeMap::new(), vec![]);
        assert!(build(&right).invariant_ok);
        let no_row = Tally {
            completed: 0,
            ..right.clone()
        };
        assert!(!build(&no_row).invariant_ok);
        let extra_id = Tally {
            ids: 2,
            ..right.clone()
        };
        assert!(!build(&extra_id).invariant_ok);
    }
}
