//! EPN sinks: where built TFs go (processing command, plug-in, file writer, burst saver,
//! monitoring tap). One thread runs them in turn and returns each TF's verdict.
//!
//! Specs are parsed once, at the edge (`SinkSpec::from_str`); docs/sinks.md lists them.

mod burst;
mod exec;
mod file;
mod pipe;
mod plugin;
mod tap;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context;
use fanin_proto::tf_record::TF_HEADER_LEN;
use fanin_proto::Reason;
use fanin_sched::{EpnId, FlpId, TfId};
use tokio::sync::mpsc;

use super::builder::Built;
use super::receiver::BuildEvent;
use crate::admission::LogLimit;
use crate::metrics::Metrics;

pub use burst::BurstOpts;
pub use exec::OnFailure;
pub use file::{FileOpts, Fsync};
pub use tap::TapOpts;

/// One sink as given on the command line or in an experiment file.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkSpec {
    /// `exec:CMD`: TF records to the stdin of `sh -c CMD`.
    Exec { cmd: String },
    /// `plugin:LIB.so[,ARG...]`: the C ABI of examples/plugin/fanin_sink.h.
    Plugin { lib: PathBuf, args: Vec<String> },
    /// `file:DIR[,rotate=SIZE][,rotate_s=S][,fsync=never|rotate|every]`.
    File(FileOpts),
    /// `burst:DIR[,keep_s=S][,keep=SIZE][,after_s=S]`.
    Burst(BurstOpts),
    /// `tap:ADDR[,every=K][,queue=SIZE]`.
    Tap(TapOpts),
}

impl FromStr for SinkSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, rest) = s.split_once(':').ok_or_else(|| {
            format!("sink `{s}`: expected KIND:ARG (exec, plugin, file, burst, tap)")
        })?;
        let err = |e: String| format!("sink `{s}`: {e}");
        match kind {
            "exec" if !rest.trim().is_empty() => Ok(SinkSpec::Exec { cmd: rest.into() }),
            "exec" => Err(err("exec needs a command".into())),
            "plugin" => {
                let mut parts = rest.split(',').map(str::to_string);
                let lib = PathBuf::from(parts.next().unwrap_or_default());
                if lib.as_os_str().is_empty() {
                    return Err(err("plugin needs a library path".into()));
                }
                Ok(SinkSpec::Plugin {
                    lib,
                    args: parts.collect(),
                })
            }
            "file" => FileOpts::parse(rest).map(SinkSpec::File).map_err(err),
            "burst" => BurstOpts::parse(rest).map(SinkSpec::Burst).map_err(err),
            "tap" => TapOpts::parse(rest).map(SinkSpec::Tap).map_err(err),
            _ => Err(format!(
                "sink `{s}`: unknown kind `{kind}` (exec, plugin, file, burst, tap)"
            )),
        }
    }
}

/// A spec's `key=value` options.
type Options<'a> = Vec<(&'a str, &'a str)>;

/// `PATH[,key=value...]`: the path and the options, each key known to the caller.
fn options<'a>(rest: &'a str, known: &[&str]) -> Result<(&'a str, Options<'a>), String> {
    let mut parts = rest.split(',');
    let head = parts.next().unwrap_or_default();
    if head.is_empty() {
        return Err("needs a path or address before the options".into());
    }
    let mut opts = Vec::new();
    for p in parts {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| format!("option `{p}` is not key=value"))?;
        if !known.contains(&k) {
            return Err(format!(
                "unknown option `{k}` (known: {})",
                known.join(", ")
            ));
        }
        opts.push((k, v));
    }
    Ok((head, opts))
}

fn number<T: FromStr>(k: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{k}: `{v}` is not a number"))
}

fn seconds(k: &str, v: &str) -> Result<std::time::Duration, String> {
    let s: f64 = number(k, v)?;
    std::time::Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero() && d.as_secs() <= 86_400)
        .ok_or_else(|| format!("{k}: {v} is not within (0, 86400] seconds"))
}

fn size(k: &str, v: &str) -> Result<u64, String> {
    fanin_sched::workload::parse_bytes(v).map_err(|e| format!("{k}: {e}"))
}

