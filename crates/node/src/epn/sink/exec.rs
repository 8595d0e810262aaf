//! The `exec:` sink: a processing command (`sh -c CMD`) reading TF records on its stdin;
//! its stdout is the filtered output, kept beside the file sink's files when there is one.
//!
//! A command that dies fails the TF being written (`sink_failed`) and is started again,
//! or makes the EPN leave the run (`--on-sink-failure leave`).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Sink, SinkCtx, SinkError, TfView};

/// What an EPN does when its processing command dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Start it again (at most `MAX_RESTARTS` times without a TF taken in between, and
    /// fewer than `MAX_RESTARTS` failures of its filtered output in the run).
    #[default]
    Restart,
    /// Leave the run: the ICN moves this EPN's TFs elsewhere (with `reassign`).
    Leave,
}

impl std::str::FromStr for OnFailure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "restart" => Ok(OnFailure::Restart),
            "leave" => Ok(OnFailure::Leave),
            _ => Err(format!("`{s}` is not restart or leave")),
        }
    }
}

/// Restarts in a row, without one TF taken, before the EPN gives up and leaves; the
/// `MAX_RESTARTS`-th failure of the filtered output in a run makes it leave too.
pub const MAX_RESTARTS: u32 = 5;

pub struct ExecSink {
    cmd: String,
    epn: u32,
    run_id: u64,
    filtered_dir: Option<PathBuf>,
    on_failure: OnFailure,
    /// Lend payload pages to the pipe (vmsplice) instead of copying them.
    zero_copy: bool,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    proc: Option<Running>,
    restarts_in_a_row: u32,
    /// Commands stopped because their filtered output could not be written: a full
    /// disk stays full while TFs are taken, so these count for the whole run.
    output_failures: u32,
}

struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Copies its stdout to the filtered output; ends with the error that stopped it.
    forward: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl ExecSink {
    pub fn start(cmd: &str, ctx: &SinkCtx, filtered_dir: Option<PathBuf>) -> anyhow::Result<Self> {
        let mut s = ExecSink {
            cmd: cmd.into(),
            epn: ctx.epn,
            run_id: ctx.run_id,
            filtered_dir,
            on_failure: ctx.on_failure,
            zero_copy: ctx.exec_zero_copy,
            metrics: ctx.metrics.clone(),
            proc: None,
            restarts_in_a_row: 0,
            output_failures: 0,
        };
        s.proc = Some(s.spawn()?);
        Ok(s)
    }

    fn spawn(&self) -> anyhow::Result<Running> {
        let out = match &self.filtered_dir {
            Some(_) => Stdio::piped(),
            None => Stdio::null(),
        };
        let mut child = Command::new("sh")
            .args(["-c", &self.cmd])
            // Its own process group: stopping it stops what it started.
            .process_group(0)
            // The run secret is the node's, not the command's.
            .env_remove(crate::auth::SECRET_ENV)
            .env("FANIN_EPN_ID", self.epn.to_string())
            .env("FANIN_RUN_ID", self.run_id.to_string())
            .stdin(Stdio::piped())
            .stdout(out)
            .spawn()
            .with_context(|| format!("exec sink `{}`: starting sh", self.cmd))?;
        let stdin = child.stdin.take();
        if let Some(s) = &stdin {
            super::pipe::prepare(s)
                .with_context(|| format!("exec sink `{}`: its stdin", self.cmd))?;
        }
        let forward = match (child.stdout.take(), &self.filtered_dir) {
            (Some(out), Some(dir)) => {
                let file = filtered_file(dir, self.epn)?;
                let group = child.id() as libc::pid_t;
                Some(forward_filtered(out, file, group, self.metrics.clone()))
            }
            _ => None,
        };
        Ok(Running {
            child,
            stdin,
            forward,
        })
    }

    /// The command broke while taking a TF: why, and what happens next.
    fn failed(&mut self, e: std::io::Error) -> SinkError {
        let status = self.stop(Duration::from_millis(200));
        let mut msg = format!("exec sink `{}`: {e} (the command {status})", self.cmd);
        let mut err = SinkError::failed(msg.clone());
        let gave_up =
            self.restarts_in_a_row >= MAX_RESTARTS || self.output_failures >= MAX_RESTARTS;
        if self.on_failure == OnFailure::Leave || gave_up {
            msg.push_str("; the EPN leaves the run");
            err.msg = msg;
            err.fatal = true;
            return err;
        }
        self.restarts_in_a_row += 1;
        match self.spawn() {
            Ok(p) => self.proc = Some(p),
            Err(e) => {
                err.msg = format!("{msg}; restarting it failed: {e:#}; the EPN leaves the run");
                err.fatal = true;
            }
        }
        err
    }
}

