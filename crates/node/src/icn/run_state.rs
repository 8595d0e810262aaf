//! The run's identity in the registry and its rows in the results directory: what an
//! ICN taking over a failed one reads, and what fences an ICN that lost the lead.
//!
//! The state znode (`/PATH/run/state`) names the run (id, first TF id), how many ICNs
//! led it (`epoch`), where its rows are (results directory and file) and whether it
//! ended. Only the leader's own session writes it, by compare-and-set: an ICN deposed
//! while frozen cannot mark the run ended, and so writes no summary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::core::Takeover;
use super::summary::{Summary, TfCsv};
use crate::registry::Leadership;

/// The run as the state znode holds it (`key=value` lines).
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    pub run_id: u64,
    pub id_base: u64,
    /// ICNs that led the run before the current one.
    pub epoch: u64,
    /// The results directory (absolute) and the file of the current leader's rows.
    pub results: String,
    pub rows: String,
    pub ended: bool,
}

impl RunState {
    pub fn encode(&self) -> String {
        format!(
            "run_id={}\nid_base={}\nepoch={}\nresults={}\nrows={}\nended={}\n",
            self.run_id, self.id_base, self.epoch, self.results, self.rows, self.ended
        )
    }

    pub fn parse(text: &str) -> Option<RunState> {
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(str::to_string)
        };
        Some(RunState {
            run_id: get("run_id")?.parse().ok()?,
            id_base: get("id_base")?.parse().ok()?,
            epoch: get("epoch")?.parse().ok()?,
            results: get("results")?,
            rows: get("rows")?,
            ended: get("ended")?.parse().ok()?,
        })
    }
}

/// The leading ICN's claim on its run: the state it wrote, and its version.
pub struct Claim {
    pub state: RunState,
    pub version: i32,
    /// Set when this ICN took the run over from a failed one.
    pub takeover: Option<Takeover>,
    /// The run's start (wall clock, µs), when it had started.
    pub started_unix_us: Option<u64>,
    /// Its rows file, made before the state named it (a later take-over finds it).
    pub csv: Option<TfCsv>,
}

/// The file holding the run's start time (µs since the epoch) in the results directory.
pub const RUN_START_FILE: &str = "run_start_us";

/// Elected: takes over the run the state znode names if it is still going and its rows
/// are in this ICN's results directory, else claims a new one (`fresh`: its id and
/// first TF id). A standby (`waited`: another ICN led when it started) whose run ended
/// meanwhile has nothing to take over, and must not touch its results. A going run whose
/// summary is in its results directory ended there, and is marked so first.
pub async fn claim(
    lead: &Leadership,
    results: Option<&Path>,
    waited: bool,
    fresh: impl std::future::Future<Output = anyhow::Result<(u64, u64)>>,
) -> anyhow::Result<Claim> {
    let results = results.map(absolute);
    let prior = lead.run_state().await?;
    let mut version = prior.as_ref().map(|p| p.1);
    let mut prior = prior.as_ref().and_then(|(text, _)| RunState::parse(text));
    let here = |s: &RunState| results.as_deref() == Some(Path::new(&s.results));
    if let Some(s) = prior.as_mut().filter(|s| !s.ended && here(s)) {
        version = end_if_summarized(lead, s, version).await?;
    }
    if let Some(s) = prior.as_ref().filter(|s| s.ended && waited && here(s)) {
        anyhow::bail!(
            "run {} in {} ended while this ICN stood by: nothing to take over",
            s.run_id,
            s.results
        );
    }
    let going = prior.filter(|s| !s.ended);
    if let (Some(s), Some(dir)) = (&going, &results) {
        if here(s) {
            return take_over(lead, s, dir, version).await;
        }
        tracing::warn!(
            "ICN: the registry names run {} (results in {}) as going on; its rows are not in {}: starting a new run",
            s.run_id,
            s.results,
            dir.display()
        );
    }
    let (run_id, id_base) = fresh.await?;
    // This run's files, before the state names them (no earlier run's start is taken).
    let csv = match &results {
        Some(d) => {
            // An earlier run's summary too: a later standby takes it for this run's end.
            for f in [RUN_START_FILE, Summary::JSON_FILE, Summary::CSV_FILE] {
                let _ = std::fs::remove_file(d.join(f));
            }
            Some(TfCsv::create(d)?)
        }
        None => None,
    };
    let state = RunState {
        run_id,
        id_base,
        epoch: 0,
        results: results.map(|d| d.display().to_string()).unwrap_or_default(),
        rows: "tfs.csv".into(),
        ended: false,
    };
    let version = lead.set_run_state(&state.encode(), version).await?;
    Ok(Claim {
        state,
        version,
        takeover: None,
        started_unix_us: None,
        csv,
    })
}

