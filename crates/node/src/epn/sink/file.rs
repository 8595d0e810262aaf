//! The `file:` sink: built TFs appended to files of TF records (docs/sinks.md), rotated
//! by size or age, synced as chosen. A crash leaves each file readable to its last TF.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{options, seconds, size, Sink, SinkCtx, SinkError, TfView};

/// When the writer calls fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    Never,
    /// When a file is closed (rotation, run end): the default.
    Rotate,
    /// After every TF.
    Every,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FileOpts {
    pub dir: PathBuf,
    /// A new file once this many bytes are written (default 1 GiB).
    pub rotate_bytes: u64,
    /// A new file once the current one is this old.
    pub rotate_s: Option<Duration>,
    pub fsync: Fsync,
}

impl FileOpts {
    pub(super) fn parse(rest: &str) -> Result<FileOpts, String> {
        let (dir, opts) = options(rest, &["rotate", "rotate_s", "fsync"])?;
        let mut o = FileOpts {
            dir: dir.into(),
            rotate_bytes: 1 << 30,
            rotate_s: None,
            fsync: Fsync::Rotate,
        };
        for (k, v) in opts {
            match k {
                "rotate" => o.rotate_bytes = size(k, v)?.max(1),
                "rotate_s" => o.rotate_s = Some(seconds(k, v)?),
                _ => {
                    o.fsync = match v {
                        "never" => Fsync::Never,
                        "rotate" => Fsync::Rotate,
                        "every" => Fsync::Every,
                        _ => return Err(format!("fsync: `{v}` is not never, rotate or every")),
                    }
                }
            }
        }
        Ok(o)
    }
}

/// Files `PREFIX-epnN-SEQ.fanin` in one directory, never overwriting one.
pub struct TfFiles {
    opts: FileOpts,
    prefix: String,
    epn: u32,
    seq: u32,
    cur: Option<Open>,
}

struct Open {
    w: BufWriter<File>,
    path: PathBuf,
    bytes: u64,
    since: Instant,
}

impl TfFiles {
    /// Creates the directory (an error names it).
    pub fn new(opts: FileOpts, prefix: &str, epn: u32) -> anyhow::Result<TfFiles> {
        std::fs::create_dir_all(&opts.dir)
            .with_context(|| format!("sink directory {}", opts.dir.display()))?;
        Ok(TfFiles {
            opts,
            prefix: prefix.into(),
            epn,
            seq: 0,
            cur: None,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    /// Appends one TF; the file is flushed after it, so a crash loses no earlier TF.
    pub fn write(&mut self, tf: &TfView) -> std::io::Result<()> {
        self.write_record(tf.record_len(), |w| tf.write_to(w))
    }

    /// Appends one record already encoded (the burst ring).
    pub fn write_bytes(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.write_record(record.len() as u64, |w| w.write_all(record))
    }

    fn write_record(
        &mut self,
        len: u64,
        f: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if self.cur.is_none() {
            self.cur = Some(self.create()?);
        }
        let cur = self.cur.as_mut().expect("opened");
        if let Err(e) = f(&mut cur.w).and_then(|()| cur.w.flush()) {
            // The file may end in a partial record: the next one starts a fresh file
            // (readers see this one end in a truncated record, never a record run on).
            self.cur = None;
            return Err(e);
        }
        cur.bytes += len;
        if self.opts.fsync == Fsync::Every {
            cur.w.get_ref().sync_data()?;
        }
        let age = self.opts.rotate_s.is_some_and(|s| cur.since.elapsed() >= s);
        if cur.bytes >= self.opts.rotate_bytes || age {
            self.close()?;
        }
        Ok(())
    }

    fn create(&mut self) -> std::io::Result<Open> {
        let (prefix, epn) = (&self.prefix, self.epn);
        let name = |seq: u32| format!("{prefix}epn{epn}-{seq:06}.fanin");
        let (f, path) = create_numbered(&self.opts.dir, &mut self.seq, name)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        w.write_all(&fanin_proto::tf_record::encode_file_header(self.epn))?;
        let since = Instant::now();
        Ok(Open {
            w,
            path,
            bytes: 0,
            since,
        })
    }

    /// Closes the current file once it is `rotate_s` old, TFs or not: a pause in the
    /// run leaves no file open (and, with `fsync=rotate`, unsynced) for its length.
    pub fn close_if_old(&mut self, now: Instant) -> std::io::Result<()> {
        let since = self.cur.as_ref().map(|c| c.since);
        let age = |t: Instant| now.saturating_duration_since(t);
        let old = since
            .zip(self.opts.rotate_s)
            .is_some_and(|(t, s)| age(t) >= s);
        match old {
            true => self.close(),
            false => Ok(()),
        }
    }

    /// Closes the current file (synced unless `fsync=never`); the next TF opens one.
    pub fn close(&mut self) -> std::io::Result<()> {
        if let Some(mut cur) = self.cur.take() {
            cur.w.flush()?;
            if self.opts.fsync != Fsync::Never {
                cur.w.get_ref().sync_all()?;
            }
            tracing::debug!("closed {}", cur.path.display());
        }
        Ok(())
    }
}

/// Creates `dir/name(seq)` for the first sequence number from `*next` that is not
/// taken (never overwriting a file), and moves `*next` past it. An error names the file.
pub(super) fn create_numbered(
    dir: &Path,
    next: &mut u32,
    name: impl Fn(u32) -> String,
) -> std::io::Result<(File, PathBuf)> {
    loop {
        let path = dir.join(name(*next));
        *next += 1;
        match File::options().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                let msg = format!("{}: {e}", path.display());
                return Err(std::io::Error::new(e.kind(), msg));
            }
        }
    }
}

/// The `file:` sink.
pub struct FileSink {
    files: TfFiles,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl FileSink {
    pub fn open(opts: FileOpts, ctx: &SinkCtx) -> anyhow::Result<FileSink> {
        Ok(FileSink {
            files: TfFiles::new(opts, "", ctx.epn)?,
            metrics: ctx.metrics.clone(),
        })
    }
}

impl Sink for FileSink {
    fn accept(&mut self, tf: &TfView) -> Result<(), SinkError> {
        self.files.write(tf).map_err(|e| {
            let _ = self.files.cur.take(); // also after a failed fsync or rotation
            SinkError::failed(format!("file sink {}: {e}", self.files.dir().display()))
        })
    }

