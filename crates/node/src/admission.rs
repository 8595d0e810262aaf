//! Admission of new connections on the ICN's control port and an EPN's data port: each
//! must prove the run secret within a deadline; those still proving themselves share a
//! small pool where a newcomer evicts the oldest (first of its own source), so a flood of
//! idle or garbage connections never keeps a real node out. Refusals are logged at a
//! bounded rate.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use fanin_proto::{Message, Nonce, MAX_HANDSHAKE_BODY};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::conn::{read_frame_within, write_msg};
use crate::metrics::Metrics;

/// How long a new connection has to prove itself (Challenge -> Register / DataHello).
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// Connections proving themselves at once, in all (at least; twice the run's nodes for
/// a larger run) and from one source address (at least; half the pool for a larger run,
/// so a run whose nodes share one address, on one host, all connect at once).
pub const PENDING_MAX: usize = 64;
pub const PENDING_PER_SOURCE: usize = 32;

/// The pool of connections still in their handshake.
pub struct Admission {
    pending: Mutex<Pending>,
    /// Places in the pool: `PENDING_MAX`, or more for a large run.
    capacity: usize,
    /// Places one source address may hold: `PENDING_PER_SOURCE`, or half the pool.
    per_source: usize,
    /// Refusals logged: at most `LOG_PER_SECOND` lines a second, the rest counted.
    pub log: LogLimit,
}

#[derive(Default)]
struct Pending {
    next: u64,
    /// Ticket -> (source, eviction switch: dropping it ends that handshake).
    by_ticket: BTreeMap<u64, (IpAddr, oneshot::Sender<()>)>,
}

impl Pending {
    /// Whose place a newcomer from `source` takes, if the pool has no room.
    fn victim(&self, source: IpAddr, (capacity, per_source_max): (usize, usize)) -> Option<u64> {
        let per_source = self.per_source();
        let own = per_source.get(&source).copied();
        if let Some((n, oldest)) = own.filter(|(n, _)| *n >= per_source_max) {
            debug_assert!(n >= per_source_max);
            return Some(oldest);
        }
        if self.by_ticket.len() < capacity {
            return None;
        }
        Self::oldest_of_largest(&per_source)
    }

    /// Each source's places and its oldest ticket.
    fn per_source(&self) -> BTreeMap<IpAddr, (usize, u64)> {
        let mut per_source: BTreeMap<IpAddr, (usize, u64)> = BTreeMap::new();
        for (t, (ip, _)) in &self.by_ticket {
            let e = per_source.entry(*ip).or_insert((0, *t));
            e.0 += 1; // tickets ascend: the first seen is the source's oldest
        }
        per_source
    }

    /// The oldest ticket of the source holding the most places (a flood's own).
    fn oldest_of_largest(per_source: &BTreeMap<IpAddr, (usize, u64)>) -> Option<u64> {
        per_source
            .values()
            .max_by_key(|(n, oldest)| (*n, std::cmp::Reverse(*oldest)))
            .map(|(_, oldest)| *oldest)
    }
}

/// A connection's place in the pool; `evicted` fires when a newcomer takes it.
pub struct Ticket {
    id: u64,
    pool: Arc<Admission>,
    pub evicted: oneshot::Receiver<()>,
}

/// Why a handshake ended without a first frame: the error kind (for the metric) and a
/// line for the log.
pub struct Silent {
    pub kind: &'static str,
    pub why: String,
}

impl Ticket {
    /// Its number: unique among the pool's connections.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The handshake's first half, the same on every listener: the Challenge out, then
    /// the peer's first frame within the deadline, unless a newcomer evicts this
    /// connection first (a frame that came in time wins). `None`: it left without a word.
    pub async fn challenge<R, W>(
        &mut self,
        rd: &mut R,
        wr: &mut W,
    ) -> Result<(Nonce, Option<Message>), Silent>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let nonce = crate::auth::nonce();
        let read = async {
            write_msg(wr, &Message::Challenge { nonce }).await?;
            read_frame_within(rd, MAX_HANDSHAKE_BODY, HANDSHAKE_DEADLINE).await
        };
        let first = tokio::select! {
            biased;
            r = read => r,
            _ = &mut self.evicted => return Err(Silent {
                kind: "handshake_evicted",
                why: "still silent when newer connections came".into(),
            }),
        };
        match first {
            Ok(frame) => Ok((nonce, frame)),
            Err(e) => Err(Silent {
                kind: e.kind(),
                why: e.to_string(),
            }),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pool.pending.lock().unwrap().by_ticket.remove(&self.id);
    }
}

impl Admission {
    /// A pool for a listener that expects about `nodes` peers, within its share of the
    /// process's open files (`fdlimit::pending_room`).
    pub fn new(nodes: usize) -> Arc<Admission> {
        Self::with_room(nodes, crate::fdlimit::pending_room())
    }

