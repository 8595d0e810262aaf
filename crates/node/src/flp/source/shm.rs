//! The `shm:NAME` source: STFs a read-out wrote into the shared-memory ring, sent in
//! place; a slot goes back to the writer when the ICN released its TF.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use fanin_proto::StfInfo;
use fanin_sched::TfId;
use fanin_shm::{Reader, Slot};

use super::{Event, Payload, Produced, SourceError, STALL_LIMIT};

/// How often an empty ring is looked at again (announcements batch what came meanwhile).
const POLL: Duration = Duration::from_millis(1);

pub struct Shm {
    reader: Reader,
    /// The next slot, taken from the ring but not yet produced (it did not fit).
    pending: Option<Slot>,
    /// Slots produced and not freed, by TF.
    slots: HashMap<TfId, Slot>,
    last_tf: Option<TfId>,
    what: String,
    /// The run this FLP serves (marked in the slots it schedules).
    run_id: u64,
    /// STFs an earlier run scheduled, found and freed at attach (the FLP counts them).
    pub freed_at_attach: u64,
    /// Since when the writer has been inside the next STF (its slot WRITING).
    inside_since: Option<(u64, Instant)>,
}

impl Shm {
    /// Attaches for run `run_id`. STFs left in the ring that another run scheduled (its
    /// FLP died before that run released them, and the run is over) are freed: their TFs
    /// ended in that run and must not be built again.
    pub fn attach(name: &str, what: String, run_id: u64) -> anyhow::Result<Shm> {
        let mut reader = Reader::attach(name).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let freed_at_attach = reader.free_earlier_runs(run_id);
        Ok(Shm {
            reader,
            pending: None,
            slots: HashMap::new(),
            last_tf: None,
            what,
            run_id,
            freed_at_attach,
            inside_since: None,
        })
    }

    pub fn scheduled(&mut self, tf: TfId) {
        if let Some(s) = self.slots.get(&tf) {
            self.reader.mark_scheduled(s, self.run_id);
        }
    }

    pub async fn next(&mut self, room: u64) -> Result<Event, SourceError> {
        let s = loop {
            if let Some(s) = self.pending {
                break s;
            }
            match self.reader.poll() {
                // Another run scheduled it (that FLP died before its Release): counted
                // in that run, it must not be built again.
                Ok(Some(s)) if s.scheduled_run != 0 && s.scheduled_run != self.run_id => {
                    let (what, tf, run) = (&self.what, s.tf_id, s.scheduled_run);
                    if self.reader.free(&s) {
                        tracing::warn!("{what}: TF {tf}'s STF was scheduled by run {run}, which is over: freed (run_over), not announced");
                    }
                }
                Ok(Some(s)) => self.pending = Some(self.check(s)?),
                Ok(None) if self.reader.ended() => {
                    return Ok(Event::Ended("the read-out closed the ring".into()))
                }
                Ok(None) => {
                    self.stalled_inside()?;
                    tokio::time::sleep(POLL).await
                }
                Err(e) => return Err(SourceError(format!("{}: {e}", self.what))),
            }
        };
        if s.size > room || room == 0 {
            return Ok(Event::Held(s.size));
        }
        self.pending = None;
        self.last_tf = Some(s.tf_id);
        self.slots.insert(s.tf_id, s);
        Ok(Event::Stf(Produced {
            info: StfInfo {
                tf_id: s.tf_id,
                size: s.size,
            },
            payload: Payload::Shared(self.reader.payload(&s)),
        }))
    }

    /// A writer inside the same STF for `STALL_LIMIT` stopped or died there: an error
    /// (an empty ring is only a quiet read-out).
    fn stalled_inside(&mut self) -> Result<(), SourceError> {
        let Some((i, seq)) = self.reader.inside_next() else {
            self.inside_since = None;
            return Ok(());
        };
        let since = match self.inside_since {
            Some((s, at)) if s == seq => at,
            _ => self.inside_since.insert((seq, Instant::now())).1,
        };
        if since.elapsed() < STALL_LIMIT {
            return Ok(());
        }
        Err(SourceError(format!(
            "{}: slot {i}: state: the read-out has been writing STF {seq} for {STALL_LIMIT:?} (stopped or died inside it)",
            self.what
        )))
    }

    fn check(&self, s: Slot) -> Result<Slot, SourceError> {
        match self.last_tf {
            Some(last) if s.tf_id <= last => Err(SourceError(format!(
                "{}: slot {}: tf_id {} does not grow (last {last})",
                self.what, s.index, s.tf_id
            ))),
            _ => Ok(s),
        }
    }

    pub fn free(&mut self, tf: TfId) {
        if let Some(s) = self.slots.remove(&tf) {
            if !self.reader.free(&s) {
                let (what, i) = (&self.what, s.index);
                tracing::error!("{what}: slot {i} no longer holds TF {tf}: left as it is");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read-out that died inside an STF leaves its slot WRITING: after `STALL_LIMIT`
    /// the source fails, naming the slot, instead of waiting for ever.
    #[tokio::test(start_paused = true)]
    async fn a_read_out_that_died_inside_an_stf_is_a_stall() {
        let name = format!("fanin-test-stall-{}", std::process::id());
        let mut w = fanin_shm::Writer::create(&name, 2, 4096).unwrap();
        let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.write_with(1, 10, false, |_| panic!("the read-out dies inside TF 1"))
        }));
        assert!(died.is_err());
        let mut s = Shm::attach(&name, "FLP 0: source shm".into(), 1).unwrap();
        let t0 = Instant::now();
        let e = s.next(1 << 20).await.err().expect("a stall");
        assert!(
            e.0.contains("slot 0: state") && e.0.contains("STF 0"),
            "{}",
            e.0
        );
        assert!(t0.elapsed() >= STALL_LIMIT);
        w.unlink().unwrap();
    }
}