    fn idle(&mut self) {
        if let Err(e) = self.files.close_if_old(Instant::now()) {
            let _ = self.files.cur.take(); // the next TF starts a new file
            let dir = self.files.dir().display();
            tracing::error!(
                "EPN {}: file sink {dir}: closing an aged file: {e}",
                self.files.epn
            );
            self.metrics.error("sink_failed");
        }
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        let dir = self.files.dir().display().to_string();
        self.files
            .close()
            .with_context(|| format!("file sink {dir}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tf_of(stfs: &[(u32, Vec<u8>)], tf: u64) -> TfView<'_> {
        TfView::new(1, 2, tf, stfs)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A record that fails half written (a full disk, say) ends its file: the next one
    /// goes to a new file, for the burst ring's saves as for the file sink.
    #[test]
    fn a_record_that_fails_half_written_ends_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let opts = FileOpts::parse(&dir.path().display().to_string()).unwrap();
        let mut f = TfFiles::new(opts, "burst-", 2).unwrap();
        let torn = f.write_record(100, |w| {
            w.write_all(&[1u8; 40])?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(torn.is_err());
        f.write_bytes(&tf_of(&[(0, vec![7u8; 10])], 1).record())
            .unwrap();
        f.close().unwrap();
        let files = names(dir.path());
        assert_eq!(
            files,
            ["burst-epn2-000000.fanin", "burst-epn2-000001.fanin"]
        );
    }

    #[test]
    fn files_rotate_by_size_and_age_and_never_overwrite_one() {
        let dir = tempfile::tempdir().unwrap();
        let stfs = vec![(0, vec![7u8; 1000])];
        let opts = FileOpts::parse(&format!("{},rotate=2500", dir.path().display())).unwrap();
        let mut f = TfFiles::new(opts.clone(), "", 2).unwrap();
        for tf in 0..5 {
            f.write(&tf_of(&stfs, tf)).unwrap();
        }
        f.close().unwrap();
        // 1056 bytes a record: a file closes once it holds 2500, i.e. after 3 TFs.
        assert_eq!(
            names(dir.path()),
            ["epn2-000000.fanin", "epn2-000001.fanin"]
        );
        // Another writer (a rejoined EPN) in the same directory starts new files.
        let mut again = TfFiles::new(opts, "", 2).unwrap();
        again.write(&tf_of(&stfs, 9)).unwrap();
        again.close().unwrap();
        assert_eq!(names(dir.path()).len(), 3);

        let aged = tempfile::tempdir().unwrap();
        // Aged by 0.5 s: long enough that a slow disk's fsync never ages a file early.
        let spec = format!("{},rotate_s=0.5,fsync=every", aged.path().display());
        let mut f = TfFiles::new(FileOpts::parse(&spec).unwrap(), "", 2).unwrap();
        f.write(&tf_of(&stfs, 0)).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        f.write(&tf_of(&stfs, 1)).unwrap();
        f.write(&tf_of(&stfs, 2)).unwrap();
        f.close().unwrap();
        assert_eq!(
            names(aged.path()).len(),
            2,
            "the second write found its file old"
        );
    }

    /// A file is closed once `rotate_s` old while no TF comes (a paused run): the TF
    /// after the pause goes to a new file, not onto the old one.
    #[test]
    fn an_aged_file_closes_while_no_tf_comes() {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("{},rotate_s=0.5", dir.path().display());
        let ctx = SinkCtx::for_tests(2);
        let mut s = FileSink::open(FileOpts::parse(&spec).unwrap(), &ctx).unwrap();
        let stfs = vec![(0, vec![7u8; 100])];
        s.accept(&tf_of(&stfs, 0)).unwrap();
        let opened = s.files.cur.as_ref().unwrap().since;
        s.files
            .close_if_old(opened + Duration::from_millis(400))
            .unwrap();
        assert!(s.files.cur.is_some(), "young: still open");
        s.files
            .close_if_old(opened + Duration::from_millis(600))
            .unwrap();
        assert!(s.files.cur.is_none(), "aged: closed without a TF");
        s.accept(&tf_of(&stfs, 1)).unwrap();
        s.finish().unwrap();
        assert_eq!(
            names(dir.path()),
            ["epn2-000000.fanin", "epn2-000001.fanin"]
        );
    }
}
