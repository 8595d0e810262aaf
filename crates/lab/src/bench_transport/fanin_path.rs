//! fanin's own data path as a transport peer: the FLP's sender (DataHello, STF frames of
//! one block-sized buffer, a CRC32C per STF for `fanin-crc`) and the EPN's receiver (the
//! handshake, header checks, pooled buffers inside the byte budget, the CRC check).

use std::sync::Arc;

use anyhow::{bail, Context};
use fanin_node::budget::ByteBudget;
use fanin_node::epn::receiver::{accept_loop, BufPool, BuildEvent, DataCtx};
use fanin_node::flp::core::StfJob;
use fanin_node::flp::payload::Pattern;
use fanin_node::flp::sender::{connect_epn, send_loop, Outgoing, SendCtx};
use fanin_node::flp::source::Payload;
use fanin_node::metrics::Metrics;
use tokio::sync::mpsc;

use super::peer::{PeerArgs, PeerReport, Role, Span, Transport};

const RUN: u64 = 1;
const SECRET: &[u8] = b"fanin bench transport";

pub async fn run(a: &PeerArgs) -> anyhow::Result<PeerReport> {
    match a.role {
        Role::Send => send(a).await,
        Role::Recv => recv(a).await,
    }
}

async fn send(a: &PeerArgs) -> anyhow::Result<PeerReport> {
    let ctx = Arc::new(SendCtx {
        me: 0,
        run_id: RUN,
        crc: a.transport == Transport::FaninCrc,
        pattern: Pattern::new(7, 0),
        metrics: Metrics::new("flp", Some(0)),
        secret: fanin_node::auth::Secret::new(SECRET),
    });
    let stream = connect_epn(&ctx, 0, a.addr, None).await?;
    let window = flp_window(a.block);
    let (tx, rx) = mpsc::channel(window);
    let (done_tx, mut done) = mpsc::channel(window);
    // One block-sized buffer sent again and again, as every peer and iperf3 send theirs
    // (the FLP's synthetic pattern of 256 KiB would stay in the cache where a large
    // block does not).
    let block = bytes::Bytes::from(super::peer::block_bytes(a.block));
    // fanin-crc: the CRC32C of each STF, made as an FLP makes it for a source's bytes
    // (per STF, on the sending side).
    let crc_on = a.transport == Transport::FaninCrc;
    let span = Span::start();
    tokio::spawn(send_loop(ctx, 0, stream, rx, done_tx));
    let out = |tf| Outgoing {
        job: StfJob {
            tf,
            epn: 0,
            len: a.block,
            queue: 0,
        },
        payload: Payload::Owned(block.clone()),
        crc: crc_on.then(|| crc32c::crc32c(&block)),
    };
    let (mut next, mut ok) = (0, 0);
    while ok < a.blocks {
        while next < a.blocks && next - ok < window as u64 {
            // At most `window` in flight: the channel has room.
            tx.try_send(out(next)).expect("room for the window");
            next += 1;
        }
        match done.recv().await {
            Some((_, true)) => ok += 1,
            Some((job, false)) => bail!("fanin: STF of TF {} not sent", job.tf),
            None => bail!("fanin: sender ended early"),
        }
    }
    tokio::task::spawn_blocking(super::peer::wait_for_bench).await?;
    Ok(span.report(a.block * a.blocks))
}

/// STFs in flight as an FLP with one EPN keeps them: within its default send buffer
/// (all of it its one EPN's share) and its queue limit per EPN.
fn flp_window(block: u64) -> usize {
    let buffer = fanin_node::RunConfig::default().flp_buffer.0;
    let jobs = fanin_node::flp::core::QUEUE_PER_EPN as u64;
    (buffer / block.max(1)).clamp(1, jobs) as usize
}

async fn recv(a: &PeerArgs) -> anyhow::Result<PeerReport> {
    let listener = tokio::net::TcpListener::bind(a.addr)
        .await
        .with_context(|| format!("fanin: listening on {}", a.addr))?;
    let budget = Arc::new(ByteBudget::new((8 * a.block).max(256 << 20)));
    let pool = Arc::new(BufPool::new(budget.clone()));
    let (b_tx, mut b_rx) = mpsc::channel(64);
    let ctx = Arc::new(DataCtx {
        me: 0,
        run_id: RUN,
        flps: 1,
        max_stf: a.block,
        budget: budget.clone(),
        pool: pool.clone(),
        builder: b_tx,
        metrics: Metrics::new("epn", Some(0)),
        connected: Default::default(),
        secret: fanin_node::auth::Secret::new(SECRET),
        admission: fanin_node::admission::Admission::new(1),
    });
    tokio::spawn(accept_loop(Arc::new(listener), ctx));
    super::peer::say_listening();
    let mut span = None;
    let mut bytes = 0;
    for _ in 0..a.blocks {
        match b_rx.recv().await {
            Some(BuildEvent::Stf { payload, .. }) => {
                let n = payload.len() as u64;
                budget.release(n);
                pool.put(payload);
                match span {
                    None => span = Some(Span::start()),
                    Some(_) => bytes += n,
                }
            }
            Some(BuildEvent::Lost { tf, reason, .. }) => {
                bail!("fanin: STF of TF {tf} lost: {}", reason.name())
            }
            Some(_) => bail!("fanin: unexpected event from the receiver"),
            None => bail!("fanin: receiver ended early"),
        }
    }
    Ok(span.expect("at least two blocks").report(bytes))
}
