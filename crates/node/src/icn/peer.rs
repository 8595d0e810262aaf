//! ICN side of control connections: accept, challenge, check the Register's proof, then
//! forward every frame to the ICN task. Bad peers get a bounded log line and a metric.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fanin_proto::{Message, Register, RejectCode, MAX_CONTROL_BODY};
use tokio::io::BufReader;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::admission::{Admission, Ticket};
use crate::auth::Secret;
use crate::conn::{read_frame, spawn_writer, write_msg};
use crate::metrics::Metrics;

pub type ConnId = u64;

/// What connection tasks tell the ICN task.
pub enum Event {
    Registered {
        conn: ConnId,
        peer: SocketAddr,
        reg: Register,
        tx: mpsc::Sender<Message>,
        /// Dropping this closes the connection (its reader stops, the writer flushes).
        kill: oneshot::Sender<()>,
    },
    Msg {
        conn: ConnId,
        msg: Message,
    },
    Closed {
        conn: ConnId,
        err: Option<String>,
    },
}

/// `places`: member places (proven nodes) and the nodes the handshake pool expects
/// (it has twice as many places); `idle`: the keepalive idle time of each connection
/// (`conn::keepalive_idle` of the run's lease; a session changes it with each run).
pub async fn accept_loop(
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
    (max_peers, nodes): (usize, usize),
    secret: Arc<Secret>,
    idle: watch::Receiver<Duration>,
) {
    let mut next: ConnId = 1;
    let members = Arc::new(Semaphore::new(max_peers));
    let admission = Admission::new(nodes);
    loop {
        let what = "ICN control port";
        let (stream, peer, ticket) = admission.accept(&listener, what, &metrics).await;
        let conn = next;
        next += 1;
        let ctx = PeerCtx {
            events: events.clone(),
            metrics: metrics.clone(),
            secret: secret.clone(),
            members: members.clone(),
            admission: admission.clone(),
            idle: idle.clone(),
        };
        tokio::spawn(serve_peer(conn, stream, peer, ticket, ctx));
    }
}

/// What every connection task of the ICN shares.
struct PeerCtx {
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
    secret: Arc<Secret>,
    /// Places for nodes that proved the secret.
    members: Arc<Semaphore>,
    admission: Arc<Admission>,
    idle: watch::Receiver<Duration>,
}

impl PeerCtx {
    /// A refused connection: a metric and a rate-limited line; the peer may get a Reject.
    fn refuse(&self, peer: SocketAddr, kind: &'static str, why: &str) {
        self.metrics.error(kind);
        self.admission
            .log
            .warn(|| format!("ICN: peer {peer}: {why}; closing"));
    }
}

/// The handshake: Challenge out, a Register that proves the run secret back, within
/// the deadline and unless a newcomer evicts it. `None`: refused (already logged).
async fn handshake(
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    peer: SocketAddr,
    ticket: &mut Ticket,
    ctx: &PeerCtx,
) -> Option<Register> {
    let (nonce, first) = match ticket.challenge(rd, wr).await {
        Ok(x) => x,
        Err(s) => {
            ctx.refuse(peer, s.kind, &s.why);
            return None;
        }
    };
    let reg = match first {
        Some(Message::Register(reg)) => reg,
        None => return None, // connected and left without a word (a port probe)
        Some(other) => {
            let why = format!("expected Register, got {:?}", other.msg_type());
            ctx.refuse(peer, "unexpected_message", &why);
            return None;
        }
    };
    if !ctx.secret.check_register(&nonce, &reg) {
        let why = format!("{} proves the wrong run secret", reg.role.name());
        ctx.refuse(peer, "bad_proof", &why);
        let reject = Message::Reject {
            code: RejectCode::BadProof,
            reason: "wrong run secret (--secret-file / FANIN_SECRET)".into(),
        };
        let _ = write_msg(wr, &reject).await;
        return None;
    }
    Some(reg)
}

async fn serve_peer(
    conn: ConnId,
    stream: TcpStream,
    peer: SocketAddr,
    mut ticket: Ticket,
    ctx: PeerCtx,
) {
    let _ = stream.set_nodelay(true);
    crate::conn::keepalive(&stream, *ctx.idle.borrow());
    let (mut rd, mut wr) = stream.into_split();
    // No read buffer until the peer proved itself: a stranger holds a socket, no more.
    let Some(reg) = handshake(&mut rd, &mut wr, peer, &mut ticket, &ctx).await else {
        return;
    };
    drop(ticket);
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let Ok(_member) = ctx.members.clone().try_acquire_owned() else {
        ctx.refuse(peer, "too_many_connections", "every member place is taken");
        let reject = Message::Reject {
            code: RejectCode::Busy,
            reason: "the ICN has no place for another node now".into(),
        };
        let _ = write_msg(&mut wr, &reject).await;
        return;
    };
    let PeerCtx {
        events,
        metrics,
        mut idle,
        ..
    } = ctx;
    let (tx, writer) = spawn_writer(wr, peer.to_string());
    let (kill, killed) = oneshot::channel();
    if events
        .send(Event::Registered {
            conn,
            peer,
            reg,
            tx,
            kill,
        })
        .await
        .is_err()
    {
        return;
    }
    let ends = (killed, writer, &mut idle);
    let Some(err) = forward_frames(conn, peer, &mut rd, ends, &events, &metrics).await else {
        return;
    };
    let _ = events.send(Event::Closed { conn, err }).await;
}

/// How a registered peer's reading ends besides the peer closing: the ICN drops it
/// (`killed`, then its writer flushes), and the keepalive idle time it follows.
type Ends<'a> = (
    oneshot::Receiver<()>,
    tokio::task::JoinHandle<()>,
    &'a mut watch::Receiver<Duration>,
);

/// Forwards every frame of a registered peer to the ICN task until the peer closes
/// (`Some(error, if any)`), or the ICN drops the peer or stops (`None`).
async fn forward_frames(
    conn: ConnId,
    peer: SocketAddr,
    rd: &mut BufReader<OwnedReadHalf>,
    (mut killed, writer, idle): Ends<'_>,
    events: &mpsc::Sender<Event>,
    metrics: &Metrics,
) -> Option<Option<String>> {
    loop {
        tokio::select! {
            // A session configured a run with another lease.
            Ok(()) = idle.changed() => {
                let at = *idle.borrow_and_update();
                crate::conn::keepalive(rd.get_ref().as_ref(), at);
            }
            // The ICN refused or dropped this peer: stop reading; the writer flushes
            // what is queued (a Reject) and closes the socket.
            _ = &mut killed => {
                let _ = writer.await;
                return None;
            }
            r = read_frame(rd, MAX_CONTROL_BODY) => match r {
                Ok(Some(msg)) => {
                    if events.send(Event::Msg { conn, msg }).await.is_err() {
                        return None;
                    }
                }
                Ok(None) => return Some(None),
                Err(e) => {
                    tracing::warn!("ICN: peer {peer}: {e}; closing");
                    metrics.error(e.kind());
                    return Some(Some(e.to_string()));
                }
            }
        }
    }
}
