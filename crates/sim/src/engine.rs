//! The discrete-event core: a time-ordered queue of events. Ties break by insertion
//! order, so a run is a pure function of its inputs and seed (byte-for-byte output).
//! A radix heap: times never go back, so events sit in buckets by the highest bit in
//! which their time differs from the current one (amortised O(1), cache friendly).

use std::collections::VecDeque;

/// Simulated time in nanoseconds.
pub type Time = u64;

pub const US: Time = 1_000;
pub const MS: Time = 1_000_000;
pub const SEC: Time = 1_000_000_000;

pub struct Queue<E> {
    /// Bucket 0 holds events at exactly `last`; bucket i > 0 those whose time differs
    /// from `last` first in bit i - 1. Each bucket keeps insertion order.
    buckets: Vec<VecDeque<(Time, E)>>,
    /// Time of the last event popped (the heap's reference point).
    last: Time,
    len: usize,
    /// Events popped so far.
    pub processed: u64,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket(t: Time, last: Time) -> usize {
    (64 - (t ^ last).leading_zeros()) as usize
}

impl<E> Queue<E> {
    pub fn new() -> Self {
        Queue {
            buckets: (0..65).map(|_| VecDeque::new()).collect(),
            last: 0,
            len: 0,
            processed: 0,
        }
    }

    pub fn now(&self) -> Time {
        self.last
    }

    /// Schedules `ev` at absolute time `at` (never in the past).
    pub fn at(&mut self, at: Time, ev: E) {
        assert!(
            at >= self.last,
            "event scheduled in the past: {at} < {}",
            self.last
        );
        self.buckets[bucket(at, self.last)].push_back((at, ev));
        self.len += 1;
    }

    /// Schedules `ev` after `delay`.
    pub fn after(&mut self, delay: Time, ev: E) {
        self.at(self.last + delay, ev);
    }

    /// Refills bucket 0 from the lowest non-empty bucket; false if the queue is empty.
    fn settle(&mut self) -> bool {
        if !self.buckets[0].is_empty() {
            return true;
        }
        let Some(i) = (1..65).find(|&i| !self.buckets[i].is_empty()) else {
            return false;
        };
        let b = std::mem::take(&mut self.buckets[i]);
        self.last = b.iter().map(|e| e.0).min().expect("non-empty");
        // Lower buckets are empty: redistributing in order keeps ties in insertion order.
        for (t, ev) in b {
            self.buckets[bucket(t, self.last)].push_back((t, ev));
        }
        true
    }

    /// The next event, advancing the clock to its time.
    pub fn pop(&mut self) -> Option<(Time, E)> {
        if !self.settle() {
            return None;
        }
        let e = self.buckets[0].pop_front().expect("settled");
        debug_assert_eq!(e.0, self.last);
        self.len -= 1;
        self.processed += 1;
        Some(e)
    }

    pub fn peek_time(&mut self) -> Option<Time> {
        if self.settle() {
            Some(self.last)
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_order_and_ties_in_insertion_order() {
        let mut q = Queue::new();
        q.at(30, "c");
        q.at(10, "a1");
        q.at(20, "b");
        q.at(10, "a2");
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, vec![(10, "a1"), (10, "a2"), (20, "b"), (30, "c")]);
        assert_eq!(q.now(), 30);
        assert_eq!(q.processed, 4);
    }

    #[test]
    fn near_and_far_events_merge_in_order() {
        let mut q = Queue::new();
        q.at(SEC, "far-a");
        q.at(5, "near");
        q.at(SEC, "far-b");
        q.at(10 * MS, "edge");
        q.at(2 * SEC, "farther");
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(got, vec!["near", "edge", "far-a", "far-b", "farther"]);
        // A far event and a near one scheduled later for the same time: insertion order.
        let mut q = Queue::new();
        q.at(SEC, 1);
        q.at(SEC - MS, 0);
        q.pop();
        q.at(SEC, 2);
        assert_eq!(q.pop(), Some((SEC, 1)));
        assert_eq!(q.pop(), Some((SEC, 2)));
    }

    #[test]
    fn after_is_relative_to_now() {
        let mut q = Queue::new();
        q.at(100, 1);
        q.pop();
        q.after(5, 2);
        assert_eq!(q.pop(), Some((105, 2)));
    }

    #[test]
    fn matches_a_sorted_reference_on_random_schedules() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(3);
        let mut q = Queue::new();
        let mut reference: Vec<(Time, u64)> = Vec::new();
        let mut popped = Vec::new();
        let mut seq = 0u64;
        for _ in 0..20_000 {
            if rng.gen::<f64>() < 0.6 || q.is_empty() {
                let t = q.now() + [0, 1, 7, 1000, 123_456][rng.gen_range(0..5)];
                q.at(t, seq);
                reference.push((t, seq));
                seq += 1;
            } else {
                popped.push(q.pop().unwrap());
            }
        }
        while let Some(e) = q.pop() {
            popped.push(e);
        }
        // Same order as sorting by (time, insertion).
        reference.sort();
        assert_eq!(popped, reference);
    }

    #[test]
    #[should_panic(expected = "in the past")]
    fn the_past_is_refused() {
        let mut q = Queue::new();
        q.at(10, ());
        q.pop();
        q.at(5, ());
    }
}
