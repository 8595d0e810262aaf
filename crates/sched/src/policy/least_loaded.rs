//! Least-loaded / buffer-aware (ALICE DataDistribution's TF scheduler): round robin over the
//! EPNs with free buffer >= 1.2 x TF size and a free building slot; else wait or drop, by policy.

use super::{Decision, DropReason, EpnLoad, Policy, TfRequest};
use crate::EpnId;
use std::collections::BTreeMap;

/// What `least-loaded` answers when EPNs exist but none qualifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenNoneReady {
    /// `Decision::Wait`: hold the TF and ask again after the next report.
    Wait,
    /// `Decision::Drop(NoEpnBuffer | EpnsBusy)`: the TF is dropped (DataDistribution
    /// rejects it the same way).
    #[default]
    Drop,
}

impl WhenNoneReady {
    pub fn name(self) -> &'static str {
        match self {
            WhenNoneReady::Wait => "wait",
            WhenNoneReady::Drop => "drop",
        }
    }
}

impl std::str::FromStr for WhenNoneReady {
    type Err = crate::ParseError;
    fn from_str(s: &str) -> Result<Self, crate::ParseError> {
        match s {
            "wait" => Ok(WhenNoneReady::Wait),
            "drop" => Ok(WhenNoneReady::Drop),
            _ => Err(format!("unknown when-none-ready {s:?} (known: wait, drop)").into()),
        }
    }
}

/// Parameters of `least-loaded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeastLoadedConfig {
    /// An EPN qualifies when its free buffer is at least this percentage of the TF size
    /// (DataDistribution over-estimates TF sizes by 20 %: 120).
    pub headroom_percent: u32,
    /// ... and it builds fewer than this many TFs (at least 1; the default is fanin's EPN
    /// `--max-building` default).
    pub max_building: u32,
    /// What to answer when members exist but none qualifies.
    pub when_none_ready: WhenNoneReady,
}

impl Default for LeastLoadedConfig {
    fn default() -> Self {
        LeastLoadedConfig {
            headroom_percent: 120,
            max_building: 4096,
            when_none_ready: WhenNoneReady::Drop,
        }
    }
}

impl LeastLoadedConfig {
    /// Buffer bytes a TF of `bytes` needs to be placed: `bytes` x headroom, rounded up
    /// (the policy's rule, and the configuration's check of the largest TF).
    pub fn need(&self, bytes: u64) -> u64 {
        let n = (bytes as u128 * self.headroom_percent as u128).div_ceil(100);
        n.min(u64::MAX as u128) as u64
    }

    /// Checks the values as the runtime and the simulators take them: the field at
    /// fault and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.max_building == 0 {
            let why = "0 is not within 1..=4294967295".into();
            return Err(("least_loaded.max_building", why));
        }
        if self.headroom_percent > 10_000 {
            let why = format!("{} is not within 0..=10000", self.headroom_percent);
            return Err(("least_loaded.headroom_percent", why));
        }
        Ok(())
    }
}

/// DataDistribution's `findTfBuilderForTf`, deterministic and without threads:
///
/// - Members are kept in a ready list (joiners at the back). Each TF goes to the first
///   EPN in that list that qualifies, which then moves to the back: round robin over the
///   qualifying EPNs, and an EPN that was skipped is first in line once it qualifies.
/// - An EPN qualifies when it never reported (its load is unknown: treated like plain
///   round robin), or when its estimated free buffer >= `headroom_percent` % of the TF
///   size and its estimated TFs in building < `max_building`.
/// - Between reports the policy estimates locally, as DataDistribution does: assigning a
///   TF to an EPN takes the over-estimated TF size off its free buffer and adds one TF in
///   building. So a burst of TFs between two reports spreads out and stops at each EPN's
///   capacity instead of piling onto the EPN that reported most. A new report replaces
///   the estimate (the EPN knows best; it counts the TFs it already received).
/// - No member qualifies: `Wait`, or `Drop(EpnsBusy)` when every member is at
///   `max_building`, else `Drop(NoEpnBuffer)` (`when_none_ready`). No member at all:
///   `Drop(NoEpn)`.
/// - A leaving EPN's estimate is forgotten; when it returns it is at the back of the
///   ready list with an unknown load until it reports. Reports from non-members are
///   ignored.
#[derive(Debug, Default, Clone)]
pub struct LeastLoaded {
    cfg: LeastLoadedConfig,
    /// Members in scheduling order: tried front to back; the chosen one moves to the back.
    ready: Vec<EpnId>,
    /// Estimated load of the members that have reported.
    est: BTreeMap<EpnId, EpnLoad>,
}

impl LeastLoaded {
    pub fn new(cfg: LeastLoadedConfig) -> LeastLoaded {
        LeastLoaded {
            cfg: LeastLoadedConfig {
                max_building: cfg.max_building.max(1),
                ..cfg
            },
            ..LeastLoaded::default()
        }
    }

