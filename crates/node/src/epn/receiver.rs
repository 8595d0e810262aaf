//! EPN data connections: the DataHello handshake, then STF frames read straight into
//! pooled buffers under the build-buffer limit. A bad FLP connection is closed alone.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use fanin_proto::{Message, Nonce, Proof, Reason, RejectCode, StfHeader, STF_HEADER_LEN};
use fanin_sched::{EpnId, FlpId, TfId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::admission::{Admission, Ticket};

use super::lowat::RecvLowat;
use crate::budget::ByteBudget;
use crate::conn::{read_exact_or_eof, read_header, ConnError};
use crate::metrics::{BufferGauge, Metrics};

/// What data connections and the control connection tell the builder task.
pub enum BuildEvent {
    Stf {
        tf: TfId,
        flp: FlpId,
        target: EpnId,
        payload: Vec<u8>,
    },
    Lost {
        tf: TfId,
        flp: FlpId,
        reason: Reason,
    },
    /// FLP `flp` has no data connection here any more (its last one ended, not replaced):
    /// what it wrote into one that was reset may be lost without a word.
    FlpGone { flp: FlpId },
    /// A frame from the ICN (the control loop forwards them all).
    Control(Message),
    /// The sinks' verdict on a built TF, with its buffers back.
    Delivered {
        tf: TfId,
        outcome: Result<(), Reason>,
        stfs: Vec<(FlpId, Vec<u8>)>,
    },
    /// A sink cannot go on: the EPN leaves the run.
    SinkFatal(String),
    /// An ICN took the run over: what the EPN holds (TFs building, unreleased reports).
    Held(tokio::sync::oneshot::Sender<(Vec<TfId>, Vec<fanin_proto::TfReport>)>),
}

/// What a payload buffer may hold beyond twice the bytes charged for it.
const SLACK: usize = 4096;

/// Reusable payload buffers. Idle buffers are kept only while held + idle bytes stay
/// within the build-buffer limit, so the limit bounds the EPN's payload memory (a held
/// buffer's capacity is at most twice, and `SLACK`, the bytes charged for it).
pub struct BufPool {
    free: Mutex<(Vec<Vec<u8>>, u64)>,
    budget: Arc<ByteBudget>,
}

impl BufPool {
    pub fn new(budget: Arc<ByteBudget>) -> Self {
        BufPool {
            free: Mutex::new((Vec::new(), 0)),
            budget,
        }
    }

    /// A buffer of `n` bytes. The budget charges `n`, so its capacity stays within twice
    /// that: a pooled buffer larger is shrunk (a small STF must not pin a large
    /// allocation); one too small grows as a `Vec` does (at most doubling, so to less
    /// than `2n`). Equal STF sizes, the common case, reuse buffers as they are; with
    /// mixed sizes one of the newest that fits is taken before any is shrunk.
    pub fn take(&self, n: usize) -> Vec<u8> {
        /// Free buffers looked at for one that fits (a bounded cost per STF).
        const FIT_SCAN: usize = 16;
        let mut v = {
            let mut g = self.free.lock().unwrap();
            // Among the newest few, one that fits as it is (with mixed sizes, no shrink
            // and regrow per STF), else the newest.
            let fits = |v: &&Vec<u8>| (n..=2 * n + SLACK).contains(&v.capacity());
            let last = g.0.len().checked_sub(1);
            let fit = g.0.iter().rev().take(FIT_SCAN).position(|v| fits(&v));
            let at = fit.map(|k| g.0.len() - 1 - k).or(last);
            match at.map(|i| g.0.swap_remove(i)) {
                Some(v) => {
                    g.1 -= v.capacity() as u64;
                    v
                }
                None => Vec::new(),
            }
        };
        if v.capacity() > 2 * n + SLACK {
            v.truncate(n);
            v.shrink_to(n);
        }
        v.resize(n, 0);
        debug_assert!(v.capacity() <= 2 * n + SLACK);
        v
    }

    /// Call after the buffer's bytes went back to the budget.
    pub fn put(&self, v: Vec<u8>) {
        let mut g = self.free.lock().unwrap();
        let cap = v.capacity() as u64;
        if g.1 + cap + self.budget.used() <= self.budget.limit() {
            g.0.push(v);
            g.1 += cap;
        }
    }
}

/// Shared by all data connections of one EPN.
pub struct DataCtx {
    pub me: EpnId,
    pub run_id: u64,
    pub flps: u32,
    pub max_stf: u64,
    pub budget: Arc<ByteBudget>,
    pub pool: Arc<BufPool>,
    pub builder: mpsc::Sender<BuildEvent>,
    pub metrics: Arc<Metrics>,
    /// Each FLP's data connection: its number, and the switch that closes it when a newer
    /// one of the same FLP proves itself.
    pub connected: Mutex<HashMap<FlpId, (u64, tokio::sync::oneshot::Sender<()>)>>,
    /// The run secret each FLP proves in its DataHello.
    pub secret: crate::auth::Secret,
    /// Connections still in their handshake.
    pub admission: Arc<Admission>,
}

pub async fn accept_loop(listener: Arc<TcpListener>, ctx: Arc<DataCtx>) {
    // One connection per FLP once proven; the proving ones share the admission pool.
    let members = Arc::new(tokio::sync::Semaphore::new(ctx.flps as usize * 2 + 4));
    let what = format!("EPN {} data port", ctx.me);
    loop {
        let (s, peer, ticket) = ctx.admission.accept(&listener, &what, &ctx.metrics).await;
        let (ctx, members) = (ctx.clone(), members.clone());
        tokio::spawn(async move {
            if let Err(e) = serve_flp(s, peer, ticket, &members, &ctx).await {
                let me = ctx.me;
                ctx.admission
                    .log
                    .warn(|| format!("EPN {me}: data peer {peer}: {e}; closing"));
            }
        });
    }
}

#[derive(Debug, thiserror::Error)]
enum DataError {
    #[error("{0}")]
    Conn(#[from] ConnError),
    #[error("{0}")]
    Peer(String),
}

impl DataError {
    fn kind(&self) -> &'static str {
        match self {
            DataError::Conn(c) => c.kind(),
            DataError::Peer(_) => "bad_peer",
        }
    }
}

/// Why a DataHello is refused, or `None`: it proves the secret for this run and names an
/// FLP of the run.
fn refusal(
    ctx: &DataCtx,
    nonce: &Nonce,
    hello: (u64, FlpId, &Proof),
) -> Option<(RejectCode, String)> {
    let (run_id, flp_id, proof) = hello;
    if !ctx.secret.check_data(nonce, run_id, flp_id, proof) {
        let why = "wrong run secret (--secret-file / FANIN_SECRET)".to_string();
        Some((RejectCode::BadProof, why))
    } else if run_id != ctx.run_id {
        let why = format!("DataHello for run {run_id}, this EPN runs {}", ctx.run_id);
        Some((RejectCode::WrongRun, why))
    } else if flp_id >= ctx.flps {
        let why = format!("unknown FLP id {flp_id} (run has FLPs 0..{})", ctx.flps);
        Some((RejectCode::UnknownId, why))
    } else {
        None
    }
}

/// A proven FLP's connection from now on. An older one of the same FLP is closed: only a
/// member of the run proves the secret, and one restarted after its host died would
/// otherwise be kept out by a connection nobody will ever close (no byte comes on it).
fn claim(ctx: &DataCtx, flp: FlpId, conn: u64) -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Some((_, older)) = ctx.connected.lock().unwrap().insert(flp, (conn, tx)) {
        let _ = older.send(());
        let me = ctx.me;
        tracing::warn!("EPN {me}: FLP {flp} connected again; its older data connection is closed");
        ctx.metrics.error("data_connection_replaced");
    }
    rx
}

