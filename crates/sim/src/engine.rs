//! The discrete-event core: a time-ordered queue of events. Ties break by insertion
//! order, so a run is a pure function of its inputs and seed (byte-for-byte output).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Simulated time in nanoseconds.
pub type Time = u64;

pub const NS: Time = 1;
pub const US: Time = 1_000;
pub const MS: Time = 1_000_000;
pub const SEC: Time = 1_000_000_000;

struct Entry<E> {
    at: Time,
    seq: u64,
    ev: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed: the heap pops the earliest (time, sequence) first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

pub struct Queue<E> {
    heap: BinaryHeap<Entry<E>>,
    now: Time,
    seq: u64,
    /// Events popped so far.
    pub processed: u64,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> Queue<E> {
    pub fn new() -> Self {
        Queue {
            heap: BinaryHeap::with_capacity(1 << 16),
            now: 0,
            seq: 0,
            processed: 0,
        }
    }

    pub fn now(&self) -> Time {
        self.now
    }

    /// Schedules `ev` at absolute time `at` (never in the past).
    pub fn at(&mut self, at: Time, ev: E) {
        assert!(
            at >= self.now,
            "event scheduled in the past: {at} < {}",
            self.now
        );
        self.seq += 1;
        self.heap.push(Entry {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// Schedules `ev` after `delay`.
    pub fn after(&mut self, delay: Time, ev: E) {
        self.at(self.now + delay, ev);
    }

    /// The next event, advancing the clock to its time.
    pub fn pop(&mut self) -> Option<(Time, E)> {
        let e = self.heap.pop()?;
        debug_assert!(e.at >= self.now);
        self.now = e.at;
        self.processed += 1;
        Some((e.at, e.ev))
    }

    pub fn peek_time(&self) -> Option<Time> {
        self.heap.peek().map(|e| e.at)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
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
    fn after_is_relative_to_now() {
        let mut q = Queue::new();
        q.at(100, 1);
        q.pop();
        q.after(5, 2);
        assert_eq!(q.pop(), Some((105, 2)));
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