/// A going run whose summary is in its results directory ended there, but its ICN could
/// not mark it so (the registry was out of reach at its end): marked ended now. The
/// state's version after.
async fn end_if_summarized(
    lead: &Leadership,
    s: &mut RunState,
    version: Option<i32>,
) -> anyhow::Result<Option<i32>> {
    if !summary_names(Path::new(&s.results), s.run_id) {
        return Ok(version);
    }
    tracing::warn!(
        "ICN: run {} has its summary in {} but was not marked ended in the registry; marking it ended",
        s.run_id,
        s.results
    );
    debug_assert!(!s.ended, "only a going run is marked ended here");
    s.ended = true;
    Ok(Some(lead.set_run_state(&s.encode(), version).await?))
}

/// Whether `dir` holds the summary of run `run_id`: the run ended there.
fn summary_names(dir: &Path, run_id: u64) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join(Summary::JSON_FILE)) else {
        return false;
    };
    let json: Option<serde_json::Value> = serde_json::from_str(&text).ok();
    json.is_some_and(|j| j["run_id"].as_u64() == Some(run_id))
}

/// Takes the run over: its rows so far become the start of this ICN's own rows file.
async fn take_over(
    lead: &Leadership,
    prior: &RunState,
    dir: &Path,
    version: Option<i32>,
) -> anyhow::Result<Claim> {
    let from = dir.join(&prior.rows);
    let rows = TfCsv::read_rows(&from)
        .with_context(|| format!("take-over: reading the run's rows {}", from.display()))?;
    let started_unix_us = std::fs::read_to_string(dir.join(RUN_START_FILE))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    let elapsed = started_unix_us
        .map(|t0| Duration::from_micros(unix_us().saturating_sub(t0)))
        .unwrap_or_default();
    let epoch = prior.epoch + 1;
    let state = RunState {
        epoch,
        rows: format!("tfs.icn{epoch}.csv"),
        ..prior.clone()
    };
    // The new rows file holds every row so far before the state names it.
    let csv = TfCsv::resume(dir, &state.rows, &rows)?;
    let version = lead.set_run_state(&state.encode(), version).await?;
    tracing::warn!(
        "ICN: taking over run {} from a failed ICN ({} TFs ended before, {:.1} s into the run)",
        state.run_id,
        rows.len(),
        elapsed.as_secs_f64()
    );
    Ok(Claim {
        state,
        version,
        takeover: Some(Takeover {
            epoch: prior.epoch,
            elapsed,
            rows,
        }),
        started_unix_us,
        csv: Some(csv),
    })
}

/// Why a run's end could not be marked in the registry.
pub enum NotMarked {
    /// Another ICN wrote the state: it goes on with the run, this one is fenced.
    Deposed(String),
    /// This ICN's session ended (an outage): it may lead again, then mark the end.
    Lost(String),
}

impl Claim {
    /// The run ended here: marked so through the leader's session. An ICN deposed by
    /// another cannot, and must write no summary (the other goes on with the run).
    pub async fn end(&mut self, lead: &Leadership) -> Result<(), NotMarked> {
        let ended = RunState {
            ended: true,
            ..self.state.clone()
        };
        match lead
            .set_run_state(&ended.encode(), Some(self.version))
            .await
        {
            Ok(v) => {
                (self.state, self.version) = (ended, v);
                Ok(())
            }
            Err(e) if deposed(&e) => Err(NotMarked::Deposed(e.to_string())),
            Err(e) if !lead.is_leader() || session_over(&e) => Err(NotMarked::Lost(e.to_string())),
            Err(e) => {
                // Still the leader, the registry out of reach: the summary is written.
                tracing::warn!("ICN: could not mark run {} ended: {e}", self.state.run_id);
                Ok(())
            }
        }
    }
}

