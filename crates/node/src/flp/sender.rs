//! FLP data connections: the DataHello handshake with an EPN, then one task per EPN
//! writing queued STFs (frame prefix + payload) and handing each job back when written.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use fanin_proto::{Message, StfHeader, MAX_CONTROL_BODY};
use fanin_sched::EpnId;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::core::StfJob;
use super::payload::Pattern;
use super::source::Payload;
use crate::conn::{connect_retry, read_frame_within, write_msg};
use crate::metrics::Metrics;

/// A data connection that accepts no bytes for this long is failed: its EPN has
/// stopped reading, and its STFs must not hold the send buffer forever.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// STFs queued for one EPN go out together, up to this many and while under
/// `BATCH_BYTES`: fewer system calls and wake-ups when the sender falls behind (a lone
/// STF goes out alone, at once). Measured in docs/performance.md.
const BATCH_MAX: usize = 16;
const BATCH_BYTES: u64 = 1 << 20;

/// Writes all of `buf` with vectored writes (frame prefixes and payloads, up to 64
/// pieces per system call), failing if no byte moves for `limit`.
async fn write_with_progress(
    stream: &mut TcpStream,
    buf: &mut impl bytes::Buf,
    limit: Duration,
) -> std::io::Result<()> {
    while buf.has_remaining() {
        let written = {
            let mut iov = [std::io::IoSlice::new(&[]); 64];
            let n = buf.chunks_vectored(&mut iov);
            tokio::time::timeout(limit, stream.write_vectored(&iov[..n])).await
        };
        match written {
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => buf.advance(n),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no progress for {limit:?} (EPN not reading)"),
                ))
            }
        }
    }
    Ok(())
}

/// What every sender of one FLP shares.
pub struct SendCtx {
    pub me: u32,
    pub run_id: u64,
    pub crc: bool,
    pub pattern: Pattern,
    pub metrics: Arc<Metrics>,
    /// The run secret proved in each DataHello.
    pub secret: crate::auth::Secret,
}

/// An EPN refused the data connection; `code` says whether trying again can help.
#[derive(Debug, thiserror::Error)]
#[error("{what}: refused: {reason}")]
pub struct EpnRefused {
    pub what: String,
    pub code: fanin_proto::RejectCode,
    pub reason: String,
}

pub async fn connect_epn(
    ctx: &SendCtx,
    epn: EpnId,
    addr: SocketAddr,
    bind: Option<IpAddr>,
) -> anyhow::Result<TcpStream> {
    let what = format!("FLP {} data connection to EPN {epn}", ctx.me);
    let mut s = connect_retry(addr, bind, Duration::from_secs(10), &what).await?;
    let within = Duration::from_secs(10);
    let nonce = match read_frame_within(&mut s, MAX_CONTROL_BODY, within).await {
        Ok(Some(Message::Challenge { nonce })) => nonce,
        Ok(other) => bail!("{what} at {addr}: expected Challenge, got {other:?}"),
        Err(e) => bail!("{what} at {addr}: {e}"),
    };
    let hello = Message::DataHello {
        run_id: ctx.run_id,
        flp_id: ctx.me,
        proof: ctx.secret.prove_data(&nonce, ctx.run_id, ctx.me),
    };
    write_msg(&mut s, &hello).await?;
    match read_frame_within(&mut s, MAX_CONTROL_BODY, within).await {
        Ok(Some(Message::DataHelloAck { epn_id })) if epn_id == epn => Ok(s),
        Ok(Some(Message::DataHelloAck { epn_id })) => {
            bail!("{what} at {addr}: answered as EPN {epn_id}")
        }
        Ok(Some(Message::Reject { code, reason })) => Err(EpnRefused {
            what: format!("{what} at {addr}"),
            code,
            reason,
        }
        .into()),
        Ok(other) => bail!("{what} at {addr}: expected DataHelloAck, got {other:?}"),
        Err(e) => bail!("{what} at {addr}: {e}"),
    }
}

/// One STF for a sender: the core's job, its bytes and (for a source's bytes) its CRC.
pub struct Outgoing {
    pub job: StfJob,
    pub payload: Payload,
    pub crc: Option<u32>,
}

