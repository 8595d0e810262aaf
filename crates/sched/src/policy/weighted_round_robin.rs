//! Smooth weighted round robin (nginx's upstream algorithm) over per-EPN capacity weights:
//! over any window of sum-of-weights TFs, each EPN gets exactly its weight, interleaved.

use super::{Decision, DropReason, Policy, TfRequest};
use crate::EpnId;
use std::collections::BTreeMap;

/// Each member has a weight `w` (default 1; `set_weight`, remembered across leave and
/// rejoin, may come before the EPN joins) and a running score. Per TF every score grows by
/// its weight, the highest score wins (ties: the earliest joined) and loses the total
/// weight. Weights 5, 1, 1 give `a a b a c a a`, not `a a a a a b c`.
///
/// A membership or weight change keeps the other members' scores (as nginx does): a
/// joining or returning EPN is appended to the join order with score 0, a leaving one takes
/// its score with it. (Restarting every score at 0 instead would hand the next TF to the
/// first member after every change: with EPNs failing and returning often, that one EPN
/// would get most TFs.)
#[derive(Debug, Default, Clone)]
pub struct WeightedRoundRobin {
    /// Members in join order.
    members: Vec<EpnId>,
    /// Running score of `members[i]`.
    score: Vec<i64>,
    /// Weights given by `set_weight` (members or not); absent means 1.
    weights: BTreeMap<EpnId, u32>,
}

/// The largest weight an EPN may have.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// Checks per-EPN weights as the runtime and the simulators take them: at most
/// `max_len` of them (one per EPN), each 1..=`MAX_WEIGHT` (`set_weight` would take a 0
/// as 1, silently; the scores add weights up, so they are kept far from overflow).
pub fn check_weights(weights: &[u32], max_len: usize) -> Result<(), String> {
    if weights.len() > max_len {
        let n = weights.len();
        return Err(format!("{n} weights: at most {max_len}, one per EPN"));
    }
    match weights.iter().find(|&&w| w == 0 || w > MAX_WEIGHT) {
        Some(w) => Err(format!(
            "weight {w}: weights must be 1..={MAX_WEIGHT}, one per EPN"
        )),
        None => Ok(()),
    }
}

impl WeightedRoundRobin {
    /// The weight `epn` is scheduled with.
    pub fn weight(&self, epn: EpnId) -> u32 {
        self.weights.get(&epn).copied().unwrap_or(1)
    }
}

