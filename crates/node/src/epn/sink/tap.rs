//! The `tap:` sink: every k-th built TF to the monitoring clients connected to a TCP
//! port, as a stream of TF records. A slow client loses samples (counted), never TFs.
//!
//! Each client has its own queue bounded in bytes; the sink never waits for one.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use super::{number, options, size, Sink, SinkCtx, SinkError, TfView};
use crate::metrics::Metrics;

#[derive(Debug, Clone, PartialEq)]
pub struct TapOpts {
    pub addr: SocketAddr,
    /// One TF in `every` goes to the clients.
    pub every: u64,
    /// Bytes queued per client at most; beyond, samples are dropped for it.
    pub queue_bytes: u64,
}

impl TapOpts {
    pub(super) fn parse(rest: &str) -> Result<TapOpts, String> {
        // The address holds a colon: options start at the first comma.
        let (addr, opts) = options(rest, &["every", "queue"])?;
        let addr = addr
            .parse()
            .map_err(|_| format!("tap address `{addr}` is not IP:PORT"))?;
        let mut o = TapOpts {
            addr,
            every: 10,
            queue_bytes: 64 << 20,
        };
        for (k, v) in opts {
            match k {
                "every" => o.every = number(k, v)?,
                _ => o.queue_bytes = size(k, v)?,
            }
        }
        if o.every == 0 {
            return Err("every: must be at least 1".into());
        }
        Ok(o)
    }
}

/// Clients at once; more are closed at once (counted).
pub const MAX_CLIENTS: usize = 16;
/// A client that takes no byte for this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

struct Client {
    /// Shut down when the run ends, so a stuck client's writer thread ends too.
    sock: TcpStream,
    tx: SyncSender<Arc<Vec<u8>>>,
    queued: Arc<AtomicU64>,
    alive: Arc<AtomicBool>,
}

pub struct TapSink {
    opts: TapOpts,
    seen: u64,
    clients: Arc<Mutex<Vec<Client>>>,
    stop: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl TapSink {
    pub fn bind(opts: TapOpts, ctx: &SinkCtx) -> anyhow::Result<TapSink> {
        let l = TcpListener::bind(opts.addr).with_context(|| format!("tap bind {}", opts.addr))?;
        l.set_nonblocking(true)?;
        tracing::info!("EPN {}: tap on {}", ctx.epn, l.local_addr()?);
        let clients = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, epn, m) = (clients.clone(), stop.clone(), ctx.epn, ctx.metrics.clone());
        std::thread::spawn(move || accept_clients(l, c, s, epn, m));
        Ok(TapSink {
            opts,
            seen: 0,
            clients,
            stop,
            metrics: ctx.metrics.clone(),
        })
    }
}

impl Sink for TapSink {
    fn accept(&mut self, tf: &TfView) -> Result<(), SinkError> {
        self.seen += 1;
        if !self.seen.is_multiple_of(self.opts.every) {
            return Ok(());
        }
        let mut clients = self.clients.lock().unwrap();
        clients.retain(|c| c.alive.load(Ordering::Relaxed));
        if clients.is_empty() {
            return Ok(());
        }
        let rec = Arc::new(tf.record());
        let len = rec.len() as u64;
        for c in clients.iter() {
            let room = c.queued.load(Ordering::Relaxed) + len <= self.opts.queue_bytes;
            match room.then(|| c.tx.try_send(rec.clone())) {
                Some(Ok(())) => {
                    c.queued.fetch_add(len, Ordering::Relaxed);
                    self.metrics.stf("tap_sample", "sent", 1);
                }
                Some(Err(TrySendError::Disconnected(_))) => {}
                _ => self.metrics.stf("tap_sample", "client_slow", 1),
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients.lock().unwrap().drain(..) {
            let _ = c.sock.shutdown(std::net::Shutdown::Both);
        }
        Ok(())
    }
}

fn accept_clients(
    l: TcpListener,
    clients: Arc<Mutex<Vec<Client>>>,
    stop: Arc<AtomicBool>,
    epn: u32,
    metrics: Arc<Metrics>,
) {
    while !stop.load(Ordering::Relaxed) {
        match l.accept() {
            Ok((s, peer)) => {
                let mut all = clients.lock().unwrap();
                all.retain(|c| c.alive.load(Ordering::Relaxed));
                if all.len() >= MAX_CLIENTS {
                    metrics.error("tap_clients_full");
                    continue; // dropped: closed
                }
                tracing::info!("EPN {epn}: tap client {peer}");
                match client(s, epn) {
                    Ok(c) => all.push(c),
                    Err(e) => tracing::warn!("EPN {epn}: tap client {peer}: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                tracing::warn!("EPN {epn}: tap accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A client: its queue and the thread that writes it out (file header first).
fn client(mut s: TcpStream, epn: u32) -> std::io::Result<Client> {
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let sock = s.try_clone()?;
    let (tx, rx) = sync_channel::<Arc<Vec<u8>>>(1024);
    let queued = Arc::new(AtomicU64::new(0));
    let alive = Arc::new(AtomicBool::new(true));
    let (q, a) = (queued.clone(), alive.clone());
    std::thread::spawn(move || {
        let mut ok = s
            .write_all(&fanin_proto::tf_record::encode_file_header(epn))
            .is_ok();
        while ok {
            let Ok(rec) = rx.recv() else { break };
            ok = s.write_all(&rec).is_ok();
            q.fetch_sub(rec.len() as u64, Ordering::Relaxed);
        }
        a.store(false, Ordering::Relaxed);
    });
    Ok(Client {
        sock,
        tx,
        queued,
        alive,
    })
}
