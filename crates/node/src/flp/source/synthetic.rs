//! The synthetic source under on-data scheduling: the detector's clock on the FLP, TF
//! `n` at `n / rate` after RunStart (or as fast as the buffer allows), run's size model.

use std::time::Duration;

use fanin_proto::{Prepare, StfInfo};
use fanin_sched::StfSize;
use tokio::time::Instant;

use super::{Event, Payload, Produced};

pub struct Synthetic {
    me: u32,
    size: StfSize,
    seed: u64,
    t0: Instant,
    rate_hz: Option<f64>,
    /// TFs to make (0: until the run stops).
    total: u64,
    next: u64,
}

impl Synthetic {
    pub fn new(me: u32, prep: &Prepare, size: StfSize, rate_hz: Option<f64>) -> Synthetic {
        Synthetic {
            me,
            size,
            seed: prep.seed,
            t0: Instant::now(),
            rate_hz,
            total: prep.tfs,
            next: 0,
        }
    }

    /// The detector clock starts (RunStart).
    pub fn start(&mut self) {
        self.t0 = Instant::now();
    }

    pub async fn next(&mut self, room: u64) -> Event {
        if self.total > 0 && self.next >= self.total {
            return Event::Ended(format!("made all {} TFs", self.total));
        }
        if let Some(r) = self.rate_hz {
            let at = Duration::from_secs_f64(self.next as f64 / r);
            tokio::time::sleep_until(self.t0 + at).await;
        }
        let tf = self.next;
        let size = self.size.sample(self.seed, self.me, tf);
        if size > room {
            return Event::Held(size);
        }
        self.next += 1;
        Event::Stf(Produced {
            info: StfInfo { tf_id: tf, size },
            payload: Payload::Synthetic,
        })
    }
}