/// A built TF as the sinks see it, with its record headers encoded once (every sink
/// shares them, so each payload's CRC is computed once per TF, not once per sink).
pub struct TfView<'a> {
    pub run_id: u64,
    pub epn: EpnId,
    pub tf: TfId,
    pub stfs: &'a [(FlpId, Vec<u8>)],
    pub bytes: u64,
    /// The TF header, then one STF header per STF (docs/sinks.md).
    heads: Vec<u8>,
}

impl<'a> TfView<'a> {
    pub fn new(run_id: u64, epn: EpnId, tf: TfId, stfs: &'a [(FlpId, Vec<u8>)]) -> Self {
        // Records hold STFs in FLP order, each FLP once: readers refuse anything else.
        debug_assert!(
            stfs.windows(2).all(|w| w[0].0 < w[1].0),
            "STFs in FLP order"
        );
        use fanin_proto::tf_record::{StfRecordHeader, TfHeader, STF_RECORD_HEADER_LEN};
        let len = TF_HEADER_LEN + stfs.len() * STF_RECORD_HEADER_LEN;
        let mut heads = Vec::with_capacity(len);
        let stf_count = stfs.len() as u32;
        heads.extend_from_slice(
            &TfHeader {
                run_id,
                tf_id: tf,
                stfs: stf_count,
            }
            .encode(),
        );
        for (flp, p) in stfs {
            heads.extend_from_slice(&StfRecordHeader::of(*flp, p).encode());
        }
        let bytes = stfs.iter().map(|(_, p)| p.len() as u64).sum();
        TfView {
            run_id,
            epn,
            tf,
            stfs,
            bytes,
            heads,
        }
    }

    /// The record as slices, in order: TF header, then per STF its header and payload.
    pub fn slices(&self) -> Vec<&[u8]> {
        use fanin_proto::tf_record::STF_RECORD_HEADER_LEN;
        let mut v = Vec::with_capacity(1 + 2 * self.stfs.len());
        v.push(&self.heads[..TF_HEADER_LEN]);
        let stf_heads = self.heads[TF_HEADER_LEN..].chunks(STF_RECORD_HEADER_LEN);
        for (h, (_, p)) in stf_heads.zip(self.stfs) {
            v.push(h);
            v.push(p.as_slice());
        }
        v
    }

    /// Bytes of the record.
    pub fn record_len(&self) -> u64 {
        self.heads.len() as u64 + self.bytes
    }

    /// The whole record in one buffer (tap, burst ring).
    pub fn record(&self) -> Vec<u8> {
        self.slices().concat()
    }

    /// Writes the record (no copy of the payloads).
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        self.slices().into_iter().try_for_each(|s| w.write_all(s))
    }
}

/// Why a sink did not take a TF.
#[derive(Debug)]
pub struct SinkError {
    /// `sink_failed` (the sink broke) or `sink_refused` (it said no).
    pub reason: Reason,
    pub msg: String,
    /// The EPN must leave the run (`--on-sink-failure leave`, or no recovery).
    pub fatal: bool,
}

impl SinkError {
    fn failed(msg: String) -> Self {
        SinkError {
            reason: Reason::SinkFailed,
            msg,
            fatal: false,
        }
    }
}

