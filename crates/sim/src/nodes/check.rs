//! The promises every simulated run is held to: the run starts and ends, every TF
//! planned is issued and accounted once with a named reason, none completed twice or at
//! two EPNs, ids never reused, byte limits kept; and, where the scenario allows it, zero
//! TFs lost (EPN crashes with re-assignment on).

use std::collections::BTreeSet;

use fanin_proto::TfStatus;

use super::Outcome;

/// What a scenario promises beyond accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Faults may cost TFs, but each must end once with a named reason.
    Accounted,
    /// Only EPN crashes, re-assignment on, room enough: every TF completes.
    ZeroLoss,
}

/// Every broken promise, as one line each (none: the run kept them all).
pub fn violations(o: &Outcome, expect: Expect) -> Vec<String> {
    let s = &o.summary;
    let mut v = run(o);
    v.extend(accounting(s));
    v.extend(rows(o));
    for (tf, by) in &o.seen.complete_reports {
        if by.len() > 1 {
            let epns: Vec<u32> = by.iter().map(|b| b.0).collect();
            v.push(format!(
                "TF {tf} completed {} times (EPNs {epns:?})",
                by.len()
            ));
        }
    }
    v.extend(o.seen.over_limit.iter().cloned());
    v.extend(o.seen.fenced.iter().cloned());
    v.extend(zero_loss(s, expect));
    v
}

/// The run: it started, ended, and issued what it planned.
fn run(o: &Outcome) -> Vec<String> {
    let mut v = Vec::new();
    let s = &o.summary;
    if !o.ended {
        v.push(format!(
            "the run did not end ({:.1} s simulated)",
            o.sim_ns as f64 / 1e9
        ));
    }
    if let Some(f) = &o.fatal {
        v.push(format!("the ICN gave the run up: {f}"));
    }
    // On-data, TFs exist when their STFs do: a source that made fewer (a restarted
    // synthetic source skips what was due while its FLP was away) is not a loss; with
    // no FLP lost or run anew, every TF planned must be issued there too.
    let timer = o.schedule == fanin_node::config::ScheduleKind::Timer;
    let flp_lost = s
        .membership
        .iter()
        .any(|m| m.node.starts_with("FLP") && m.kind == "lost")
        || o.seen.sources_cut > 0;
    if (timer || !flp_lost) && s.planned_tfs.is_some_and(|n| s.issued != n) {
        v.push(format!(
            "issued {} of the {:?} TFs planned",
            s.issued, s.planned_tfs
        ));
    }
    v
}

/// The invariant, and every TF not complete ended for a named reason.
pub fn accounting(s: &fanin_node::Summary) -> Vec<String> {
    let mut v = Vec::new();
    if !s.invariant_ok || s.issued != s.completed + s.incomplete + s.dropped {
        v.push(format!(
            "invariant: issued {} != completed {} + incomplete {} + dropped {}",
            s.issued, s.completed, s.incomplete, s.dropped
        ));
    }
    for (what, n, by) in [
        ("dropped", s.dropped, &s.dropped_by_reason),
        ("incomplete", s.incomplete, &s.incomplete_by_reason),
    ] {
        let by_reason: u64 = by.values().sum();
        if by_reason != n || by.contains_key("none") {
            v.push(format!("{what} {n} but by reason {by:?}"));
        }
    }
    v
}

/// The rows: one per TF issued, ids unique and below the count, a completed TF's EPN the
/// one that reported it.
fn rows(o: &Outcome) -> Vec<String> {
    let mut v = once_each(o.rows.iter().map(|r| r.tf_id), o.summary.issued);
    for r in &o.rows {
        // Timer TF ids are 0..issued; on-data ids are the sources' (below the count).
        let bound = o.summary.issued.max(o.summary.planned_tfs.unwrap_or(0));
        if r.tf_id >= bound {
            v.push(format!(
                "TF {} beyond the {bound} issued or planned",
                r.tf_id
            ));
        }
        if r.status != TfStatus::Complete && r.reason == fanin_proto::Reason::None {
            v.push(format!(
                "TF {} ended {} without a reason",
                r.tf_id,
                r.status.name()
            ));
        }
        if r.status == TfStatus::Complete {
            let reported = o.seen.complete_reports.get(&r.tf_id);
            let by = |x: u32| reported.is_some_and(|b| b.iter().any(|b| b.0 == x));
            if !r.epn.is_some_and(by) {
                v.push(format!(
                    "TF {} complete at EPN {:?}, which never reported it",
                    r.tf_id, r.epn
                ));
            }
        }
    }
    v
}

/// The TF ids of `tfs.csv`: each once, one per TF issued.
pub fn once_each(ids: impl Iterator<Item = u64>, issued: u64) -> Vec<String> {
    let mut v = Vec::new();
    let mut seen = BTreeSet::new();
    for id in ids {
        if !seen.insert(id) {
            v.push(format!("TF {id} ended twice in tfs.csv (id reused)"));
        }
    }
    if seen.len() as u64 != issued {
        v.push(format!("{} TFs in tfs.csv, {issued} issued", seen.len()));
    }
    v
}

/// Where zero loss is promised: every TF issued completed.
pub fn zero_loss(s: &fanin_node::Summary, expect: Expect) -> Option<String> {
    (expect == Expect::ZeroLoss && s.completed != s.issued).then(|| {
        format!(
            "zero loss: {} of {} TFs completed (incomplete {:?}, dropped {:?})",
            s.completed, s.issued, s.incomplete_by_reason, s.dropped_by_reason
        )
    })
}
