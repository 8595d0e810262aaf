//! The ring between a writer and a reader in one process: order, wrap-around, waiting,
//! a reader that crashed and attaches again, and bad rings named by field.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{Reader, RingError, Slot, Writer};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A ring name no other test uses.
fn name() -> String {
    format!(
        "fanin-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn data(tf: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (tf as usize * 31 + i * 7) as u8).collect()
}

#[test]
fn stfs_arrive_in_order_across_wrap_around_and_free_slots_are_reused() {
    let n = name();
    let mut w = Writer::create(&n, 3, 4096).unwrap();
    let mut r = Reader::attach(&n).unwrap();
    for round in 0..4u64 {
        for k in 0..3 {
            let tf = round * 3 + k;
            assert!(w.write(tf, &data(tf, 100 + tf as usize), false).unwrap());
        }
        assert!(
            !w.write(round * 3 + 3, b"x", false).unwrap(),
            "full: the writer is told"
        );
        for k in 0..3 {
            let s = r.poll().unwrap().expect("ready");
            assert_eq!(s.tf_id, round * 3 + k);
            assert_eq!(
                r.payload(&s).as_slice(),
                &data(s.tf_id, 100 + s.tf_id as usize)[..]
            );
            r.free(&s);
        }
        assert_eq!(r.poll().unwrap(), None);
    }
    assert!(!r.ended());
    w.close();
    assert!(r.ended());
    assert!(w.wait_empty(Duration::from_secs(1)));
    w.unlink().unwrap();
}

#[test]
fn a_reattached_reader_gets_every_slot_not_freed_in_write_order() {
    let n = name();
    let mut w = Writer::create(&n, 4, 4096).unwrap();
    let mut first = Reader::attach(&n).unwrap();
    for tf in [10, 11, 12] {
        w.write(tf, &data(tf, 10), true).unwrap();
    }
    let a = first.poll().unwrap().unwrap();
    let b = first.poll().unwrap().unwrap();
    first.free(&a);
    drop(first); // the FLP crashed holding TFs 11 and 12
    let _ = b;
    let mut again = Reader::attach(&n).unwrap();
    w.write(13, &data(13, 10), true).unwrap();
    let got: Vec<u64> = std::iter::from_fn(|| again.poll().unwrap())
        .map(|s| s.tf_id)
        .collect();
    assert_eq!(got, [11, 12, 13]);
    w.unlink().unwrap();
}

#[test]
fn a_ring_has_one_reader_at_a_time() {
    let n = name();
    let mut w = Writer::create(&n, 1, 4096).unwrap();
    let first = Reader::attach(&n).unwrap();
    let e = Reader::attach(&n)
        .err()
        .expect("a second reader is refused");
    let pid = std::process::id();
    assert!(
        e.to_string()
            .contains(&format!("reader_pid: another FLP (pid {pid})")),
        "{e}"
    );
    drop(first);
    let mut again = Reader::attach(&n).expect("the first let go");
    assert!(w.write(5, &data(5, 10), false).unwrap());
    assert_eq!(again.poll().unwrap().map(|s| s.tf_id), Some(5));
    w.unlink().unwrap();
}

#[test]
fn freeing_a_slot_that_holds_another_stf_now_leaves_it_alone() {
    let n = name();
    let mut w = Writer::create(&n, 1, 4096).unwrap();
    let mut r = Reader::attach(&n).unwrap();
    assert!(w.write(1, &data(1, 10), false).unwrap());
    let old = r.poll().unwrap().unwrap();
    assert!(r.free(&old));
    assert!(w.write(2, &data(2, 10), false).unwrap());
    assert!(!r.free(&old), "slot 0 holds TF 2 now");
    assert!(!w.write(3, &data(3, 10), false).unwrap(), "TF 2 is unread");
    let next = r.poll().unwrap().expect("TF 2 is still there");
    assert_eq!(next.tf_id, 2);
    assert!(r.free(&next));
    w.unlink().unwrap();
}

/// TFs 1-4 in a ring; an FLP of run 7 scheduled TFs 1 and 2 and was killed; TF 3 was
/// scheduled by run 8 (a restarted FLP joined it), TF 4 never.
#[test]
fn a_reader_for_a_new_run_frees_what_an_earlier_run_scheduled() {
    let n = name();
    let mut w = Writer::create(&n, 4, 4096).unwrap();
    for tf in 1..=4 {
        assert!(w.write(tf, &data(tf, 10), false).unwrap());
    }
    let mut first = Reader::attach(&n).unwrap();
    let slots: Vec<Slot> = std::iter::from_fn(|| first.poll().unwrap()).collect();
    first.mark_scheduled(&slots[0], 7);
    first.mark_scheduled(&slots[1], 7);
    first.mark_scheduled(&slots[2], 8);
    drop(first);
    let mut again = Reader::attach(&n).unwrap();
    assert_eq!(again.free_earlier_runs(8), 2, "run 7's TFs 1 and 2");
    let left: Vec<(u64, u64)> = std::iter::from_fn(|| again.poll().unwrap())
        .map(|s| (s.tf_id, s.scheduled_run))
        .collect();
    assert_eq!(left, [(3, 8), (4, 0)]);
    drop(again);
    let mut same = Reader::attach(&n).unwrap();
    assert_eq!(same.free_earlier_runs(8), 0, "run 8 goes on: its own stay");
    assert!(w.write(5, &data(5, 10), false).unwrap(), "into TF 1's slot");
    let reused = std::iter::from_fn(|| same.poll().unwrap()).find(|s| s.tf_id == 5);
    let reused = reused.expect("TF 5 comes");
    assert_eq!(
        (reused.index, reused.scheduled_run),
        (0, 0),
        "a freed slot's mark is gone"
    );
    w.unlink().unwrap();
}

/// A mark left on a slot whose STF was freed without clearing it (an FLP of an older
/// version, say) does not count for the next STF written there.
#[test]
fn a_mark_counts_only_for_the_stf_it_was_made_for() {
    let n = name();
    let mut w = Writer::create(&n, 1, 4096).unwrap();
    assert!(w.write(1, &data(1, 10), false).unwrap());
    let mut r = Reader::attach(&n).unwrap();
    let s = r.poll().unwrap().unwrap();
    r.mark_scheduled(&s, 7);
    // Freed as an FLP that knows no marks would: the mark stays.
    let path = crate::ring_path(&n);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path);
    let raw = crate::layout::Mapping::map(&file.unwrap(), &path).unwrap();
    raw.state(0).store(crate::layout::FREE, Ordering::Release);
    assert!(w.write(2, &data(2, 10), false).unwrap());
    drop(r);
    let mut again = Reader::attach(&n).unwrap();
    assert_eq!(again.free_earlier_runs(8), 0, "TF 2 was never scheduled");
    let s = again.poll().unwrap();
    assert_eq!(s.map(|s| (s.tf_id, s.scheduled_run)), Some((2, 0)));
    w.unlink().unwrap();
}

