//! The FLP: registers with the ICN, connects to every EPN it is told about, and for each
//! assignment sends its STF of that TF to the chosen EPN through a bounded send buffer.

mod payload;
mod sender;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use fanin_proto::{
    EpnEntry, Message, NodeStats, Prepare, Reason, Register, Role, MAX_CONTROL_BODY,
};
use fanin_sched::{EpnId, StfSize};
use tokio::io::BufReader;
use tokio::sync::mpsc;

use crate::budget::ByteBudget;
use crate::config::size_from_wire;
use crate::conn::{connect_retry, read_frame, read_frame_within, spawn_writer};
use crate::metrics::{self, Metrics};
use sender::{SendCtx, StfJob};

pub struct FlpOptions {
    pub icn: SocketAddr,
    pub id: Option<u32>,
    /// Local address of the control connection (the auxiliary network).
    pub control_bind: Option<IpAddr>,
    /// Local address of the data connections to EPNs (the data network).
    pub data_bind: Option<IpAddr>,
    /// Send buffer limit in bytes.
    pub send_buffer: u64,
    pub metrics_bind: Option<SocketAddr>,
    pub connect_timeout: Duration,
}

/// STFs queued per EPN connection at most (besides the byte limit).
const QUEUE_PER_EPN: usize = 4096;

pub async fn run(opts: FlpOptions) -> anyhow::Result<()> {
    let metrics = Metrics::new("flp", opts.id);
    if let Some(b) = opts.metrics_bind {
        let a = metrics::serve(b, metrics.clone()).await?;
        tracing::info!("FLP metrics on http://{a}/metrics");
    }
    let mut ctl = connect_retry(
        opts.icn,
        opts.control_bind,
        opts.connect_timeout,
        "FLP control connection to ICN",
    )
    .await?;
    crate::conn::write_msg(
        &mut ctl,
        &Message::Register(Register {
            role: Role::Flp,
            node_id: opts.id,
            data_addr: String::new(),
        }),
    )
    .await?;
    let (rd, wr) = ctl.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let me = match read_frame_within(&mut rd, MAX_CONTROL_BODY, Duration::from_secs(30)).await? {
        Some(Message::RegisterAck { node_id, run_id }) => {
            tracing::info!("FLP {node_id}: registered for run {run_id}");
            node_id
        }
        Some(Message::Reject { reason }) => bail!("ICN {} refused this FLP: {reason}", opts.icn),
        other => bail!("ICN {}: expected RegisterAck, got {other:?}", opts.icn),
    };
    let (ctl_tx, writer) = spawn_writer(wr, format!("ICN {}", opts.icn));

    // Pre-run: the run parameters and the EPN list, in either order.
    let mut prep: Option<Prepare> = None;
    let mut list: Option<Vec<EpnEntry>> = None;
    while prep.is_none() || list.is_none() {
        match read_frame(&mut rd, MAX_CONTROL_BODY).await? {
            Some(Message::Prepare(p)) => prep = Some(p),
            Some(Message::EpnList(l)) => list = Some(l),
            Some(other) => {
                tracing::warn!("FLP {me}: ignoring {:?} before the run", other.msg_type())
            }
            None => bail!("ICN {} closed the connection before the run", opts.icn),
        }
    }
    let (prep, list) = (
        prep.expect("loop ends with it"),
        list.expect("loop ends with it"),
    );
    let size = size_from_wire(prep.size)?;
    let budget = Arc::new(ByteBudget::new(opts.send_buffer));
    metrics.set_buffer("flp_send", 0, opts.send_buffer);
    let ctx = Arc::new(SendCtx {
        me,
        run_id: prep.run_id,
        crc: prep.crc,
        pattern: payload::Pattern::new(prep.seed, me),
        budget: budget.clone(),
        metrics: metrics.clone(),
        ctl: ctl_tx.clone(),
    });

    // Connect to every EPN and confirm each connection with a handshake.
    let mut queues: HashMap<EpnId, mpsc::Sender<StfJob>> = HashMap::new();
    let mut tasks = Vec::new();
    for e in &list {
        let addr: SocketAddr = e
            .addr
            .parse()
            .with_context(|| format!("EPN {} data address {:?}", e.epn_id, e.addr))?;
        let stream = sender::connect_epn(&ctx, e.epn_id, addr, opts.data_bind).await?;
        let (tx, rx) = mpsc::channel(QUEUE_PER_EPN);
        tasks.push(tokio::spawn(sender::send_loop(
            ctx.clone(),
            e.epn_id,
            stream,
            rx,
        )));
        queues.insert(e.epn_id, tx);
    }
    tracing::info!("FLP {me}: connected to {} EPNs", queues.len());
    ctl_tx
        .send(Message::Ready {
            role: Role::Flp,
            node_id: me,
            connected: queues.len() as u32,
        })
        .await?;

    loop {
        match read_frame(&mut rd, MAX_CONTROL_BODY).await {
            Ok(Some(Message::Assign { tf_id, epn_id })) => {
                enqueue(&ctx, &size, prep.seed, &queues, tf_id, epn_id).await;
            }
            Ok(Some(Message::RunStart { run_id })) => {
                tracing::info!("FLP {me}: run {run_id} started")
            }
            Ok(Some(Message::RunStop { run_id })) => {
                tracing::info!("FLP {me}: run {run_id} stopping; flushing send queues");
                drop(queues);
                for t in tasks {
                    let _ = t.await;
                }
                ctl_tx
                    .send(Message::NodeStats(NodeStats {
                        role: Role::Flp,
                        node_id: me,
                        counters: metrics.snapshot(),
                    }))
                    .await?;
                drop(ctx);
                drop(ctl_tx);
                let _ = writer.await;
                return Ok(());
            }
            Ok(Some(other)) => {
                tracing::warn!("FLP {me}: unexpected {:?} from the ICN", other.msg_type());
                metrics.error("unexpected_message");
            }
            Ok(None) => bail!(
                "FLP {me}: ICN {} closed the control connection mid-run",
                opts.icn
            ),
            Err(e) => {
                metrics.error(e.kind());
                bail!("FLP {me}: control connection to ICN {}: {e}", opts.icn)
            }
        }
    }
}

/// Puts the STF of `tf` in the send queue of `epn`, or reports why it cannot.
async fn enqueue(
    ctx: &Arc<SendCtx>,
    size: &StfSize,
    seed: u64,
    queues: &HashMap<EpnId, mpsc::Sender<StfJob>>,
    tf: u64,
    epn: EpnId,
) {
    let n = size.sample(seed, ctx.me, tf);
    let Some(q) = queues.get(&epn) else {
        tracing::warn!("FLP {}: TF {tf} assigned to unknown EPN {epn}", ctx.me);
        ctx.metrics.error("unknown_epn");
        return ctx.dropped(tf, Reason::SendFailed).await;
    };
    if !ctx.budget.try_reserve(n) {
        return ctx.dropped(tf, Reason::FlpBufferFull).await;
    }
    ctx.metrics
        .set_buffer("flp_send", ctx.budget.used(), ctx.budget.limit());
    let job = StfJob { tf, epn, len: n };
    match q.try_send(job) {
        Ok(()) => {}
        Err(e) => {
            ctx.budget.release(n);
            let reason = match e {
                mpsc::error::TrySendError::Full(_) => Reason::FlpQueueFull,
                mpsc::error::TrySendError::Closed(_) => Reason::SendFailed,
            };
            ctx.dropped(tf, reason).await;
        }
    }
}
