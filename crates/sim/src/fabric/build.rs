//! Event building over a fat tree: FLPs and EPNs on the hosts, so the EPN policy (which
//! EPN builds a TF) and the routing (which path each STF takes) together load the core.

use fanin_sched::policy::LeastLoadedConfig;
use fanin_sched::{Placed, Placer, PolicyConfig, PolicyKind};
use serde::{Deserialize, Serialize};

use super::hedera::{Controller, Placement, Seen};
use super::run::Routing;
use super::topo::{ecmp_index, mix, FatTree};
use crate::engine::{Queue, Time, SEC};
use crate::flow::{FlowId, Fluid};

/// An event-building run on a fat tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuildConfig {
    pub k: u32,
    pub hosts_per_edge: u32,
    pub switch_mbps: f64,
    pub host_mbps: f64,
    /// Every `flp_every`-th host is an FLP (spread over all edge switches); the others
    /// are EPNs.
    pub flp_every: u32,
    pub tf_rate_hz: f64,
    /// Each FLP's output as a fraction of its host link.
    pub load: f64,
    pub policy: PolicyKind,
    /// `weighted-round-robin`: weight of EPN i, as the runtime's `epn_weights`.
    pub epn_weights: Vec<u32>,
    /// `least-loaded` parameters, as the runtime's (EPNs report no load here: every
    /// EPN qualifies).
    pub least_loaded: LeastLoadedConfig,
    pub routing: Routing,
    pub hedera: Option<Placement>,
    pub hedera_interval_s: f64,
    pub duration_s: f64,
    pub drain_s: f64,
    pub seed: u64,
}

