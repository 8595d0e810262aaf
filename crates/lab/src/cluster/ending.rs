//! The end of one run: waiting for the ICN (or the standby that took over), letting every
//! node leave (and killing what a fault left dead), and reading the run's summary.

use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{bail, Context};
use fanin_node::Summary;
use tokio::process::Child;

use super::launcher::last_line;
use super::Takeover;
use crate::faults::{self, FaultResult, Injected, NodeProc, Nodes};

/// Waits for the ICN that ended the run: the primary, or (after a take-over) the standby,
/// killing the deposed primary. Returns the exit status of the one that counts.
pub(super) async fn wait_icns(
    nodes: &Nodes,
    standby: Option<&mut Child>,
    took_over: bool,
) -> anyhow::Result<ExitStatus> {
    let mut g = nodes.lock().await;
    let primary = g.iter_mut().find(|n| n.name == "ICN").expect("primary ICN");
    if took_over {
        let _ = primary.child.kill().await;
    }
    let st = primary.child.wait().await?;
    Ok(match standby {
        Some(child) if took_over => child.wait().await?,
        Some(child) => {
            let _ = child.kill().await;
            st
        }
        None => st,
    })
}

/// Every node leaves by itself after RunStop; give them a moment (`exit_wait`, all of
/// them together), then insist. After an ICN that failed without a summary (`ended`
/// false: no RunStop came) they are told to stop at once, and get `FAILED_ICN_WAIT`.
pub(super) async fn reap_nodes(
    nodes: &Nodes,
    injected: &[Injected],
    (prefix, dir): (&str, &Path),
    (exit_wait, ended): (Duration, bool),
) {
    let mut nodes = nodes.lock().await;
    // Nodes still running when a failed ICN ended: told to stop (their end by it is no
    // news; one that failed by itself meanwhile still says why).
    let mut told = std::collections::BTreeSet::new();
    let wait = match ended {
        true => exit_wait,
        false => {
            for n in nodes.iter_mut().filter(|n| n.name != "ICN") {
                if matches!(n.child.try_wait(), Ok(None)) {
                    crate::process::signal_child(&n.child, libc::SIGTERM);
                    told.insert(n.name.clone());
                }
            }
            FAILED_ICN_WAIT
        }
    };
    let deadline = tokio::time::Instant::now() + wait;
    for NodeProc { name, child, .. } in nodes.iter_mut() {
        if name == "ICN" {
            continue;
        }
        if injected
            .iter()
            .any(|i| &i.node == name && i.back_unix_us.is_none())
        {
            // Killed or frozen by a fault and never brought back.
            signal_kill(child).await;
            continue;
        }
        match tokio::time::timeout_at(deadline, child.wait()).await {
            Ok(Ok(st)) if st.success() || (told.contains(name.as_str()) && by_sigterm(&st)) => {}
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
}

/// Ended by the SIGTERM it was sent (a node that failed by itself meanwhile says why).
fn by_sigterm(st: &ExitStatus) -> bool {
    std::os::unix::process::ExitStatusExt::signal(st) == Some(libc::SIGTERM)
}

/// How long nodes told to stop after a failed ICN have, together.
const FAILED_ICN_WAIT: Duration = Duration::from_secs(5);

/// Kills a node left frozen or dead by a fault (SIGCONT first, so it can die).
async fn signal_kill(child: &mut Child) {
    crate::process::signal_child(child, libc::SIGCONT);
    let _ = child.kill().await;
}

/// The run's summary and fault results. After a take-over the standby went on with the
/// same run, and wrote its one summary; an event line times the take-over.
pub(super) fn summary(
    dir: &Path,
    status: ExitStatus,
    injected: &[Injected],
    takeover: Takeover,
) -> anyhow::Result<(Summary, Vec<FaultResult>)> {
    let took_over = takeover.elected_unix_us.is_some();
    let summary_dir = dir.to_path_buf();
    let summary_path = summary_dir.join("summary.json");
    if !summary_path.exists() {
        bail!(
            "ICN exited with {status} and no summary: {}",
            last_line(&dir.join("icn.log"))
        );
    }
    let mut s: Summary = serde_json::from_str(&std::fs::read_to_string(&summary_path)?)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    // One clock: the run's start (a take-over keeps it).
    let origin = takeover
        .first_started_unix_us
        .unwrap_or(s.run_start_unix_us);
    let mut results = faults::results(injected, &s, &summary_dir, origin);
    if took_over {
        let line = takeover_event(injected, takeover, &mut results);
        s.events.push(line);
    }
    Ok((s, results))
}

/// Times the ICN fault from the kill to the standby's election and run start, and says
/// what the failed ICN had ended.
fn takeover_event(
    injected: &[Injected],
    takeover: Takeover,
    results: &mut [FaultResult],
) -> String {
    let killed = injected
        .iter()
        .find(|i| i.node == "ICN")
        .and_then(|i| i.at_unix_us);
    let since_kill = |t: Option<u64>| killed.zip(t).map(|(k, e)| e.saturating_sub(k) as f64 / 1e3);
    let (detect_ms, rejoin_ms) = (
        since_kill(takeover.elected_unix_us),
        since_kill(takeover.started_unix_us),
    );
    for r in results.iter_mut().filter(|r| r.node == "ICN") {
        r.detect_ms = detect_ms;
        r.rejoin_ms = rejoin_ms;
        r.at_s = None;
        // Its TFs are in the event line: they are the failed ICN's, not the outage's.
        r.outage_tfs.clear();
    }
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.0}")).unwrap_or("?".into());
    format!(
        "the ICN was killed; the standby was elected {} ms later and went on with the run {} ms after the kill (same run, same TF ids)",
        ms(detect_ms),
        ms(rejoin_ms)
    )
}
