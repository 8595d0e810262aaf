//! Delivery in TF-id order (the ANTARES active-slice queue): complete TFs wait for every
//! older TF assigned here; the oldest is given up once too many newer ones wait. Pure.
//!
//! A TF assigned after newer ones were handed on goes out when built (counted).

use std::collections::{BTreeMap, BTreeSet};

use fanin_sched::TfId;

use super::builder::Built;

pub struct Order<P> {
    /// Assigned here, neither built nor closed yet.
    open: BTreeSet<TfId>,
    /// Built, waiting for older open TFs.
    held: BTreeMap<TfId, Built<P>>,
    /// Newest TF handed on so far.
    last_out: Option<TfId>,
    give_up_after: usize,
    /// TFs handed on after a newer one (their assignment came late).
    pub out_of_order: u64,
}

impl<P> Order<P> {
    /// `give_up_after`: newer complete TFs that may wait for the oldest open one.
    pub fn new(give_up_after: usize) -> Self {
        assert!(give_up_after > 0, "validated by the caller");
        Order {
            open: BTreeSet::new(),
            held: BTreeMap::new(),
            last_out: None,
            give_up_after,
            out_of_order: 0,
        }
    }

    pub fn assigned(&mut self, tf: TfId) {
        if !self.held.contains_key(&tf) {
            self.open.insert(tf);
        }
    }

    /// `tf` ended here without being built (reported, abandoned).
    pub fn closed(&mut self, tf: TfId) {
        self.open.remove(&tf);
    }

    pub fn built(&mut self, b: Built<P>) {
        self.open.remove(&b.tf);
        let old = self.held.insert(b.tf, b);
        assert!(old.is_none(), "a TF is built once");
    }

    /// Takes a held TF back (the ICN abandoned it).
    pub fn take(&mut self, tf: TfId) -> Option<Built<P>> {
        self.open.remove(&tf);
        self.held.remove(&tf)
    }

    /// The TFs built and waiting for their turn.
    pub fn held_ids(&self) -> impl Iterator<Item = TfId> + '_ {
        self.held.keys().copied()
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Moves every TF that may go now to `out`; returns the open TF to give up, if
    /// too many newer ones wait for it.
    pub fn release(&mut self, out: &mut Vec<Built<P>>) -> Option<TfId> {
        let head = self.open.first().copied();
        while let Some(entry) = self.held.first_entry() {
            if head.is_some_and(|h| h < *entry.key()) {
                break;
            }
            let b = entry.remove();
            if self.last_out.is_some_and(|l| b.tf < l) {
                self.out_of_order += 1;
            }
            self.last_out = Some(self.last_out.map_or(b.tf, |l| l.max(b.tf)));
            out.push(b);
        }
        match head {
            Some(h) if self.held.len() >= self.give_up_after => Some(h),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(tf: TfId) -> Built<u32> {
        Built {
            tf,
            stfs: vec![],
            bytes: 0,
        }
    }

    fn ids(v: &[Built<u32>]) -> Vec<TfId> {
        v.iter().map(|b| b.tf).collect()
    }

    #[test]
    fn newer_tfs_wait_for_older_ones_and_go_in_id_order() {
        let mut o = Order::new(8);
        (1..=3).for_each(|tf| o.assigned(tf));
        let mut out = vec![];
        o.built(built(3));
        o.built(built(2));
        assert_eq!(o.release(&mut out), None);
        assert!(out.is_empty());
        o.built(built(1));
        o.release(&mut out);
        assert_eq!(ids(&out), [1, 2, 3]);
        assert_eq!(o.out_of_order, 0);
    }

    #[test]
    fn the_oldest_is_given_up_once_enough_newer_ones_wait() {
        let mut o = Order::new(2);
        (1..=3).for_each(|tf| o.assigned(tf));
        let mut out = vec![];
        o.built(built(2));
        assert_eq!(o.release(&mut out), None);
        o.built(built(3));
        assert_eq!(o.release(&mut out), Some(1));
        o.closed(1); // the builder closed it incomplete
        assert_eq!(o.release(&mut out), None);
        assert_eq!(ids(&out), [2, 3]);
    }

    #[test]
    fn a_late_assignment_goes_out_when_built_and_is_counted() {
        let mut o = Order::new(4);
        o.assigned(5);
        o.built(built(5));
        let mut out = vec![];
        o.release(&mut out);
        o.built(built(4)); // its Assign came after its STFs, once 5 was out
        o.release(&mut out);
        assert_eq!(ids(&out), [5, 4]);
        assert_eq!(o.out_of_order, 1);
    }
}
