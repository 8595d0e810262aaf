//! One fat-tree run (seed 002 §5): hosts send constant-rate UDP-like flows in a traffic
//! pattern, routed by single path or ECMP with optional Hedera; metrics every 10 s.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::hedera::{Controller, Placement, Seen};
use super::topo::{ecmp_index, mix, FatTree};
use crate::engine::{Queue, Time, SEC};
use crate::flow::{FlowId, Fluid};

/// How a flow's path is chosen when it starts (Hedera may move it later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// One shortest path per host pair, the first of the controller's route list (via
    /// core 0 between pods): what the thesis's Floodlight "ECMP" installed.
    SinglePath,
    /// Per-flow ECMP: a hash of the 5-tuple picks one of the equal-cost paths.
    Ecmp,
}

/// Who sends to whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// A random bijection without fixed points: every host sends to one other host and
    /// receives from one.
    Random,
    /// Host x sends to (x + i) mod hosts.
    Stride(u32),
}

impl std::str::FromStr for Pattern {
    type Err = crate::ConfigError;
    fn from_str(s: &str) -> Result<Self, crate::ConfigError> {
        let s = s.trim();
        if s == "random" {
            return Ok(Pattern::Random);
        }
        if let Some(v) = s.strip_prefix("stride(").and_then(|r| r.strip_suffix(')')) {
            return v
                .trim()
                .parse()
                .map(Pattern::Stride)
                .map_err(|_| format!("pattern {s:?}: stride(i) needs a whole number").into());
        }
        Err(format!("pattern {s:?}: random or stride(i)").into())
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Random => f.write_str("random"),
            Pattern::Stride(i) => write!(f, "stride({i})"),
        }
    }
}

/// A fat-tree run's configuration; the defaults are seed 002's experiment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FabricConfig {
    pub k: u32,
    pub hosts_per_edge: u32,
    /// Links between switches.
    pub switch_mbps: f64,
    /// Links between hosts and edge switches.
    pub host_mbps: f64,
    /// `random` or `stride(i)`.
    pub pattern: String,
    pub routing: Routing,
    /// Hedera's placement, or none (ECMP / single path alone).
    pub hedera: Option<Placement>,
    pub hedera_interval_s: f64,
    /// Elephant threshold, fraction of the host link rate.
    pub elephant_frac: f64,
    pub anneal_iterations: u32,
    /// Idle time before the first flow starts.
    pub idle_s: f64,
    /// Each flow's duration (D-ITG's -t).
    pub traffic_s: f64,
    /// Hosts start one after another over this time (D-ITG launched host by host); each
    /// still sends for `traffic_s`.
    pub start_spread_s: f64,
    /// Idle time after the last flow ends.
    pub tail_s: f64,
    pub sample_s: f64,
    pub packet_bytes: u32,
    /// Each flow's packet rate is drawn uniformly from [min, max] packets/s.
    pub rate_min_pps: f64,
    pub rate_max_pps: f64,
    pub seed: u64,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            k: 4,
            hosts_per_edge: 10,
            switch_mbps: 10.0,
            host_mbps: 1.0,
            pattern: "random".into(),
            routing: Routing::SinglePath,
            hedera: None,
            hedera_interval_s: 5.0,
            elephant_frac: 0.1,
            anneal_iterations: 1000,
            idle_s: 20.0,
            traffic_s: 140.0,
            start_spread_s: 0.0,
            tail_s: 20.0,
            sample_s: 10.0,
            packet_bytes: 1500,
            rate_min_pps: 1000.0,
            rate_max_pps: 2000.0,
            seed: 1,
        }
    }
}

/// Most packets a second a host's flow may ask for (a 100 Gbit/s link carries about
/// 150 million of the smallest).
const MAX_PPS: f64 = 1e9;