    pub fn config(&self) -> LeastLoadedConfig {
        self.cfg
    }

    /// The current load estimate of `epn`: its last report minus what was assigned to it
    /// since; `None` when it has not reported (or is not a member).
    pub fn estimate(&self, epn: EpnId) -> Option<EpnLoad> {
        self.est.get(&epn).copied()
    }

    /// Buffer bytes a TF of `bytes` needs to be placed (`LeastLoadedConfig::need`).
    pub fn need(&self, bytes: u64) -> u64 {
        self.cfg.need(bytes)
    }

    fn qualifies(&self, epn: EpnId, need: u64) -> bool {
        match self.est.get(&epn) {
            None => true,
            Some(l) => l.free_bytes >= need && l.building < self.cfg.max_building,
        }
    }
}

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }

    fn add_epn(&mut self, epn: EpnId) {
        if !self.ready.contains(&epn) {
            self.ready.push(epn);
        }
    }

    fn remove_epn(&mut self, epn: EpnId) {
        if let Some(i) = self.ready.iter().position(|&e| e == epn) {
            self.ready.remove(i);
            self.est.remove(&epn);
        }
    }

    fn epns(&self) -> &[EpnId] {
        &self.ready
    }

    fn assign(&mut self, req: TfRequest) -> Decision {
        if self.ready.is_empty() {
            return Decision::Drop(DropReason::NoEpn);
        }
        let need = self.need(req.bytes);
        let Some(i) = self.ready.iter().position(|&e| self.qualifies(e, need)) else {
            return match self.cfg.when_none_ready {
                WhenNoneReady::Wait => Decision::Wait,
                WhenNoneReady::Drop => {
                    let all_busy = self.ready.iter().all(|e| {
                        self.est
                            .get(e)
                            .is_some_and(|l| l.building >= self.cfg.max_building)
                    });
                    Decision::Drop(if all_busy {
                        DropReason::EpnsBusy
                    } else {
                        DropReason::NoEpnBuffer
                    })
                }
            };
        };
        let epn = self.ready.remove(i);
        self.ready.push(epn);
        if let Some(l) = self.est.get_mut(&epn) {
            l.free_bytes -= need; // qualifies: free_bytes >= need
            l.building += 1; // qualifies: building < max_building
        }
        Decision::Assign(epn)
    }

    fn report_load(&mut self, epn: EpnId, load: EpnLoad) {
        if self.ready.contains(&epn) {
            self.est.insert(epn, load);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::take_from;

    const MIB: u64 = 1 << 20;

    fn ll(cfg: LeastLoadedConfig, members: &[EpnId]) -> LeastLoaded {
        let mut p = LeastLoaded::new(cfg);
        for &m in members {
            p.add_epn(m);
        }
        p
    }

    fn load(free_bytes: u64, building: u32) -> EpnLoad {
        EpnLoad {
            free_bytes,
            building,
        }
    }

    fn one(p: &mut LeastLoaded, tf: u64, bytes: u64) -> Decision {
        p.assign(TfRequest::new(tf, bytes))
    }

    #[test]
    fn without_reports_it_is_round_robin_in_join_order() {
        let mut p = ll(LeastLoadedConfig::default(), &[10, 3, 7]);
        assert_eq!(take_from(&mut p, 0, 7, MIB), vec![10, 3, 7, 10, 3, 7, 10]);
        assert_eq!(p.estimate(10), None);
    }

    #[test]
    fn threshold_is_headroom_times_tf_size() {
        let mut p = ll(LeastLoadedConfig::default(), &[1]);
        assert_eq!(p.need(1000), 1200);
        assert_eq!(p.need(1001), 1202, "rounded up");
        p.report_load(1, load(1199, 0));
        assert_eq!(
            one(&mut p, 0, 1000),
            Decision::Drop(DropReason::NoEpnBuffer)
        );
        p.report_load(1, load(1200, 0));
        assert_eq!(one(&mut p, 1, 1000), Decision::Assign(1));
        assert_eq!(p.estimate(1), Some(load(0, 1)));
    }

    #[test]
    fn a_burst_between_reports_spreads_and_stops_at_capacity() {
        // Each EPN has 3 MiB free; a 1 MiB TF needs 1.2 MiB: two TFs each.
        let mut p = ll(LeastLoadedConfig::default(), &[1, 2, 3]);
        for e in [1, 2, 3] {
            p.report_load(e, load(3 * MIB, 0));
        }
        assert_eq!(take_from(&mut p, 0, 6, MIB), vec![1, 2, 3, 1, 2, 3]);
        let left = 3 * MIB - 2 * p.need(MIB);
        assert_eq!(p.estimate(2), Some(load(left, 2)));
        assert_eq!(one(&mut p, 6, MIB), Decision::Drop(DropReason::NoEpnBuffer));
        // A fresh report replaces the estimate.
        p.report_load(2, load(10 * MIB, 1));
        assert_eq!(one(&mut p, 7, MIB), Decision::Assign(2));
        assert_eq!(p.estimate(2), Some(load(10 * MIB - p.need(MIB), 2)));
    }

    #[test]
    fn an_uneven_burst_does_not_pile_onto_the_emptiest_epn() {
        // EPN 1 reports much more free buffer, but the rotation still alternates while
        // both qualify; once 2 is full, 1 takes the rest.
        let mut p = ll(LeastLoadedConfig::default(), &[1, 2]);
        p.report_load(1, load(100 * MIB, 0));
        p.report_load(2, load(2 * MIB, 0)); // room for one 1 MiB TF
        assert_eq!(take_from(&mut p, 0, 5, MIB), vec![1, 2, 1, 1, 1]);
    }

    #[test]
    fn a_skipped_epn_is_first_in_line_once_it_qualifies() {
        let mut p = ll(LeastLoadedConfig::default(), &[1, 2, 3]);
        p.report_load(1, load(0, 0));
        assert_eq!(take_from(&mut p, 0, 4, MIB), vec![2, 3, 2, 3]);
        assert_eq!(p.epns(), &[1, 2, 3]);
        p.report_load(1, load(100 * MIB, 0));
        assert_eq!(take_from(&mut p, 4, 4, MIB), vec![1, 2, 3, 1]);
    }

    #[test]
    fn building_limit_and_busy_reason() {
        let cfg = LeastLoadedConfig {
            max_building: 2,
            ..LeastLoadedConfig::default()
        };
        let mut p = ll(cfg, &[1, 2]);
        p.report_load(1, load(100 * MIB, 1)); // one more slot
        p.report_load(2, load(100 * MIB, 2)); // full
        assert_eq!(one(&mut p, 0, MIB), Decision::Assign(1));
        assert_eq!(p.estimate(1).unwrap().building, 2);
        assert_eq!(one(&mut p, 1, MIB), Decision::Drop(DropReason::EpnsBusy));
        // One busy, one without buffer: the buffer is the reason.
        p.report_load(2, load(0, 0));
        assert_eq!(one(&mut p, 2, MIB), Decision::Drop(DropReason::NoEpnBuffer));
    }

    #[test]
    fn wait_policy_waits_without_changing_state_then_assigns() {
        let cfg = LeastLoadedConfig {
            when_none_ready: WhenNoneReady::Wait,
            ..LeastLoadedConfig::default()
        };
        let mut p = ll(cfg, &[1, 2]);
        p.report_load(1, load(MIB, 0));
        p.report_load(2, load(MIB, 0));
        assert_eq!(one(&mut p, 0, MIB), Decision::Wait);
        assert_eq!(
            one(&mut p, 0, MIB),
            Decision::Wait,
            "same answer when asked again"
        );
        assert_eq!(p.estimate(1), Some(load(MIB, 0)));
        p.report_load(2, load(2 * MIB, 0));
        assert_eq!(one(&mut p, 0, MIB), Decision::Assign(2));
        // No member at all is still NoEpn, not Wait.
        p.remove_epn(1);
        p.remove_epn(2);
        assert_eq!(one(&mut p, 1, MIB), Decision::Drop(DropReason::NoEpn));
    }

    #[test]
    fn leave_forgets_the_estimate_and_rejoin_starts_unknown_at_the_back() {
        let mut p = ll(LeastLoadedConfig::default(), &[1, 2, 3]);
        p.report_load(1, load(0, 0));
        assert_eq!(take_from(&mut p, 0, 1, MIB), vec![2]);
        p.remove_epn(1);
        assert_eq!(p.estimate(1), None);
        p.report_load(1, load(0, 0)); // from a non-member: ignored
        p.add_epn(1);
        assert_eq!(p.epns(), &[3, 2, 1]);
        assert_eq!(take_from(&mut p, 1, 4, MIB), vec![3, 2, 1, 3]);
    }

    #[test]
    fn zero_byte_tf_needs_only_a_slot_and_max_building_is_at_least_one() {
        let cfg = LeastLoadedConfig {
            max_building: 0,
            ..LeastLoadedConfig::default()
        };
        let mut p = ll(cfg, &[4]);
        assert_eq!(p.config().max_building, 1);
        p.report_load(4, load(0, 0));
        assert_eq!(one(&mut p, 0, 0), Decision::Assign(4));
        assert_eq!(one(&mut p, 1, 0), Decision::Drop(DropReason::EpnsBusy));
    }

    #[test]
    fn names_of_when_none_ready() {
        for w in [WhenNoneReady::Wait, WhenNoneReady::Drop] {
            assert_eq!(w.name().parse::<WhenNoneReady>().unwrap(), w);
        }
        assert!("hold".parse::<WhenNoneReady>().is_err());
        assert_eq!(WhenNoneReady::default(), WhenNoneReady::Drop);
    }
}
