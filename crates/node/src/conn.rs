//! Framed transport over TCP: reading one validated frame, and the control writer task.
//! Every failure becomes a `ConnError` whose message names what was wrong.

use std::time::Duration;

use fanin_proto::{DecodeError, FrameHeader, Message, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Messages a control writer may hold before the peer counts as stuck.
pub const CONTROL_QUEUE: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("connection closed in the middle of a frame")]
    Eof,
    #[error("no frame within {0:?}")]
    Timeout(Duration),
}

impl ConnError {
    /// Short label for the protocol-error metric.
    pub fn kind(&self) -> &'static str {
        match self {
            ConnError::Io(_) => "io",
            ConnError::Eof => "truncated",
            ConnError::Timeout(_) => "timeout",
            ConnError::Decode(d) => match d {
                DecodeError::BadMagic(_) => "bad_magic",
                DecodeError::Version { .. } => "version",
                DecodeError::Oversized { .. } => "oversized",
                DecodeError::UnknownType(_) => "unknown_type",
                _ => "malformed",
            },
        }
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the peer closed before the first byte.
pub async fn read_exact_or_eof<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
) -> Result<bool, ConnError> {
    let mut got = 0;
    while got < buf.len() {
        let n = r.read(&mut buf[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(false)
            } else {
                Err(ConnError::Eof)
            };
        }
        got += n;
    }
    Ok(true)
}

/// Reads and validates the next frame header; `None` on a clean close.
pub async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: u32,
) -> Result<Option<FrameHeader>, ConnError> {
    let mut hb = [0u8; HEADER_LEN];
    if !read_exact_or_eof(r, &mut hb).await? {
        return Ok(None);
    }
    Ok(Some(FrameHeader::decode(&hb, max_body)?))
}

/// Reads one whole frame; `None` on a clean close between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: u32,
) -> Result<Option<Message>, ConnError> {
    let Some(h) = read_header(r, max_body).await? else {
        return Ok(None);
    };
    let mut body = vec![0u8; h.length as usize];
    if !read_exact_or_eof(r, &mut body).await? && !body.is_empty() {
        return Err(ConnError::Eof);
    }
    Ok(Some(Message::decode(h, &body)?))
}

/// `read_frame` with a deadline, for handshakes.
pub async fn read_frame_within<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: u32,
    limit: Duration,
) -> Result<Option<Message>, ConnError> {
    tokio::time::timeout(limit, read_frame(r, max_body))
        .await
        .map_err(|_| ConnError::Timeout(limit))?
}

pub async fn write_msg<W: AsyncWrite + Unpin>(s: &mut W, m: &Message) -> Result<(), ConnError> {
    s.write_all(&m.encode()).await?;
    Ok(())
}

/// A control write that makes no progress for this long fails the connection.
pub const CONTROL_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Spawns the task that owns the write half of a control connection. Messages are
/// encoded in order and flushed in batches; the queue is bounded, and a peer that
/// stops reading fails the writer after `CONTROL_WRITE_TIMEOUT`.
pub fn spawn_writer(
    half: OwnedWriteHalf,
    peer: String,
) -> (mpsc::Sender<Message>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Message>(CONTROL_QUEUE);
    let task = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(64 * 1024, half);
        while let Some(m) = rx.recv().await {
            let batch = async {
                w.write_all(&m.encode()).await?;
                while let Ok(m) = rx.try_recv() {
                    w.write_all(&m.encode()).await?;
                }
                w.flush().await
            };
            match tokio::time::timeout(CONTROL_WRITE_TIMEOUT, batch).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!("control write to {peer} failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!(
                        "control write to {peer}: no progress for {CONTROL_WRITE_TIMEOUT:?}; closing"
                    );
                    return;
                }
            }
        }
        let _ = tokio::time::timeout(CONTROL_WRITE_TIMEOUT, w.shutdown()).await;
    });
    (tx, task)
}

/// TCP keepalive on control connections: a peer whose host died or was cut off sends no
/// FIN and no RST, so without probes its connection would stay open for good, holding
/// the node's id and place before the run (leases start only at Running) and between
/// runs. After `idle` without a segment from the peer, `KEEPALIVE_PROBES` unanswered
/// probes `KEEPALIVE_INTERVAL` apart close it. A live process answers them from its
/// kernel, even when stopped or busy. Probes go out only while nothing sent waits for
/// its acknowledgement: a node's heartbeats (every 100 ms) keep its end busy during a
/// run, and the ICN's end waits at least the run's lease (`keepalive_idle`), so a
/// partition the lease rides through is never cut by keepalive. The EPN's end of a data
/// connection waits `KEEPALIVE_IDLE` whatever the lease (it does not know it), so a
/// partition over about 11 s cuts an idle one (docs/reliability.md).
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
pub const KEEPALIVE_PROBES: u32 = 3;

/// The ICN's idle time before probes for a run whose lease is `lease_ms`.
pub fn keepalive_idle(lease_ms: u64) -> Duration {
    KEEPALIVE_IDLE.max(Duration::from_millis(lease_ms))
}

/// Turns keepalive on for `s` with `idle` (a failure is only logged: the connection
/// still works).
pub fn keepalive(s: &TcpStream, idle: Duration) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(s).set_tcp_keepalive(&ka) {
        tracing::debug!("TCP keepalive: {e}");
    }
}

/// A local address given to bind to (`flag` names it), checked to be one of this host's:
/// a connection bound to another fails at every attempt, which would be retried as if
/// the ICN were away.
pub fn check_local_ip(flag: &str, ip: Option<std::net::IpAddr>) -> anyhow::Result<()> {
    if let Some(ip) = ip {
        std::net::TcpListener::bind((ip, 0))
            .map_err(|e| anyhow::anyhow!("{flag} {ip}: not an address of this host ({e})"))?;
    }
    Ok(())
}

/// Connects with retries until `limit` passes (the last try at the limit, so a caller
/// that also counts `limit` from its start sees it used up): lets nodes start before the
/// ICN.
pub async fn connect_retry(
    addr: std::net::SocketAddr,
    bind_ip: Option<std::net::IpAddr>,
    limit: Duration,
    what: &str,
) -> anyhow::Result<TcpStream> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut backoff = Duration::from_millis(20);
    loop {
        let sock = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        if let Some(ip) = bind_ip {
            sock.bind(std::net::SocketAddr::new(ip, 0))
                .map_err(|e| anyhow::anyhow!("{what}: cannot bind local address {ip}: {e}"))?;
        }
        // A peer that drops SYNs would hold one attempt for minutes: the limit bounds it.
        let attempt = tokio::time::timeout_at(deadline, sock.connect(addr)).await;
        let attempt = attempt.unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
        match attempt {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                let wait =
                    backoff.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
                tracing::debug!("{what} {addr}: {e}; retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            Err(e) => anyhow::bail!("{what} {addr}: {e} (gave up after {limit:?})"),
        }
    }
}