impl FabricConfig {
    /// Checks every value, naming the field at fault.
    pub fn check(&self) -> Result<Pattern, crate::ConfigError> {
        if self.k < 2 || self.k & 1 == 1 || self.k > 64 {
            return Err(format!("k = {}: an even number from 2 to 64", self.k).into());
        }
        if self.hosts_per_edge == 0 || self.hosts_per_edge > 1000 {
            return Err("hosts_per_edge: 1 to 1000".into());
        }
        for (name, v) in [
            ("switch_mbps", self.switch_mbps),
            ("host_mbps", self.host_mbps),
            ("hedera_interval_s", self.hedera_interval_s),
            ("sample_s", self.sample_s),
            ("rate_min_pps", self.rate_min_pps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} = {v}: must be positive").into());
            }
        }
        for (name, v) in [
            ("idle_s", self.idle_s),
            ("traffic_s", self.traffic_s),
            ("start_spread_s", self.start_spread_s),
            ("tail_s", self.tail_s),
            ("elephant_frac", self.elephant_frac),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} = {v}: must be zero or positive").into());
            }
        }
        if self.start_spread_s > self.tail_s {
            return Err(
                "start_spread_s must not exceed tail_s (late hosts stop in the tail)".into(),
            );
        }
        if self.rate_max_pps.is_nan() || self.rate_max_pps > MAX_PPS {
            let v = self.rate_max_pps;
            return Err(format!("rate_max_pps = {v}: at most {MAX_PPS:e} packets a second").into());
        }
        if self.rate_max_pps < self.rate_min_pps {
            return Err("rate_max_pps must be at least rate_min_pps".into());
        }
        if self.duration_s() > 100_000.0 {
            return Err("run longer than 100 000 s".into());
        }
        // Each step takes time (a step that rounds to 0 ns never ends) and a run has at
        // most a million of them.
        let hedera = self
            .hedera
            .map(|_| ("hedera_interval_s", self.hedera_interval_s));
        for (name, step) in std::iter::once(("sample_s", self.sample_s)).chain(hedera) {
            if step < 1e-6 || self.duration_s() / step > 1e6 {
                return Err(format!(
                    "{name} = {step}: at least 1 µs and at most a million steps in the run"
                )
                .into());
            }
        }
        if self.seed > crate::MAX_SEED {
            return Err(format!("seed = {}: at most 2^62", self.seed).into());
        }
        let p: Pattern = self.pattern.parse()?;
        if let Pattern::Stride(i) = p {
            let hosts = self.k * self.k / 2 * self.hosts_per_edge;
            if i % hosts == 0 {
                return Err(format!("pattern stride({i}): hosts would send to themselves").into());
            }
        }
        Ok(p)
    }

    /// Idle, traffic and tail: the thesis's 180 s. Hosts that start late (the spread)
    /// stop late too, inside the tail.
    pub fn duration_s(&self) -> f64 {
        self.idle_s + self.traffic_s + self.tail_s
    }
}

/// The metrics of seed 002 §4.3.6 over one sampling interval. `rx` are the
/// aggregation-to-core links (what core ports receive), `tx` core-to-aggregation.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// End of the interval, seconds.
    pub t: f64,
    /// Core Link Load Balancing Level: max load / mean load of the core links (NaN when
    /// they carried nothing).
    pub level_rx: f64,
    pub level_tx: f64,
    /// Bisection Bandwidth: mean utilisation (load / capacity) of the core links.
    pub bb_rx: f64,
    pub bb_tx: f64,
    /// Mean rate of the flows active at the sample, Mbit/s (a check on what the hosts got).
    pub flow_mbps: f64,
}

pub struct FabricRun {
    pub cfg: FabricConfig,
    pub samples: Vec<Sample>,
    /// Flows moved by Hedera (path changed).
    pub moves: u64,
    pub hedera_rounds: u64,
    pub solves: u64,
    pub events: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Start(u32),
    Stop(u32),
    Hedera,
    Sample,
}

struct Host {
    dst: u32,
    rate_bps: f64,
    path: usize,
    placed: bool,
    flow: Option<FlowId>,
    /// Bits sent at the controller's previous poll (its flow statistics).
    polled: f64,
    /// Mean rate over the last poll interval, bit/s.
    last_rate: f64,
}

fn secs(v: f64) -> Time {
    (v * SEC as f64).round() as Time
}

/// Each of `n` hosts' destination: a stride, or a random permutation without fixed
/// points.
fn destinations(pattern: Pattern, n: u32, rng: &mut rand_pcg::Pcg64Mcg) -> Vec<u32> {
    match pattern {
        // In u64: a stride near u32::MAX must not wrap (it stays a bijection).
        Pattern::Stride(i) => (0..n)
            .map(|x| ((x as u64 + i as u64) % n as u64) as u32)
            .collect(),
        Pattern::Random => loop {
            let mut p: Vec<u32> = (0..n).collect();
            for i in (1..n as usize).rev() {
                let j = rng.gen_range(0..=i);
                p.swap(i, j);
            }
            if n < 2 || p.iter().enumerate().all(|(i, &d)| i as u32 != d) {
                break p;
            }
        },
    }
}

