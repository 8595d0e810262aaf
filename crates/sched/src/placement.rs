//! Placing TFs: a policy with its parameters, and the issue -> assign / wait / drop ->
//! retry-oldest-first logic around it. The ICN and every simulator place TFs through this.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::policy::{LeastLoaded, LeastLoadedConfig};
use crate::{Decision, DropReason, EpnId, Policy, PolicyKind, TfId, TfRequest};

/// A policy and its parameters, as configured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyConfig {
    pub kind: PolicyKind,
    /// `weighted-round-robin`: weight of EPN i (EPNs beyond the list weigh 1).
    pub epn_weights: Vec<u32>,
    /// `least-loaded`: headroom, TFs in building, and wait or drop when none has room.
    pub least_loaded: LeastLoadedConfig,
}

impl PolicyConfig {
    /// The configured policy, with its weights and least-loaded settings, no members.
    pub fn build(&self) -> Box<dyn Policy> {
        let mut p: Box<dyn Policy> = match self.kind {
            PolicyKind::LeastLoaded => Box::new(LeastLoaded::new(self.least_loaded)),
            other => other.build(),
        };
        for (epn, &w) in self.epn_weights.iter().enumerate() {
            p.set_weight(epn as EpnId, w);
        }
        p
    }
}

/// Where a TF went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// Build it on this EPN.
    Assigned(EpnId),
    /// No EPN has room now: it waits (in id order) for a later `place_next`.
    Waiting,
    /// The policy dropped it.
    Dropped(DropReason),
}

/// A policy and the TFs waiting for an EPN, oldest first.
pub struct Placer {
    policy: Box<dyn Policy>,
    waiting: VecDeque<(TfId, u64)>,
}

impl Placer {
    pub fn new(policy: Box<dyn Policy>) -> Placer {
        Placer {
            policy,
            waiting: VecDeque::new(),
        }
    }

    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// Membership, weights and load reports go to the policy directly.
    pub fn policy_mut(&mut self) -> &mut dyn Policy {
        self.policy.as_mut()
    }

    /// The TFs waiting for an EPN, oldest first.
    pub fn waiting(&self) -> impl Iterator<Item = TfId> + '_ {
        self.waiting.iter().map(|&(tf, _)| tf)
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// A new TF of `bytes`: behind waiting TFs it waits too (TFs are placed oldest
    /// first); otherwise the policy decides. Timer runs issue ids in rising order;
    /// on-data runs may issue an older TF after a newer one (it went stale later), and
    /// it waits in its id's place.
    pub fn issue(&mut self, tf: TfId, bytes: u64) -> Placed {
        if !self.waiting.is_empty() {
            self.wait_in_order(tf, bytes);
            return Placed::Waiting;
        }
        match self.policy.assign(TfRequest::new(tf, bytes)) {
            Decision::Assign(e) => Placed::Assigned(e),
            Decision::Drop(r) => Placed::Dropped(r),
            Decision::Wait => {
                self.wait_in_order(tf, bytes);
                Placed::Waiting
            }
        }
    }

    /// `tf` joins the waiting TFs in id order.
    fn wait_in_order(&mut self, tf: TfId, bytes: u64) {
        let at = self.waiting.partition_point(|&(w, _)| w < tf);
        self.waiting.insert(at, (tf, bytes));
        debug_assert!(
            self.waiting.get(at + 1).is_none_or(|&(w, _)| w > tf),
            "TF {tf} waits once"
        );
    }

    /// Places the oldest waiting TF if the policy assigns or drops it now: `Some((tf,
    /// Assigned | Dropped))`; `None` when it must wait on (or none waits). TFs for which
    /// `open` says false (they ended meanwhile) leave the queue unplaced.
    pub fn place_next(&mut self, mut open: impl FnMut(TfId) -> bool) -> Option<(TfId, Placed)> {
        while let Some(&(tf, bytes)) = self.waiting.front() {
            if !open(tf) {
                self.waiting.pop_front();
                continue;
            }
            let placed = match self.policy.assign(TfRequest::new(tf, bytes)) {
                Decision::Wait => return None,
                Decision::Assign(e) => Placed::Assigned(e),
                Decision::Drop(r) => Placed::Dropped(r),
            };
            self.waiting.pop_front();
            return Some((tf, placed));
        }
        None
    }

