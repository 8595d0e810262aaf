//! The `burst` sink: the last N seconds (at most B bytes) of built TFs kept in memory;
//! a trigger (`fanin trigger`, HTTP POST /trigger) saves them and the next M seconds.
//!
//! Files go to DIR as `burst-UNIXMS-epnN-SEQ.fanin`, one set per trigger.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::file::{FileOpts, Fsync, TfFiles};
use super::{options, seconds, size, Sink, SinkCtx, SinkError, TfView};
use crate::metrics::Metrics;

#[derive(Debug, Clone, PartialEq)]
pub struct BurstOpts {
    pub dir: std::path::PathBuf,
    /// Seconds of TFs kept before a trigger (default 20).
    pub keep: Duration,
    /// Bytes kept at most (default 1 GiB); the oldest go first.
    pub keep_bytes: u64,
    /// Seconds saved after a trigger (default 10).
    pub after: Duration,
}

impl BurstOpts {
    pub(super) fn parse(rest: &str) -> Result<BurstOpts, String> {
        let (dir, opts) = options(rest, &["keep_s", "keep", "after_s"])?;
        let mut o = BurstOpts {
            dir: dir.into(),
            keep: Duration::from_secs(20),
            keep_bytes: 1 << 30,
            after: Duration::from_secs(10),
        };
        for (k, v) in opts {
            match k {
                "keep_s" => o.keep = seconds(k, v)?,
                "keep" => o.keep_bytes = size(k, v)?,
                _ => o.after = seconds(k, v)?,
            }
        }
        Ok(o)
    }
}

pub struct BurstSink {
    opts: BurstOpts,
    epn: u32,
    ring: VecDeque<(Instant, Arc<Vec<u8>>)>,
    ring_bytes: u64,
    triggers: Receiver<Instant>,
    /// Saving until this instant, into these files.
    saving: Option<(Instant, TfFiles)>,
    metrics: Arc<Metrics>,
}

impl BurstSink {
    pub fn open(opts: BurstOpts, ctx: &SinkCtx) -> anyhow::Result<BurstSink> {
        std::fs::create_dir_all(&opts.dir)
            .map_err(|e| anyhow::anyhow!("burst directory {}: {e}", opts.dir.display()))?;
        let (tx, triggers) = channel();
        let tx = Mutex::new(tx);
        let epn = ctx.epn;
        let trigger = move |_: &crate::metrics::Request| {
            let ok = tx.lock().unwrap().send(Instant::now()).is_ok();
            let reply = match ok {
                true => format!("EPN {epn}: burst saved from now\n"),
                false => format!("EPN {epn}: the run has ended; nothing saved\n"),
            };
            crate::metrics::Reply::ok(crate::metrics::TEXT, reply)
        };
        ctx.metrics.route("POST", "/trigger", Box::new(trigger));
        Ok(BurstSink {
            opts,
            epn,
            ring: VecDeque::new(),
            ring_bytes: 0,
            triggers,
            saving: None,
            metrics: ctx.metrics.clone(),
        })
    }

    /// Starts saving for each trigger that came; ends a save whose time is over.
    fn poll(&mut self, now: Instant) -> std::io::Result<()> {
        while let Ok(t) = self.triggers.try_recv() {
            self.metrics.stf("burst_trigger", "", 1);
            let until = t + self.opts.after;
            match self.saving.as_mut() {
                Some((u, _)) => *u = (*u).max(until),
                None => self.start_saving(t, until)?,
            }
        }
        if self.saving.as_ref().is_some_and(|(u, _)| now >= *u) {
            let (_, mut files) = self.saving.take().expect("saving");
            files.close()?;
        }
        Ok(())
    }

    fn start_saving(&mut self, t: Instant, until: Instant) -> std::io::Result<()> {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let opts = FileOpts {
            dir: self.opts.dir.clone(),
            rotate_bytes: u64::MAX,
            rotate_s: None,
            fsync: Fsync::Rotate,
        };
        let mut files = TfFiles::new(opts, &format!("burst-{unix_ms}-"), self.epn)
            .map_err(std::io::Error::other)?;
        let from = t.checked_sub(self.opts.keep).unwrap_or(t);
        for (_, rec) in self.ring.iter().filter(|(at, _)| *at >= from) {
            files.write_bytes(rec)?;
            self.metrics.stf("burst_saved", "", 1);
        }
        self.saving = Some((until, files));
        Ok(())
    }

    /// Keeps `rec` and forgets what is too old or over the byte limit.
    fn keep(&mut self, now: Instant, rec: Arc<Vec<u8>>) {
        self.ring_bytes += rec.len() as u64;
        self.ring.push_back((now, rec));
        let oldest = now.checked_sub(self.opts.keep);
        while let Some((at, r)) = self.ring.front() {
            let old = oldest.is_some_and(|o| *at < o);
            if !old && self.ring_bytes <= self.opts.keep_bytes {
                break;
            }
            self.ring_bytes -= r.len() as u64;
            self.ring.pop_front();
        }
        debug_assert!(self.ring_bytes <= self.opts.keep_bytes || self.ring.is_empty());
    }
}

impl Sink for BurstSink {
    fn accept(&mut self, tf: &TfView) -> Result<(), SinkError> {
        let now = Instant::now();
        let dir = self.opts.dir.display().to_string();
        let fail = |e: std::io::Error| SinkError::failed(format!("burst sink {dir}: {e}"));
        self.poll(now).map_err(fail)?;
        let rec = Arc::new(tf.record());
        if let Some((_, files)) = self.saving.as_mut() {
            files.write_bytes(&rec).map_err(fail)?;
            self.metrics.stf("burst_saved", "", 1);
        }
        self.keep(now, rec);
        Ok(())
    }

    fn idle(&mut self) {
        if let Err(e) = self.poll(Instant::now()) {
            tracing::error!(
                "EPN {}: burst sink {}: {e}",
                self.epn,
                self.opts.dir.display()
            );
            self.metrics.error("sink_failed");
        }
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if let Some((_, mut files)) = self.saving.take() {
            files.close()?;
        }
        Ok(())
    }
}
