//! The ring's bytes: header fields, slot table and payload offsets, one mapping shared
//! by writer and reader, and its checks (every bad value names its field).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

pub const MAGIC: [u8; 8] = *b"FANINSHM";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: u64 = 4096;
pub const SLOT_ENTRY: u64 = 64;
/// Largest slot (one STF): 1 GiB, as the wire's STF limit.
pub const MAX_SLOT_SIZE: u64 = 1 << 30;
/// Most slots in one ring.
pub const MAX_SLOTS: u64 = 1 << 20;

pub const FREE: u32 = 0;
pub const WRITING: u32 = 1;
pub const READY: u32 = 2;

// Header field offsets.
const SLOTS: usize = 16;
const SLOT_SIZE: usize = 24;
const WRITE_SEQ: usize = 32;
const CLOSED: usize = 40;
const READER_PID: usize = 48;

// Slot entry field offsets.
const STATE: usize = 0;
const SEQ: usize = 8;
const TF_ID: usize = 16;
const SIZE: usize = 24;
/// The reader's own fields: the run that scheduled the slot's STF (0: none yet), and
/// that STF's `seq + 1` (a mark counts only for the STF it was made for).
const SCHEDULED_RUN: usize = 32;
const SCHEDULED_SEQ: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: {field}: {what}")]
    Bad {
        path: PathBuf,
        field: &'static str,
        what: String,
    },
}

/// Where the ring NAME lives (`shm_open("/NAME")` on Linux).
pub fn ring_path(name: &str) -> PathBuf {
    Path::new("/dev/shm").join(name.trim_start_matches('/'))
}

/// Offset of the payload area for `slots` slots.
pub fn payload_offset(slots: u64) -> u64 {
    HEADER_LEN + (slots * SLOT_ENTRY).div_ceil(4096) * 4096
}

/// The file length of a ring.
pub fn ring_len(slots: u64, slot_size: u64) -> u64 {
    payload_offset(slots) + slots * slot_size
}

/// A mapped ring: typed access to its fields.
pub struct Mapping {
    map: MmapRaw,
    pub slots: u64,
    pub slot_size: u64,
    pub path: PathBuf,
    /// The reader's open ring file, locked: the lock lives as long as the mapping, so
    /// also while a payload lent from it is in use.
    reader_lock: Option<File>,
}

impl Mapping {
    pub fn map(file: &File, path: &Path) -> Result<Mapping, RingError> {
        let map = MmapRaw::map_raw(file).map_err(|err| RingError::Io {
            path: path.into(),
            err,
        })?;
        let m = Mapping {
            map,
            slots: 0,
            slot_size: 0,
            path: path.into(),
            reader_lock: None,
        };
        m.check()
    }

    /// Makes this the ring's one reader: an exclusive lock on `file` (the ring's file,
    /// open), held as long as the mapping. The kernel drops it when the process ends, so
    /// a crashed FLP's successor attaches; a live one is refused, naming its pid.
    pub fn lock_reader(&mut self, file: File) -> Result<(), RingError> {
        match file.try_lock() {
            Ok(()) => {
                self.reader_lock = Some(file);
                Ok(())
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let pid = self.reader_pid().load(Ordering::Acquire);
                let what =
                    format!("another FLP (pid {pid}) reads this ring; a ring has one reader");
                Err(self.bad("reader_pid", what))
            }
            Err(std::fs::TryLockError::Error(err)) => Err(RingError::Io {
                path: self.path.clone(),
                err,
            }),
        }
    }

    fn bad(&self, field: &'static str, what: String) -> RingError {
        RingError::Bad {
            path: self.path.clone(),
            field,
            what,
        }
    }

