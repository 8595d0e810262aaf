//! The CPU time of a process's threads, each read from its own clock: exact even for a
//! thread running on another core at that moment, which getrusage misses until a tick.
//!
//! A peer's measured span can be a millisecond on loopback (16 MiB at 12 GB/s), less than
//! one scheduler tick: getrusage charged such a span with 0 s (or with a tick of the work
//! before it) when a thread ran through it without being switched out.

use std::collections::BTreeMap;

/// CPU time in ns of every thread of this process alive now, by thread id.
pub fn threads() -> BTreeMap<i32, u64> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return BTreeMap::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|tid| Some((tid, thread_ns(tid)?)))
        .collect()
}

/// One thread's CPU clock (the kernel's per-thread CPUCLOCK_SCHED clock, as glibc's
/// pthread_getcpuclockid makes it); None once the thread has exited.
fn thread_ns(tid: i32) -> Option<u64> {
    const PERTHREAD: libc::clockid_t = 4;
    const SCHED: libc::clockid_t = 2;
    let clock = (!tid << 3) | PERTHREAD | SCHED;
    // SAFETY: clock_gettime writes into the zeroed struct we own; an id that names no
    // thread of ours is an error (EINVAL), not undefined behaviour.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return None;
    }
    Some(t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64)
}

/// The CPU the threads of the second reading used since the first, in ns, and whether
/// that is all of it. It is not when a thread of the first reading has exited since
/// (its last CPU is unknown here), nor when a reading is empty (/proc/self/task could
/// not be read): the sum is then only a lower bound, or nothing.
pub fn used_between(start: &BTreeMap<i32, u64>, end: &BTreeMap<i32, u64>) -> (u64, bool) {
    let mut ns = 0u64;
    for (tid, t) in end {
        ns += t.saturating_sub(start.get(tid).copied().unwrap_or(0));
    }
    let read = !start.is_empty() && !end.is_empty();
    (ns, read && start.keys().all(|tid| end.contains_key(tid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that spins on another core through the whole span, never switched out:
    /// its 2 ms are counted (getrusage saw 0 until the next tick).
    #[test]
    fn a_thread_running_through_the_span_is_charged_for_it() {
        use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
        use std::sync::Arc;
        let state = Arc::new(AtomicU8::new(0)); // 0 wait, 1 go, 2 spun 2 ms, 3 stop
        let s = state.clone();
        let spinner = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            while s.load(SeqCst) == 0 {}
            let c0 = thread_ns(tid).unwrap();
            while thread_ns(tid).unwrap() < c0 + 2_000_000 {}
            s.store(2, SeqCst);
            while s.load(SeqCst) != 3 {}
            tid
        });
        let start = threads();
        state.store(1, SeqCst);
        while state.load(SeqCst) != 2 {}
        let end = threads();
        state.store(3, SeqCst);
        let tid = spinner.join().unwrap();
        let used = end[&tid] - start[&tid];
        assert!(used >= 2_000_000, "{used} ns");
    }

    #[test]
    fn a_thread_that_exited_or_an_empty_reading_leaves_a_lower_bound() {
        let start: BTreeMap<i32, u64> = [(1, 10), (2, 20)].into();
        assert_eq!(used_between(&start, &[(1, 15), (3, 7)].into()), (12, false));
        let all = [(1, 15), (2, 20), (3, 7)].into();
        assert_eq!(used_between(&start, &all), (12, true));
        // An unreadable /proc gives empty readings: never taken as the whole.
        assert_eq!(used_between(&BTreeMap::new(), &all), (42, false));
        assert_eq!(used_between(&start, &BTreeMap::new()), (0, false));
    }
}