pub trait Sink: Send {
    /// Takes one TF; Ok once it holds or passed on everything it needs of it.
    fn accept(&mut self, tf: &TfView) -> Result<(), SinkError>;
    /// Time passed without a TF (the burst saver and the file sink close their files).
    fn idle(&mut self) {}
    /// Run end: flush, close, wait for children.
    fn finish(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// What the sinks of one run share.
pub struct SinkCtx {
    pub run_id: u64,
    pub epn: EpnId,
    pub metrics: Arc<Metrics>,
    pub on_failure: OnFailure,
    /// Exec sinks lend payload pages (vmsplice) instead of writing them.
    pub exec_zero_copy: bool,
    /// Bumped for each TF the sinks return and each sink finished: the EPN's stop
    /// watchdog tells slow sinks from stuck ones by it.
    pub progress: Arc<std::sync::atomic::AtomicU64>,
}

impl SinkCtx {
    /// Run 1 of EPN `epn`, sinks restarted on failure (the sinks' tests).
    #[cfg(test)]
    pub(crate) fn for_tests(epn: EpnId) -> SinkCtx {
        SinkCtx {
            run_id: 1,
            epn,
            metrics: Metrics::new("epn", Some(epn)),
            on_failure: OnFailure::Restart,
            exec_zero_copy: false,
            progress: Default::default(),
        }
    }
}

/// The sink thread of one run: built TFs in, verdicts back to the build task.
pub struct Sinks {
    tx: Option<std::sync::mpsc::Sender<Built<Vec<u8>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sinks {
    /// Starts the sink thread, which opens every sink (commands started, libraries
    /// loaded and initialised, ports bound) before it takes a TF: every plug-in call
    /// happens on that one thread. An error names the sink. The opening is awaited, so a
    /// slow plug-in does not hold up the EPN's other tasks.
    pub async fn start(
        specs: &[SinkSpec],
        ctx: SinkCtx,
        verdicts: mpsc::Sender<BuildEvent>,
    ) -> anyhow::Result<Sinks> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let specs = specs.to_vec();
        let thread = std::thread::Builder::new()
            .name(format!("epn{}-sinks", ctx.epn))
            .spawn(move || {
                let sinks = match open(&specs, &ctx) {
                    Ok(s) => s,
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                let _ = ready_tx.send(Ok(()));
                guarded(sinks, ctx, rx, verdicts)
            })
            .context("starting the sink thread")?;
        match ready.await {
            Ok(Ok(())) => Ok(Sinks {
                tx: Some(tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => anyhow::bail!("the sink thread died while opening its sinks"),
        }
    }

    /// Hands a TF on; its verdict comes back as `BuildEvent::Delivered`. The bytes it
    /// holds stay charged to the build buffer until then, which bounds this queue.
    /// False when the sink thread is gone (the EPN must leave: the TF has no verdict).
    pub fn send(&self, b: Built<Vec<u8>>) -> bool {
        let tx = self.tx.as_ref().expect("open until closed");
        tx.send(b).is_ok()
    }

    /// Closes the queue and waits until every sink finished its files and commands.
    pub fn close(mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Sinks {
    /// Dropped without `close` (the run was cut short): the sinks finish on their own
    /// thread; nobody waits for them here.
    fn drop(&mut self) {
        drop(self.tx.take());
    }
}

fn open(specs: &[SinkSpec], ctx: &SinkCtx) -> anyhow::Result<Vec<Box<dyn Sink>>> {
    let filtered = specs.iter().find_map(|s| match s {
        SinkSpec::File(f) => Some(f.dir.clone()),
        _ => None,
    });
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    for spec in specs {
        let sink: Box<dyn Sink> = match spec {
            SinkSpec::Exec { cmd } => Box::new(exec::ExecSink::start(cmd, ctx, filtered.clone())?),
            SinkSpec::Plugin { lib, args } => Box::new(plugin::PluginSink::load(lib, args, ctx)?),
            SinkSpec::File(o) => Box::new(file::FileSink::open(o.clone(), ctx)?),
            SinkSpec::Burst(o) => Box::new(burst::BurstSink::open(o.clone(), ctx)?),
            SinkSpec::Tap(o) => Box::new(tap::TapSink::bind(o.clone(), ctx)?),
        };
        sinks.push(sink);
    }
    Ok(sinks)
}

/// The sink loop; a panic in a sink becomes a fatal sink error, so the EPN leaves
/// instead of waiting for verdicts that never come.
fn guarded(
    sinks: Vec<Box<dyn Sink>>,
    ctx: SinkCtx,
    rx: std::sync::mpsc::Receiver<Built<Vec<u8>>>,
    verdicts: mpsc::Sender<BuildEvent>,
) {
    let v = verdicts.clone();
    let run = std::panic::AssertUnwindSafe(move || sink_thread(sinks, ctx, rx, v));
    if std::panic::catch_unwind(run).is_err() {
        let _ = verdicts.blocking_send(BuildEvent::SinkFatal("a sink panicked".into()));
    }
}

fn sink_thread(
    mut sinks: Vec<Box<dyn Sink>>,
    ctx: SinkCtx,
    rx: std::sync::mpsc::Receiver<Built<Vec<u8>>>,
    verdicts: mpsc::Sender<BuildEvent>,
) {
    let log = LogLimit::new(10);
    let tick = std::time::Duration::from_millis(100);
    loop {
        let b = match rx.recv_timeout(tick) {
            Ok(b) => b,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                sinks.iter_mut().for_each(|s| s.idle());
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let (outcome, fatal) = run_sinks(&mut sinks, &ctx, &b, &log);
        let ev = BuildEvent::Delivered {
            tf: b.tf,
            outcome,
            stfs: b.stfs,
        };
        if verdicts.blocking_send(ev).is_err() {
            break;
        }
        ctx.progress
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(msg) = fatal {
            let _ = verdicts.blocking_send(BuildEvent::SinkFatal(msg));
            break;
        }
    }
    for s in sinks.iter_mut() {
        if let Err(e) = s.finish() {
            tracing::error!("EPN {}: sink: {e:#}", ctx.epn);
            ctx.metrics.error("sink_finish");
        }
        ctx.progress
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Every sink takes the TF in turn; the first refusal or failure is its verdict.
fn run_sinks(
    sinks: &mut [Box<dyn Sink>],
    ctx: &SinkCtx,
    b: &Built<Vec<u8>>,
    log: &LogLimit,
) -> (Result<(), Reason>, Option<String>) {
    let view = TfView::new(ctx.run_id, ctx.epn, b.tf, &b.stfs);
    let (mut outcome, mut fatal) = (Ok(()), None);
    for s in sinks.iter_mut() {
        if let Err(e) = s.accept(&view) {
            let epn = ctx.epn;
            log.warn(|| format!("EPN {epn}: TF {}: {} ({})", b.tf, e.msg, e.reason.name()));
            ctx.metrics.error(e.reason.name());
            outcome = outcome.and(Err(e.reason));
            if e.fatal {
                fatal = Some(e.msg);
            }
        }
    }
    (outcome, fatal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_views_record_is_the_documented_encoding() {
        let stfs: Vec<(u32, Vec<u8>)> = vec![(0, b"abc".to_vec()), (1, vec![])];
        let v = TfView::new(7, 2, 42, &stfs);
        let h = fanin_proto::tf_record::TfHeader {
            run_id: 7,
            tf_id: 42,
            stfs: 2,
        };
        let want = fanin_proto::tf_record::encode_record(h, &[(0, b"abc"), (1, b"")]);
        assert_eq!(v.record(), want);
        assert_eq!(v.record_len(), want.len() as u64);
    }

    #[test]
    fn specs_parse_with_their_options_and_errors_name_the_field() {
        let f: SinkSpec = "file:/tmp/x,rotate=1MiB,fsync=every".parse().unwrap();
        let SinkSpec::File(o) = f else { panic!() };
        assert_eq!((o.rotate_bytes, o.fsync), (1 << 20, Fsync::Every));
        assert_eq!(
            "exec:cat > /dev/null".parse::<SinkSpec>(),
            Ok(SinkSpec::Exec {
                cmd: "cat > /dev/null".into()
            })
        );
        let e = "file:/tmp/x,rotat=1".parse::<SinkSpec>().unwrap_err();
        assert!(e.contains("unknown option `rotat`"), "{e}");
        let e = "tap:127.0.0.1:0,every=0".parse::<SinkSpec>().unwrap_err();
        assert!(e.contains("every"), "{e}");
        let e = "burst:/tmp/b,keep_s=-1".parse::<SinkSpec>().unwrap_err();
        assert!(e.contains("keep_s"), "{e}");
        assert!("mail:me"
            .parse::<SinkSpec>()
            .unwrap_err()
            .contains("unknown kind"));
        let p: SinkSpec = "plugin:./libx.so,a,b".parse().unwrap();
        assert_eq!(
            p,
            SinkSpec::Plugin {
                lib: "./libx.so".into(),
                args: vec!["a".into(), "b".into()]
            }
        );
    }
}
