//! One side of a `fanin bench transport` measurement, as its own process: sends or
//! receives a number of equal blocks over one transport and reports bytes, time and CPU.
//!
//! The protocol with the bench: a receiver prints `listening` once it is bound; a sender
//! sends every block, then waits for a line on stdin (the receiver has them all) before
//! it reports, so a library that sends from its own threads is charged for all of it.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use super::thread_cpu;

/// The transports measured; `iperf3` runs as its own program, not as a peer.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// fanin's FLP -> EPN data path: DataHello, STF frames, the EPN's pooled buffers;
    /// without CRCs, as the other peers check nothing.
    Fanin,
    /// The same with a CRC32C per STF, made by the FLP and checked by the EPN (a run's
    /// default).
    #[value(name = "fanin-crc")]
    #[serde(rename = "fanin-crc")]
    FaninCrc,
    /// Plain blocking TCP: write_all of each block, read_exact into one buffer.
    Tcp,
    /// ZeroMQ PUSH/PULL (libzmq, the seeds' transport).
    Zeromq,
    /// nng PUSH/PULL (nanomsg's successor).
    Nng,
    /// iperf3 with the same block size (`-l`).
    Iperf3,
}

impl Transport {
    pub const ALL: [Transport; 6] = [
        Transport::Fanin,
        Transport::FaninCrc,
        Transport::Zeromq,
        Transport::Nng,
        Transport::Iperf3,
        Transport::Tcp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Transport::Fanin => "fanin",
            Transport::FaninCrc => "fanin-crc",
            Transport::Tcp => "tcp",
            Transport::Zeromq => "zeromq",
            Transport::Nng => "nng",
            Transport::Iperf3 => "iperf3",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Send,
    Recv,
}

#[derive(Args, Clone, Debug)]
pub struct PeerArgs {
    #[arg(long)]
    pub transport: Transport,
    #[arg(long)]
    pub role: Role,
    /// Bytes per block (one message, one STF).
    #[arg(long)]
    pub block: u64,
    /// Blocks to move.
    #[arg(long)]
    pub blocks: u64,
    /// The receiver's address (it listens there; the sender connects to it).
    #[arg(long)]
    pub addr: SocketAddr,
}

/// What one side measured. A receiver's span runs from the end of its first block to
/// the end of its last (the first block's bytes are not counted); a sender's from its
/// first block to the receiver having all. The CPU is the whole process's (every
/// thread) over the span.
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
pub struct PeerReport {
    pub bytes: u64,
    pub secs: f64,
    pub cpu_s: f64,
}

/// Marks the start of a measured span: wall clock and the CPU clock of every thread
/// (getrusage too, for a span in which a thread exits: the larger of the two is taken).
pub struct Span {
    wall: Instant,
    threads: BTreeMap<i32, u64>,
    process_us: u64,
}

impl Span {
    pub fn start() -> Span {
        Span {
            process_us: fanin_node::host::process_cpu_us(),
            threads: thread_cpu::threads(),
            wall: Instant::now(),
        }
    }

    pub fn report(&self, bytes: u64) -> PeerReport {
        let secs = self.wall.elapsed().as_secs_f64();
        let (ns, whole) = thread_cpu::used_between(&self.threads, &thread_cpu::threads());
        let mut cpu_s = ns as f64 / 1e9;
        if !whole {
            let us = fanin_node::host::process_cpu_us().saturating_sub(self.process_us);
            cpu_s = cpu_s.max(us as f64 / 1e6);
        }
        PeerReport { bytes, secs, cpu_s }
    }
}

/// `fanin bench transport-peer`: runs one side and prints `report {json}`.
pub async fn run(a: PeerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=1 << 30).contains(&a.block),
        "--block must be 1 B..=1 GiB"
    );
    anyhow::ensure!(a.blocks >= 2, "--blocks must be at least 2");
    let report = match a.transport {
        Transport::Fanin | Transport::FaninCrc => super::fanin_path::run(&a).await?,
        Transport::Iperf3 => bail!("iperf3 runs as itself, not as a transport peer"),
        _ => {
            let a2 = a.clone();
            tokio::task::spawn_blocking(move || blocking(&a2))
                .await
                .context("peer thread")??
        }
    };
    println!("report {}", serde_json::to_string(&report)?);
    Ok(())
}

fn blocking(a: &PeerArgs) -> anyhow::Result<PeerReport> {
    match (a.transport, a.role) {
        (Transport::Tcp, Role::Send) => tcp_send(a),
        (Transport::Tcp, Role::Recv) => tcp_recv(a),
        (Transport::Zeromq | Transport::Nng, _) => super::libs::run(a),
        (Transport::Fanin | Transport::FaninCrc | Transport::Iperf3, _) => {
            unreachable!("not a blocking peer")
        }
    }
}

/// Tells the bench the receiver is bound.
pub fn say_listening() {
    println!("listening");
    let _ = std::io::stdout().flush();
}

/// A sender's last step: wait until the bench says the receiver has every block.
pub fn wait_for_bench() {
    // Any line, end of input or a read error all mean "go": the bench is done waiting.
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

/// The block a sender sends again and again (not all zeros, so no page is shared).
pub fn block_bytes(n: u64) -> Vec<u8> {
    (0..n).map(|i| (i * 131 + 7) as u8).collect()
}

fn tcp_send(a: &PeerArgs) -> anyhow::Result<PeerReport> {
    let mut s = TcpStream::connect(a.addr).with_context(|| format!("connecting {}", a.addr))?;
    let buf = block_bytes(a.block);
    let span = Span::start();
    for _ in 0..a.blocks {
        s.write_all(&buf).context("sending")?;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    // The receiver closes once it has every byte.
    let _ = s.read(&mut [0u8; 1]);
    wait_for_bench();
    Ok(span.report(a.block * a.blocks))
}

fn tcp_recv(a: &PeerArgs) -> anyhow::Result<PeerReport> {
    let l = TcpListener::bind(a.addr).with_context(|| format!("listening on {}", a.addr))?;
    say_listening();
    let (mut s, _) = l.accept()?;
    let mut buf = vec![0u8; a.block as usize];
    s.read_exact(&mut buf).context("receiving")?;
    let span = Span::start();
    for _ in 1..a.blocks {
        s.read_exact(&mut buf).context("receiving")?;
    }
    Ok(span.report(a.block * (a.blocks - 1)))
}
