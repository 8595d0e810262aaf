//! The ICN's TF ledger: every issued TF is pending until it ends exactly once as
//! completed, incomplete or dropped(reason). Holds the counts, the latency histogram.

use std::collections::{BTreeMap, HashMap};

use fanin_proto::{Reason, TfStatus};
use fanin_sched::{EpnId, TfId};
use hdrhistogram::Histogram;

#[derive(Debug, Clone)]
struct Pending {
    epn: Option<EpnId>,
    issued_us: u64,
}

/// One ended TF, for `tfs.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct TfRow {
    pub tf_id: TfId,
    pub epn: Option<EpnId>,
    pub issued_us: u64,
    pub ended_us: u64,
    pub status: TfStatus,
    pub reason: Reason,
}

impl TfRow {
    /// A row read back from `tfs.csv`, as `TfCsv::line` (summary.rs) wrote it (None: not one).
    pub fn parse(line: &str) -> Option<TfRow> {
        let f: Vec<&str> = line.trim_end().split(',').collect();
        if f.len() != 7 {
            return None;
        }
        let us = |s: &str| s.parse::<f64>().ok().map(|v| (v * 1e6).round() as u64);
        let status = [TfStatus::Complete, TfStatus::Incomplete, TfStatus::Dropped]
            .into_iter()
            .find(|s| s.name() == f[5])?;
        let reason = Reason::ALL.iter().copied().find(|r| r.name() == f[6])?;
        Some(TfRow {
            tf_id: f[0].parse().ok()?,
            epn: match f[1] {
                "" => None,
                e => Some(e.parse().ok()?),
            },
            issued_us: us(f[2])?,
            ended_us: us(f[3])?,
            status,
            reason,
        })
    }
}

/// What a report did to the ledger.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ended(TfRow),
    /// Report for a TF not pending (already ended, or never issued).
    NotPending,
    /// Report from an EPN the TF was not assigned to.
    WrongEpn {
        assigned: Option<EpnId>,
    },
}

