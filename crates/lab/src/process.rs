//! The processes the lab starts: they die with it (a parent-death signal), and the one
//! place that signals them (faults freeze, continue and kill; clean-ups kill).

use tokio::process::{Child, Command};

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

/// Makes `cmd`'s process die (SIGKILL) when the process that started it ends, however
/// it ends (a signal, SIGKILL, a panic): a launched cluster never outlives its launcher.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (prctl, getppid, _exit).
    let launcher = std::process::id() as libc::pid_t;
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the line above: then go at once.
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// How many times the operator asked to stop (SIGINT or SIGTERM) since `listen`.
pub type Interrupts = tokio::sync::watch::Receiver<u32>;

/// Counts SIGINT and SIGTERM from now on instead of dying at once: the first asks the
/// run to stop cleanly; the second exits at once (status 130), and every launched
/// process dies with this one.
pub fn listen() -> anyhow::Result<Interrupts> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            let n = *tx.borrow() + 1;
            if n >= 2 {
                eprintln!("fanin: interrupted again: stopping at once");
                std::process::exit(130);
            }
            eprintln!("fanin: interrupted: stopping the run cleanly (again to stop at once)");
            let _ = tx.send(n);
        }
    });
    Ok(rx)
}
