//! The EPN's build clock: time since its start without the time it had no ICN (build
//! time-outs wait for a take-over). Pure: `fanin epn` and the nodes model feed it time.

/// Times are nanoseconds since the clock's own start; readings are microseconds.
#[derive(Debug, Default, Clone, Copy)]
pub struct BuildClock {
    stopped_at: Option<u64>,
    stopped: u64,
}

impl BuildClock {
    /// The ICN is away (`away`) or back, at `now_ns`. Stopping twice keeps the first stop.
    pub fn stop(&mut self, away: bool, now_ns: u64) {
        match (away, self.stopped_at) {
            (true, None) => self.stopped_at = Some(now_ns),
            (false, Some(t)) => {
                self.stopped += now_ns.saturating_sub(t);
                self.stopped_at = None;
            }
            _ => {}
        }
    }

    /// Microseconds on the clock at `now_ns` (standing still while stopped).
    pub fn now_us(&self, now_ns: u64) -> u64 {
        let now = self.stopped_at.unwrap_or(now_ns);
        now.saturating_sub(self.stopped) / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::BuildClock;

    #[test]
    fn it_stands_while_the_icn_is_away() {
        let mut c = BuildClock::default();
        assert_eq!(c.now_us(5_000), 5);
        c.stop(true, 10_000);
        c.stop(true, 12_000); // the first stop counts
        assert_eq!(c.now_us(50_000), 10);
        c.stop(false, 60_000);
        assert_eq!(c.now_us(70_000), 20);
    }
}