impl Sink for ExecSink {
    fn accept(&mut self, tf: &TfView) -> Result<(), SinkError> {
        let Some(w) = self.proc.as_mut().and_then(|p| p.stdin.as_mut()) else {
            return Err(self.failed(std::io::ErrorKind::BrokenPipe.into()));
        };
        match super::pipe::send(w, tf, self.zero_copy, super::pipe::STALL) {
            Ok(()) => {
                self.restarts_in_a_row = 0;
                Ok(())
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        let status = self.stop(Duration::from_secs(10));
        anyhow::ensure!(
            status == "exited with 0",
            "exec sink `{}`: at run end the command {status}",
            self.cmd
        );
        Ok(())
    }
}

impl ExecSink {
    fn stop(&mut self, grace: Duration) -> String {
        let Some(mut p) = self.proc.take() else {
            return "was not running".into();
        };
        let (how, output_failed) = p.stop(grace);
        self.output_failures += u32::from(output_failed);
        how
    }
}

impl Running {
    fn kill_group(&self) {
        kill_group(self.child.id() as libc::pid_t);
    }

    /// Closes its stdin, waits up to `grace` for it to end (then kills it); how it ended,
    /// and how its filtered output failed if it did ("exited with 0" when all went well),
    /// and whether it did.
    fn stop(&mut self, grace: Duration) -> (String, bool) {
        drop(self.stdin.take());
        let until = Instant::now() + grace;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    self.kill_group();
                    match self.child.wait() {
                        Ok(s) => break s,
                        Err(e) => return (format!("could not be waited for ({e})"), false),
                    }
                }
            }
        };
        // What it left behind (a pipeline's other end, background children) goes too,
        // so its stdout closes and the forwarding thread ends.
        self.kill_group();
        let forward = self.forward.take().and_then(join_forward);
        let ended = match (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(&status),
        ) {
            (Some(c), _) => format!("exited with {c}"),
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            _ => format!("ended ({status})"),
        };
        match forward {
            Some(e) => (format!("{ended}; {e}"), true),
            None => (ended, false),
        }
    }
}

/// How long a stopped command's stdout may stay open (a process it started outside its
/// group, `setsid`, may hold it): the sink does not wait for it longer.
const FORWARD_WAIT: Duration = Duration::from_secs(2);

/// Waits for the forwarding thread to end, at most `FORWARD_WAIT` (after that it goes
/// on alone until the stdout closes, and the sink goes on); the error it ended with.
fn join_forward(t: std::thread::JoinHandle<Result<(), String>>) -> Option<String> {
    let until = Instant::now() + FORWARD_WAIT;
    while !t.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    match t.is_finished() {
        true => t
            .join()
            .unwrap_or_else(|_| Err("filtered output: its thread panicked".into()))
            .err(),
        false => {
            tracing::warn!(
                "exec sink: the command's stdout is still open {FORWARD_WAIT:?} after it ended (a process outside its group holds it); its filtered output goes on being copied"
            );
            None
        }
    }
}

