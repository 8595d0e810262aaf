//! Signals to the processes the lab starts: the one place that calls `kill(2)`.
//! Faults freeze, continue and kill nodes; clean-ups kill what a run or testbed left.

use tokio::process::Child;

/// Sends `sig` to process `pid`; false when it is gone (or not ours).
pub fn signal(pid: u32, sig: i32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Sends `sig` to a child that is still running.
pub fn signal_child(child: &Child, sig: i32) -> bool {
    child.id().is_some_and(|pid| signal(pid, sig))
}