    /// A pool for about `nodes` peers with at most `room` places.
    pub fn with_room(nodes: usize, room: usize) -> Arc<Admission> {
        let capacity = PENDING_MAX.max(nodes.saturating_mul(2)).min(room).max(1);
        // A run's nodes on one host must not evict each other, even in a pool cut down
        // to its share of open files.
        let per_source = PENDING_PER_SOURCE.max(capacity / 2).max(nodes);
        Arc::new(Admission {
            pending: Mutex::new(Pending::default()),
            capacity,
            per_source: per_source.min(capacity),
            log: LogLimit::new(LOG_PER_SECOND),
        })
    }

    /// A place for a new connection from `peer`. When its source already holds its
    /// share of places, its own oldest goes; when the pool is full, the oldest
    /// of the source holding the most places goes (a flood evicts itself first). The
    /// ticket leaves the pool when dropped (handshake over).
    pub fn enter(self: &Arc<Self>, peer: SocketAddr) -> Ticket {
        let (tx, rx) = oneshot::channel();
        let mut p = self.pending.lock().unwrap();
        let victim = p.victim(peer.ip(), (self.capacity, self.per_source));
        if let Some(v) = victim {
            p.by_ticket.remove(&v); // dropping its sender ends that handshake (it counts)
        }
        let id = p.next;
        p.next += 1;
        p.by_ticket.insert(id, (peer.ip(), tx));
        debug_assert!(p.by_ticket.len() <= self.capacity);
        Ticket {
            id,
            pool: self.clone(),
            evicted: rx,
        }
    }

    /// Connections in their handshake now.
    pub fn pending(&self) -> usize {
        self.pending.lock().unwrap().by_ticket.len()
    }

    /// Makes room when `accept` failed for want of open files: the oldest connection of
    /// the source holding the most places goes, as when the pool is full. False: none
    /// is in its handshake, so nothing here can free a file.
    pub fn shed(&self) -> bool {
        let mut p = self.pending.lock().unwrap();
        let victim = Pending::oldest_of_largest(&p.per_source());
        victim.is_some_and(|v| p.by_ticket.remove(&v).is_some())
    }

