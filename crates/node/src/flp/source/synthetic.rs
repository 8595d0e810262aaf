//! The synthetic source under on-data scheduling: the detector's clock on the FLP, TF
//! `n` at `n / rate` after RunStart (or as fast as the buffer allows), run's size model.

use std::time::Duration;

use fanin_proto::{Prepare, StfInfo};
use fanin_sched::{DetectorClock, StfSize};
use tokio::time::Instant;

use super::{Event, Payload, Produced};

pub struct Synthetic {
    me: u32,
    size: StfSize,
    seed: u64,
    t0: Instant,
    clock: DetectorClock,
    next: u64,
}

impl Synthetic {
    pub fn new(me: u32, prep: &Prepare, size: StfSize, rate_hz: Option<f64>) -> Synthetic {
        Synthetic {
            me,
            size,
            seed: prep.seed,
            t0: Instant::now(),
            clock: DetectorClock {
                rate_hz,
                total: prep.tfs,
            },
            next: 0,
        }
    }

    /// The detector clock started `elapsed` ago: TFs due before now are not made (a
    /// restarted FLP's STFs of them are gone with its process).
    pub fn start(&mut self, elapsed: Duration) {
        self.t0 = Instant::now()
            .checked_sub(elapsed)
            .unwrap_or_else(Instant::now);
        if let Some(first) = self.clock.first_at(elapsed.as_secs_f64()) {
            self.next = first;
        }
    }

    pub async fn next(&mut self, room: u64) -> Event {
        if self.clock.ended(self.next) {
            return Event::Ended(format!("made all {} TFs", self.clock.total));
        }
        if self.clock.rate_hz.is_some() {
            let at = Duration::from_secs_f64(self.clock.due_s(self.next));
            tokio::time::sleep_until(self.t0 + at).await;
        }
        let tf = self.next;
        let size = self.size.sample(self.seed, self.me, tf);
        if size > room || room == 0 {
            return Event::Held(size);
        }
        self.next += 1;
        Event::Stf(Produced {
            info: StfInfo { tf_id: tf, size },
            payload: Payload::Synthetic,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanin_proto::{Schedule, SizeWire};

    fn prep() -> Prepare {
        Prepare {
            run_id: 1,
            flps: 1,
            build_timeout_ms: 1000,
            crc: false,
            size: SizeWire {
                kind: 1,
                a: 10,
                b: 0,
                c: 0,
            },
            seed: 1,
            retain: true,
            schedule: Schedule::OnData,
            rate_mhz: 1_000_000,
            tfs: 100,
            pull: false,
        }
    }

    fn tf(e: Event) -> u64 {
        match e {
            Event::Stf(p) => p.info.tf_id,
            _ => panic!("expected an STF"),
        }
    }

    #[tokio::test]
    async fn a_source_joining_mid_run_starts_at_the_tf_due_now_and_ends_at_the_count() {
        let mut s = Synthetic::new(0, &prep(), StfSize::Fixed(10), Some(1000.0));
        s.start(Duration::from_millis(98));
        assert_eq!(tf(s.next(1 << 20).await), 98);
        assert!(matches!(s.next(5).await, Event::Held(10)), "no room: held");
        assert_eq!(tf(s.next(1 << 20).await), 99);
        assert!(matches!(s.next(1 << 20).await, Event::Ended(_)));
    }
}
