//! How many TFs an unthrottled run keeps in flight: never more than the buffers hold,
//! and fewer while TFs take long to build, so back-pressure replaces losses.
//!
//! Additive increase, multiplicative decrease on TF latency (as TCP does on delay): a
//! TF built within a quarter of the build time-out opens the window by one; one that
//! took more than half of it, or did not complete, halves it (at most once per
//! latency, so one slow burst halves it once).

use crate::config::Checked;

#[derive(Debug, Clone)]
pub struct Window {
    size: u64,
    /// The buffers' bound (and `max_inflight`).
    max: u64,
    build_timeout_us: u64,
    /// When the window last shrank (µs since the run's start).
    shrunk_at_us: Option<u64>,
}

/// The window at the start: small, so the first TFs show how fast building is.
const START: u64 = 16;

impl Window {
    pub fn new(run: &Checked) -> Window {
        let max = run.unthrottled_inflight();
        Window {
            size: START.min(max),
            max,
            build_timeout_us: run.cfg.build_timeout_ms * 1000,
            shrunk_at_us: None,
        }
    }

    /// TFs allowed in flight now.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// A TF ended at `now_us` after `latency_us` (complete or not).
    pub fn ended(&mut self, complete: bool, latency_us: u64, now_us: u64) {
        let slow = !complete || latency_us > self.build_timeout_us / 2;
        if slow {
            let recent = self
                .shrunk_at_us
                .is_some_and(|t| now_us.saturating_sub(t) < latency_us);
            if !recent {
                self.size = (self.size / 2).max(1);
                self.shrunk_at_us = Some(now_us);
            }
        } else if latency_us <= self.build_timeout_us / 4 {
            self.size = (self.size + 1).min(self.max);
        }
        debug_assert!((1..=self.max.max(1)).contains(&self.size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;

    fn window() -> Window {
        let cfg = RunConfig {
            rate_hz: 0.0,
            ..RunConfig::default()
        };
        Window::new(&cfg.check().unwrap())
    }

    #[test]
    fn fast_tfs_open_the_window_up_to_the_buffers() {
        let mut w = window();
        assert_eq!(w.size(), START);
        for t in 0..10_000 {
            w.ended(true, 1_000, t);
        }
        assert_eq!(
            w.size(),
            115,
            "the buffers' bound (one EPN's half of 256 MiB / 1 MiB, a tenth free)"
        );
    }

    #[test]
    fn slow_tfs_halve_it_once_per_latency() {
        let mut w = window();
        for t in 0..100 {
            w.ended(true, 1_000, t);
        }
        let open = w.size();
        w.ended(true, 600_000, 1_000_000);
        assert_eq!(w.size(), open / 2);
        w.ended(false, 600_000, 1_100_000);
        assert_eq!(w.size(), open / 2, "the same slow burst");
        w.ended(false, 600_000, 1_700_000);
        assert_eq!(w.size(), open / 4);
    }
}