pub struct Ledger {
    pending: HashMap<TfId, Pending>,
    pub issued: u64,
    pub completed: u64,
    pub completed_bytes: u64,
    pub incomplete: BTreeMap<Reason, u64>,
    pub dropped: BTreeMap<Reason, u64>,
    pub unexpected_reports: u64,
    /// TFs moved to another EPN because theirs died (zero-loss mode).
    pub reassigned: u64,
    latency_us: Histogram<u64>,
    pub first_issue_us: Option<u64>,
    pub last_issue_us: Option<u64>,
    pub last_end_us: Option<u64>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    pub fn new() -> Self {
        Ledger {
            pending: HashMap::new(),
            issued: 0,
            completed: 0,
            completed_bytes: 0,
            incomplete: BTreeMap::new(),
            dropped: BTreeMap::new(),
            unexpected_reports: 0,
            reassigned: 0,
            // 1 us .. 1 hour, 3 significant digits.
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("static histogram bounds are valid"),
            first_issue_us: None,
            last_issue_us: None,
            last_end_us: None,
        }
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn incomplete_total(&self) -> u64 {
        self.incomplete.values().sum()
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }

    /// issued = completed + incomplete + dropped + still pending.
    pub fn invariant_holds(&self) -> bool {
        self.issued
            == self.completed
                + self.incomplete_total()
                + self.dropped_total()
                + self.pending.len() as u64
    }

    /// Records a newly issued TF assigned to `epn`.
    pub fn issue(&mut self, tf: TfId, epn: EpnId, now_us: u64) {
        let prev = self.pending.insert(
            tf,
            Pending {
                epn: Some(epn),
                issued_us: now_us,
            },
        );
        assert!(prev.is_none(), "TF {tf} issued twice");
        self.issued += 1;
        self.first_issue_us.get_or_insert(now_us);
        self.last_issue_us = Some(now_us);
    }

    /// A TF that ended under an earlier ICN of this run (its row, with its bytes when
    /// complete): a take-over goes on with one ledger for the whole run.
    pub fn carried(&mut self, row: &TfRow, bytes: u64) {
        self.issued += 1;
        match row.status {
            TfStatus::Complete => {
                self.completed += 1;
                self.completed_bytes = self.completed_bytes.saturating_add(bytes);
                let lat = row.ended_us.saturating_sub(row.issued_us).max(1);
                self.latency_us.saturating_record(lat);
            }
            TfStatus::Incomplete => *self.incomplete.entry(row.reason).or_default() += 1,
            TfStatus::Dropped => *self.dropped.entry(row.reason).or_default() += 1,
        }
        let first = self.first_issue_us.get_or_insert(row.issued_us);
        *first = (*first).min(row.issued_us);
        self.last_issue_us = self.last_issue_us.max(Some(row.issued_us));
        self.last_end_us = self.last_end_us.max(Some(row.ended_us));
    }

    /// Records a newly issued TF that waits for an EPN (a buffer-aware policy said wait).
    pub fn issue_waiting(&mut self, tf: TfId, now_us: u64) {
        let prev = self.pending.insert(
            tf,
            Pending {
                epn: None,
                issued_us: now_us,
            },
        );
        assert!(prev.is_none(), "TF {tf} issued twice");
        self.issued += 1;
        self.first_issue_us.get_or_insert(now_us);
        self.last_issue_us = Some(now_us);
    }

    /// Is this TF still pending (issued, not ended)?
    pub fn is_pending(&self, tf: TfId) -> bool {
        self.pending.contains_key(&tf)
    }

    /// A pending TF loses its EPN and waits for another (the policy said wait).
    pub fn unassign(&mut self, tf: TfId) {
        if let Some(p) = self.pending.get_mut(&tf) {
            p.epn = None;
        }
    }

    /// A waiting TF got its EPN.
    pub fn assign_waiting(&mut self, tf: TfId, epn: EpnId) {
        let p = self.pending.get_mut(&tf).expect("waiting TF is pending");
        assert!(p.epn.is_none(), "TF {tf} was not waiting");
        p.epn = Some(epn);
    }

    /// Records a TF that is dropped at issue time (no EPN, admission limit).
    pub fn issue_dropped(&mut self, tf: TfId, reason: Reason, now_us: u64) -> TfRow {
        self.issued += 1;
        self.first_issue_us.get_or_insert(now_us);
        self.last_issue_us = Some(now_us);
        self.pending.insert(
            tf,
            Pending {
                epn: None,
                issued_us: now_us,
            },
        );
        self.end(tf, TfStatus::Dropped, reason, 0, now_us)
            .expect("just inserted")
    }

    /// A pending TF cannot complete (an FLP could not send its STF, its EPN died, it
    /// waited for an EPN until the run ended): it ends now, dropped for `reason`.
    /// Returns the row, with the EPN that was building it.
    pub fn flp_dropped(&mut self, tf: TfId, reason: Reason, now_us: u64) -> Option<TfRow> {
        self.end(tf, TfStatus::Dropped, reason, 0, now_us)
    }

    /// The EPN's word on a TF. The ledger accepts it only from the assigned EPN.
    pub fn report(
        &mut self,
        tf: TfId,
        from: EpnId,
        status: TfStatus,
        reason: Reason,
        bytes: u64,
        now_us: u64,
    ) -> Outcome {
        let Some(p) = self.pending.get(&tf) else {
            self.unexpected_reports += 1;
            return Outcome::NotPending;
        };
        if p.epn != Some(from) {
            self.unexpected_reports += 1;
            return Outcome::WrongEpn { assigned: p.epn };
        }
        Outcome::Ended(
            self.end(tf, status, reason, bytes, now_us)
                .expect("pending checked above"),
        )
    }

    /// The EPN a pending TF is assigned to (`None`: not pending, or waiting).
    pub fn assigned(&self, tf: TfId) -> Option<EpnId> {
        self.pending.get(&tf).and_then(|p| p.epn)
    }

    /// Pending TFs assigned to `epn`, in id order.
    pub fn pending_on(&self, epn: EpnId) -> Vec<TfId> {
        let mut ids: Vec<TfId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.epn == Some(epn))
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Moves a pending TF to another EPN; from now on only that EPN's report counts.
    /// Its latency still runs from the first issue.
    pub fn reassign(&mut self, tf: TfId, to: EpnId) -> bool {
        match self.pending.get_mut(&tf) {
            Some(p) => {
                assert_ne!(p.epn, Some(to), "TF {tf} re-assigned to its own EPN");
                p.epn = Some(to);
                self.reassigned += 1;
                true
            }
            None => false,
        }
    }

    /// Ends every pending TF assigned to `epn` (the EPN is gone).
    pub fn epn_lost(&mut self, epn: EpnId, now_us: u64) -> Vec<TfRow> {
        let mut ids: Vec<TfId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.epn == Some(epn))
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| self.end(id, TfStatus::Dropped, Reason::EpnLost, 0, now_us))
            .collect()
    }

    /// Ends everything still pending (run end, after the drain).
    pub fn close_all(&mut self, reason: Reason, now_us: u64) -> Vec<TfRow> {
        let mut ids: Vec<TfId> = self.pending.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| self.end(id, TfStatus::Dropped, reason, 0, now_us))
            .collect()
    }

    fn end(
        &mut self,
        tf: TfId,
        status: TfStatus,
        reason: Reason,
        bytes: u64,
        now_us: u64,
    ) -> Option<TfRow> {
        let p = self.pending.remove(&tf)?;
        match status {
            TfStatus::Complete => {
                self.completed += 1;
                self.completed_bytes = self.completed_bytes.saturating_add(bytes);
                let lat = now_us.saturating_sub(p.issued_us).max(1);
                self.latency_us.saturating_record(lat);
            }
            TfStatus::Incomplete => *self.incomplete.entry(reason).or_default() += 1,
            TfStatus::Dropped => *self.dropped.entry(reason).or_default() += 1,
        }
        self.last_end_us = Some(now_us);
        Some(TfRow {
            tf_id: tf,
            epn: p.epn,
            issued_us: p.issued_us,
            ended_us: now_us,
            status,
            reason: if status == TfStatus::Complete {
                Reason::None
            } else {
                reason
            },
        })
    }

    /// Latency quantile in milliseconds over completed TFs (0 when none).
    pub fn latency_ms(&self, q: f64) -> f64 {
        if self.latency_us.is_empty() {
            return 0.0;
        }
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn latency_max_ms(&self) -> f64 {
        if self.latency_us.is_empty() {
            return 0.0;
        }
        self.latency_us.max() as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reassigned_tf_counts_only_from_its_new_epn() {
        let mut l = Ledger::new();
        l.issue(7, 1, 0);
        l.issue(8, 1, 0);
        l.issue(9, 2, 0);
        assert_eq!(l.pending_on(1), vec![7, 8]);
        assert!(l.reassign(7, 2));
        assert!(!l.reassign(99, 2));
        assert_eq!(l.reassigned, 1);
        // The dead EPN's late report is refused; the new EPN's counts once.
        assert_eq!(
            l.report(7, 1, TfStatus::Complete, Reason::None, 1, 5),
            Outcome::WrongEpn { assigned: Some(2) }
        );
        assert!(matches!(
            l.report(7, 2, TfStatus::Complete, Reason::None, 1, 6),
            Outcome::Ended(_)
        ));
        assert_eq!(
            l.report(7, 2, TfStatus::Complete, Reason::None, 1, 7),
            Outcome::NotPending
        );
        assert!(l.invariant_holds());
    }

    #[test]
    fn every_tf_ends_exactly_once() {
        let mut l = Ledger::new();
        for tf in 0..5 {
            l.issue(tf, (tf % 2) as u32, tf * 10);
        }
        assert!(l.invariant_holds());
        assert!(matches!(
            l.report(0, 0, TfStatus::Complete, Reason::None, 100, 50),
            Outcome::Ended(_)
        ));
        // A second report of the same TF does not count again.
        assert_eq!(
            l.report(0, 0, TfStatus::Complete, Reason::None, 100, 60),
            Outcome::NotPending
        );
        // A report from the wrong EPN is refused.
        assert_eq!(
            l.report(1, 0, TfStatus::Complete, Reason::None, 100, 60),
            Outcome::WrongEpn { assigned: Some(1) }
        );
        l.report(2, 0, TfStatus::Incomplete, Reason::BuildTimeout, 0, 70);
        let lost = l.epn_lost(1, 80);
        assert_eq!(lost.iter().map(|r| r.tf_id).collect::<Vec<_>>(), vec![1, 3]);
        l.issue_dropped(5, Reason::NoEpn, 90);
        let rest = l.close_all(Reason::Unacknowledged, 100);
        assert_eq!(rest.len(), 1);
        assert_eq!(l.pending(), 0);
        assert_eq!(l.issued, 6);
        assert_eq!(l.completed, 1);
        assert_eq!(l.incomplete_total(), 1);
        assert_eq!(l.dropped[&Reason::EpnLost], 2);
        assert_eq!(l.dropped[&Reason::NoEpn], 1);
        assert_eq!(l.dropped[&Reason::Unacknowledged], 1);
        assert_eq!(l.unexpected_reports, 2);
        assert!(l.invariant_holds());
    }

    #[test]
    fn an_flp_drop_ends_the_tf_at_once_and_the_epn_report_is_late() {
        let mut l = Ledger::new();
        l.issue(7, 3, 0);
        let row = l.flp_dropped(7, Reason::FlpBufferFull, 2).unwrap();
        assert_eq!(
            (row.status, row.reason, row.epn),
            (TfStatus::Dropped, Reason::FlpBufferFull, Some(3))
        );
        // The second FLP's drop of the same TF does not count again.
        assert!(l.flp_dropped(7, Reason::FlpQueueFull, 3).is_none());
        assert_eq!(
            l.report(7, 3, TfStatus::Incomplete, Reason::BuildTimeout, 0, 5),
            Outcome::NotPending
        );
        assert_eq!(l.dropped[&Reason::FlpBufferFull], 1);
        assert!(l.invariant_holds());
    }

    #[test]
    fn latency_is_issue_to_ack() {
        let mut l = Ledger::new();
        l.issue(1, 0, 1_000);
        l.issue(2, 0, 2_000);
        l.report(1, 0, TfStatus::Complete, Reason::None, 1, 4_000);
        l.report(2, 0, TfStatus::Complete, Reason::None, 1, 12_000);
        assert!((l.latency_ms(0.5) - 3.0).abs() < 0.01);
        assert!((l.latency_max_ms() - 10.0).abs() < 0.02);
        assert_eq!(l.completed_bytes, 2);
    }
}