/// The connection `conn` of `flp` ended: it is no longer the FLP's, and unless a newer
/// one replaced it, the builder hears that the FLP has none here now.
async fn unclaim(ctx: &DataCtx, flp: FlpId, conn: u64) {
    let gone = {
        let mut connected = ctx.connected.lock().unwrap();
        let current = connected.get(&flp).is_some_and(|(c, _)| *c == conn);
        current && connected.remove(&flp).is_some()
    };
    if gone {
        send(ctx, BuildEvent::FlpGone { flp }).await;
    }
}

/// Challenge out, a DataHello that proves the run secret back, within the deadline and
/// unless a newcomer evicts this connection first. The FLP's id, or why not.
async fn handshake<R: AsyncRead + Unpin>(
    rd: &mut R,
    wr: &mut OwnedWriteHalf,
    ticket: &mut Ticket,
    ctx: &DataCtx,
) -> Result<Option<FlpId>, String> {
    let (nonce, hello) = match ticket.challenge(rd, wr).await {
        Ok(x) => x,
        Err(s) => {
            ctx.metrics.error(s.kind);
            return Err(s.why);
        }
    };
    match hello {
        Some(Message::DataHello {
            run_id,
            flp_id,
            proof,
        }) => match refusal(ctx, &nonce, (run_id, flp_id, &proof)) {
            None => Ok(Some(flp_id)),
            Some((code, reason)) => {
                ctx.metrics.error(if code == RejectCode::BadProof {
                    "bad_proof"
                } else {
                    "rejected"
                });
                let reject = Message::Reject {
                    code,
                    reason: reason.clone(),
                };
                let _ = wr.write_all(&reject.encode()).await;
                Err(reason)
            }
        },
        None => Ok(None),
        Some(other) => {
            ctx.metrics.error("unexpected_message");
            Err(format!("expected DataHello, got {:?}", other.msg_type()))
        }
    }
}