/// A new `filtered-epnN-SEQ.out` in `dir`, and its path.
fn filtered_file(dir: &std::path::Path, epn: u32) -> anyhow::Result<(std::fs::File, String)> {
    std::fs::create_dir_all(dir).with_context(|| format!("sink directory {}", dir.display()))?;
    let name = |seq: u32| format!("filtered-epn{epn}-{seq:06}.out");
    let (file, path) = super::file::create_numbered(dir, &mut 0, name)
        .with_context(|| format!("filtered output in {}", dir.display()))?;
    Ok((file, path.display().to_string()))
}

/// Copies the command's stdout into `file`. A write that fails (a full disk) would lose
/// its output unseen, so the command's process `group` is stopped: its next TF fails
/// (`sink_failed`) and the command starts again or the EPN leaves, as configured.
fn forward_filtered(
    mut out: impl std::io::Read + Send + 'static,
    (mut file, path): (impl std::io::Write + Send + 'static, String),
    group: libc::pid_t,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        let e = match std::io::copy(&mut out, &mut file) {
            Ok(_) => return Ok(()),
            Err(e) => format!("filtered output {path}: {e}"),
        };
        tracing::error!("exec sink: {e}; the command is stopped");
        metrics.error("filtered_output");
        kill_group(group);
        Err(e)
    })
}

/// Kills the process group a command leads (set at spawn): what it started goes too.
fn kill_group(group: libc::pid_t) {
    // SAFETY: killpg on a group id taken from our own child; no memory is touched.
    unsafe { libc::killpg(group, libc::SIGKILL) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that leaves a process outside its group holding its stdout: the sink
    /// still stops within a few seconds (the forwarding thread is not waited for).
    #[test]
    fn a_stdout_held_open_outside_the_group_does_not_hold_the_stop() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = SinkCtx::for_tests(0);
        let cmd = "setsid sleep 8 & sleep 0.3; cat > /dev/null";
        let mut s = ExecSink::start(cmd, &ctx, Some(dir.path().to_path_buf())).unwrap();
        let t0 = Instant::now();
        s.finish().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
    }

    /// A command whose filtered output keeps failing (a full disk) makes the EPN leave at
    /// its `MAX_RESTARTS`-th failure in the run, however many TFs each one took, instead
    /// of failing every other TF for as long as the disk stays full.
    #[test]
    fn filtered_output_failures_count_for_the_whole_run() {
        let ctx = SinkCtx::for_tests(0);
        let mut s = ExecSink::start("cat > /dev/null", &ctx, None).unwrap();
        let stfs = vec![(0u32, vec![1u8; 100])];
        for i in 1..=MAX_RESTARTS {
            s.accept(&TfView::new(1, 0, u64::from(i), &stfs)).unwrap();
            let failing = std::thread::spawn(|| Err("filtered output f: No space left".into()));
            s.proc.as_mut().unwrap().forward = Some(failing);
            let e = s.failed(std::io::ErrorKind::BrokenPipe.into());
            assert!(e.msg.contains("No space left"), "{}", e.msg);
            assert_eq!(e.fatal, i == MAX_RESTARTS, "failure {i}: {}", e.msg);
        }
    }

    /// The filtered output cannot be written (here /dev/full, as a full disk): the error
    /// names the file, is counted, and the command is stopped instead of writing on into
    /// nothing.
    #[test]
    fn a_filtered_output_that_cannot_be_written_stops_the_command() {
        let mut child = Command::new("sh")
            .args(["-c", "head -c 60000 /dev/zero; sleep 30"])
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let metrics = crate::metrics::Metrics::new("epn", Some(0));
        let out = child.stdout.take().unwrap();
        let group = child.id() as libc::pid_t;
        let t = forward_filtered(out, (full, "/dev/full".into()), group, metrics.clone());
        let e = t.join().unwrap().unwrap_err();
        assert!(
            e.contains("/dev/full") && e.contains("No space left"),
            "{e}"
        );
        assert_eq!(metrics.counter("errors.filtered_output"), 1);
        let until = Instant::now() + Duration::from_secs(10);
        let status = loop {
            match child.try_wait().unwrap() {
                Some(s) => break s,
                None if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                None => panic!("the command still runs"),
            }
        };
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }
}
