//! The end of one run: waiting for the ICN (or the standby that took over), letting every
//! node leave (and killing what a fault left dead), and reading the run's summary.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{bail, Context};
use fanin_node::icn::summary::MemberEvent;
use fanin_node::Summary;
use tokio::process::Child;

use super::launcher::last_line;
use super::Takeover;
use crate::faults::{self, Action, FaultResult, Injected, NodeProc, Nodes};

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

/// Every node in the run at its end leaves by itself after RunStop; give them a moment
/// (`exit_wait`, all of them together), then insist. Nodes no RunStop reaches are told
/// to stop (SIGTERM) at once: after an ICN that failed without a summary (`ended` false)
/// every node, they get `FAILED_ICN_WAIT`; after a run that ended, those `outside` it.
pub(super) async fn reap_nodes(
    nodes: &Nodes,
    injected: &[Injected],
    (prefix, dir): (&str, &Path),
    (exit_wait, ended, outside): (Duration, bool, BTreeSet<String>),
) {
    let mut nodes = nodes.lock().await;
    if ended && !outside.is_empty() {
        // What they hold goes on if they can hand it on quickly (a healed EPN's sinks).
        let until = tokio::time::Instant::now() + OUTSIDE_GRACE;
        for n in nodes.iter_mut().filter(|n| outside.contains(&n.name)) {
            let _ = tokio::time::timeout_at(until, n.child.wait()).await;
        }
    }
    // Their end by SIGTERM is no news; one that failed by itself meanwhile still says why.
    let mut told = BTreeSet::new();
    for n in nodes.iter_mut().filter(|n| n.name != "ICN") {
        if (!ended || outside.contains(&n.name)) && matches!(n.child.try_wait(), Ok(None)) {
            crate::process::signal_child(&n.child, libc::SIGTERM);
            told.insert(n.name.clone());
        }
    }
    let wait = if ended { exit_wait } else { FAILED_ICN_WAIT };
    let deadline = tokio::time::Instant::now() + wait;
    for NodeProc { name, child, .. } in nodes.iter_mut() {
        if name == "ICN" {
            continue;
        }
        if injected.iter().any(|i| &i.node == name && left_dead(i)) {
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

/// Nodes the ended run's RunStop does not reach, which would wait their whole connect
/// time-out for an ICN that is gone: the ICN's last word on them is that they were lost,
/// or a fault started them again and they never joined since (a restart at the run's
/// stop). After a take-over only the first: the standby's summary may not list joins.
pub(super) fn outside_the_run(
    dir: &Path,
    injected: &[Injected],
    took_over: bool,
) -> BTreeSet<String> {
    let text = std::fs::read_to_string(dir.join(Summary::JSON_FILE)).unwrap_or_default();
    match serde_json::from_str::<Summary>(&text) {
        Ok(s) => outside(&s.membership, s.run_start_unix_us, injected, took_over),
        Err(_) => BTreeSet::new(),
    }
}

/// `outside_the_run` on the summary's membership events (times since `start_unix_us`);
/// none when the ICN kept only the first `MAX_EVENTS` (a node's last word may be lost).
fn outside(
    membership: &[MemberEvent],
    start_unix_us: u64,
    injected: &[Injected],
    took_over: bool,
) -> BTreeSet<String> {
    if membership.len() >= fanin_node::icn::core::MAX_EVENTS {
        return BTreeSet::new();
    }
    let at_us = |t_s: f64| start_unix_us.saturating_add((t_s * 1e6) as u64);
    let names = membership.iter().map(|m| m.node.as_str());
    let names: BTreeSet<&str> = names
        .chain(injected.iter().map(|i| i.node.as_str()))
        .collect();
    let outside = |name: &str| {
        let events = membership.iter().filter(|m| m.node == name);
        let last = events.clone().max_by(|a, b| a.t_s.total_cmp(&b.t_s));
        let restarted = injected
            .iter()
            .filter(|i| i.node == name && matches!(i.action, Some(Action::Kill | Action::Goat)))
            .filter_map(|i| i.back_unix_us)
            .max();
        let joined_since = |back| events.clone().any(|m| at_us(m.t_s) >= back);
        last.is_some_and(|m| m.kind == "lost")
            || (!took_over && restarted.is_some_and(|back| !joined_since(back)))
    };
    names
        .into_iter()
        .filter(|n| outside(n))
        .map(String::from)
        .collect()
}

/// A fault that killed or froze its node and did not bring it back (one that never
/// fired, or a network fault, leaves it to end as the others do).
fn left_dead(i: &Injected) -> bool {
    let process = matches!(i.action, Some(Action::Kill | Action::Stop | Action::Goat));
    process && i.at_unix_us.is_some() && i.back_unix_us.is_none()
}

/// Ended by the SIGTERM it was sent (a node that failed by itself meanwhile says why).
fn by_sigterm(st: &ExitStatus) -> bool {
    std::os::unix::process::ExitStatusExt::signal(st) == Some(libc::SIGTERM)
}

/// How long nodes the ended run's stop cannot reach have to end by themselves, together,
/// before they are told to stop.
const OUTSIDE_GRACE: Duration = Duration::from_secs(3);

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

#[cfg(test)]
mod tests {
    use super::*;

    const START: u64 = 1_000_000_000;

    fn event(t_s: f64, node: &str, kind: &str) -> MemberEvent {
        let (node, kind, detail) = (node.into(), kind.into(), String::new());
        let (reassigned, dropped, policy_us) = (0, 0, 0.0);
        MemberEvent {
            t_s,
            node,
            kind,
            reassigned,
            dropped,
            detail,
            policy_us,
        }
    }

    fn fault(node: &str, action: Action, at_s: f64, back_s: Option<f64>) -> Injected {
        let us = |s: f64| START + (s * 1e6) as u64;
        Injected {
            node: node.into(),
            action: Some(action),
            at_unix_us: Some(us(at_s)),
            back_unix_us: back_s.map(us),
            error: None,
        }
    }

    #[test]
    fn nodes_no_run_stop_reaches_are_outside_the_run() {
        let membership = [
            event(0.4, "EPN 3", "lost"),
            event(1.5, "EPN 3", "joining"),
            event(1.5, "EPN 3", "rejoined"),
            event(2.0, "EPN 2", "lost"),
            event(2.1, "FLP 1", "lost"),
            event(2.2, "FLP 1", "joining"),
        ];
        let injected = [
            // Killed, back and joined, killed again and started at the run's stop.
            fault("EPN 3", Action::Kill, 0.3, Some(1.4)),
            fault("EPN 3", Action::Kill, 2.9, Some(3.0)),
            // Frozen and let go without being lost: still in the run.
            fault("EPN 1", Action::Stop, 1.0, Some(1.2)),
            // Killed, back, joined again: in the run.
            fault("FLP 1", Action::Kill, 2.05, Some(2.15)),
        ];
        let out = outside(&membership, START, &injected, false);
        assert_eq!(out, BTreeSet::from(["EPN 2".into(), "EPN 3".into()]));
        // After a take-over the standby's summary may not list the joins: lost ones only.
        let out = outside(&membership, START, &injected, true);
        assert_eq!(out, BTreeSet::from(["EPN 2".into()]));
    }

    #[test]
    fn only_a_fired_kill_or_freeze_not_undone_leaves_its_node_dead() {
        assert!(left_dead(&fault("EPN 0", Action::Kill, 1.0, None)));
        assert!(left_dead(&fault("EPN 0", Action::Stop, 1.0, None)));
        assert!(!left_dead(&fault("EPN 0", Action::Kill, 1.0, Some(2.0))));
        // A goat that never crashed, a kill after the run's end: never fired.
        let mut never = fault("EPN 0", Action::Goat, 0.0, None);
        never.at_unix_us = None;
        assert!(!left_dead(&never));
        // A partition healed at the run's end (not by its own task) killed nothing.
        assert!(!left_dead(&fault("EPN 0", Action::Partition, 1.0, None)));
    }
}