impl Policy for WeightedRoundRobin {
    fn name(&self) -> &'static str {
        "weighted-round-robin"
    }

    fn add_epn(&mut self, epn: EpnId) {
        if !self.members.contains(&epn) {
            self.members.push(epn);
            self.score.push(0);
        }
    }

    fn remove_epn(&mut self, epn: EpnId) {
        if let Some(i) = self.members.iter().position(|&e| e == epn) {
            self.members.remove(i);
            self.score.remove(i);
        }
    }

    fn epns(&self) -> &[EpnId] {
        &self.members
    }

    fn assign(&mut self, _req: TfRequest) -> Decision {
        if self.members.is_empty() {
            return Decision::Drop(DropReason::NoEpn);
        }
        let mut total = 0i64;
        let mut best = 0;
        for i in 0..self.members.len() {
            let w = self.weight(self.members[i]) as i64;
            total += w;
            self.score[i] += w;
            if self.score[i] > self.score[best] {
                best = i;
            }
        }
        self.score[best] -= total;
        Decision::Assign(self.members[best])
    }

    /// Weight 0 is taken as 1: every member gets some TFs (remove an EPN to stop it).
    fn set_weight(&mut self, epn: EpnId, weight: u32) {
        let weight = weight.max(1);
        self.weights.insert(epn, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::take_from;

    fn wrr(members: &[(EpnId, u32)]) -> WeightedRoundRobin {
        let mut p = WeightedRoundRobin::default();
        for &(e, w) in members {
            p.add_epn(e);
            p.set_weight(e, w);
        }
        p
    }

    fn take(p: &mut WeightedRoundRobin, n: usize) -> Vec<EpnId> {
        take_from(p, 0, n, 0)
    }

    #[test]
    fn nginx_sequence_for_weights_5_1_1() {
        let mut p = wrr(&[(1, 5), (2, 1), (3, 1)]);
        assert_eq!(take(&mut p, 7), vec![1, 1, 2, 1, 3, 1, 1]);
        // And it repeats.
        assert_eq!(take(&mut p, 7), vec![1, 1, 2, 1, 3, 1, 1]);
    }

    #[test]
    fn equal_weights_are_plain_round_robin_in_join_order() {
        let mut p = wrr(&[(10, 1), (3, 1), (7, 1)]);
        assert_eq!(take(&mut p, 6), vec![10, 3, 7, 10, 3, 7]);
        // Unweighted EPNs weigh 1.
        let mut q = WeightedRoundRobin::default();
        for e in [10, 3, 7] {
            q.add_epn(e);
        }
        assert_eq!(q.weight(3), 1);
        assert_eq!(take(&mut q, 6), vec![10, 3, 7, 10, 3, 7]);
    }

    #[test]
    fn weights_3_2_interleave() {
        let mut p = wrr(&[(1, 3), (2, 2)]);
        // scores: (3,2)->1 (-2,2); (1,4)->2 (1,-1); (4,1)->1 (-1,1); (2,3)->2 (2,-2); (5,0)->1
        assert_eq!(take(&mut p, 5), vec![1, 2, 1, 2, 1]);
    }

    #[test]
    fn shares_follow_weights_over_many_tfs() {
        let mut p = wrr(&[(0, 4), (1, 2), (2, 1), (3, 1)]);
        let mut count = [0usize; 4];
        for e in take(&mut p, 8000) {
            count[e as usize] += 1;
        }
        assert_eq!(count, [4000, 2000, 1000, 1000]);
    }

    #[test]
    fn weight_before_join_and_after_rejoin_is_kept() {
        let mut p = WeightedRoundRobin::default();
        p.set_weight(2, 3);
        p.add_epn(1);
        p.add_epn(2);
        // (1,3)->2 (1,-1); (2,2)->1 first on tie (-2,2); (-1,5)->2 (-1,1); (0,4)->2 (0,0)
        assert_eq!(take(&mut p, 4), vec![2, 1, 2, 2]);
        p.remove_epn(2);
        assert_eq!(take(&mut p, 2), vec![1, 1]);
        p.add_epn(2); // back, at the end of the join order, still weight 3, from score 0
        assert_eq!(p.epns(), &[1, 2]);
        assert_eq!(take(&mut p, 4), vec![2, 1, 2, 2]);
    }

    #[test]
    fn a_leave_keeps_the_survivors_scores() {
        let mut p = wrr(&[(1, 2), (2, 1), (3, 1)]);
        // (2,1,1)->1 (-2,1,1); (0,2,2)->2 (0,-2,2); (2,-1,3)->3 (2,-1,-1)
        assert_eq!(take(&mut p, 3), vec![1, 2, 3]);
        p.remove_epn(2);
        // [1 (2), 3 (1)] from (2,-1): (4,0)->1 (1,0); (3,1)->1 (0,1); (2,2)->1 (-1,2);
        // (1,3)->3 (1,0)
        assert_eq!(take(&mut p, 4), vec![1, 1, 1, 3]);
    }

    #[test]
    fn frequent_changes_do_not_favour_the_first_member() {
        // Restarting scores on every change would give EPN 0 nearly every TF here.
        let mut p = WeightedRoundRobin::default();
        for e in 0..100 {
            p.add_epn(e);
        }
        let mut count = [0u32; 100];
        for round in 0..1000u32 {
            let gone = 1 + round % 99;
            p.remove_epn(gone);
            for e in take(&mut p, 9) {
                count[e as usize] += 1;
            }
            p.add_epn(gone);
        }
        let max = *count.iter().max().unwrap();
        assert!(max <= 2 * 9000 / 100, "one EPN got {max} of 9000 TFs");
    }

    #[test]
    fn changing_a_weight_keeps_the_scores_and_zero_counts_as_one() {
        let mut p = wrr(&[(1, 1), (2, 1)]);
        assert_eq!(take(&mut p, 1), vec![1]); // (1,1)->1 (-1,1)
        p.set_weight(2, 2);
        // (0,3)->2 (0,0); (1,2)->2 (1,-1); (2,1)->1 (-1,1)
        assert_eq!(take(&mut p, 3), vec![2, 2, 1]);
        p.set_weight(1, 0);
        assert_eq!(p.weight(1), 1);
        p.set_weight(9, 7); // not a member
        assert_eq!(take(&mut p, 3), vec![2, 2, 1]);
    }
}
