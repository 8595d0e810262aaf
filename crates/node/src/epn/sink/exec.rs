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
    /// Start it again (at most `MAX_RESTARTS` times without a TF taken in between).
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

/// Restarts in a row, without one TF taken, before the EPN gives up and leaves.
pub const MAX_RESTARTS: u32 = 5;

pub struct ExecSink {
    cmd: String,
    epn: u32,
    run_id: u64,
    filtered_dir: Option<PathBuf>,
    on_failure: OnFailure,
    /// Lend payload pages to the pipe (vmsplice) instead of copying them.
    zero_copy: bool,
    proc: Option<Running>,
    restarts_in_a_row: u32,
}

struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    forward: Option<std::thread::JoinHandle<()>>,
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
            proc: None,
            restarts_in_a_row: 0,
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
            (Some(out), Some(dir)) => Some(forward_filtered(out, dir, self.epn)?),
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
        if self.on_failure == OnFailure::Leave || self.restarts_in_a_row >= MAX_RESTARTS {
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
            status.starts_with("exited with 0"),
            "exec sink `{}`: at run end the command {status}",
            self.cmd
        );
        Ok(())
    }
}

impl ExecSink {
    fn stop(&mut self, grace: Duration) -> String {
        match self.proc.take() {
            Some(mut p) => p.stop(grace),
            None => "was not running".into(),
        }
    }
}

impl Running {
    fn kill_group(&self) {
        // SAFETY: killpg on the process group this command leads (set at spawn).
        unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
    }

    /// Closes its stdin, waits up to `grace` for it to end (then kills it); how it ended.
    fn stop(&mut self, grace: Duration) -> String {
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
                        Err(e) => return format!("could not be waited for ({e})"),
                    }
                }
            }
        };
        // What it left behind (a pipeline's other end, background children) goes too,
        // so its stdout closes and the forwarding thread ends.
        self.kill_group();
        if let Some(t) = self.forward.take() {
            join_forward(t);
        }
        match (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(&status),
        ) {
            (Some(c), _) => format!("exited with {c}"),
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            _ => format!("ended ({status})"),
        }
    }
}

/// How long a stopped command's stdout may stay open (a process it started outside its
/// group, `setsid`, may hold it): the sink does not wait for it longer.
const FORWARD_WAIT: Duration = Duration::from_secs(2);

/// Waits for the forwarding thread to end, at most `FORWARD_WAIT`; after that it goes
/// on alone until the stdout closes, and the sink goes on.
fn join_forward(t: std::thread::JoinHandle<()>) {
    let until = Instant::now() + FORWARD_WAIT;
    while !t.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    match t.is_finished() {
        true => drop(t.join()),
        false => tracing::warn!(
            "exec sink: the command's stdout is still open {FORWARD_WAIT:?} after it ended (a process outside its group holds it); its filtered output goes on being copied"
        ),
    }
}

/// Copies the command's stdout to a new `filtered-epnN-SEQ.out` in `dir`.
fn forward_filtered(
    mut out: std::process::ChildStdout,
    dir: &std::path::Path,
    epn: u32,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    std::fs::create_dir_all(dir).with_context(|| format!("sink directory {}", dir.display()))?;
    let name = |seq: u32| format!("filtered-epn{epn}-{seq:06}.out");
    let (mut file, path) = super::file::create_numbered(dir, &mut 0, name)
        .with_context(|| format!("filtered output in {}", dir.display()))?;
    Ok(std::thread::spawn(move || {
        if let Err(e) = std::io::copy(&mut out, &mut file) {
            tracing::warn!("filtered output {}: {e}", path.display());
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that leaves a process outside its group holding its stdout: the sink
    /// still stops within a few seconds (the forwarding thread is not waited for).
    #[test]
    fn a_stdout_held_open_outside_the_group_does_not_hold_the_stop() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = SinkCtx {
            run_id: 1,
            epn: 0,
            metrics: crate::metrics::Metrics::new("epn", Some(0)),
            on_failure: OnFailure::Restart,
            exec_zero_copy: false,
            progress: Default::default(),
        };
        let cmd = "setsid sleep 8 & sleep 0.3; cat > /dev/null";
        let mut s = ExecSink::start(cmd, &ctx, Some(dir.path().to_path_buf())).unwrap();
        let t0 = Instant::now();
        s.finish().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
    }
}