/// Writes every STF queued for `epn` and hands each job back through `done` (false:
/// its frame was not written whole, the connection failed now or before). The bytes are
/// the core's to count.
pub async fn send_loop(
    ctx: Arc<SendCtx>,
    epn: EpnId,
    mut stream: TcpStream,
    mut rx: mpsc::Receiver<Outgoing>,
    done: mpsc::Sender<(StfJob, bool)>,
) {
    let mut failed = false;
    let mut carry = None;
    while let Some(first) = match carry.take() {
        Some(out) => Some(out),
        None => rx.recv().await,
    } {
        let batch = gather(first, &mut rx, &mut carry);
        debug_assert!(batch.iter().all(|o| o.job.epn == epn));
        let sent = match failed {
            true => 0,
            false => send_batch(&ctx, &mut stream, &batch).await,
        };
        if sent < batch.len() && !failed {
            failed = true;
            // The EPN sees the connection end rather than wait on a half-written frame.
            let _ = stream.shutdown().await;
        }
        for (i, out) in batch.into_iter().enumerate() {
            if done.send((out.job, i < sent)).await.is_err() {
                return;
            }
        }
    }
    if !failed {
        let _ = stream.shutdown().await;
    }
}

/// `first` and what else is queued for the EPN, up to `BATCH_MAX` STFs and
/// `BATCH_BYTES` (an STF that would go over waits in `carry` and starts the next batch).
fn gather(
    first: Outgoing,
    rx: &mut mpsc::Receiver<Outgoing>,
    carry: &mut Option<Outgoing>,
) -> Vec<Outgoing> {
    let mut bytes = first.job.len;
    let mut batch = vec![first];
    while batch.len() < BATCH_MAX {
        let Ok(out) = rx.try_recv() else { break };
        if bytes + out.job.len > BATCH_BYTES {
            *carry = Some(out);
            break;
        }
        bytes += out.job.len;
        batch.push(out);
    }
    batch
}

/// Writes the STF frames of `batch` (a source's bytes from where they lie): how many of
/// them went out whole (all of them, unless the connection failed).
async fn send_batch(ctx: &SendCtx, stream: &mut TcpStream, batch: &[Outgoing]) -> usize {
    let mut frames = Frames::default();
    for out in batch {
        frames.push(frame(ctx, out));
    }
    if let Err(e) = write_with_progress(stream, &mut frames, STALL_TIMEOUT).await {
        let epn = batch[0].job.epn;
        tracing::warn!("FLP {}: data connection to EPN {epn}: {e}", ctx.me);
    }
    debug_assert!(frames.written <= batch.len());
    frames.written
}

/// One STF frame: its prefix, then its payload (the pattern's, or a source's bytes).
fn frame<'a>(ctx: &'a SendCtx, out: &'a Outgoing) -> Box<dyn bytes::Buf + Send + Sync + 'a> {
    let job = &out.job;
    let len = job.len as usize;
    let bytes = out.payload.slice();
    debug_assert!(bytes.is_none_or(|b| b.len() == len));
    let crc = match bytes {
        None => ctx.crc.then(|| ctx.pattern.crc(job.tf, len)),
        Some(_) => out.crc,
    };
    let header = StfHeader {
        run_id: ctx.run_id,
        tf_id: job.tf,
        flp_id: ctx.me,
        epn_id: job.epn,
        crc,
        payload_len: job.len as u32,
    };
    let prefix = header.encode_frame_prefix();
    match bytes {
        None => Box::new(ctx.pattern.frame(prefix, job.tf, len)),
        Some(b) => Box::new(bytes::Buf::chain(std::io::Cursor::new(prefix), b)),
    }
}

/// Frames written back to back, as one `Buf`, counting those written whole.
#[derive(Default)]
struct Frames<'a> {
    queue: std::collections::VecDeque<Box<dyn bytes::Buf + Send + Sync + 'a>>,
    written: usize,
}

impl<'a> Frames<'a> {
    fn push(&mut self, f: Box<dyn bytes::Buf + Send + Sync + 'a>) {
        match f.has_remaining() {
            true => self.queue.push_back(f),
            false => self.written += 1,
        }
    }
}

