//! On-data scheduling's rule, once for the ICN and the simulators: a TF can be placed
//! when every FLP announced its STF (its size is then known); the first announcement
//! starts its stale clock. Pure: times are whatever the caller counts in.

use std::collections::{BTreeMap, VecDeque};

use crate::{FlpId, TfId};

/// One TF some FLPs announced: which (a bit per FLP), and the bytes so far.
struct Entry {
    seen: Vec<u64>,
    count: u32,
    bytes: u64,
}

/// What an announcement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// Not every FLP yet.
    Waiting,
    /// The last FLP: the TF is complete with these bytes (and no longer held here).
    Complete { bytes: u64 },
    /// This FLP had announced the TF already (or is not of the run): nothing changes.
    Repeated,
}

/// The TFs announced and not complete, and when each was first heard of.
pub struct Gather<T> {
    flps: u32,
    open: BTreeMap<TfId, Entry>,
    /// First announcements, oldest first (entries whose TF left are skipped).
    arrivals: VecDeque<(T, TfId)>,
}

impl<T: Copy + Ord> Gather<T> {
    pub fn new(flps: u32) -> Gather<T> {
        Gather {
            flps,
            open: BTreeMap::new(),
            arrivals: VecDeque::new(),
        }
    }

    /// FLP `flp` announced its STF of `tf` (`size` bytes) at `at`.
    pub fn announce(&mut self, tf: TfId, flp: FlpId, size: u64, at: T) -> Heard {
        if flp >= self.flps {
            return Heard::Repeated;
        }
        let words = (self.flps as usize).div_ceil(64);
        let arrivals = &mut self.arrivals;
        let e = self.open.entry(tf).or_insert_with(|| {
            arrivals.push_back((at, tf));
            Entry {
                seen: vec![0; words],
                count: 0,
                bytes: 0,
            }
        });
        let (w, bit) = (flp as usize / 64, 1u64 << (flp % 64));
        if e.seen[w] & bit != 0 {
            return Heard::Repeated;
        }
        e.seen[w] |= bit;
        e.count += 1;
        e.bytes = e.bytes.saturating_add(size);
        if e.count < self.flps {
            return Heard::Waiting;
        }
        let bytes = e.bytes;
        self.open.remove(&tf);
        Heard::Complete { bytes }
    }

    /// TFs announced and not complete.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// When the oldest open TF was first heard of (maybe one that left since: an
    /// early look, never a late one).
    pub fn first_arrival(&self) -> Option<T> {
        self.arrivals.front().map(|(at, _)| *at)
    }

    /// The oldest open TF first heard of at or before `before`, taken out: (TF, bytes).
    pub fn pop_stale(&mut self, before: T) -> Option<(TfId, u64)> {
        while let Some(&(at, tf)) = self.arrivals.front() {
            if !self.open.contains_key(&tf) {
                self.arrivals.pop_front();
                continue;
            }
            if at > before {
                return None;
            }
            self.arrivals.pop_front();
            return self.open.remove(&tf).map(|e| (tf, e.bytes));
        }
        None
    }

    /// The oldest open TF, taken out whatever its age (a bound on what is held).
    pub fn pop_oldest(&mut self) -> Option<(TfId, u64)> {
        while let Some((_, tf)) = self.arrivals.pop_front() {
            if let Some(e) = self.open.remove(&tf) {
                return Some((tf, e.bytes));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tf_completes_with_the_last_flp_and_its_summed_size() {
        let mut g = Gather::new(3);
        assert_eq!(g.announce(7, 0, 10, 1), Heard::Waiting);
        assert_eq!(g.announce(7, 0, 10, 2), Heard::Repeated);
        assert_eq!(g.announce(7, 9, 10, 2), Heard::Repeated, "not of the run");
        assert_eq!(g.announce(7, 2, 20, 3), Heard::Waiting);
        assert_eq!(g.announce(7, 1, 30, 4), Heard::Complete { bytes: 60 });
        assert!(g.is_empty());
        assert_eq!(g.pop_stale(100), None, "a complete TF is never stale");
    }

    #[test]
    fn stale_tfs_leave_oldest_first_and_the_bound_takes_the_oldest() {
        let mut g = Gather::new(2);
        g.announce(5, 0, 1, 10);
        g.announce(6, 1, 2, 20);
        g.announce(4, 0, 3, 30);
        assert_eq!(g.first_arrival(), Some(10));
        assert_eq!(g.pop_stale(15), Some((5, 1)));
        assert_eq!(g.pop_stale(15), None);
        assert_eq!(g.pop_oldest(), Some((6, 2)));
        assert_eq!(g.len(), 1);
    }
}