/// Runs one fat-tree scenario.
pub fn run(cfg: &FabricConfig) -> Result<FabricRun, crate::ConfigError> {
    let pattern = cfg.check()?;
    let mut sim = FabricSim::new(cfg, pattern);
    let n = sim.tree.hosts;
    let mut q: Queue<Ev> = Queue::new();
    let end = secs(cfg.duration_s());
    for h in 0..n {
        let start = secs(cfg.idle_s + cfg.start_spread_s * h as f64 / n as f64);
        q.at(start, Ev::Start(h));
        q.at(start + secs(cfg.traffic_s), Ev::Stop(h));
    }
    let sample = secs(cfg.sample_s);
    q.at(sample.min(end), Ev::Sample);
    if sim.ctl.is_some() {
        q.at(secs(cfg.hedera_interval_s), Ev::Hedera);
    }
    while let Some((t, ev)) = q.pop() {
        if t > end {
            break;
        }
        sim.net.solve();
        sim.net.advance(t);
        match ev {
            Ev::Start(h) => sim.start(h),
            Ev::Stop(h) => sim.stop(h),
            Ev::Hedera => {
                sim.hedera(t);
                let next = t + secs(cfg.hedera_interval_s);
                if next <= end {
                    q.at(next, Ev::Hedera);
                }
            }
            Ev::Sample => {
                sim.sample(t);
                if t < end {
                    q.at((t + sample).min(end), Ev::Sample);
                }
            }
        }
    }
    Ok(FabricRun {
        cfg: cfg.clone(),
        samples: sim.samples,
        moves: sim.moves,
        hedera_rounds: sim.rounds,
        solves: sim.net.solves,
        events: q.processed,
    })
}

/// One fat-tree scenario's state: the network, every host's flow, the controller and
/// the samples taken.
struct FabricSim {
    net: Fluid,
    tree: FatTree,
    hosts: Vec<Host>,
    ctl: Option<Controller>,
    caps: Vec<f64>,
    poller: crate::flow::LinkPoller,
    /// Core links (aggregation to core, core to aggregation) and what each had carried
    /// at the previous sample, taken at `last_t`.
    up: Vec<u32>,
    down: Vec<u32>,
    last_up: Vec<f64>,
    last_down: Vec<f64>,
    last_t: Time,
    samples: Vec<Sample>,
    moves: u64,
    rounds: u64,
}

impl FabricSim {
    fn new(cfg: &FabricConfig, pattern: Pattern) -> Self {
        let (net, tree) =
            FatTree::network(cfg.k, cfg.hosts_per_edge, cfg.switch_mbps, cfg.host_mbps);
        let hosts = hosts(cfg, pattern, &tree);
        let ctl = cfg.hedera.map(|p| {
            let mut c =
                Controller::new(p, &tree, net.links.len(), cfg.seed ^ 0x082e_fa98_ec4e_6c89);
            c.threshold = cfg.elephant_frac;
            c.anneal_iterations = cfg.anneal_iterations;
            c
        });
        let (up, down) = tree.core_links();
        let (up, down) = (up.to_vec(), down.to_vec());
        let caps: Vec<f64> = net.links.iter().map(|l| l.cap).collect();
        FabricSim {
            poller: crate::flow::LinkPoller::new(caps.len()),
            last_up: vec![0.0; up.len()],
            last_down: vec![0.0; down.len()],
            net,
            tree,
            hosts,
            ctl,
            caps,
            up,
            down,
            last_t: 0,
            samples: Vec::new(),
            moves: 0,
            rounds: 0,
        }
    }

    /// Host `h` starts its flow on its current path.
    fn start(&mut self, h: u32) {
        let s = &mut self.hosts[h as usize];
        let path = self.tree.path(h, s.dst, s.path);
        s.flow = Some(self.net.start(&path, s.rate_bps, f64::INFINITY, h as u64));
    }

    /// Host `h` stops sending; the controller forgets its flow.
    fn stop(&mut self, h: u32) {
        if let Some(id) = self.hosts[h as usize].flow.take() {
            self.net.stop(id);
        }
        if let Some(c) = self.ctl.as_mut() {
            c.release(h as u64);
        }
    }

    /// A Hedera round: the controller sees every active flow's rate and moves some.
    fn hedera(&mut self, t: Time) {
        self.net.solve();
        self.rounds += 1;
        // Like the thesis's port and flow statistics: rates are byte-counter differences
        // over the last interval, not instantaneous rates.
        let dt = self.poller.interval_s(t);
        let loads = self.poller.poll(&self.net, t);
        for s in self.hosts.iter_mut() {
            let sent = s.flow.map_or(0.0, |f| self.net.flow(f).sent);
            s.last_rate = (sent - s.polled).max(0.0) / dt;
            s.polled = sent;
        }
        let active: Vec<u32> = (0..self.tree.hosts)
            .filter(|&h| self.hosts[h as usize].flow.is_some())
            .collect();
        let seen: Vec<Seen> = active
            .iter()
            .map(|&h| {
                let s = &self.hosts[h as usize];
                Seen {
                    src: h,
                    dst: s.dst,
                    rate: s.last_rate,
                    cap: s.rate_bps,
                    path: s.path,
                    placed: s.placed,
                    key: h as u64,
                }
            })
            .collect();
        let c = self
            .ctl
            .as_mut()
            .expect("hedera rounds only with a controller");
        for (i, p) in c.round(&self.tree, &self.caps, &loads, &seen) {
            let h = active[i];
            let s = &mut self.hosts[h as usize];
            s.placed = true;
            if s.path != p {
                s.path = p;
                self.moves += 1;
                let route = self.tree.path(h, s.dst, p);
                self.net.reroute(s.flow.expect("active"), &route);
            }
        }
    }

