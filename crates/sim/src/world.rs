//! One simulation: builds the topology, produces fragments slice by slice, carries them
//! over TCP or UDP, and records when each fragment left and arrived.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};

use crate::config::{SimConfig, Transport};
use crate::engine::{Queue, Time, MS, SEC, US};
use crate::event::Ev;
use crate::net::{Builder, Kind, Limit, Net, NodeId, Packet};
use crate::tcp::{Act, Receiver, Sender, TcpParams};
use crate::workload::{antares_bio, delay_slices, BioModel, BurstState, Fragment};

/// Bytes of an ACK's payload (none: header only).
const ACK_LEN: u32 = 0;

pub const NEVER: Time = Time::MAX;

#[derive(Debug, Clone)]
pub struct Frag {
    pub sender: u32,
    pub slice: u64,
    /// Destination PC (EPN) index.
    pub dst: u32,
    pub bytes: u32,
    pub suppressed: bool,
    pub sent: Time,
    pub arrived: Time,
    /// TCP segments of this fragment sent again.
    pub retx: u32,
    /// UDP: payload bytes received so far.
    got: u32,
}

struct Conn {
    src: NodeId,
    dst: NodeId,
    snd: Sender,
    rcv: Receiver,
    /// Identifies the one pending timer event; older ones are stale.
    gen: u32,
    /// When the retransmission timer is due, if armed.
    deadline: Option<Time>,
    /// Time of the pending timer event, if one is queued.
    pending: Option<Time>,
    /// Fragments in this byte stream not yet delivered: (end offset, fragment id).
    bounds: VecDeque<(u64, u32)>,
    /// Fragments not yet acknowledged to the sender (to charge retransmissions).
    unacked: VecDeque<(u64, u32)>,
    written: u64,
}

pub struct World {
    pub cfg: SimConfig,
    q: Queue<Ev>,
    pub net: Net,
    /// Independent random streams, so changing one model leaves the others' draws alone.
    rng_bio: rand_pcg::Pcg64Mcg,
    rng_jitter: rand_pcg::Pcg64Mcg,
    rng_ber: rand_pcg::Pcg64Mcg,
    lcm_nodes: Vec<NodeId>,
    pc_nodes: Vec<NodeId>,
    placer: fanin_sched::Placer,
    bio: BioModel,
    bursts: Vec<BurstState>,
    slice: Time,
    slices: u64,
    conn_of: Vec<u32>,
    conns: Vec<Conn>,
    pub frags: Vec<Frag>,
    tcp: TcpParams,
    acts: Vec<Act>,
    end: Time,
    jitter: Time,
    /// Fragment size model from `crates/sched`, if configured.
    sizes: Option<fanin_sched::StfSize>,
    /// Pull mode: the transfer tokens (`crates/sched`) and the grant of each fragment
    /// asked for.
    pull: Option<fanin_sched::TokenManager>,
}

fn bps(mbps: f64) -> u64 {
    (mbps * 1e6).round() as u64
}

fn us(v: f64) -> Time {
    (v * US as f64).round() as Time
}

/// The detector's network: each sector's LCMs on their MLCM, every MLCM and every shore
/// PC on the one switch ashore. The LCM and PC hosts, in order.
fn network(cfg: &SimConfig) -> (Net, Vec<NodeId>, Vec<NodeId>) {
    let limit = match cfg.queue_bytes {
        Some(b) => Limit::Bytes(b),
        None => Limit::Packets(cfg.queue_packets as usize),
    };
    let mut b = Builder::default();
    let gigaswitch = b.node();
    let mut lcm_nodes = Vec::new();
    for _ in 0..cfg.strings * cfg.sectors_per_string {
        let mlcm = b.node();
        let (rate, delay) = (bps(cfg.mlcm_mbps), us(cfg.shore_delay_us));
        b.link(mlcm, gigaswitch, rate, delay, limit, cfg.ber);
        for _ in 0..cfg.lcms_per_sector {
            let lcm = b.host();
            let (rate, delay) = (bps(cfg.lcm_mbps), us(cfg.lcm_delay_us));
            b.link(lcm, mlcm, rate, delay, limit, 0.0);
            lcm_nodes.push(lcm);
        }
    }
    let mut pc_nodes = Vec::new();
    for _ in 0..cfg.pc_count() {
        let pc = b.host();
        let (rate, delay) = (bps(cfg.pc_mbps), us(cfg.pc_delay_us));
        b.link(gigaswitch, pc, rate, delay, limit, 0.0);
        pc_nodes.push(pc);
    }
    (b.build(), lcm_nodes, pc_nodes)
}

