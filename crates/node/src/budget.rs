//! Byte budgets: the configured limit of a buffer (FLP send buffer, EPN build buffer).
//! Reservations either fit under the limit or fail; the caller then applies its named policy.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct ByteBudget {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

impl ByteBudget {
    pub fn new(limit: u64) -> Self {
        ByteBudget {
            limit,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// Reserves `n` bytes if they fit under the limit.
    pub fn try_reserve(&self, n: u64) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&v| v <= self.limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn release(&self, n: u64) {
        let prev = self.used.fetch_sub(n, Ordering::AcqRel);
        assert!(
            prev >= n,
            "byte budget released {n} bytes but only {prev} were reserved"
        );
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// A new limit for a budget this owner alone holds. What is reserved stays reserved:
    /// above the new limit, nothing more fits until enough is released.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_respect_the_limit() {
        let b = ByteBudget::new(100);
        assert!(b.try_reserve(60));
        assert!(!b.try_reserve(41));
        assert!(b.try_reserve(40));
        assert_eq!(b.used(), 100);
        b.release(60);
        assert!(b.try_reserve(10));
        assert_eq!(b.peak(), 100);
        assert!(!b.try_reserve(u64::MAX));
    }

    #[test]
    fn a_lower_limit_keeps_what_is_reserved_and_admits_nothing_above_it() {
        let mut b = ByteBudget::new(100);
        assert!(b.try_reserve(80));
        b.set_limit(50);
        assert!(!b.try_reserve(1), "80 reserved, 50 allowed");
        b.release(40);
        assert!(b.try_reserve(10));
        assert!(!b.try_reserve(1));
        assert_eq!((b.used(), b.limit()), (50, 50));
    }

    #[test]
    #[should_panic(expected = "released")]
    fn over_release_is_a_bug() {
        ByteBudget::new(10).release(1);
    }
}