/// The registry's answer: the run state it holds, `Ok(None)` if it holds none; `Err`
/// when it does not answer, or holds a state that does not parse.
async fn answer(reg: &crate::registry::ZkRegistry) -> Result<Option<RunState>, ()> {
    match reg.run_state(crate::registry::runtime::RUN).await {
        Ok(None) => Ok(None),
        Ok(Some(t)) => RunState::parse(&t).map(Some).ok_or(()),
        Err(_) => Err(()),
    }
}

/// The run state as the registry holds it; no answer, or no state, is None.
async fn read(reg: &crate::registry::ZkRegistry) -> Option<RunState> {
    answer(reg).await.ok().flatten()
}

/// The run the registry says is going: `Some(None)` when it answers that none is (no
/// state, or its run ended), `None` when it gives no answer.
pub async fn going(reg: &crate::registry::ZkRegistry) -> Option<Option<u64>> {
    let state = answer(reg).await.ok()?;
    Some(state.filter(|s| !s.ended).map(|s| s.run_id))
}

/// Did run `run_id` end, says the registry? (A node that was away when it ended then
/// has nothing to join.) No answer counts as no.
pub async fn ended(reg: &crate::registry::ZkRegistry, run_id: u64) -> bool {
    read(reg)
        .await
        .is_some_and(|s| s.run_id == run_id && s.ended)
}

/// An answer that says another ICN wrote the state.
fn deposed(e: &crate::registry::RegistryError) -> bool {
    use zookeeper_client::Error as Zk;
    matches!(
        e,
        crate::registry::RegistryError::Zk {
            source: Zk::BadVersion | Zk::NoNode,
            ..
        }
    )
}

/// An answer that says this ICN's session is over (not that another ICN leads).
fn session_over(e: &crate::registry::RegistryError) -> bool {
    use zookeeper_client::Error as Zk;
    matches!(
        e,
        crate::registry::RegistryError::Zk {
            source: Zk::SessionExpired | Zk::SessionMoved | Zk::ClientClosed,
            ..
        }
    )
}

pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_reads_back_and_refuses_what_it_is_not() {
        let s = RunState {
            run_id: 42,
            id_base: 1 << 32,
            epoch: 2,
            results: "/tmp/r".into(),
            rows: "tfs.icn2.csv".into(),
            ended: false,
        };
        assert_eq!(RunState::parse(&s.encode()), Some(s.clone()));
        assert_eq!(RunState::parse("run_id=1\n"), None);
        assert_eq!(RunState::parse("17"), None);
        let bad = s.encode().replace("ended=false", "ended=maybe");
        assert_eq!(RunState::parse(&bad), None);
        let bad = s.encode().replace("epoch=2", "epoch=-1");
        assert_eq!(RunState::parse(&bad), None);
    }

    #[test]
    fn rows_left_by_a_killed_icn_are_read_whole_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tfs.csv");
        let text = format!(
            "{}\n0,1,0.001000,0.002000,1.000,complete,none\nnot,a,row\n1,,0.002000,0.002000,0.000,dropped,icn_lost\n2,0,0.003000,0.004000,1.000,compl",
            TfCsv::HEADER
        );
        std::fs::write(&p, text).unwrap();
        let rows = TfCsv::read_rows(&p).unwrap();
        let ids: Vec<u64> = rows.iter().map(|r| r.tf_id).collect();
        assert_eq!(
            ids,
            [0, 1],
            "the garbage line and the cut last row are left out"
        );
        assert_eq!(rows[1].epn, None);
        assert_eq!(rows[1].reason, fanin_proto::Reason::IcnLost);
    }
}
