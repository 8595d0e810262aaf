//! Transfer tokens: which EPN reads which FLP's STF next, with at most `per_flp` EPNs
//! reading from one FLP and at most `per_epn` STFs read by one EPN at once.
//!
//! As ALICE's TfScheduler token manager: an EPN wants the STFs of its TF from a set of
//! FLPs and gets a token for one it still needs whose FLP has one free; a TF whose
//! transfers began first (its EPN's build time-out runs from its first STF), then the
//! oldest TF. The grant picks among the free FLPs from a point that depends on the EPN and
//! TF, so EPNs spread over the FLPs instead of all reading from the same one. The
//! runtime and the simulators call this code; it has no clock, I/O or randomness.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::{EpnId, FlpId, TfId};

/// A transfer that may start now: `epn` reads the STF of `tf` from `flp`. Hand it back
/// with `done` when the STF arrived, failed or is no longer wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Grant {
    pub epn: EpnId,
    pub tf: TfId,
    pub flp: FlpId,
}

#[derive(Debug, Clone)]
struct Want {
    epn: EpnId,
    tf: TfId,
    /// FLPs whose STF it still needs and has no token for.
    flps: BTreeSet<FlpId>,
    /// One of its transfers was granted: its EPN is building it.
    started: bool,
}

/// The token state of one run.
#[derive(Debug, Clone)]
pub struct TokenManager {
    per_flp: u32,
    per_epn: u32,
    /// Tokens in use, indexed by FLP and EPN id (grown on demand).
    flp_busy: Vec<u32>,
    epn_busy: Vec<u32>,
    /// Outstanding wants, oldest first.
    wants: VecDeque<Want>,
    /// Transfers granted and not ended yet, counted (the same transfer can be granted
    /// again, to an EPN restarted under its id, before the first ends).
    out: BTreeMap<Grant, u32>,
}

fn slot(v: &mut Vec<u32>, i: u32) -> &mut u32 {
    if v.len() <= i as usize {
        v.resize(i as usize + 1, 0);
    }
    &mut v[i as usize]
}

impl TokenManager {
    /// Both limits at least 1.
    pub fn new(per_flp: u32, per_epn: u32) -> TokenManager {
        assert!(per_flp >= 1 && per_epn >= 1, "a limit of 0 never transfers");
        TokenManager {
            per_flp,
            per_epn,
            flp_busy: Vec::new(),
            epn_busy: Vec::new(),
            wants: VecDeque::new(),
            out: BTreeMap::new(),
        }
    }

    /// `epn` wants the STFs of `tf` from `flps`: the transfers that may start now.
    pub fn want(
        &mut self,
        epn: EpnId,
        tf: TfId,
        flps: impl IntoIterator<Item = FlpId>,
    ) -> Vec<Grant> {
        let flps: BTreeSet<FlpId> = flps.into_iter().collect();
        if flps.is_empty() {
            return Vec::new();
        }
        // Oldest TF first: a TF that moved to another EPN keeps its place.
        let i = self.wants.partition_point(|w| w.tf <= tf);
        let want = Want {
            epn,
            tf,
            flps,
            started: false,
        };
        self.wants.insert(i, want);
        let mut out = Vec::new();
        while let Some(g) = self.grant_from(i) {
            out.push(g);
        }
        self.wants.retain(|w| !w.flps.is_empty());
        out
    }