    /// The core links' levels and utilisation since the previous sample, and the mean
    /// rate of the active flows.
    fn sample(&mut self, t: Time) {
        self.net.solve();
        let dt = (t - self.last_t) as f64 / SEC as f64;
        let (level_rx, bb_rx) = core_metric(&self.net, &self.up, &mut self.last_up, dt);
        let (level_tx, bb_tx) = core_metric(&self.net, &self.down, &mut self.last_down, dt);
        let act: Vec<f64> = self
            .hosts
            .iter()
            .filter_map(|s| s.flow.map(|f| self.net.flow(f).rate))
            .collect();
        let flow_mbps = if act.is_empty() {
            0.0
        } else {
            act.iter().sum::<f64>() / act.len() as f64 / 1e6
        };
        self.samples.push(Sample {
            t: t as f64 / SEC as f64,
            level_rx,
            level_tx,
            bb_rx,
            bb_tx,
            flow_mbps,
        });
        self.last_t = t;
    }
}

/// Every host's flow as configured: its destination, rate and first path.
fn hosts(cfg: &FabricConfig, pattern: Pattern, tree: &FatTree) -> Vec<Host> {
    // Separate random streams: the pattern, the rates, the switches' hash seed, and
    // the annealer, so changing one leaves the others' draws unchanged.
    let mut rng_pattern = rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ 0x243f_6a88_85a3_08d3);
    let mut rng_rate = rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ 0x1319_8a2e_0370_7344);
    let salt = mix(cfg.seed ^ 0xa409_3822_299f_31d0);
    let dsts = destinations(pattern, tree.hosts, &mut rng_pattern);
    dsts.iter()
        .enumerate()
        .map(|(src, &dst)| {
            let pps = rng_rate.gen_range(cfg.rate_min_pps..=cfg.rate_max_pps);
            let np = tree.n_paths(src as u32, dst);
            // D-ITG: a fresh source port per sender, destination port 7000.
            let port = 10_000u16.wrapping_add(src as u16);
            let path = match cfg.routing {
                Routing::SinglePath => 0,
                Routing::Ecmp => ecmp_index(src as u32, dst, port, 7000, salt, np),
            };
            Host {
                dst,
                rate_bps: pps * cfg.packet_bytes as f64 * 8.0,
                path,
                placed: false,
                flow: None,
                polled: 0.0,
                last_rate: 0.0,
            }
        })
        .collect()
}

/// Core links' (level, utilisation) over the `dt` s since `last` (their carried bits
/// then, updated here): level is max / mean load (NaN when they carried nothing).
fn core_metric(net: &Fluid, links: &[u32], last: &mut [f64], dt: f64) -> (f64, f64) {
    let loads: Vec<f64> = links
        .iter()
        .zip(last.iter_mut())
        .map(|(&l, prev)| {
            let c = net.links[l as usize].carried;
            let v = (c - *prev) / dt;
            *prev = c;
            v.max(0.0)
        })
        .collect();
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    let max = loads.iter().copied().fold(0.0, f64::max);
    let level = if mean > 1e-9 { max / mean } else { f64::NAN };
    let bb = loads
        .iter()
        .zip(links)
        .map(|(v, &l)| v / net.links[l as usize].cap)
        .sum::<f64>()
        / loads.len() as f64;
    (level, bb)
}

impl FabricRun {
    /// samples.csv: one row per sampling interval (empty level when nothing flowed).
    pub fn csv(&self) -> String {
        let mut s = String::from("time_s,level_rx,level_tx,bb_rx,bb_tx,flow_mbps\n");
        let f = |v: f64| {
            if v.is_nan() {
                String::new()
            } else {
                format!("{v:.5}")
            }
        };
        for x in &self.samples {
            s.push_str(&format!(
                "{},{},{},{:.7},{:.7},{:.5}\n",
                x.t,
                f(x.level_rx),
                f(x.level_tx),
                x.bb_rx,
                x.bb_tx,
                x.flow_mbps
            ));
        }
        s
    }
}
