//! A record whose STF claims a payload far larger than the stream: the reader ends with
//! "truncated" having reserved a bounded piece, not the claimed length (a strict
//! overcommit policy would otherwise abort the process). Its own test binary: the
//! allocator below watches every allocation of the process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use fanin_proto::tf_record::{
    RecordError, RecordReader, StfRecordHeader, TfHeader, RESERVE_AT_MOST,
};

/// The largest single allocation asked for.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

struct Watch;

// SAFETY: every call goes to the system allocator unchanged; only sizes are noted.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Watch = Watch;

#[test]
fn a_forged_payload_length_reserves_a_bounded_piece_and_reads_as_truncated() {
    let tf = TfHeader {
        run_id: 1,
        tf_id: 7,
        stfs: 1,
    };
    let stf = StfRecordHeader {
        flp_id: 0,
        crc: 0,
        len: (1 << 30) - 1,
    };
    let mut bytes = tf.encode().to_vec();
    bytes.extend_from_slice(&stf.encode());
    bytes.extend_from_slice(&[7u8; 1000]);
    LARGEST.store(0, Ordering::Relaxed);
    let got = RecordReader::new(bytes.as_slice(), 1 << 30).next_record();
    assert!(
        matches!(got, Err(RecordError::Truncated { index: 0, .. })),
        "{got:?}"
    );
    let largest = LARGEST.load(Ordering::Relaxed) as u64;
    assert!(
        largest <= RESERVE_AT_MOST,
        "reserved {largest} bytes for a payload the stream does not hold"
    );
}