impl Default for BuildConfig {
    fn default() -> Self {
        BuildConfig {
            k: 8,
            hosts_per_edge: 4,
            switch_mbps: 10_000.0,
            host_mbps: 10_000.0,
            flp_every: 4,
            tf_rate_hz: 50.0,
            load: 0.5,
            policy: PolicyKind::RoundRobin,
            epn_weights: Vec::new(),
            least_loaded: LeastLoadedConfig::default(),
            routing: Routing::Ecmp,
            hedera: None,
            hedera_interval_s: 1.0,
            duration_s: 10.0,
            drain_s: 10.0,
            seed: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildSummary {
    pub issued: u64,
    pub completed: u64,
    /// Still arriving at the end of the drain.
    pub incomplete: u64,
    /// The policy had no EPN.
    pub dropped: u64,
    pub invariant_ok: bool,
    pub latency_p50_s: f64,
    pub latency_p99_s: f64,
    /// Core links over the issuing period: max / mean carried (RX: aggregation to core,
    /// TX: core to aggregation), and mean utilisation.
    pub level_rx: f64,
    pub level_tx: f64,
    pub bisection: f64,
    pub moves: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Issue(u64),
    Finish,
    Hedera,
    Mark,
}

struct Stf {
    tf: u64,
    src: u32,
    dst: u32,
    path: usize,
    placed: bool,
    polled: f64,
}

/// Checks every value of a build run, naming the field at fault.
pub fn check(cfg: &BuildConfig) -> Result<(), crate::ConfigError> {
    if cfg.k < 2 || cfg.k & 1 == 1 || cfg.k > 64 {
        return Err("k: even, 2 to 64".into());
    }
    if cfg.hosts_per_edge == 0 || cfg.hosts_per_edge > 1000 {
        return Err("hosts_per_edge: 1 to 1000".into());
    }
    for (n, v) in [
        ("switch_mbps", cfg.switch_mbps),
        ("host_mbps", cfg.host_mbps),
        ("tf_rate_hz", cfg.tf_rate_hz),
        ("load", cfg.load),
        ("hedera_interval_s", cfg.hedera_interval_s),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{n} = {v}: must be positive").into());
        }
    }
    let duration_ok = cfg.duration_s.is_finite()
        && cfg.duration_s >= 1e-6
        && cfg.duration_s <= 1e6
        && cfg.duration_s * cfg.tf_rate_hz <= 1e6;
    let drain_ok = cfg.drain_s.is_finite() && (0.0..=1e6).contains(&cfg.drain_s);
    if !duration_ok || !drain_ok {
        return Err("duration_s 1 µs to 10^6 s (and at most 10^6 TFs), drain_s 0 to 10^6 s".into());
    }
    let steps = (cfg.duration_s + cfg.drain_s) / cfg.hedera_interval_s;
    if cfg.hedera.is_some() && (cfg.hedera_interval_s < 1e-6 || steps > 1e6) {
        let v = cfg.hedera_interval_s;
        return Err(
            format!("hedera_interval_s = {v}: at least 1 µs and at most a million steps").into(),
        );
    }
    if cfg.flp_every < 2 {
        return Err(format!(
            "flp_every = {}: at least 2 (FLPs and EPNs both)",
            cfg.flp_every
        )
        .into());
    }
    Ok(())
}

pub fn run(cfg: &BuildConfig) -> Result<BuildSummary, crate::ConfigError> {
    check(cfg)?;
    let mut sim = BuildSim::new(cfg);
    let mut q: Queue<Ev> = Queue::new();
    let n_tfs = (cfg.duration_s * cfg.tf_rate_hz).round() as u64;
    let stop = (cfg.duration_s * SEC as f64).round() as Time;
    let end = stop + (cfg.drain_s * SEC as f64).round() as Time;
    let interval = (cfg.hedera_interval_s * SEC as f64).round() as Time;
    if n_tfs > 0 {
        q.at(0, Ev::Issue(0));
    }
    q.at(stop, Ev::Mark);
    if sim.ctl.is_some() {
        q.at(interval, Ev::Hedera);
    }
    let mut finish_at: Option<Time> = None;
    while let Some((t, ev)) = q.pop() {
        if t > end {
            break;
        }
        sim.net.advance(t);
        match ev {
            Ev::Issue(n) => {
                if n + 1 < n_tfs {
                    let next = (n + 1) as f64 / cfg.tf_rate_hz * SEC as f64;
                    q.at(next.round() as Time, Ev::Issue(n + 1));
                }
                sim.issue(n, t);
            }
            Ev::Finish => {
                if finish_at == Some(t) {
                    finish_at = None;
                }
                sim.finish(t);
            }
            Ev::Hedera => {
                sim.hedera(t);
                if t + interval <= end {
                    q.at(t + interval, Ev::Hedera);
                }
            }
            Ev::Mark => sim.mark(),
        }
        sim.net.solve();
        if let Some(f) = sim.net.next_finish() {
            if finish_at.is_none_or(|x| f < x) {
                finish_at = Some(f);
                q.at(f, Ev::Finish);
            }
        }
    }
    Ok(sim.summary(stop))
}

/// One build run's state: the network, the placement, every STF's flow and what the
/// summary counts.
struct BuildSim<'a> {
    cfg: &'a BuildConfig,
    net: Fluid,
    tree: FatTree,
    flps: Vec<u32>,
    epns: Vec<u32>,
    placer: Placer,
    stf_bits: f64,
    salt: u64,
    caps: Vec<f64>,
    ctl: Option<Controller>,
    poller: crate::flow::LinkPoller,
    stfs: Vec<Stf>,
    /// Flow id -> STF index, and STF index -> its flow while under way.
    flow_stf: Vec<u32>,
    stf_flow: Vec<Option<FlowId>>,
    /// STFs of each TF still under way, and when each TF was issued.
    left: Vec<u32>,
    issued_at: Vec<Time>,
    latencies: Vec<f64>,
    dropped: u64,
    moves: u64,
    /// Core links' carried bits (up, down) when issuing stopped.
    at_stop: Option<(Vec<f64>, Vec<f64>)>,
}

impl<'a> BuildSim<'a> {
    fn new(cfg: &'a BuildConfig) -> Self {
        let (net, tree) =
            FatTree::network(cfg.k, cfg.hosts_per_edge, cfg.switch_mbps, cfg.host_mbps);
        let every = cfg.flp_every;
        let flps: Vec<u32> = (0..tree.hosts).filter(|h| h % every == 0).collect();
        let epns: Vec<u32> = (0..tree.hosts).filter(|h| h % every != 0).collect();
        let policy = PolicyConfig {
            kind: cfg.policy,
            epn_weights: cfg.epn_weights.clone(),
            least_loaded: cfg.least_loaded,
        };
        let mut placer = Placer::new(policy.build());
        for e in 0..epns.len() as u32 {
            placer.policy_mut().add_epn(e);
        }
        let caps: Vec<f64> = net.links.iter().map(|l| l.cap).collect();
        let ctl = cfg
            .hedera
            .map(|p| Controller::new(p, &tree, caps.len(), cfg.seed ^ 0x082e_fa98_ec4e_6c89));
        BuildSim {
            cfg,
            stf_bits: cfg.load * cfg.host_mbps * 1e6 / cfg.tf_rate_hz,
            salt: mix(cfg.seed ^ 0xa409_3822_299f_31d0),
            poller: crate::flow::LinkPoller::new(caps.len()),
            net,
            tree,
            flps,
            epns,
            placer,
            caps,
            ctl,
            stfs: Vec::new(),
            flow_stf: Vec::new(),
            stf_flow: Vec::new(),
            left: Vec::new(),
            issued_at: Vec::new(),
            latencies: Vec::new(),
            dropped: 0,
            moves: 0,
            at_stop: None,
        }
    }

    /// TF `n` at `t`: its EPN from the policy, an STF flow from every FLP to it.
    fn issue(&mut self, n: u64, t: Time) {
        self.issued_at.push(t);
        self.left.push(0);
        let bytes = (self.stf_bits / 8.0 * self.flps.len() as f64) as u64;
        match self.placer.issue(n, bytes) {
            Placed::Assigned(e) => {
                let dst = self.epns[e as usize];
                for i in 0..self.flps.len() {
                    self.start_stf(n, self.flps[i], dst);
                }
            }
            // EPNs report no load here, so no policy makes a TF wait; if one did, the TF
            // is dropped and leaves the queue.
            Placed::Waiting => {
                self.placer.drain_waiting();
                self.dropped += 1;
            }
            Placed::Dropped(_) => self.dropped += 1,
        }
    }

