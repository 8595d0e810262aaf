//! The nodes model's on-data source: the synthetic source of `fanin flp` (the detector's
//! clock on the FLP, `fanin_sched::DetectorClock`, shared with it; the run's size model),
//! made of events. It waits while the FLP's send buffer has no room, never drops.

use fanin_node::flp::core::Input;
use fanin_node::icn::core::ConnId;
use fanin_proto::{Prepare, StfInfo};
use fanin_sched::{DetectorClock, StfSize};

use super::net::End;
use super::world::{Ev, World};
use crate::engine::{Time, SEC};

pub struct SimSource {
    size: StfSize,
    seed: u64,
    clock: DetectorClock,
    /// When TF 0 was due (set at RunStart).
    t0: Option<Time>,
    next: u64,
    /// A Produce event is queued.
    queued: bool,
    /// Waiting for room in the send buffer.
    pub held: bool,
    /// Its run is kept while the ICN is away: it reads on at the new ICN's RunStart.
    pub paused: bool,
    /// How it ended (told again to an ICN that takes the run over).
    end: Option<(bool, String)>,
}

impl SimSource {
    pub fn new(prep: &Prepare, size: StfSize) -> SimSource {
        SimSource {
            size,
            seed: prep.seed,
            clock: DetectorClock {
                rate_hz: (prep.rate_mhz > 0).then(|| prep.rate_mhz as f64 / 1000.0),
                total: prep.tfs,
            },
            t0: None,
            next: 0,
            queued: false,
            held: false,
            paused: false,
            end: None,
        }
    }

    fn due(&self, tf: u64) -> Time {
        let t0 = self.t0.expect("started");
        t0 + (self.clock.due_s(tf) * SEC as f64).ceil() as Time
    }
}

impl World {
    fn source(&mut self, i: u32) -> Option<&mut SimSource> {
        self.flp_run(i)?.source.as_mut()
    }

    /// RunStart: the detector's clock started `elapsed_us` ago (an FLP joining mid-run
    /// starts at the TF due now: the earlier ones are gone with the process before it).
    /// In a run taken over it runs already: it goes on, and an end is told again.
    pub fn source_start(&mut self, i: u32, conn: ConnId, elapsed_us: u64) {
        let now = self.q.now();
        let Some(s) = self.source(i) else { return };
        if s.t0.is_some() {
            s.paused = false;
            if let Some((ok, detail)) = s.end.clone() {
                return self.flp_feed(i, conn, Input::SourceEnded { ok, detail });
            }
            return self.source_wake(i, conn, now);
        }
        let elapsed = elapsed_us * 1000;
        s.t0 = Some(now.saturating_sub(elapsed));
        if let Some(first) = s.clock.first_at(elapsed as f64 / SEC as f64) {
            s.next = first;
        }
        self.source_wake(i, conn, now);
    }

    fn source_wake(&mut self, i: u32, conn: ConnId, at: Time) {
        let Some(s) = self.source(i) else { return };
        if !s.queued && s.end.is_none() {
            s.queued = true;
            self.q.at(at, Ev::Produce { conn });
        }
    }

    /// The source's next STF, if it is due and fits; else when it is due, or held.
    pub fn produce(&mut self, conn: ConnId) {
        let Some(End::Flp(i)) = self.holder(conn) else {
            return;
        };
        let now = self.q.now();
        let Some(run) = self.flp_run(i) else { return };
        let stopping = run.stopping;
        let Some(s) = run.source.as_mut() else { return };
        s.queued = false;
        if stopping || s.end.is_some() || s.held || s.paused {
            return;
        }
        if s.clock.ended(s.next) {
            let detail = format!("made all {} TFs", s.clock.total);
            s.end = Some((true, detail.clone()));
            return self.flp_feed(i, conn, Input::SourceEnded { ok: true, detail });
        }
        let (tf, due) = (s.next, s.due(s.next));
        if due > now {
            return self.source_wake(i, conn, due);
        }
        let size = s.size.sample(s.seed, i, tf);
        if size > run.core.limit() {
            // As `fanin flp`'s source: an STF no send buffer can take fails the source.
            let limit = run.core.limit();
            let detail = format!(
                "FLP {i}: source: an STF of {size} bytes is over --send-buffer {limit}: it can never be sent"
            );
            run.source.as_mut().expect("a source").end = Some((false, detail.clone()));
            return self.flp_feed(i, conn, Input::SourceEnded { ok: false, detail });
        }
        if !run.core.has_room(size) {
            run.source.as_mut().expect("a source").held = true;
            return;
        }
        run.source.as_mut().expect("a source").next += 1;
        self.flp_feed(i, conn, Input::Produced(StfInfo { tf_id: tf, size }));
        self.flp_feed(i, conn, Input::Flush);
        self.source_wake(i, conn, now);
    }

    /// After the FLP's core took an input: a held source tries again (room may be free).
    pub fn source_unhold(&mut self, i: u32, conn: ConnId) {
        let now = self.q.now();
        let Some(s) = self.source(i) else { return };
        if s.held {
            s.held = false;
            self.source_wake(i, conn, now);
        }
    }
}