/// The data connection's read buffer. Small on purpose: a payload read with the buffer
/// empty goes straight into its pooled buffer, so only the bytes read with a header and
/// a tail shorter than the buffer (under 16 KiB of each STF) are copied twice (`fanin bench transport`: 256 KiB here doubled the EPN's copying
/// for STFs below that size).
const RECV_BUFFER: usize = 8 * 1024;

async fn serve_flp(
    stream: TcpStream,
    peer: SocketAddr,
    mut ticket: Ticket,
    members: &Arc<tokio::sync::Semaphore>,
    ctx: &DataCtx,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    // The EPN never writes on a data connection, so only probes find an FLP whose host
    // died mid-STF (no FIN, no RST): without them the reader would hold the STF's
    // reservation, its place and the FLP's claim (no FlpGone) for good.
    crate::conn::keepalive(&stream, crate::conn::KEEPALIVE_IDLE);
    let mut lowat = RecvLowat::new(stream.as_raw_fd());
    let (mut rd, mut wr) = stream.into_split();
    // No read buffer until the FLP proved itself: a stranger holds a socket, no more
    // (the handshake reads exactly its frame, so nothing after it is lost).
    let Some(flp) = handshake(&mut rd, &mut wr, &mut ticket, ctx).await? else {
        return Ok(()); // connected and left without a word
    };
    let mut rd = BufReader::with_capacity(RECV_BUFFER, rd);
    let conn = ticket.id();
    drop(ticket);
    let Ok(_member) = members.clone().try_acquire_owned() else {
        ctx.metrics.error("too_many_connections");
        return Err(format!("FLP {flp}: every data connection place is taken"));
    };
    let mut replaced = claim(ctx, flp, conn);
    if let Err(e) = wr
        .write_all(&Message::DataHelloAck { epn_id: ctx.me }.encode())
        .await
    {
        unclaim(ctx, flp, conn).await;
        return Err(e.to_string());
    }
    tracing::debug!("EPN {}: FLP {flp} connected from {peer}", ctx.me);
    let res = read_stfs(&mut rd, &mut lowat, (flp, &mut replaced), ctx).await;
    unclaim(ctx, flp, conn).await;
    match res {
        Ok(()) => Ok(()),
        Err(e) => {
            ctx.metrics.error(e.kind());
            Err(format!("FLP {flp}: {e}"))
        }
    }
}

/// Bytes of STFs a connection's reader hands on before it lets other tasks run.
const YIELD_AFTER_BYTES: u64 = 256 << 10;