    /// The STF of TF `n` from `src` to `dst`, on the path the routing picks.
    fn start_stf(&mut self, n: u64, src: u32, dst: u32) {
        let np = self.tree.n_paths(src, dst);
        let path = match self.cfg.routing {
            Routing::SinglePath => 0,
            Routing::Ecmp => ecmp_index(src, dst, n as u16, 5555, self.salt, np),
        };
        let route = self.tree.path(src, dst, path);
        let id = self.net.start(&route, f64::INFINITY, self.stf_bits, n);
        let s = self.stfs.len() as u32;
        self.stfs.push(Stf {
            tf: n,
            src,
            dst,
            path,
            placed: false,
            polled: 0.0,
        });
        self.stf_flow.push(Some(id));
        if self.flow_stf.len() <= id as usize {
            self.flow_stf.resize(id as usize + 1, 0);
        }
        self.flow_stf[id as usize] = s;
        self.left[n as usize] += 1;
    }

    /// The flows that ended at `t`: a TF completes with its last STF.
    fn finish(&mut self, t: Time) {
        for id in self.net.finished() {
            let s = self.flow_stf[id as usize];
            self.net.stop(id);
            self.stf_flow[s as usize] = None;
            if let Some(c) = self.ctl.as_mut() {
                c.release(s as u64);
            }
            let n = self.stfs[s as usize].tf as usize;
            assert!(self.left[n] > 0, "TF {n}: an STF finished twice");
            self.left[n] -= 1;
            if self.left[n] == 0 {
                self.latencies
                    .push((t - self.issued_at[n]) as f64 / SEC as f64);
            }
        }
    }

    /// A Hedera round: the controller sees every STF's rate and moves some to new paths.
    fn hedera(&mut self, t: Time) {
        self.net.solve();
        let dt = self.poller.interval_s(t);
        let loads = self.poller.poll(&self.net, t);
        let active: Vec<u32> = (0..self.stfs.len() as u32)
            .filter(|&s| self.stf_flow[s as usize].is_some())
            .collect();
        let seen: Vec<Seen> = active.iter().map(|&s| self.seen(s, dt)).collect();
        let c = self.ctl.as_mut().expect("controller");
        for (i, p) in c.round(&self.tree, &self.caps, &loads, &seen) {
            let s = active[i] as usize;
            self.stfs[s].placed = true;
            if self.stfs[s].path != p {
                self.stfs[s].path = p;
                self.moves += 1;
                let st = &self.stfs[s];
                let route = self.tree.path(st.src, st.dst, p);
                self.net.reroute(self.stf_flow[s].expect("active"), &route);
            }
        }
    }

    /// What the controller sees of active STF `s`: its rate over the last `dt` s.
    fn seen(&mut self, s: u32, dt: f64) -> Seen {
        let sent = self
            .net
            .flow(self.stf_flow[s as usize].expect("active"))
            .sent;
        let st = &mut self.stfs[s as usize];
        let rate = (sent - st.polled).max(0.0) / dt;
        st.polled = sent;
        Seen {
            src: st.src,
            dst: st.dst,
            rate,
            cap: f64::INFINITY,
            path: st.path,
            placed: st.placed,
            key: s as u64,
        }
    }

    /// Issuing stopped: what the core links carried until now.
    fn mark(&mut self) {
        let carried = |v: &[u32]| {
            v.iter()
                .map(|&l| self.net.links[l as usize].carried)
                .collect()
        };
        self.at_stop = Some((carried(&self.tree.core_up), carried(&self.tree.core_down)));
    }

    /// The run's counts (checked against each other), latencies and core-link figures
    /// over the issuing period, which ended at `stop`.
    fn summary(mut self, stop: Time) -> BuildSummary {
        let (cu, cd) = self.at_stop.take().unwrap_or_default();
        let secs = stop as f64 / SEC as f64;
        let level = |c: &[f64]| {
            let mean = c.iter().sum::<f64>() / c.len().max(1) as f64;
            if mean > 0.0 {
                c.iter().copied().fold(0.0, f64::max) / mean
            } else {
                f64::NAN
            }
        };
        let up = self.tree.core_up.len() as f64;
        let bisection = cu.iter().sum::<f64>() / (up * self.tree.switch_bps * secs);
        // Each count from its own source, so the check below can fail: a TF completes
        // when its last STF arrives, is incomplete while some STF is still under way.
        let issued = self.issued_at.len() as u64;
        let completed = self.latencies.len() as u64;
        let incomplete = self.left.iter().filter(|&&n| n > 0).count() as u64;
        self.latencies.sort_by(f64::total_cmp);
        let pct = |p: f64| fanin_report::percentile(&self.latencies, p).unwrap_or(0.0);
        BuildSummary {
            issued,
            completed,
            incomplete,
            dropped: self.dropped,
            invariant_ok: issued == completed + incomplete + self.dropped,
            latency_p50_s: pct(0.5),
            latency_p99_s: pct(0.99),
            level_rx: level(&cu),
            level_tx: level(&cd),
            bisection,
            moves: self.moves,
        }
    }
}