/// The TCP senders' parameters: the configured MSS, minimum RTO and slow-start restart.
fn tcp_params(cfg: &SimConfig) -> TcpParams {
    let min_rto = (cfg.min_rto_ms * MS as f64).round() as Time;
    TcpParams {
        mss: cfg.mss,
        min_rto,
        initial_rto: TcpParams::default().initial_rto.max(min_rto),
        slow_start_restart: cfg.slow_start_restart,
        ..TcpParams::default()
    }
}

impl World {
    pub fn new(cfg: SimConfig) -> World {
        let (net, lcm_nodes, pc_nodes) = network(&cfg);
        let mut placer = fanin_sched::Placer::new(cfg.policy.build());
        for i in 0..pc_nodes.len() as u32 {
            placer.policy_mut().add_epn(i);
        }
        let slice = (cfg.slice_ms * MS as f64).round() as Time;
        let slices = ((cfg.duration_s * SEC as f64) / slice as f64).round() as u64;
        let mut bio = antares_bio(cfg.bio);
        if cfg.bio == crate::workload::Bio::None {
            bio.normal = cfg.fragment_bytes;
        }
        let sizes = cfg.fragment_size.as_ref().map(|m| {
            m.parse::<fanin_sched::StfSize>()
                .expect("checked by resolve")
        });
        // Relaxation starts when the last fragment has left (delayed senders wait up to
        // (LCMs - 1) / k slices; jitter adds its maximum).
        let last_delay = delay_slices(lcm_nodes.len().saturating_sub(1) as u32, cfg.k);
        let end = (slices + last_delay) * slice
            + us(cfg.jitter_us)
            + (cfg.relax_s * SEC as f64).round() as Time;
        World {
            rng_bio: rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed),
            rng_jitter: rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ 0x6a09_e667_f3bc_c908),
            rng_ber: rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ 0xbb67_ae85_84ca_a73b),
            bursts: vec![BurstState::default(); lcm_nodes.len()],
            conn_of: vec![u32::MAX; lcm_nodes.len() * pc_nodes.len()],
            lcm_nodes,
            pc_nodes,
            placer,
            bio,
            slice,
            slices,
            conns: Vec::new(),
            frags: Vec::new(),
            tcp: tcp_params(&cfg),
            acts: Vec::new(),
            end,
            jitter: us(cfg.jitter_us),
            sizes,
            pull: cfg
                .pull
                .map(|n| fanin_sched::TokenManager::new(cfg.flp_tokens.unwrap_or(2), n)),
            cfg,
            q: Queue::new(),
            net,
        }
    }

    pub fn slices(&self) -> u64 {
        self.slices
    }
    /// One time slice, in simulated ns.
    pub fn slice_len(&self) -> Time {
        self.slice
    }
    pub fn pcs(&self) -> usize {
        self.pc_nodes.len()
    }
    pub fn events(&self) -> u64 {
        self.q.processed
    }
    pub fn end_time(&self) -> Time {
        self.end
    }

    /// Runs to the end of the relaxation period.
    pub fn run(&mut self) {
        if self.slices > 0 {
            self.q.at(self.slice, Ev::SliceEnd(0));
        }
        while let Some(t) = self.q.peek_time() {
            if t > self.end {
                break;
            }
            let (now, ev) = self.q.pop().expect("peeked");
            match ev {
                Ev::Arrive(node, id) => self.arrive(now, node, id),
                Ev::Rto { conn, gen } => self.timer(now, conn, gen),
                Ev::SliceEnd(n) => self.slice_end(now, n),
                Ev::Transmit(id) => self.transmit(now, id),
                Ev::PullCheck(id) => self.pull_check(now, id),
            }
        }
    }

    /// Slice `n` ends: every LCM produces its fragment of `n`; each LCM whose delay is
    /// `d` slices sends its fragment of slice `n - d` (barrel shifting).
    fn slice_end(&mut self, now: Time, n: u64) {
        let lcms = self.lcm_nodes.len() as u64;
        if n < self.slices {
            // The slice's size for the policy: exact with a size model, nominal with the
            // ANTARES bioluminescence model (PCs report no load, so no policy uses it).
            let bytes = match self.sizes {
                Some(m) => m.tf_bytes(self.cfg.seed, lcms as u32, n),
                None => self.cfg.fragment_bytes as u64 * lcms,
            };
            let fanin_sched::Placed::Assigned(dst) = self.placer.issue(n, bytes) else {
                unreachable!("PCs never leave nor report load in this model")
            };
            for i in 0..lcms as u32 {
                let f = match self.sizes {
                    Some(m) => Fragment::Send(m.sample(self.cfg.seed, i, n) as u32),
                    None => {
                        self.bio
                            .next(&mut self.bursts[i as usize], self.slice, &mut self.rng_bio)
                    }
                };
                let (bytes, suppressed) = match f {
                    Fragment::Send(b) => (b, false),
                    Fragment::Suppressed => (0, true),
                };
                debug_assert_eq!(self.frags.len() as u64, n * lcms + i as u64);
                self.frags.push(Frag {
                    sender: i,
                    slice: n,
                    dst,
                    bytes,
                    suppressed,
                    sent: NEVER,
                    arrived: NEVER,
                    retx: 0,
                    got: 0,
                });
            }
        }
        if self.pull.is_some() {
            if n < self.slices {
                self.ask_for_slice(now, n);
            }
            if n + 1 < self.slices {
                self.q.at(now + self.slice, Ev::SliceEnd(n + 1));
            }
            return;
        }
        let mut more = false;
        for i in 0..lcms as u32 {
            let d = delay_slices(i, self.cfg.k);
            if let Some(s) = n.checked_sub(d).filter(|&s| s < self.slices) {
                let id = (s * lcms + i as u64) as u32;
                if !self.frags[id as usize].suppressed {
                    if self.jitter > 0 {
                        let j = self.rng_jitter.gen_range(0..=self.jitter);
                        self.q.at(now + j, Ev::Transmit(id));
                    } else {
                        self.transmit(now, id);
                    }
                }
            }
            more |= n < d + self.slices - 1;
        }
        if more {
            self.q.at(now + self.slice, Ev::SliceEnd(n + 1));
        }
    }

    /// Pull mode: the slice's PC wants every fragment of it; it asks the LCMs the
    /// tokens grant it now.
    fn ask_for_slice(&mut self, now: Time, n: u64) {
        let lcms = self.lcm_nodes.len() as u64;
        let first = (n * lcms) as usize;
        let pc = self.frags[first].dst;
        let wanted: Vec<u32> = (0..lcms as u32)
            .filter(|&i| !self.frags[first + i as usize].suppressed)
            .collect();
        let pull = self.pull.as_mut().expect("pull mode");
        let grants = pull.want(pc, n, wanted);
        self.ask(now, grants);
    }

    /// Each grant's request travels from its PC to its LCM through the network.
    fn ask(&mut self, now: Time, grants: Vec<fanin_sched::Grant>) {
        let lcms = self.lcm_nodes.len() as u64;
        for g in grants {
            let id = (g.tf * lcms + g.flp as u64) as u32;
            self.send_pull(now, id, g);
        }
    }

    /// A request (a header-only packet) from the PC to the LCM; asked again after a
    /// minimum RTO if the fragment has not left by then (it may have been dropped).
    fn send_pull(&mut self, now: Time, id: u32, g: fanin_sched::Grant) {
        let (src, dst) = (
            self.pc_nodes[g.epn as usize],
            self.lcm_nodes[g.flp as usize],
        );
        let pkt = self.net.pkts.alloc(Packet {
            kind: Kind::Pull,
            conn: 0,
            seq: id as u64,
            len: ACK_LEN,
            dst,
        });
        self.net.send(&mut self.q, src, pkt, &mut self.rng_ber);
        self.q.at(now + self.tcp.min_rto, Ev::PullCheck(id));
    }

    fn pull_check(&mut self, now: Time, id: u32) {
        let g = self.grant_of(id);
        let asked = self.pull.as_ref().is_some_and(|p| p.is_out(&g));
        if asked && self.frags[id as usize].sent == NEVER {
            self.send_pull(now, id, g);
        }
    }

    /// The transfer of fragment `id`: its PC reads its LCM's fragment of its slice.
    fn grant_of(&self, id: u32) -> fanin_sched::Grant {
        let f = &self.frags[id as usize];
        fanin_sched::Grant {
            epn: f.dst,
            tf: f.slice,
            flp: f.sender,
        }
    }

    /// Fragment `id` is whole at its PC: in pull mode its token goes on.
    fn arrived(&mut self, now: Time, id: u32) {
        let f = &mut self.frags[id as usize];
        debug_assert_eq!(f.arrived, NEVER, "fragment {id} arrived twice");
        f.arrived = now;
        let g = self.grant_of(id);
        if let Some(pull) = self.pull.as_mut() {
            let next = pull.done(g);
            self.ask(now, next);
        }
    }

    fn transmit(&mut self, now: Time, id: u32) {
        let f = &mut self.frags[id as usize];
        f.sent = now;
        let (lcm, pc, bytes) = (f.sender, f.dst, f.bytes);
        let src = self.lcm_nodes[lcm as usize];
        let dst = self.pc_nodes[pc as usize];
        match self.cfg.transport {
            Transport::Udp => {
                let mut off = 0;
                while off < bytes {
                    let len = (bytes - off).min(self.cfg.mss);
                    let pkt = self.net.pkts.alloc(Packet {
                        kind: Kind::Udp,
                        conn: 0,
                        seq: id as u64,
                        len,
                        dst,
                    });
                    self.net.send(&mut self.q, src, pkt, &mut self.rng_ber);
                    off += len;
                }
                if bytes == 0 {
                    self.arrived(now, id);
                }
            }
            Transport::Tcp => {
                let slot = lcm as usize * self.pc_nodes.len() + pc as usize;
                if self.conn_of[slot] == u32::MAX {
                    self.conn_of[slot] = self.conns.len() as u32;
                    self.conns.push(Conn {
                        src,
                        dst,
                        snd: Sender::new(self.tcp),
                        rcv: Receiver::default(),
                        gen: 0,
                        deadline: None,
                        pending: None,
                        bounds: VecDeque::new(),
                        unacked: VecDeque::new(),
                        written: 0,
                    });
                }
                if bytes == 0 {
                    self.arrived(now, id); // nothing to carry
                    return;
                }
                let c = self.conn_of[slot];
                let conn = &mut self.conns[c as usize];
                conn.written += bytes as u64;
                conn.bounds.push_back((conn.written, id));
                conn.unacked.push_back((conn.written, id));
                let mut acts = std::mem::take(&mut self.acts);
                conn.snd.write(bytes as u64, now, &mut acts);
                self.apply(c, &mut acts);
                self.acts = acts;
            }
        }
    }

    /// Carries out what a TCP sender asked for.
    fn apply(&mut self, c: u32, acts: &mut Vec<Act>) {
        for a in acts.drain(..) {
            let conn = &mut self.conns[c as usize];
            match a {
                Act::Send { seq, len, retx } => {
                    if retx {
                        // Charge the fragment that holds this byte.
                        let snd_una = conn.snd.acked();
                        while conn.unacked.front().is_some_and(|&(end, _)| end <= snd_una) {
                            conn.unacked.pop_front();
                        }
                        if let Some(&(_, f)) = conn.unacked.iter().find(|&&(end, _)| end > seq) {
                            self.frags[f as usize].retx += 1;
                        }
                    }
                    let (src, dst) = (conn.src, conn.dst);
                    let pkt = self.net.pkts.alloc(Packet {
                        kind: Kind::Data,
                        conn: c,
                        seq,
                        len,
                        dst,
                    });
                    self.net.send(&mut self.q, src, pkt, &mut self.rng_ber);
                }
                Act::Arm(at) => {
                    let at = at.max(self.q.now());
                    conn.deadline = Some(at);
                    // Re-arming moves the deadline; keep one queued event per
                    // connection (it re-schedules itself when it fires early).
                    if conn.pending.is_none_or(|p| p > at) {
                        conn.gen += 1;
                        conn.pending = Some(at);
                        let gen = conn.gen;
                        self.q.at(at, Ev::Rto { conn: c, gen });
                    }
                }
                Act::Disarm => conn.deadline = None,
            }
        }
    }

    /// The pending timer event of `c` fired: time out, or wait for the moved deadline.
    fn timer(&mut self, now: Time, c: u32, gen: u32) {
        let conn = &mut self.conns[c as usize];
        if conn.gen != gen {
            return; // superseded by an earlier event
        }
        conn.pending = None;
        match conn.deadline {
            None => {}
            Some(d) if d > now => {
                conn.gen += 1;
                conn.pending = Some(d);
                let gen = conn.gen;
                self.q.at(d, Ev::Rto { conn: c, gen });
            }
            Some(_) => {
                conn.deadline = None;
                let mut acts = std::mem::take(&mut self.acts);
                conn.snd.on_timeout(now, &mut acts);
                self.apply(c, &mut acts);
                self.acts = acts;
            }
        }
    }

    fn arrive(&mut self, now: Time, node: NodeId, id: u32) {
        let p = self.net.pkts.get(id).clone();
        if p.dst != node {
            self.net.send(&mut self.q, node, id, &mut self.rng_ber);
            return;
        }
        self.net.pkts.release(id);
        match p.kind {
            Kind::Udp => {
                let f = &mut self.frags[p.seq as usize];
                f.got += p.len;
                if f.got >= f.bytes && f.arrived == NEVER {
                    self.arrived(now, p.seq as u32);
                }
            }
            Kind::Data => {
                let c = p.conn as usize;
                let ack = self.conns[c].rcv.on_data(p.seq, p.len);
                while let Some(&(end, fid)) = self.conns[c].bounds.front() {
                    if end > ack {
                        break;
                    }
                    self.conns[c].bounds.pop_front();
                    self.arrived(now, fid);
                }
                let src = self.conns[c].src;
                let pkt = self.net.pkts.alloc(Packet {
                    kind: Kind::Ack,
                    conn: p.conn,
                    seq: ack,
                    len: ACK_LEN,
                    dst: src,
                });
                self.net.send(&mut self.q, node, pkt, &mut self.rng_ber);
            }
            // The PC asks for a fragment it holds a token for: the LCM sends it (once:
            // a request asked again may arrive after the first).
            Kind::Pull => {
                if self.frags[p.seq as usize].sent == NEVER {
                    self.transmit(now, p.seq as u32);
                }
            }
            Kind::Ack => {
                let mut acts = std::mem::take(&mut self.acts);
                self.conns[p.conn as usize]
                    .snd
                    .on_ack(p.seq, now, &mut acts);
                self.apply(p.conn, &mut acts);
                self.acts = acts;
            }
        }
    }

    /// Segments sent and retransmitted over all TCP connections.
    pub fn tcp_segments(&self) -> (u64, u64, u64) {
        self.conns.iter().fold((0, 0, 0), |(s, r, t), c| {
            (
                s + c.snd.segments_sent,
                r + c.snd.segments_retransmitted,
                t + c.snd.timeouts,
            )
        })
    }
}