#[test]
fn a_waiting_writer_goes_on_when_the_reader_frees() {
    let n = name();
    let mut w = Writer::create(&n, 1, 4096).unwrap();
    let mut r = Reader::attach(&n).unwrap();
    let t = std::thread::spawn(move || {
        for tf in 0..50 {
            w.write(tf, &data(tf, 64), true).unwrap();
        }
        w.close();
        w
    });
    let mut seen = 0;
    while !r.ended() {
        if let Some(s) = r.poll().unwrap() {
            assert_eq!(
                (s.tf_id, r.payload(&s).as_slice()),
                (seen, &data(seen, 64)[..])
            );
            r.free(&s);
            seen += 1;
        }
    }
    assert_eq!(seen, 50);
    t.join().unwrap().unlink().unwrap();
}

#[test]
fn bad_rings_and_writes_name_their_field() {
    let field = |e: RingError| match e {
        RingError::Bad { field, .. } => field,
        RingError::Io { err, .. } => panic!("io: {err}"),
    };
    assert_eq!(
        field(Writer::create(&name(), 0, 4096).err().unwrap()),
        "slots"
    );
    assert_eq!(
        field(Writer::create(&name(), 1, 1000).err().unwrap()),
        "slot_size"
    );
    let n = name();
    let mut w = Writer::create(&n, 2, 4096).unwrap();
    assert_eq!(field(w.write(0, &[0; 4097], true).unwrap_err()), "size");
    w.write(5, b"a", true).unwrap();
    assert_eq!(field(w.write(5, b"b", true).unwrap_err()), "tf_id");
    std::fs::write(crate::ring_path(&n), b"not a ring at all, far too short").unwrap();
    assert_eq!(field(Reader::attach(&n).err().unwrap()), "header");
    let mut bytes = vec![0u8; 8192];
    bytes[..8].copy_from_slice(b"FANINSHX");
    std::fs::write(crate::ring_path(&n), &bytes).unwrap();
    assert_eq!(field(Reader::attach(&n).err().unwrap()), "magic");
    bytes[..8].copy_from_slice(b"FANINSHM");
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    bytes[12..16].copy_from_slice(&8192u32.to_le_bytes());
    std::fs::write(crate::ring_path(&n), &bytes).unwrap();
    assert_eq!(field(Reader::attach(&n).err().unwrap()), "header_len");
    std::fs::remove_file(crate::ring_path(&n)).unwrap();
    assert!(
        matches!(Reader::attach(&n), Err(RingError::Io { .. })),
        "no such ring"
    );
}