    /// A TF placed before whose EPN is gone: the policy places it again; if it must
    /// wait, it joins the queue in id order.
    pub fn replace(&mut self, tf: TfId, bytes: u64) -> Placed {
        match self.policy.assign(TfRequest::new(tf, bytes)) {
            Decision::Assign(e) => Placed::Assigned(e),
            Decision::Drop(r) => Placed::Dropped(r),
            Decision::Wait => {
                self.wait_in_order(tf, bytes);
                Placed::Waiting
            }
        }
    }

    /// Empties the queue (the run ends): the TFs that never got an EPN, oldest first.
    pub fn drain_waiting(&mut self) -> Vec<TfId> {
        self.waiting.drain(..).map(|(tf, _)| tf).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::WhenNoneReady;
    use crate::EpnLoad;

    fn least_loaded_wait() -> Placer {
        let cfg = PolicyConfig {
            kind: PolicyKind::LeastLoaded,
            least_loaded: LeastLoadedConfig {
                headroom_percent: 100,
                max_building: 8,
                when_none_ready: WhenNoneReady::Wait,
            },
            ..PolicyConfig::default()
        };
        let mut p = Placer::new(cfg.build());
        p.policy_mut().add_epn(0);
        p
    }

    fn full(p: &mut Placer, free_bytes: u64) {
        let load = EpnLoad {
            free_bytes,
            building: 0,
        };
        p.policy_mut().report_load(0, load);
    }

    #[test]
    fn weights_reach_the_policy() {
        let cfg = PolicyConfig {
            kind: PolicyKind::WeightedRoundRobin,
            epn_weights: vec![3, 1],
            ..PolicyConfig::default()
        };
        let mut p = Placer::new(cfg.build());
        p.policy_mut().add_epn(0);
        p.policy_mut().add_epn(1);
        let picks: Vec<Placed> = (0..8).map(|tf| p.issue(tf, 1)).collect();
        let on0 = picks.iter().filter(|&&x| x == Placed::Assigned(0)).count();
        assert_eq!(on0, 6, "{picks:?}");
    }

    #[test]
    fn tfs_behind_a_waiting_one_wait_and_go_in_order() {
        let mut p = least_loaded_wait();
        full(&mut p, 0);
        assert_eq!(p.issue(1, 10), Placed::Waiting);
        full(&mut p, 1000);
        assert_eq!(p.issue(2, 10), Placed::Waiting, "behind TF 1");
        assert_eq!(p.place_next(|_| true), Some((1, Placed::Assigned(0))));
        assert_eq!(p.place_next(|_| true), Some((2, Placed::Assigned(0))));
        assert_eq!(p.place_next(|_| true), None);
    }

    #[test]
    fn ended_tfs_leave_the_queue_unplaced() {
        let mut p = least_loaded_wait();
        full(&mut p, 0);
        p.issue(1, 10);
        p.issue(2, 10);
        full(&mut p, 1000);
        assert_eq!(p.place_next(|tf| tf != 1), Some((2, Placed::Assigned(0))));
        assert_eq!(p.waiting_len(), 0);
    }

    #[test]
    fn replaced_tfs_wait_in_id_order() {
        let mut p = least_loaded_wait();
        full(&mut p, 0);
        p.issue(5, 10);
        assert_eq!(p.replace(3, 10), Placed::Waiting);
        assert_eq!(p.waiting().collect::<Vec<_>>(), [3, 5]);
        assert_eq!(p.drain_waiting(), [3, 5]);
    }

    /// On-data, an older TF can be issued after a newer one (it went stale later): it
    /// waits in its id's place, and in debug builds nothing asserts otherwise.
    #[test]
    fn an_older_tf_issued_late_waits_in_id_order() {
        let mut p = least_loaded_wait();
        full(&mut p, 0);
        assert_eq!(p.issue(7, 10), Placed::Waiting);
        assert_eq!(p.issue(5, 10), Placed::Waiting);
        assert_eq!(p.waiting().collect::<Vec<_>>(), [5, 7]);
    }

    #[test]
    fn no_member_drops_with_no_epn() {
        let mut p = Placer::new(PolicyConfig::default().build());
        assert_eq!(p.issue(0, 1), Placed::Dropped(DropReason::NoEpn));
    }
}