    /// Checks the header against the file and fills in the ring's shape.
    fn check(mut self) -> Result<Mapping, RingError> {
        let len = self.map.len() as u64;
        if len < HEADER_LEN {
            return Err(self.bad("header", format!("file is {len} bytes, under 4096")));
        }
        // The magic is the writer's last word (a release store): the rest is there once
        // it reads right.
        let magic = self.u64_at(0).load(Ordering::Acquire).to_le_bytes();
        if magic != MAGIC {
            return Err(self.bad("magic", format!("{magic:?} is not FANINSHM")));
        }
        let head = unsafe { std::slice::from_raw_parts(self.map.as_ptr(), 16) };
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(self.bad("version", format!("{version}, this FLP reads {VERSION}")));
        }
        let header_len = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
        if header_len as u64 != HEADER_LEN {
            return Err(self.bad("header_len", format!("{header_len}, not {HEADER_LEN}")));
        }
        let (slots, slot_size) = (
            self.u64_at(SLOTS).load(Ordering::Acquire),
            self.u64_at(SLOT_SIZE).load(Ordering::Acquire),
        );
        if slots == 0 || slots > MAX_SLOTS {
            return Err(self.bad("slots", format!("{slots} is not within 1..={MAX_SLOTS}")));
        }
        if slot_size == 0 || !slot_size.is_multiple_of(4096) || slot_size > MAX_SLOT_SIZE {
            let what = format!("{slot_size} is not a multiple of 4096 within 4096..=1 GiB");
            return Err(self.bad("slot_size", what));
        }
        if ring_len(slots, slot_size) > len {
            let what = format!(
                "{slots} slots of {slot_size} bytes need {} bytes, the file has {len}",
                ring_len(slots, slot_size)
            );
            return Err(self.bad("slots", what));
        }
        (self.slots, self.slot_size) = (slots, slot_size);
        Ok(self)
    }

    /// Writes a fresh header (the writer, at creation).
    pub fn init(
        file: &File,
        path: &Path,
        slots: u64,
        slot_size: u64,
    ) -> Result<Mapping, RingError> {
        let map = MmapRaw::map_raw(file).map_err(|err| RingError::Io {
            path: path.into(),
            err,
        })?;
        let head = unsafe { std::slice::from_raw_parts_mut(map.as_mut_ptr(), 16) };
        head[8..12].copy_from_slice(&VERSION.to_le_bytes());
        head[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        let m = Mapping {
            map,
            slots,
            slot_size,
            path: path.into(),
            reader_lock: None,
        };
        m.u64_at(SLOTS).store(slots, Ordering::Release);
        m.u64_at(SLOT_SIZE).store(slot_size, Ordering::Release);
        // Last, as the C and Python writers do: a reader that sees the magic sees the rest.
        m.u64_at(0)
            .store(u64::from_le_bytes(MAGIC), Ordering::Release);
        Ok(m)
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.map.len());
        // SAFETY: in bounds, 8-aligned (the mapping is page-aligned), and every access
        // to shared ring fields goes through atomics.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    fn slot_field(&self, slot: u64, off: usize) -> &AtomicU64 {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        self.u64_at(HEADER_LEN as usize + (slot * SLOT_ENTRY) as usize + off)
    }

    pub fn state(&self, slot: u64) -> &AtomicU32 {
        let a = self.slot_field(slot, STATE);
        // SAFETY: the low half of an aligned u64 field (little-endian host).
        unsafe { &*(a as *const AtomicU64 as *const AtomicU32) }
    }

    pub fn seq(&self, slot: u64) -> &AtomicU64 {
        self.slot_field(slot, SEQ)
    }
    pub fn tf_id(&self, slot: u64) -> &AtomicU64 {
        self.slot_field(slot, TF_ID)
    }
    pub fn size(&self, slot: u64) -> &AtomicU64 {
        self.slot_field(slot, SIZE)
    }
    pub fn scheduled_run(&self, slot: u64) -> &AtomicU64 {
        self.slot_field(slot, SCHEDULED_RUN)
    }
    pub fn scheduled_seq(&self, slot: u64) -> &AtomicU64 {
        self.slot_field(slot, SCHEDULED_SEQ)
    }
    pub fn write_seq(&self) -> &AtomicU64 {
        self.u64_at(WRITE_SEQ)
    }
    pub fn closed(&self) -> &AtomicU64 {
        self.u64_at(CLOSED)
    }
    pub fn reader_pid(&self) -> &AtomicU64 {
        self.u64_at(READER_PID)
    }

    /// The payload area of a slot.
    pub fn payload_ptr(&self, slot: u64) -> *mut u8 {
        assert!(slot < self.slots);
        let off = payload_offset(self.slots) + slot * self.slot_size;
        // SAFETY: `check`/`init` made sure the file holds every slot.
        unsafe { self.map.as_mut_ptr().add(off as usize) }
    }
}

#[cfg(target_endian = "big")]
compile_error!("the ring layout is little-endian; this reader assumes a little-endian host");
