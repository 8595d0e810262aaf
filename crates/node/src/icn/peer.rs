//! ICN side of control connections: accept, read the Register frame, then forward
//! every frame to the ICN task. Bad peers get a one-line error and a metric, nothing else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fanin_proto::{Message, Register, MAX_CONTROL_BODY};
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::conn::{read_frame, read_frame_within, spawn_writer};
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

/// How long a new connection may take to send its Register frame.
const REGISTER_WITHIN: Duration = Duration::from_secs(10);

pub async fn accept_loop(
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
    max_conns: usize,
) {
    let mut next: ConnId = 1;
    let slots = Arc::new(Semaphore::new(max_conns));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    tracing::warn!("ICN: peer {peer}: too many connections ({max_conns}); closing");
                    metrics.error("too_many_connections");
                    continue;
                };
                let conn = next;
                next += 1;
                let (events, metrics) = (events.clone(), metrics.clone());
                tokio::spawn(async move {
                    serve_peer(conn, stream, peer, events, metrics).await;
                    drop(permit);
                });
            }
            Err(e) => {
                // e.g. out of file descriptors: keep serving the peers we have.
                tracing::warn!("ICN: accept failed: {e}");
                metrics.error("accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_peer(
    conn: ConnId,
    stream: TcpStream,
    peer: SocketAddr,
    events: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
) {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let reg = match read_frame_within(&mut rd, MAX_CONTROL_BODY, REGISTER_WITHIN).await {
        Ok(Some(Message::Register(reg))) => reg,
        Ok(None) => return, // connected and left without a word (a port probe)
        Ok(Some(other)) => {
            tracing::warn!(
                "ICN: peer {peer}: expected Register, got {:?}; closing",
                other.msg_type()
            );
            metrics.error("unexpected_message");
            return;
        }
        Err(e) => {
            tracing::warn!("ICN: peer {peer}: {e}; closing");
            metrics.error(e.kind());
            return;
        }
    };
    let (tx, writer) = spawn_writer(wr, peer.to_string());
    let (kill, mut killed) = oneshot::channel();
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
    let err = loop {
        tokio::select! {
            // The ICN refused or dropped this peer: stop reading; the writer flushes
            // what is queued (a Reject) and closes the socket.
            _ = &mut killed => {
                let _ = writer.await;
                return;
            }
            r = read_frame(&mut rd, MAX_CONTROL_BODY) => match r {
                Ok(Some(msg)) => {
                    if events.send(Event::Msg { conn, msg }).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break None,
                Err(e) => {
                    tracing::warn!("ICN: peer {peer}: {e}; closing");
                    metrics.error(e.kind());
                    break Some(e.to_string());
                }
            }
        }
    };
    let _ = events.send(Event::Closed { conn, err }).await;
}
