//! The read-out's side of the ring: creates it, writes each STF into the next slot once
//! the FLP freed it (waiting, or answering "full": the caller chooses), closes it.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::layout::{
    ring_len, ring_path, Mapping, RingError, FREE, MAX_SLOTS, MAX_SLOT_SIZE, READY, WRITING,
};

/// How often a waiting writer looks at its slot again.
const POLL: Duration = Duration::from_micros(50);

pub struct Writer {
    ring: Mapping,
    seq: u64,
    last_tf: Option<u64>,
}

impl Writer {
    /// Creates the ring NAME with `slots` slots of `slot_size` bytes (a multiple of
    /// 4096). Fails if it exists: a ring has one writer.
    pub fn create(name: &str, slots: u64, slot_size: u64) -> Result<Writer, RingError> {
        let path = ring_path(name);
        let bad = |field, what: String| RingError::Bad {
            path: path.clone(),
            field,
            what,
        };
        if slots == 0 || slots > MAX_SLOTS {
            return Err(bad(
                "slots",
                format!("{slots} is not within 1..={MAX_SLOTS}"),
            ));
        }
        if slot_size == 0 || !slot_size.is_multiple_of(4096) || slot_size > MAX_SLOT_SIZE {
            return Err(bad(
                "slot_size",
                format!("{slot_size} is not a multiple of 4096 within 4096..=1 GiB"),
            ));
        }
        let io = |err| RingError::Io {
            path: path.clone(),
            err,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        // Reserved now: a /dev/shm too small fails here, not as a SIGBUS at a write.
        let len = ring_len(slots, slot_size);
        let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if err != 0 {
            let _ = std::fs::remove_file(&path);
            return Err(io(std::io::Error::from_raw_os_error(err)));
        }
        let ring = Mapping::init(&file, &path, slots, slot_size)?;
        Ok(Writer {
            ring,
            seq: 0,
            last_tf: None,
        })
    }

    pub fn path(&self) -> &PathBuf {
        &self.ring.path
    }

    /// Largest STF one slot holds.
    pub fn slot_size(&self) -> u64 {
        self.ring.slot_size
    }

    /// Writes one STF. `wait`: wait until the FLP frees the slot (false: answer
    /// `Ok(false)` at once when it is not free). TF ids must grow.
    pub fn write(&mut self, tf_id: u64, data: &[u8], wait: bool) -> Result<bool, RingError> {
        let len = data.len() as u64;
        self.write_with(tf_id, len, wait, |slot| slot.copy_from_slice(data))
    }

    /// Writes one STF of `len` bytes in place: `fill` gets the slot's first `len` bytes
    /// (what a DMA engine would have written there; they hold what the slot held before).
    pub fn write_with(
        &mut self,
        tf_id: u64,
        len: u64,
        wait: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, RingError> {
        let bad = |field, what: String| RingError::Bad {
            path: self.ring.path.clone(),
            field,
            what,
        };
        if len > self.ring.slot_size {
            let what = format!("{len} bytes is over the slot size {}", self.ring.slot_size);
            return Err(bad("size", what));
        }
        if self.last_tf.is_some_and(|t| tf_id <= t) {
            return Err(bad(
                "tf_id",
                format!("{tf_id} does not grow (last {})", self.last_tf.unwrap_or(0)),
            ));
        }
        let slot = self.seq % self.ring.slots;
        while self.ring.state(slot).load(Ordering::Acquire) != FREE {
            if !wait {
                return Ok(false);
            }
            std::thread::sleep(POLL);
        }
        let r = &self.ring;
        r.state(slot).store(WRITING, Ordering::Relaxed);
        // SAFETY: the slot is WRITING, so no reader looks at its payload, and it holds
        // slot_size >= len bytes.
        fill(unsafe { std::slice::from_raw_parts_mut(r.payload_ptr(slot), len as usize) });
        r.seq(slot).store(self.seq, Ordering::Relaxed);
        r.tf_id(slot).store(tf_id, Ordering::Relaxed);
        r.size(slot).store(len, Ordering::Relaxed);
        r.state(slot).store(READY, Ordering::Release);
        self.seq += 1;
        r.write_seq().store(self.seq, Ordering::Release);
        self.last_tf = Some(tf_id);
        Ok(true)
    }

    /// No STF follows: the FLP reports its source ended once it took the rest.
    pub fn close(&self) {
        self.ring.closed().store(1, Ordering::Release);
    }

    /// Waits until the FLP freed every slot (true), or `timeout` passed (false).
    pub fn wait_empty(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            if (0..self.ring.slots).all(|s| self.ring.state(s).load(Ordering::Acquire) == FREE) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Removes the ring's name (mappings stay valid until unmapped).
    pub fn unlink(&self) -> Result<(), RingError> {
        std::fs::remove_file(&self.ring.path).map_err(|err| RingError::Io {
            path: self.ring.path.clone(),
            err,
        })
    }
}