/// Reads STFs until the FLP closes the connection, or a newer connection of the same FLP
/// proved itself (`replaced`: checked while reading, never while handing an STF on).
async fn read_stfs<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    lowat: &mut RecvLowat,
    (flp, replaced): (FlpId, &mut tokio::sync::oneshot::Receiver<()>),
    ctx: &DataCtx,
) -> Result<(), DataError> {
    let max_body = (STF_HEADER_LEN as u64 + ctx.max_stf).min(u32::MAX as u64) as u32;
    let mut scratch = vec![0u8; 64 * 1024];
    let mut unyielded = 0u64;
    let received = ctx.metrics.stf_counter("received", "received");
    let build = ctx.metrics.buffer_gauge("epn_build");
    while let Some((sh, n)) = unless(replaced, read_stf_header(rd, flp, ctx, max_body)).await? {
        ctx.metrics.count_stf(&received, n as u64);
        let ev = if ctx.budget.try_reserve(n as u64) {
            let reserved = Reserved(&ctx.budget, n as u64);
            let keep = keep_stf(rd, lowat, &build, (flp, ctx), &sh, reserved);
            unless(replaced, keep).await?
        } else {
            // Build buffer full: the named policy is to drop the TF, reading the bytes away.
            let read_away = async {
                let mut left = n;
                while left > 0 {
                    let k = left.min(scratch.len());
                    rd.read_exact(&mut scratch[..k])
                        .await
                        .map_err(ConnError::from)?;
                    left -= k;
                }
                Ok(())
            };
            unless(replaced, read_away).await?;
            ctx.metrics.stf("dropped", Reason::EpnBufferFull.name(), 1);
            BuildEvent::Lost {
                tf: sh.tf_id,
                flp,
                reason: Reason::EpnBufferFull,
            }
        };
        send(ctx, ev).await;
        // Let the builder take what was read before reading on: on one thread it would
        // otherwise run only when the socket ran dry, the channel filled or tokio's budget
        // ran out, holding dozens of STFs meanwhile. Not after every small STF: a yield
        // with nothing else to run costs a poll of the driver (an epoll_wait).
        unyielded += n as u64;
        if unyielded >= YIELD_AFTER_BYTES {
            unyielded = 0;
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// A read of the connection, unless a newer connection of the same FLP proves itself
/// first (the read is then dropped; a payload's reservation goes back with `Reserved`).
async fn unless<T>(
    replaced: &mut tokio::sync::oneshot::Receiver<()>,
    read: impl std::future::Future<Output = Result<T, DataError>>,
) -> Result<T, DataError> {
    tokio::select! {
        r = read => r,
        _ = replaced => Err(DataError::Peer("a newer connection of this FLP proved itself".into())),
    }
}

/// Bytes reserved in the build buffer for one payload: given back when dropped (a read
/// that failed or was cut short, a bad CRC) unless handed on with the payload.
struct Reserved<'a>(&'a ByteBudget, u64);

impl Reserved<'_> {
    /// The payload goes on to the builder, which gives the bytes back once it is done.
    fn hand_on(self) {
        std::mem::forget(self);
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// The next STF's header and payload length, checked against the connection's FLP and
/// run; None at a clean end of the connection.
async fn read_stf_header<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    flp: FlpId,
    ctx: &DataCtx,
    max_body: u32,
) -> Result<Option<(StfHeader, usize)>, DataError> {
    let Some(h) = read_header(rd, max_body).await? else {
        return Ok(None);
    };
    if h.msg_type != fanin_proto::MsgType::Stf as u8 {
        return Err(DataError::Peer(format!(
            "message type {} on a data connection (only STF frames belong here)",
            h.msg_type
        )));
    }
    if (h.length as usize) < STF_HEADER_LEN {
        return Err(DataError::Peer(format!(
            "STF frame length {} is shorter than its {STF_HEADER_LEN}-byte STF header",
            h.length
        )));
    }
    let mut hb = [0u8; STF_HEADER_LEN];
    if !read_exact_or_eof(rd, &mut hb).await? {
        return Err(ConnError::Eof.into());
    }
    let sh = StfHeader::decode(&hb).map_err(ConnError::from)?;
    let n = h.length as usize - STF_HEADER_LEN;
    if sh.payload_len as usize != n {
        let e = fanin_proto::DecodeError::PayloadLength {
            declared: sh.payload_len,
            actual: n,
        };
        return Err(ConnError::from(e).into());
    }
    if sh.flp_id != flp || sh.run_id != ctx.run_id {
        return Err(DataError::Peer(format!(
            "STF header says FLP {} run {}, connection is FLP {flp} run {}",
            sh.flp_id, sh.run_id, ctx.run_id
        )));
    }
    Ok(Some((sh, n)))
}

/// Reads a payload whose `n` bytes are reserved in the build buffer into a pooled
/// buffer; a bad CRC gives the bytes back and the STF is lost (`crc_error`).
async fn keep_stf<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    lowat: &mut RecvLowat,
    build: &BufferGauge,
    (flp, ctx): (FlpId, &DataCtx),
    sh: &StfHeader,
    reserved: Reserved<'_>,
) -> Result<BuildEvent, DataError> {
    let n = reserved.1 as usize;
    let mut buf = ctx.pool.take(n);
    let read = read_payload(rd, lowat, &mut buf).await;
    if !matches!(read, Ok(true)) && n > 0 {
        // The FLP went away mid-STF: give the bytes back before leaving.
        drop(reserved);
        ctx.pool.put(buf);
        return Err(read.err().unwrap_or(ConnError::Eof).into());
    }
    build.set(ctx.budget.used(), ctx.budget.limit());
    if sh.crc.is_some_and(|crc| crc32c::crc32c(&buf) != crc) {
        drop(reserved);
        ctx.pool.put(buf);
        ctx.metrics.stf("crc_error", "", 1);
        let (me, tf) = (ctx.me, sh.tf_id);
        tracing::warn!("EPN {me}: CRC mismatch in STF of TF {tf} from FLP {flp}");
        return Ok(BuildEvent::Lost {
            tf,
            flp,
            reason: Reason::CrcError,
        });
    }
    reserved.hand_on();
    Ok(BuildEvent::Stf {
        tf: sh.tf_id,
        flp,
        target: sh.epn_id,
        payload: buf,
    })
}

/// Fills `buf` with a payload, telling the kernel how many bytes are still owed before
/// each wait; Ok(false) if the connection closed before the first byte.
async fn read_payload<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    lowat: &mut RecvLowat,
    buf: &mut [u8],
) -> Result<bool, ConnError> {
    let mut got = 0;
    while got < buf.len() {
        lowat.expect(buf.len() - got - rd.buffer().len().min(buf.len() - got))?;
        let n = rd.read(&mut buf[got..]).await?;
        if n == 0 {
            lowat.expect(0)?;
            return if got == 0 {
                Ok(false)
            } else {
                Err(ConnError::Eof)
            };
        }
        got += n;
    }
    lowat.expect(0)?;
    Ok(true)
}