    /// A transfer ended (arrived, failed, or no longer wanted): its tokens go to the
    /// oldest wants that can use them. Returns the transfers that may start now; a
    /// transfer not granted (or ended already) changes nothing.
    pub fn done(&mut self, g: Grant) -> Vec<Grant> {
        match self.out.get_mut(&g) {
            None => return Vec::new(),
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.out.remove(&g);
            }
        }
        let f = slot(&mut self.flp_busy, g.flp);
        assert!(*f > 0, "FLP {} has no token out", g.flp);
        *f -= 1;
        let e = slot(&mut self.epn_busy, g.epn);
        assert!(*e > 0, "EPN {} has no token out", g.epn);
        *e -= 1;
        let mut out = Vec::new();
        // The oldest started want that can use a freed token gets it, then the oldest
        // of any, while any can. Only the freed EPN's wants and those that need the
        // freed FLP can (no other could before, and nothing frees a token meanwhile).
        for started_only in [true, false] {
            let mut i = 0;
            // Once both freed tokens are taken again, no want can gain any more.
            while i < self.wants.len() && !self.retaken(g) {
                let w = &self.wants[i];
                let gains =
                    (w.started || !started_only) && (w.epn == g.epn || w.flps.contains(&g.flp));
                match gains.then(|| self.grant_from(i)).flatten() {
                    Some(gr) => out.push(gr),
                    None => i += 1,
                }
            }
        }
        self.wants.retain(|w| !w.flps.is_empty());
        out
    }

    /// Ends every transfer under way that `which` picks (each as often as it was
    /// granted): the transfers that may start now.
    pub fn end_where(&mut self, which: impl Fn(&Grant) -> bool) -> Vec<Grant> {
        let ended: Vec<(Grant, u32)> = self
            .out
            .iter()
            .filter(|(g, _)| which(g))
            .map(|(g, n)| (*g, *n))
            .collect();
        let mut next = Vec::new();
        for (g, n) in ended {
            (0..n).for_each(|_| next.extend(self.done(g)));
        }
        next
    }

    /// Is this transfer granted and not ended?
    pub fn is_out(&self, g: &Grant) -> bool {
        self.out.contains_key(g)
    }

    /// Is the STF of `tf` from `flp` wanted or on its way?
    pub fn open(&self, tf: TfId, flp: FlpId) -> bool {
        self.wanted(tf, flp) || self.out.keys().any(|g| g.tf == tf && g.flp == flp)
    }

    /// Is some transfer of `tf` granted and not ended?
    pub fn under_way(&self, tf: TfId) -> bool {
        self.out.keys().any(|g| g.tf == tf)
    }

    /// Forgets the wants of `tf` (it ended or moved); its transfers in progress are
    /// still handed back with `done`.
    pub fn cancel(&mut self, tf: TfId) {
        self.wants.retain(|w| w.tf != tf);
    }

    /// FLP `flp` is gone: nobody waits for its STFs any more.
    pub fn forget_flp(&mut self, flp: FlpId) {
        for w in &mut self.wants {
            w.flps.remove(&flp);
        }
        self.wants.retain(|w| !w.flps.is_empty());
    }

    /// EPN `epn` is gone: it waits for nothing (its TFs are wanted again by the EPNs they
    /// move to). Before its transfers end, so their tokens go to EPNs that can use them.
    pub fn forget_epn(&mut self, epn: EpnId) {
        self.wants.retain(|w| w.epn != epn);
    }

    /// The run stopped: nothing is wanted any more (the transfers under way still end).
    pub fn forget_wants(&mut self) {
        self.wants.clear();
    }

    /// Does some EPN still wait for a token for the STF of `tf` from `flp`?
    pub fn wanted(&self, tf: TfId, flp: FlpId) -> bool {
        self.wants
            .iter()
            .any(|w| w.tf == tf && w.flps.contains(&flp))
    }

    /// Tokens of `flp` in use.
    pub fn flp_busy(&self, flp: FlpId) -> u32 {
        self.flp_busy.get(flp as usize).copied().unwrap_or(0)
    }

    /// Tokens of `epn` in use.
    pub fn epn_busy(&self, epn: EpnId) -> u32 {
        self.epn_busy.get(epn as usize).copied().unwrap_or(0)
    }

    /// STFs wanted and not granted yet.
    pub fn waiting(&self) -> usize {
        self.wants.iter().map(|w| w.flps.len()).sum()
    }

    /// One grant for want `i`, if its EPN has a token free and one of its FLPs too.
    /// Are the FLP's and the EPN's tokens that `g` freed both out again?
    fn retaken(&self, g: Grant) -> bool {
        self.flp_busy(g.flp) >= self.per_flp && self.epn_busy(g.epn) >= self.per_epn
    }

    fn grant_from(&mut self, i: usize) -> Option<Grant> {
        let w = &self.wants[i];
        if w.flps.is_empty() || self.epn_busy(w.epn) >= self.per_epn {
            return None;
        }
        // Start at a place in the FLPs still needed of the EPN's and TF's own, then the
        // first with a token free.
        let mix = w.tf.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (w.epn as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let k = ((mix >> 32) % w.flps.len() as u64) as usize;
        let free = |f: &&FlpId| self.flp_busy(**f) < self.per_flp;
        let flp = *w
            .flps
            .iter()
            .skip(k)
            .chain(w.flps.iter().take(k))
            .find(free)?;
        let (epn, tf) = (w.epn, w.tf);
        self.wants[i].flps.remove(&flp);
        self.wants[i].started = true;
        *self.out.entry(Grant { epn, tf, flp }).or_insert(0) += 1;
        *slot(&mut self.flp_busy, flp) += 1;
        *slot(&mut self.epn_busy, epn) += 1;
        debug_assert!(self.flp_busy(flp) <= self.per_flp && self.epn_busy(epn) <= self.per_epn);
        Some(Grant { epn, tf, flp })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_epn_reads_one_flp_at_a_time_and_the_next_when_it_arrives() {
        let mut t = TokenManager::new(2, 1);
        let g = t.want(7, 100, [0, 1, 2]);
        assert_eq!(g.len(), 1, "one STF at a time for EPN 7");
        assert_eq!((t.epn_busy(7), t.waiting()), (1, 2));
        let next = t.done(g[0]);
        assert_eq!(next.len(), 1);
        assert_ne!(next[0].flp, g[0].flp);
        let last = t.done(next[0]);
        assert_eq!(t.done(last[0]), vec![]);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn a_busy_flp_makes_the_next_epn_read_another_and_the_oldest_tf_goes_first() {
        let mut t = TokenManager::new(1, 1);
        let a = t.want(1, 10, [5]);
        assert_eq!(
            a,
            vec![Grant {
                epn: 1,
                tf: 10,
                flp: 5
            }]
        );
        // EPN 2 needs FLP 5 too, which is busy: it reads FLP 6 first.
        let b = t.want(2, 11, [5, 6]);
        assert_eq!(
            b,
            vec![Grant {
                epn: 2,
                tf: 11,
                flp: 6
            }]
        );
        // EPN 3 wants FLP 5 as well; when it frees, the older TF 11 (EPN 2) waits for
        // its own token, so TF 12 gets FLP 5.
        assert!(t.want(3, 12, [5]).is_empty());
        assert_eq!(
            t.done(a[0]),
            vec![Grant {
                epn: 3,
                tf: 12,
                flp: 5
            }]
        );
        let c = t.done(b[0]);
        assert!(c.is_empty(), "FLP 5 is EPN 3's now");
        assert_eq!(
            t.done(Grant {
                epn: 3,
                tf: 12,
                flp: 5
            }),
            vec![Grant {
                epn: 2,
                tf: 11,
                flp: 5
            }]
        );
    }

    #[test]
    fn a_tf_whose_transfers_began_goes_before_an_older_one_moved_here() {
        let mut t = TokenManager::new(1, 1);
        let first = t.want(1, 20, [5, 6]);
        assert_eq!(first.len(), 1);
        // TF 10 moves here (its EPN died): older, but not begun here.
        assert!(t.want(1, 10, [5, 6]).is_empty());
        let next = t.done(first[0]);
        assert_eq!(next.len(), 1);
        assert_eq!(
            next[0].tf, 20,
            "TF 20's build time-out runs: it finishes first"
        );
        assert_ne!(next[0].flp, first[0].flp);
        assert_eq!(t.done(next[0])[0].tf, 10);
    }

    #[test]
    fn epns_start_on_different_flps_and_a_moved_tf_keeps_its_place() {
        let mut t = TokenManager::new(1, 1);
        let firsts: BTreeSet<FlpId> = (0..8)
            .flat_map(|e| t.want(e, 100 + e as u64, 0..16))
            .map(|g| g.flp)
            .collect();
        assert!(
            firsts.len() >= 6,
            "eight EPNs spread over the FLPs: {firsts:?}"
        );
        let mut t = TokenManager::new(1, 1);
        let busy = t.want(0, 1, [0]);
        assert!(t.want(1, 9, [0]).is_empty());
        assert!(t.want(2, 5, [0]).is_empty(), "TF 5 waits, before TF 9");
        assert!(t.wanted(5, 0) && !t.wanted(5, 1));
        assert_eq!(
            t.done(busy[0]),
            vec![Grant {
                epn: 2,
                tf: 5,
                flp: 0
            }]
        );
    }

    #[test]
    fn cancelled_tfs_and_forgotten_flps_are_not_waited_for() {
        let mut t = TokenManager::new(1, 1);
        let g = t.want(1, 1, [0, 1]);
        t.cancel(1);
        assert!(t.done(g[0]).is_empty());
        let g = t.want(2, 2, [0, 1, 2]);
        t.forget_flp(1);
        t.forget_flp(2);
        t.forget_flp(0);
        assert_eq!(t.waiting(), 0);
        assert!(t.done(g[0]).is_empty());
    }

    #[test]
    fn a_gone_epns_wants_and_a_stopped_runs_are_not_granted() {
        let mut t = TokenManager::new(1, 1);
        let first = t.want(1, 1, [0]);
        // EPN 1 also wants TF 2 from FLP 1; EPN 2 wants TF 3 from FLP 0 (busy).
        assert_eq!(t.want(1, 2, [1]), []);
        assert_eq!(t.want(2, 3, [0]), []);
        t.forget_epn(1);
        // EPN 1's token comes back: its own want is gone, FLP 0's goes to EPN 2.
        let next = t.done(first[0]);
        assert_eq!(
            next,
            [Grant {
                epn: 2,
                tf: 3,
                flp: 0
            }]
        );
        assert_eq!(t.want(3, 4, [0]), []);
        t.forget_wants();
        assert_eq!(t.waiting(), 0);
        assert!(t.done(next[0]).is_empty());
    }

    proptest! {
        /// Whatever the wants and completions: never more than the limits in use, every
        /// wanted STF granted exactly once, and nothing left waiting once all is done.
        #[test]
        fn limits_hold_and_every_stf_is_granted_once(
            per_flp in 1u32..3,
            per_epn in 1u32..3,
            wants in proptest::collection::vec((0u32..4, proptest::collection::btree_set(0u32..5, 1..5)), 1..20),
            order in proptest::collection::vec(any::<proptest::sample::Index>(), 0..200),
        ) {
            let mut t = TokenManager::new(per_flp, per_epn);
            let mut running: Vec<Grant> = Vec::new();
            let mut granted = std::collections::BTreeSet::new();
            let mut expected = 0;
            for (tf, (epn, flps)) in wants.iter().enumerate() {
                expected += flps.len();
                for g in t.want(*epn, tf as u64, flps.iter().copied()) {
                    prop_assert!(granted.insert((g.tf, g.flp)));
                    running.push(g);
                }
            }
            let mut step = order.into_iter();
            while !running.is_empty() {
                let k = step.next().map_or(0, |ix| ix.index(running.len()));
                let g = running.swap_remove(k);
                for n in t.done(g) {
                    prop_assert!(granted.insert((n.tf, n.flp)));
                    running.push(n);
                }
                for f in 0..5 {
                    prop_assert!(t.flp_busy(f) <= per_flp);
                    prop_assert_eq!(t.flp_busy(f) as usize, running.iter().filter(|g| g.flp == f).count());
                }
                for e in 0..4 {
                    prop_assert!(t.epn_busy(e) <= per_epn);
                }
            }
            prop_assert_eq!(granted.len(), expected);
            prop_assert_eq!(t.waiting(), 0);
        }
    }
}
