//! The FLP's side of the ring: attaches (taking over what a crashed FLP left READY),
//! hands out READY slots in write order, lends their payload in place, frees them.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::layout::{ring_path, Mapping, RingError, FREE, READY, WRITING};

/// One STF in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub index: u64,
    pub seq: u64,
    pub tf_id: u64,
    pub size: u64,
    /// The run that scheduled this STF, as a reader marked it (0: none, or a mark left
    /// for an earlier STF of the slot).
    pub scheduled_run: u64,
}

pub struct Reader {
    ring: Arc<Mapping>,
    /// READY slots found at attach, oldest first (announced again after a crash).
    backlog: VecDeque<Slot>,
    next_seq: u64,
}

impl Reader {
    /// Attaches to the ring NAME a read-out created, as its only reader (refused while
    /// another process reads it: two readers would free each other's slots).
    pub fn attach(name: &str) -> Result<Reader, RingError> {
        let path = ring_path(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|err| RingError::Io {
                path: path.clone(),
                err,
            })?;
        let mut ring = Mapping::map(&file, &path)?;
        ring.lock_reader(file)?;
        let ring = Arc::new(ring);
        ring.reader_pid()
            .store(std::process::id() as u64, Ordering::Release);
        // What was written before this moment is READY or freed; what the writer adds
        // while the slots are scanned comes from `next_seq` on, in order. (Taking the
        // highest READY seq instead could skip one written during the scan.)
        let next_seq = ring.write_seq().load(Ordering::Acquire);
        let mut backlog: Vec<Slot> = (0..ring.slots)
            .filter(|&i| ring.state(i).load(Ordering::Acquire) == READY)
            .map(|i| slot(&ring, i))
            .filter(|s| s.seq < next_seq)
            .collect();
        backlog.sort_by_key(|s| s.seq);
        let r = Reader {
            ring,
            backlog: backlog.into(),
            next_seq,
        };
        r.backlog.iter().try_for_each(|s| r.check(s))?;
        Ok(r)
    }

    fn check(&self, s: &Slot) -> Result<(), RingError> {
        if s.size > self.ring.slot_size {
            return Err(RingError::Bad {
                path: self.ring.path.clone(),
                field: "size",
                what: format!(
                    "slot {}: {} is over the slot size {}",
                    s.index, s.size, self.ring.slot_size
                ),
            });
        }
        Ok(())
    }

    /// The next STF, if the writer made one (None: not yet).
    pub fn poll(&mut self) -> Result<Option<Slot>, RingError> {
        if let Some(s) = self.backlog.pop_front() {
            return Ok(Some(s));
        }
        let i = self.next_seq % self.ring.slots;
        if self.ring.state(i).load(Ordering::Acquire) != READY {
            return Ok(None);
        }
        let s = slot(&self.ring, i);
        if s.seq != self.next_seq {
            return Ok(None); // an older STF not freed yet: the writer waits for it
        }
        self.check(&s)?;
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(Some(s))
    }

    /// The writer is inside the next STF (its slot WRITING): if that lasts, the read-out
    /// stopped or died in the middle of it.
    pub fn inside_next(&self) -> Option<(u64, u64)> {
        let i = self.next_seq % self.ring.slots;
        let writing = self.ring.state(i).load(Ordering::Acquire) == WRITING;
        (self.backlog.is_empty() && writing).then_some((i, self.next_seq))
    }

    /// The writer closed the ring and every STF it wrote was handed out.
    pub fn ended(&self) -> bool {
        self.backlog.is_empty()
            && self.ring.closed().load(Ordering::Acquire) == 1
            && self.ring.write_seq().load(Ordering::Acquire) <= self.next_seq
    }

    /// The payload of a slot handed out and not freed, in place.
    pub fn payload(&self, s: &Slot) -> Payload {
        Payload {
            ring: self.ring.clone(),
            index: s.index,
            len: s.size as usize,
        }
    }

    /// Gives a slot back to the writer: false (and the slot untouched) when it no longer
    /// holds that STF, which only a second reader could have done.
    pub fn free(&self, s: &Slot) -> bool {
        if self.ring.seq(s.index).load(Ordering::Acquire) != s.seq {
            return false;
        }
        let state = self.ring.state(s.index);
        let freed = state
            .compare_exchange(READY, FREE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if freed {
            // The mark is the reader's (a writer never touches it) and names the STF's
            // seq: cleared after the slot went back, it can only be this STF's.
            self.ring.scheduled_seq(s.index).store(0, Ordering::Release);
            self.ring.scheduled_run(s.index).store(0, Ordering::Release);
        }
        freed
    }

    /// Marks the slot's STF scheduled by `run`, so that a reader attaching for another
    /// run (its FLP killed before the Release came) knows that run is over. The mark
    /// names the STF's `seq` too, written last: a mark half made, or left by a reader
    /// that did not clear it, never counts for another STF. Run 0 marks nothing.
    pub fn mark_scheduled(&self, s: &Slot, run: u64) {
        let Some(mark) = s.seq.checked_add(1) else {
            return;
        };
        if run != 0 && self.ring.seq(s.index).load(Ordering::Acquire) == s.seq {
            self.ring
                .scheduled_run(s.index)
                .store(run, Ordering::Release);
            self.ring
                .scheduled_seq(s.index)
                .store(mark, Ordering::Release);
        }
    }

    /// Attached for `run`: frees every STF found at attach that another run scheduled
    /// (that run ended while no FLP held the ring: its TFs were counted in it and must not
    /// be built again). Those this run or none scheduled stay. How many were freed.
    pub fn free_earlier_runs(&mut self, run: u64) -> u64 {
        let over = |s: &Slot| s.scheduled_run != 0 && s.scheduled_run != run;
        let (gone, kept): (Vec<Slot>, Vec<Slot>) = self.backlog.drain(..).partition(over);
        self.backlog = kept.into();
        gone.iter().filter(|s| self.free(s)).count() as u64
    }

    pub fn slot_size(&self) -> u64 {
        self.ring.slot_size
    }
}

/// A READY slot's payload, lent in place (the mapping lives as long as any lender).
#[derive(Clone)]
pub struct Payload {
    ring: Arc<Mapping>,
    index: u64,
    len: usize,
}

impl Payload {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot is READY until the reader frees it, so the writer does not
        // touch it; callers free a slot only when no lender is in use (the FLP core
        // frees after its sends finished).
        unsafe { std::slice::from_raw_parts(self.ring.payload_ptr(self.index), self.len) }
    }
}

fn slot(ring: &Mapping, i: u64) -> Slot {
    let seq = ring.seq(i).load(Ordering::Acquire);
    Slot {
        index: i,
        seq,
        tf_id: ring.tf_id(i).load(Ordering::Acquire),
        size: ring.size(i).load(Ordering::Acquire),
        scheduled_run: match Some(ring.scheduled_seq(i).load(Ordering::Acquire))
            == seq.checked_add(1)
        {
            true => ring.scheduled_run(i).load(Ordering::Acquire),
            false => 0,
        },
    }
}