impl bytes::Buf for Frames<'_> {
    fn remaining(&self) -> usize {
        self.queue.iter().map(|f| f.remaining()).sum()
    }

    fn chunk(&self) -> &[u8] {
        self.queue.front().map_or(&[], |f| f.chunk())
    }

    fn chunks_vectored<'b>(&'b self, dst: &mut [std::io::IoSlice<'b>]) -> usize {
        let mut n = 0;
        for f in &self.queue {
            if n == dst.len() {
                break;
            }
            let k = f.chunks_vectored(&mut dst[n..]);
            let listed: usize = dst[n..n + k].iter().map(|s| s.len()).sum();
            n += k;
            if listed < f.remaining() {
                break; // the next frame's bytes must not come before this one's rest
            }
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let f = self.queue.front_mut().expect("advance within remaining");
            let k = cnt.min(f.remaining());
            f.advance(k);
            cnt -= k;
            if !f.has_remaining() {
                self.queue.pop_front();
                self.written += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;
    use tokio::io::AsyncReadExt;

    /// A connected pair on loopback, the writer's end and the reader's, with small socket
    /// buffers: the kernel holds little of a write, whatever the host's TCP settings.
    async fn pair() -> (TcpStream, TcpStream) {
        const BUF: u32 = 128 << 10;
        let l = tokio::net::TcpSocket::new_v4().unwrap();
        l.set_recv_buffer_size(BUF).unwrap();
        l.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = l.listen(1).unwrap();
        let c = tokio::net::TcpSocket::new_v4().unwrap();
        c.set_send_buffer_size(BUF).unwrap();
        let w = c.connect(l.local_addr().unwrap()).await.unwrap();
        let (r, _) = l.accept().await.unwrap();
        (w, r)
    }

    #[tokio::test]
    async fn a_write_nobody_reads_fails_once_nothing_moves_for_the_limit() {
        let (mut w, _r) = pair().await;
        let data = vec![7u8; 8 << 20]; // far more than the two small buffers hold
        let limit = Duration::from_millis(300);
        let t = std::time::Instant::now();
        let mut rest = &data[..];
        let write = write_with_progress(&mut w, &mut rest, limit);
        let e = tokio::time::timeout(Duration::from_secs(5), write)
            .await
            .expect("the limit, not the default 10 s, ends the write")
            .expect_err("the reader never reads");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(t.elapsed() >= limit);
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_is_not_a_stall() {
        let (mut w, mut r) = pair().await;
        let total = 4 << 20; // at most 256 KiB a tenth of a second: over 1.5 s
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 256 << 10];
            let mut got = 0;
            while got < total {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let n = r.read(&mut buf).await.unwrap();
                assert!(n > 0, "the writer closed after {got} bytes");
                got += n;
            }
            got
        });
        let data = vec![7u8; total];
        let limit = Duration::from_secs(1);
        let t = std::time::Instant::now();
        let mut rest = &data[..];
        let write = write_with_progress(&mut w, &mut rest, limit);
        tokio::time::timeout(Duration::from_secs(60), write)
            .await
            .expect("the write ends")
            .expect("bytes kept moving");
        assert!(
            t.elapsed() > limit,
            "the whole write outlived the limit: only a wait without progress counts"
        );
        drop(w);
        assert_eq!(reader.await.unwrap(), total);
    }

    fn frames<'a>(parts: &[&'a [u8]]) -> Frames<'a> {
        let mut f = Frames::default();
        for p in parts {
            f.push(Box::new(bytes::Buf::chain(
                std::io::Cursor::new([0xAAu8; 2]),
                *p,
            )));
        }
        f
    }

    #[test]
    fn frames_go_out_in_order_and_count_only_whole_ones() {
        let (a, b) = (&b"first"[..], &b"second"[..]);
        let mut f = frames(&[a, b, &[]]);
        assert_eq!(f.remaining(), 2 + 5 + 2 + 6 + 2);
        let mut iov = [std::io::IoSlice::new(&[]); 3];
        let n = f.chunks_vectored(&mut iov);
        let listed: Vec<u8> = iov[..n].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(listed, b"\xAA\xAAfirst\xAA\xAA"[..]);
        f.advance(2 + 5 + 1);
        assert_eq!(f.written, 1, "the second frame is only half out");
        let rest = f.copy_to_bytes(f.remaining());
        assert_eq!(&rest[..], b"\xAAsecond\xAA\xAA");
        assert_eq!(f.written, 3);
    }
}
