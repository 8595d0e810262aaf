//! The `exec:CMD` source: framed STFs (24-byte header, then the payload) read from the
//! stdout of `sh -c CMD`; while the send buffer is full the command blocks on its pipe.

use std::process::Stdio;

use bytes::{Buf, BytesMut};
use fanin_proto::StfInfo;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;

use super::{Event, Payload, Produced, SourceError, STALL_LIMIT};
use crate::config::MAX_STF_BYTES;

/// "FSTF", version 1: the framing of docs/sources.md.
pub const MAGIC: [u8; 4] = *b"FSTF";
pub const HEADER: usize = 24;

pub struct Exec {
    child: Child,
    out: ChildStdout,
    buf: BytesMut,
    /// The header of the frame being read.
    header: Option<StfInfo>,
    /// Inside a frame: when the command has stalled if no byte came by then.
    stall_at: Option<Instant>,
    frames: u64,
    last_tf: Option<u64>,
    what: String,
}

impl Exec {
    pub fn spawn(cmd: &str, me: u32, what: String) -> anyhow::Result<Exec> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            // The run secret is the node's, not the command's.
            .env_remove(crate::auth::SECRET_ENV)
            .env("FANIN_FLP_ID", me.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("{what}: cannot start sh: {e}"))?;
        let out = child.stdout.take().expect("piped stdout");
        Ok(Exec {
            child,
            out,
            buf: BytesMut::new(),
            header: None,
            stall_at: None,
            frames: 0,
            last_tf: None,
            what,
        })
    }

    fn err(&self, field: &str, msg: String) -> SourceError {
        SourceError(format!(
            "{}: STF frame {}: {field}: {msg}",
            self.what, self.frames
        ))
    }

    /// Reads until `buf` holds `want` bytes (never more, into memory reserved for
    /// exactly that). False: stdout ended first. Inside a frame, no byte for
    /// `STALL_LIMIT` is an error (its deadline outlives this future: the shell drops
    /// and makes it again many times a second).
    async fn fill(&mut self, want: usize) -> Result<bool, SourceError> {
        self.buf.reserve(want.saturating_sub(self.buf.len()));
        while self.buf.len() < want {
            let need = (want - self.buf.len()) as u64;
            let quiet_ok = self.buf.is_empty() && self.header.is_none();
            let stall_at = match quiet_ok {
                true => None, // between frames a source may be quiet
                false => Some(
                    *self
                        .stall_at
                        .get_or_insert_with(|| Instant::now() + STALL_LIMIT),
                ),
            };
            let mut limited = (&mut self.out).take(need);
            let read = limited.read_buf(&mut self.buf);
            let n = match stall_at {
                None => read.await,
                Some(at) => match tokio::time::timeout_at(at, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        let field = match self.header {
                            Some(_) => "payload",
                            None => "header",
                        };
                        return Err(self.err(field, format!("no byte for {STALL_LIMIT:?}")));
                    }
                },
            };
            match n {
                Ok(0) => return Ok(false),
                Ok(_) => self.stall_at = Some(Instant::now() + STALL_LIMIT),
                Err(e) => return Err(self.err("stdout", e.to_string())),
            }
        }
        Ok(true)
    }

    pub async fn next(&mut self, room: u64) -> Result<Event, SourceError> {
        let info = match self.header {
            Some(h) => h,
            None => {
                if !self.fill(HEADER).await? {
                    return self.ended();
                }
                let h = self.parse()?;
                self.header = Some(h);
                h
            }
        };
        if info.size > room || room == 0 {
            self.stall_at = None; // the FLP does not read: no stall of the command's
            return Ok(Event::Held(info.size));
        }
        let total = HEADER + info.size as usize;
        if !self.fill(total).await? {
            let got = self.buf.len() - HEADER;
            return Err(self.err(
                "payload",
                format!("stdout ended after {got} of {} bytes", info.size),
            ));
        }
        let mut frame = self.buf.split_to(total);
        frame.advance(HEADER);
        (self.header, self.stall_at) = (None, None);
        self.frames += 1;
        self.last_tf = Some(info.tf_id);
        Ok(Event::Stf(Produced {
            info,
            payload: Payload::Owned(frame.freeze()),
        }))
    }

    fn parse(&self) -> Result<StfInfo, SourceError> {
        let b = &self.buf[..HEADER];
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if b[..4] != MAGIC {
            let v = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
            return Err(self.err("magic", format!("{v:#010x} is not FSTF")));
        }
        if u16_at(4) != 1 {
            return Err(self.err("version", format!("{} (this FLP reads 1)", u16_at(4))));
        }
        if u16_at(6) != 0 {
            return Err(self.err("flags", format!("{} (must be 0)", u16_at(6))));
        }
        let (tf_id, size) = (u64_at(8), u64_at(16));
        if size > MAX_STF_BYTES {
            return Err(self.err("size", format!("{size} is over 1 GiB")));
        }
        if let Some(last) = self.last_tf.filter(|&l| tf_id <= l) {
            return Err(self.err("tf_id", format!("{tf_id} does not grow (last {last})")));
        }
        Ok(StfInfo { tf_id, size })
    }

    /// Stdout ended between frames: the source ended (with the command's exit status).
    fn ended(&mut self) -> Result<Event, SourceError> {
        if !self.buf.is_empty() {
            let got = self.buf.len();
            return Err(self.err(
                "header",
                format!("stdout ended after {got} of {HEADER} bytes"),
            ));
        }
        // What the command left running in its group goes with the source. Before the
        // shell is reaped: its pid, the group's id, cannot be taken by another until then.
        self.kill_group();
        let status = match self.child.try_wait() {
            Ok(Some(s)) => format!(", {s}"),
            _ => String::new(),
        };
        Ok(Event::Ended(format!(
            "end of stdout after {} STFs{status}",
            self.frames
        )))
    }
}

impl Exec {
    /// The command and whatever it started: one process group, while its shell is not
    /// reaped (after that its id is no longer the command's).
    fn kill_group(&self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: a plain signal to the group this source started.
            unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.kill_group();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that stops inside a frame's header: the stall names the header.
    #[tokio::test(start_paused = true)]
    async fn a_stall_inside_a_header_names_the_header() {
        let mut s = Exec::spawn("printf FSTF; sleep 30", 0, "FLP 0: source exec".into()).unwrap();
        let e = match s.next(1 << 20).await {
            Err(e) => e.0,
            Ok(_) => panic!("no error"),
        };
        assert!(e.contains("STF frame 0: header: no byte for"), "{e}");
    }

    /// A command that starts a helper in the background and ends: the helper goes with
    /// the source's end, not with the FLP (which may run on for many runs).
    #[tokio::test]
    async fn what_the_command_left_running_ends_with_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("helper.pid");
        let cmd = format!("sleep 60 >/dev/null 2>&1 & echo $! > {}", pidfile.display());
        let mut s = Exec::spawn(&cmd, 0, "FLP 0: source exec".into()).unwrap();
        match s.next(1 << 20).await {
            Ok(Event::Ended(what)) => assert!(what.contains("after 0 STFs"), "{what}"),
            other => panic!("{:?}", other.map(|_| ()).map_err(|e| e.0)),
        }
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Gone, or a zombie waiting for whoever adopted it.
        let alive = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            !stat.is_empty() && !stat.contains(") Z ")
        };
        for _ in 0..100 {
            if !alive() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!alive(), "the helper {pid} outlived its source");
    }
}