    /// The next connection on `listener` (`what` names it in log lines), with its place
    /// in the pool. Whoever the newcomer evicted closes before the next accept (the
    /// caller's task yields once here), so a flood holds about the pool's places. A
    /// failed `accept` is counted and logged (at a bounded rate); out of open files, a
    /// connection still proving itself is shed and the next try comes after a moment
    /// for it to close, else after 50 ms.
    pub async fn accept(
        self: &Arc<Self>,
        listener: &TcpListener,
        what: &str,
        metrics: &Metrics,
    ) -> (TcpStream, SocketAddr, Ticket) {
        loop {
            let e = match listener.accept().await {
                Ok((s, peer)) => {
                    let ticket = self.enter(peer);
                    tokio::task::yield_now().await;
                    return (s, peer, ticket);
                }
                Err(e) => e,
            };
            metrics.error("accept");
            let out_of_files = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
            let shed = out_of_files && self.shed();
            self.log.warn(|| match shed {
                true => format!(
                    "{what}: accept failed: {e}; the oldest unproven connection is closed to make room"
                ),
                false => format!("{what}: accept failed: {e}"),
            });
            let pause = if shed { 2 } else { 50 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
}

/// Log lines per second for refusals of one listener.
pub const LOG_PER_SECOND: u32 = 10;

/// A log-rate limit: `allow()` says whether to log this line, and how many lines were
/// held back since the last one logged.
pub struct LogLimit {
    per_second: u32,
    state: Mutex<(Instant, u32, u64)>,
}

impl LogLimit {
    pub fn new(per_second: u32) -> LogLimit {
        LogLimit {
            per_second,
            state: Mutex::new((Instant::now(), 0, 0)),
        }
    }

    /// `Some(held_back)` when this line may be logged.
    pub fn allow(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap();
        if s.0.elapsed() >= Duration::from_secs(1) {
            *s = (Instant::now(), 0, s.2);
        }
        if s.1 < self.per_second {
            s.1 += 1;
            let held = s.2;
            s.2 = 0;
            Some(held)
        } else {
            s.2 += 1;
            None
        }
    }

    /// Logs `line` as a warning unless over the rate; mentions what was held back.
    pub fn warn(&self, line: impl FnOnce() -> String) {
        match self.allow() {
            Some(0) => tracing::warn!("{}", line()),
            Some(n) => tracing::warn!("{} ({n} similar lines held back)", line()),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ip: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((ip, port))
    }

    /// A stranger's first frame header claims a control-sized body: refused at once as
    /// oversized, before any buffer for it (it used to allocate 64 KiB and wait).
    #[tokio::test]
    async fn a_first_frame_over_the_handshake_limit_is_refused_unread() {
        use tokio::io::AsyncWriteExt;
        let pool = Admission::with_room(0, usize::MAX);
        let mut t = pool.enter(addr([10, 0, 0, 1], 1));
        let (mut listener, mut stranger) = tokio::io::duplex(1 << 16);
        let header = fanin_proto::FrameHeader {
            msg_type: 1,
            length: fanin_proto::MAX_CONTROL_BODY,
        };
        stranger.write_all(&header.encode()).await.unwrap();
        let (mut rd, mut wr) = tokio::io::split(&mut listener);
        let first = tokio::time::timeout(Duration::from_secs(1), t.challenge(&mut rd, &mut wr));
        let refused = first.await.expect("refused without waiting for the body");
        assert_eq!(refused.unwrap_err().kind, "oversized");
    }

    #[test]
    fn a_full_pool_evicts_the_oldest_and_never_grows() {
        let pool = Admission::with_room(0, usize::MAX);
        let mut tickets: Vec<Ticket> = (0..PENDING_PER_SOURCE as u16)
            .map(|i| pool.enter(addr([10, 0, 0, 1], i)))
            .collect();
        // One source holds its share: its next connection evicts its own oldest.
        tickets.push(pool.enter(addr([10, 0, 0, 1], 999)));
        assert!(tickets[0]
            .evicted
            .try_recv()
            .is_err_and(|e| e == oneshot::error::TryRecvError::Closed));
        assert_eq!(pool.pending(), PENDING_PER_SOURCE);
        // Other sources fill the pool; past it, the oldest of all goes.
        for i in 0..(PENDING_MAX as u16) {
            tickets.push(pool.enter(addr([10, 0, 1, (i % 200) as u8], i)));
            assert!(pool.pending() <= PENDING_MAX);
        }
        assert_eq!(pool.pending(), PENDING_MAX);
        // The newest is still waiting.
        let last = tickets.last_mut().unwrap();
        assert_eq!(
            last.evicted.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        );
        drop(tickets);
        assert_eq!(pool.pending(), 0, "a finished handshake leaves the pool");
    }

    #[test]
    fn a_flood_from_two_sources_evicts_itself_not_a_third_source() {
        let pool = Admission::with_room(0, usize::MAX);
        let mut real = pool.enter(addr([10, 0, 0, 9], 1));
        let mut flood = Vec::new();
        for i in 0..1000u16 {
            flood.push(pool.enter(addr([10, 0, 0, 1 + (i % 2) as u8], i)));
        }
        assert_eq!(
            real.evicted.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        );
        assert_eq!(pool.pending(), PENDING_MAX);
    }

    /// 40 FLPs on one host reach an EPN's data port at once (a run's pre-run): none is
    /// evicted by another, though they share one address.
    #[test]
    fn a_run_whose_nodes_share_one_address_all_connect_at_once() {
        let pool = Admission::with_room(40, usize::MAX);
        let mut t: Vec<Ticket> = (0..40u16)
            .map(|i| pool.enter(addr([127, 0, 0, 1], 5000 + i)))
            .collect();
        for x in &mut t {
            let e = x.evicted.try_recv();
            assert_eq!(e, Err(oneshot::error::TryRecvError::Empty));
        }
        assert_eq!(pool.pending(), 40);
    }

    #[test]
    fn a_large_run_gets_a_larger_pool() {
        let pool = Admission::with_room(300, usize::MAX);
        let t: Vec<Ticket> = (0..600u16)
            .map(|i| pool.enter(addr([10, 1, (i / 20) as u8, 1], i)))
            .collect();
        assert_eq!(pool.pending(), 600);
        drop(t);
    }

    #[test]
    fn a_pool_never_takes_more_than_its_share_of_open_files() {
        let pool = Admission::with_room(300, 100);
        let t: Vec<Ticket> = (0..300u16)
            .map(|i| pool.enter(addr([10, 1, (i / 20) as u8, 1], i)))
            .collect();
        assert_eq!(pool.pending(), 100);
        drop(t);
        // One host's 100 nodes all keep their places in a pool cut down to 100 (half of
        // it per source would have them evict each other).
        let mut t: Vec<Ticket> = (0..100u16)
            .map(|i| pool.enter(addr([127, 0, 0, 1], i)))
            .collect();
        for x in &mut t {
            let e = x.evicted.try_recv();
            assert_eq!(e, Err(oneshot::error::TryRecvError::Empty));
        }
        assert_eq!(pool.pending(), 100);
        drop(t);
    }

    #[test]
    fn out_of_open_files_the_flood_is_shed_first() {
        let pool = Admission::with_room(0, usize::MAX);
        assert!(!pool.shed(), "nothing to shed in an empty pool");
        let mut real = pool.enter(addr([10, 0, 0, 9], 1));
        let mut flood: Vec<Ticket> = (0..5u16)
            .map(|i| pool.enter(addr([10, 0, 0, 1], i)))
            .collect();
        assert!(pool.shed());
        let gone =
            |t: &mut Ticket| t.evicted.try_recv() == Err(oneshot::error::TryRecvError::Closed);
        assert!(gone(&mut flood[0]), "the flood's oldest goes");
        assert!(!gone(&mut real) && !gone(&mut flood[1]));
        assert_eq!(pool.pending(), 5);
    }

    #[test]
    fn the_log_limit_holds_back_and_counts() {
        let l = LogLimit::new(3);
        assert_eq!(
            (l.allow(), l.allow(), l.allow()),
            (Some(0), Some(0), Some(0))
        );
        assert_eq!((l.allow(), l.allow()), (None, None));
        l.state.lock().unwrap().0 -= Duration::from_secs(2);
        assert_eq!(
            l.allow(),
            Some(2),
            "the next line says how many were held back"
        );
    }
}