async fn send(ctx: &DataCtx, ev: BuildEvent) {
    // The builder only stops at run end; after that, STFs have nowhere to go.
    let _ = ctx.builder.send(ev).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data context for EPN 0 of run 1 with 2 FLPs, and its builder's events.
    fn data_ctx(secret: &crate::auth::Secret) -> (Arc<DataCtx>, mpsc::Receiver<BuildEvent>) {
        let budget = Arc::new(ByteBudget::new(1 << 20));
        let (builder, events) = mpsc::channel(16);
        let ctx = Arc::new(DataCtx {
            me: 0,
            run_id: 1,
            flps: 2,
            max_stf: 1 << 16,
            pool: Arc::new(BufPool::new(budget.clone())),
            budget,
            builder,
            metrics: Metrics::new("epn", Some(0)),
            connected: Default::default(),
            secret: secret.clone(),
            admission: Admission::new(2),
        });
        (ctx, events)
    }

    /// A frame too short for its STF header is named as such, not taken for a close.
    #[tokio::test]
    async fn an_stf_frame_shorter_than_its_header_is_named() {
        use tokio::io::AsyncWriteExt;
        let (ctx, _events) = data_ctx(&crate::auth::Secret::new(b"run secret"));
        let (mut epn, mut flp) = tokio::io::duplex(1024);
        let h = fanin_proto::FrameHeader {
            msg_type: fanin_proto::MsgType::Stf as u8,
            length: 10,
        };
        flp.write_all(&h.encode()).await.unwrap();
        flp.write_all(&[0u8; 10]).await.unwrap();
        let e = read_stf_header(&mut epn, 0, &ctx, 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "bad_peer");
        assert!(e.to_string().contains("STF frame length 10"), "{e}");
    }

    /// FLP 0 connects to an EPN, then (restarted after its host died, say) again while
    /// the first connection is still open: the newer one is taken, the older closed.
    /// Only when the newer ends too does the builder hear that FLP 0 has none.
    #[tokio::test]
    async fn a_newer_proven_connection_of_an_flp_replaces_the_older() {
        let secret = crate::auth::Secret::new(b"run secret");
        let (ctx, mut events) = data_ctx(&secret);
        let metrics = ctx.metrics.clone();
        let listener = Arc::new(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let at = listener.local_addr().unwrap();
        tokio::spawn(accept_loop(listener, ctx));
        let flp = crate::flp::sender::SendCtx {
            me: 0,
            run_id: 1,
            crc: false,
            pattern: crate::flp::payload::Pattern::new(1, 0),
            metrics: metrics.clone(),
            secret,
        };
        let connect = crate::flp::sender::connect_epn;
        let mut older = connect(&flp, 0, at, None)
            .await
            .expect("the first connection");
        // The EPN's end probes a silent FLP (once its DataHelloAck is acknowledged,
        // the socket's timer is the keepalive's).
        let local = older.local_addr().unwrap().to_string();
        let mut ss = String::new();
        for _ in 0..100 {
            let out = std::process::Command::new("ss")
                .args(["-tnoH", "state", "established"])
                .args(["(", "sport", "=", &format!(":{}", at.port()), ")"])
                .output()
                .expect("ss (iproute2)");
            ss = String::from_utf8_lossy(&out.stdout).into_owned();
            let epn_end = ss.lines().find(|l| l.contains(&local));
            if epn_end.is_some_and(|l| l.contains("keepalive")) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(ss.contains("keepalive"), "no keepalive timer: {ss}");
        let newer = connect(&flp, 0, at, None)
            .await
            .expect("the second, taken too");
        let mut b = [0u8; 1];
        let wait = std::time::Duration::from_secs(10);
        let read = tokio::time::timeout(wait, older.read(&mut b)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the older is closed"
        );
        assert_eq!(metrics.counter("errors.data_connection_replaced"), 1);
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), events.recv());
        assert!(quiet.await.is_err(), "FLP 0 is still connected");
        drop(newer);
        let ev = tokio::time::timeout(wait, events.recv()).await;
        assert!(
            matches!(ev, Ok(Some(BuildEvent::FlpGone { flp: 0 }))),
            "the last connection ended"
        );
    }

    /// The budget charges what an STF needs: a buffer from the pool must not be much
    /// larger (a small STF in a pooled 16 MiB buffer), and one of the right size is
    /// reused as it is.
    #[test]
    fn a_pooled_buffer_holds_about_what_the_budget_charges_for_it() {
        let pool = BufPool::new(Arc::new(ByteBudget::new(64 << 20)));
        pool.put(vec![7u8; 16 << 20]);
        let small = pool.take(1024);
        assert_eq!(small.len(), 1024);
        assert!(small.capacity() <= 2 * 1024 + SLACK, "{}", small.capacity());
        let big = vec![7u8; 1 << 20];
        let at = big.as_ptr();
        pool.put(big);
        let again = pool.take(1 << 20);
        assert_eq!(
            (again.as_ptr(), again.len()),
            (at, 1 << 20),
            "the same buffer"
        );
    }

    /// Mixed sizes: a small STF takes the small buffer that fits, not the newest large
    /// one (which would be shrunk, and grown again for the next large STF).
    #[test]
    fn mixed_sizes_take_the_buffer_that_fits() {
        let pool = BufPool::new(Arc::new(ByteBudget::new(64 << 20)));
        let small = vec![1u8; 4096];
        let at = small.as_ptr();
        pool.put(small);
        pool.put(vec![2u8; 1 << 20]);
        let got = pool.take(4096);
        assert_eq!(got.as_ptr(), at, "the small buffer, as it is");
        let big = pool.take(1 << 20);
        assert!(
            big.capacity() >= 1 << 20 && big[0] == 2,
            "the large one, unshrunk"
        );
    }
}
