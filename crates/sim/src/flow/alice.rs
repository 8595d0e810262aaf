//! ALICE O2 at full scale on the flow model: every FLP sends its STF of each TF to the
//! EPN a `fanin_sched` policy picks; EPNs build, buffer and process TFs, fail and return.

// The network is one non-blocking switch: an STF crosses its FLP's uplink and its EPN's
// downlink, sharing both max-min fairly with the other STFs in flight.

use std::collections::{BTreeMap, VecDeque};

use fanin_sched::policy::LeastLoadedConfig;
use fanin_sched::{EpnLoad, Gather, Heard, Placed, Placer, PolicyConfig, PolicyKind, StfSize};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::engine::{Queue, Time, SEC};
use crate::flow::{FlowId, Fluid};

/// An exponentially distributed draw with mean `mean` (inverse transform).
fn exp_draw(rng: &mut impl Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.gen::<f64>()).ln()
}

/// An ALICE-scale run's configuration. `preset` fills the scale; explicit keys win.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AliceConfig {
    /// `alice-2016` (268 FLPs x 1500 EPNs, seed 003) or `alice-tdr` (250 x 1750, seed 000).
    pub preset: Option<String>,
    pub flps: Option<u32>,
    pub epns: Option<u32>,
    /// Mean output of one FLP, Gbit/s (seed 003: 20).
    pub flp_gbps: Option<f64>,
    /// TFs issued per second (the issue: ~88).
    pub tf_rate_hz: Option<f64>,
    /// FLP NIC, Gbit/s (seed 003's candidates: 40 GbE, 56 Gb/s IB, 100 Gb/s OPA).
    pub flp_nic_gbps: Option<f64>,
    /// EPN NIC, Gbit/s (seed 003: "EPNs can be equipped with standard 10 Gb/s cards").
    pub epn_nic_gbps: Option<f64>,
    /// STF size model from `crates/sched` (bytes); default: fixed, flp_gbps / tf_rate_hz.
    pub stf_size: Option<String>,
    /// `timer`: the ICN places TF n at its time n / rate with the size model's mean (it
    /// cannot know a real TF's size before the data exist); `on-data`: once every FLP's
    /// STF is read out and its announcement reached the ICN, with the exact size.
    pub schedule: SimSchedule,
    /// Read-out: the STF of FLP f for TF n is ready uniform(0, readout_ms) after the TF's
    /// time; a TF's STFs are sent once all are ready (both schedules).
    pub readout_ms: f64,
    /// On-data: an announcement's way from the FLP to the ICN, µs.
    pub announce_us: f64,
    pub policy: PolicyKind,
    /// `weighted-round-robin`: weight of EPN i, as the runtime's `epn_weights` (default:
    /// capacity weights, 10 for a normal EPN and 10 / slow_factor for a slow one).
    pub epn_weights: Vec<u32>,
    /// `least-loaded` parameters, as the runtime's `[run.least_loaded]`.
    pub least_loaded: LeastLoadedConfig,
    /// Seconds of TF issuing.
    pub duration_s: f64,
    /// Then this long for TFs in flight to finish.
    pub drain_s: f64,
    /// EPN buffer: a TF is reserved whole at assignment and freed when processed.
    pub epn_buffer_gb: f64,
    /// A TF not fully received this long after its issue ends incomplete.
    pub build_timeout_s: f64,
    /// Processing time of one TF on an EPN, seconds: `fixed(S)`, `uniform(A,B)` or `exp(MEAN)`.
    pub processing: String,
    /// TFs an EPN processes at once.
    pub processing_slots: u32,
    /// Heterogeneous nodes: this fraction of EPNs processes `slow_factor` times slower.
    pub slow_epn_frac: f64,
    pub slow_factor: f64,
    /// Failures: each EPN fails after an exponential time with this mean (0 = never)
    /// and returns after an exponential time with mean `mttr_s`.
    pub mtbf_s: f64,
    pub mttr_s: f64,
    /// Recompute rates at most this often (0 = at every start and finish, exact).
    pub recompute_ms: f64,
    /// When every FLP sends the same STF size for a TF (fixed, sine and random models),
    /// all FLPs are interchangeable and max-min gives the STFs of one TF equal rates:
    /// simulate one representative FLP link and EPN links of 1/FLPs of their capacity,
    /// one flow per TF. Exact by symmetry, and FLPs times cheaper. A run whose sizes
    /// differ between FLPs stops with an error unless this is false.
    pub aggregate: bool,
    /// Transfer tokens (`fanin_sched::TokenManager`, as ALICE's TfScheduler): at most
    /// this many EPNs read from one FLP at once (ALICE: 2), each EPN reading the STFs of
    /// its TF `epn_tokens` at a time from FLPs with a token free; absent: every STF
    /// flows as soon as its TF is ready (push). Needs `aggregate = false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flp_tokens: Option<u32>,
    /// With `flp_tokens`: STFs one EPN reads at once (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epn_tokens: Option<u32>,
    pub seed: u64,
}

impl Default for AliceConfig {
    fn default() -> Self {
        AliceConfig {
            preset: Some("alice-2016".into()),
            flps: None,
            epns: None,
            flp_gbps: None,
            tf_rate_hz: None,
            flp_nic_gbps: None,
            epn_nic_gbps: None,
            stf_size: None,
            schedule: SimSchedule::Timer,
            readout_ms: 0.0,
            announce_us: 50.0,
            policy: PolicyKind::RoundRobin,
            epn_weights: Vec::new(),
            least_loaded: LeastLoadedConfig::default(),
            duration_s: 60.0,
            drain_s: 30.0,
            epn_buffer_gb: 64.0,
            build_timeout_s: 30.0,
            processing: "fixed(10)".into(),
            processing_slots: 1,
            slow_epn_frac: 0.0,
            slow_factor: 2.0,
            mtbf_s: 0.0,
            mttr_s: 60.0,
            recompute_ms: 0.0,
            aggregate: true,
            flp_tokens: None,
            epn_tokens: None,
            seed: 1,
        }
    }
}

/// When a TF is placed (the runtime's `schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimSchedule {
    #[default]
    Timer,
    OnData,
}

/// The figures a run uses after the preset is applied.
#[derive(Debug, Clone, Serialize)]
pub struct Scale {
    pub flps: u32,
    pub epns: u32,
    pub flp_gbps: f64,
    pub tf_rate_hz: f64,
    pub flp_nic_gbps: f64,
    pub epn_nic_gbps: f64,
}

/// A processing-time model.
#[derive(Debug, Clone, Copy)]
pub enum Proc {
    Fixed(f64),
    Uniform(f64, f64),
    Exp(f64),
}

fn parse_proc(s: &str) -> Result<Proc, crate::ConfigError> {
    let s = s.trim();
    let args = |name: &str| -> Option<Vec<f64>> {
        let inner = s.strip_prefix(name)?.strip_prefix('(')?.strip_suffix(')')?;
        inner.split(',').map(|v| v.trim().parse().ok()).collect()
    };
    let bad = || format!("processing {s:?}: fixed(S), uniform(A,B) or exp(MEAN), seconds");
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if let Some(v) = args("fixed") {
        if v.len() == 1 && ok(v[0]) {
            return Ok(Proc::Fixed(v[0]));
        }
    } else if let Some(v) = args("uniform") {
        if v.len() == 2 && ok(v[0]) && ok(v[1]) && v[0] <= v[1] {
            return Ok(Proc::Uniform(v[0], v[1]));
        }
    } else if let Some(v) = args("exp") {
        if v.len() == 1 && ok(v[0]) {
            return Ok(Proc::Exp(v[0]));
        }
    }
    Err(bad().into())
}

impl AliceConfig {
    pub fn scale(&self) -> Result<Scale, crate::ConfigError> {
        let (f, e, g, r) = match self.preset.as_deref() {
            Some("alice-2016") | None => (268, 1500, 20.0, 88.0),
            // Seed 000 §1.1: 250 FLPs with 4 x 10 Gbit, 1750 EPNs with 10 Gbit. It gives no
            // TF rate or FLP output: the 2016 figures are kept (20 Gb/s, 88 TFs/s).
            Some("alice-tdr") => (250, 1750, 20.0, 88.0),
            Some(p) => return Err(format!("preset {p:?}: alice-2016 or alice-tdr").into()),
        };
        let s = Scale {
            flps: self.flps.unwrap_or(f),
            epns: self.epns.unwrap_or(e),
            flp_gbps: self.flp_gbps.unwrap_or(g),
            tf_rate_hz: self.tf_rate_hz.unwrap_or(r),
            flp_nic_gbps: self.flp_nic_gbps.unwrap_or(40.0),
            epn_nic_gbps: self.epn_nic_gbps.unwrap_or(10.0),
        };
        if s.flps == 0 || s.flps > 10_000 || s.epns == 0 || s.epns > 100_000 {
            return Err("flps: 1 to 10 000, epns: 1 to 100 000".into());
        }
        for (n, v) in [
            ("flp_gbps", s.flp_gbps),
            ("tf_rate_hz", s.tf_rate_hz),
            ("flp_nic_gbps", s.flp_nic_gbps),
            ("epn_nic_gbps", s.epn_nic_gbps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{n} = {v}: must be positive").into());
            }
        }
        Ok(s)
    }

    /// Checks every value, naming the field at fault.
    pub fn check(&self) -> Result<(Scale, StfSize, Proc), crate::ConfigError> {
        /// The largest STF the model takes (a rate of 1e300 Gbit/s would be u64::MAX).
        const MAX_STF_BYTES: u64 = 64 << 30;
        let s = self.scale()?;
        let size = match &self.stf_size {
            Some(m) => m.parse::<StfSize>().map_err(|e| format!("stf_size: {e}"))?,
            None => StfSize::Fixed((s.flp_gbps * 1e9 / 8.0 / s.tf_rate_hz).round() as u64),
        };
        let proc = parse_proc(&self.processing)?;
        fanin_sched::policy::check_weights(&self.epn_weights, 100_000)
            .map_err(|e| format!("epn_weights: {e}"))?;
        (self.least_loaded.check()).map_err(|(field, why)| format!("{field}: {why}"))?;
        if size.max() > MAX_STF_BYTES {
            let what = "an STF over 64 GiB: check stf_size, or flp_gbps against tf_rate_hz";
            return Err(what.into());
        }
        self.check_flows(size)?;
        for (n, v) in [
            ("duration_s", self.duration_s),
            ("drain_s", self.drain_s),
            ("epn_buffer_gb", self.epn_buffer_gb),
            ("build_timeout_s", self.build_timeout_s),
            ("slow_epn_frac", self.slow_epn_frac),
            ("slow_factor", self.slow_factor),
            ("mtbf_s", self.mtbf_s),
            ("mttr_s", self.mttr_s),
            ("recompute_ms", self.recompute_ms),
            ("readout_ms", self.readout_ms),
            ("announce_us", self.announce_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{n} = {v}: must be zero or positive").into());
            }
        }
        self.check_times(&proc, s.epns)?;
        if self.duration_s * s.tf_rate_hz > 1e7 {
            return Err("more than 10 million TFs: shorten duration_s".into());
        }
        // An EPN without buffer takes no TF (and its occupancy would divide by zero).
        if self.epn_buffer_gb == 0.0 {
            return Err("epn_buffer_gb must be positive".into());
        }
        // A shorter run ends at time 0, and its link and buffer means divide by it.
        if self.duration_s < 1e-6 {
            return Err("duration_s must be at least 1 µs".into());
        }
        if self.slow_epn_frac > 1.0 {
            return Err("slow_epn_frac is a fraction (0 to 1)".into());
        }
        if self.processing_slots == 0 {
            return Err("processing_slots must be at least 1".into());
        }
        Ok((s, size, proc))
    }

    /// Tokens and aggregation: what each needs of the other and of the STF sizes.
    fn check_flows(&self, size: StfSize) -> Result<(), crate::ConfigError> {
        let bad = |v: Option<u32>| v.is_some_and(|n| !(1..=100_000).contains(&n));
        if bad(self.flp_tokens) || bad(self.epn_tokens) {
            return Err("flp_tokens and epn_tokens must be within 1..=100000".into());
        }
        if self.epn_tokens.is_some() && self.flp_tokens.is_none() {
            return Err("epn_tokens needs flp_tokens (tokens are on only with it)".into());
        }
        if self.flp_tokens.is_some() && self.aggregate {
            return Err("flp_tokens needs aggregate = false (FLPs differ at each instant)".into());
        }
        // One representative FLP stands for all only when their STFs are the same size.
        if self.aggregate && matches!(size, StfSize::Uniform { min, max } if min < max) {
            let why = "stf_size: uniform sizes differ between FLPs; set aggregate = false";
            return Err(why.into());
        }
        Ok(())
    }
}

/// The longest time a flow-model parameter may name (about 30 years; an exponential's
/// mean a 40th of it, for its tail): simulated time in nanoseconds, the sum of a few of
/// them, stays far from overflowing.
const MAX_SECONDS: f64 = 1e9;

impl AliceConfig {
    /// Times within `MAX_SECONDS` (processing with its slow factor, an exponential's
    /// tail counted), and failures that a run can go through (at most 10 million).
    fn check_times(&self, proc: &Proc, epns: u32) -> Result<(), crate::ConfigError> {
        for (n, s, max) in [
            ("duration_s", self.duration_s, MAX_SECONDS),
            ("drain_s", self.drain_s, MAX_SECONDS),
            ("build_timeout_s", self.build_timeout_s, MAX_SECONDS),
            ("mtbf_s", self.mtbf_s, MAX_SECONDS / 40.0),
            ("mttr_s", self.mttr_s, MAX_SECONDS / 40.0),
            ("recompute_ms", self.recompute_ms / 1e3, MAX_SECONDS),
            ("readout_ms", self.readout_ms / 1e3, MAX_SECONDS),
            ("announce_us", self.announce_us / 1e6, MAX_SECONDS),
        ] {
            if s > max {
                return Err(format!("{n}: {s} s is over {max:e} s").into());
            }
        }
        let longest = match *proc {
            Proc::Fixed(a) => a,
            Proc::Uniform(_, b) => b,
            Proc::Exp(mean) => 40.0 * mean,
        };
        if longest * self.slow_factor.max(1.0) > MAX_SECONDS {
            let p = &self.processing;
            return Err(
                format!("processing {p:?} with slow_factor: over {MAX_SECONDS:e} s").into(),
            );
        }
        let failures = epns as f64 * (self.duration_s + self.drain_s) / (self.mtbf_s + self.mttr_s);
        if self.mtbf_s > 0.0 && failures > 1e7 {
            return Err(
                format!("mtbf_s: {failures:.0} failures expected; at most 10 million").into(),
            );
        }
        Ok(())
    }
}

/// How one TF ended (reasons as the runtime's ledger names them where they exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Completed,
    Incomplete(&'static str),
    Dropped(&'static str),
}

/// Per-run results, per policy.
#[derive(Debug, Clone, Serialize)]
pub struct AliceSummary {
    pub policy: String,
    pub scale: Scale,
    pub stf_bytes_mean: f64,
    pub issued: u64,
    pub completed: u64,
    pub incomplete: u64,
    pub dropped: u64,
    /// Incomplete TFs by reason: `build_timeout` (not all STFs within the build time-out
    /// from issue), `run_stopped` (still arriving at the end of the drain).
    pub incomplete_by_reason: BTreeMap<String, u64>,
    /// Dropped TFs by reason: the policy's (`no_epn`, `no_epn_buffer`, `epns_busy`),
    /// `epn_buffer_full` (the EPN could not hold it), `epn_lost` (its EPN failed while it
    /// arrived), `wait_timeout` (a waiting TF not placed within the build time-out or by
    /// the end of the run).
    pub dropped_by_reason: BTreeMap<String, u64>,
    pub invariant_ok: bool,
    /// TF latency, issue to fully built, seconds.
    pub latency_mean_s: f64,
    pub latency_p50_s: f64,
    pub latency_p99_s: f64,
    pub latency_max_s: f64,
    /// EPN buffer: time-averaged occupancy over all EPNs, and the highest any EPN reached,
    /// as fractions of the buffer.
    pub buffer_mean_frac: f64,
    pub buffer_peak_frac: f64,
    /// Mean utilisation of the FLP uplinks and EPN downlinks over the run, and the
    /// busiest EPN downlink's.
    pub flp_link_util: f64,
    pub epn_link_util: f64,
    pub epn_link_util_max: f64,
    /// Goodput of completed TFs, Tbit/s of issuing time.
    pub goodput_tbps: f64,
    pub epn_failures: u64,
    /// TFs the policy answered `Wait` for at least once.
    pub waited: u64,
    pub flows: u64,
    pub solves: u64,
    pub events: u64,
    pub peak_flows: usize,
    /// One representative FLP (`aggregate`) or every STF a flow.
    pub aggregated: bool,
}

impl AliceSummary {
    pub fn dropped_for(&self, reason: &str) -> u64 {
        self.dropped_by_reason.get(reason).copied().unwrap_or(0)
    }
    pub fn incomplete_for(&self, reason: &str) -> u64 {
        self.incomplete_by_reason.get(reason).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Issue(u64),
    /// On-data: TF n's last announcement reached the ICN.
    Place(u64),
    /// TF n's STFs are all read out: its transfers start (if it has an EPN).
    Ready(u64),
    Resolve,
    Finish,
    Timeout(u64),
    ProcDone {
        epn: u32,
        tf: u64,
        epoch: u32,
    },
    Fail(u32),
    Return(u32),
}

struct Tf {
    epn: u32,
    issued: Time,
    /// When its last STF is read out.
    ready: Time,
    bytes: f64,
    /// STF sizes (per FLP; the representative's alone when aggregated), kept until its
    /// last STF started.
    sizes: Vec<f64>,
    flows: Vec<FlowId>,
    left: u32,
    end: Option<End>,
}

struct Epn {
    used: f64,
    peak: f64,
    /// Integral of occupancy (byte-seconds) and when it last changed.
    area: f64,
    since: Time,
    queue: VecDeque<u64>,
    busy: u32,
    /// TFs arriving now (the `building` of its load reports).
    receiving: u32,
    slow: bool,
    /// Incremented on failure: processing completions from before are stale.
    epoch: u32,
}

impl Epn {
    fn set(&mut self, now: Time, used: f64) {
        self.area += self.used * (now - self.since) as f64 / SEC as f64;
        self.since = now;
        self.used = used.max(0.0);
        self.peak = self.peak.max(self.used);
    }
}

fn secs(v: f64) -> Time {
    (v * SEC as f64).round() as Time
}

/// The simulation state of one run.
struct Sim<'a> {
    cfg: &'a AliceConfig,
    net: Fluid,
    q: Queue<Ev>,
    placer: Placer,
    /// On-data: which FLPs announced which TF (the runtime ICN's rule).
    gather: Gather<Time>,
    epns: Vec<Epn>,
    tfs: Vec<Tf>,
    flp_links: Vec<u32>,
    epn_links: Vec<u32>,
    flow_tf: Vec<u64>,
    /// The FLP of each flow (transfer tokens are per FLP).
    flow_flp: Vec<u32>,
    /// Transfer tokens, if configured.
    tokens: Option<fanin_sched::TokenManager>,
    waited: u64,
    buffer: f64,
    agg: bool,
    changed: bool,
    latencies: Vec<f64>,
    completed_bytes: f64,
    flows_started: u64,
    rng_proc: rand_pcg::Pcg64Mcg,
    proc: Proc,
}

impl Sim<'_> {
    /// Tells the policy an EPN's load (instantly; the runtime reports periodically).
    fn report(&mut self, e: u32) {
        let ep = &self.epns[e as usize];
        self.placer.policy_mut().report_load(
            e,
            EpnLoad {
                free_bytes: (self.buffer - ep.used).max(0.0) as u64,
                building: ep.receiving,
            },
        );
    }

    /// Places waiting TFs, oldest first, while the policy assigns or drops them; TFs
    /// that waited past the build time-out are dropped (`wait_timeout`).
    fn place_waiting(&mut self, now: Time) -> Result<(), crate::ConfigError> {
        let timeout = secs(self.cfg.build_timeout_s);
        loop {
            let tfs = &mut self.tfs;
            let open = |n: u64| {
                let tf = &mut tfs[n as usize];
                let late = tf.issued + timeout <= now;
                if late {
                    tf.end = Some(End::Dropped("wait_timeout"));
                }
                !late
            };
            match self.placer.place_next(open) {
                None => return Ok(()),
                Some((n, Placed::Assigned(e))) => self.start_tf(n, e, now)?,
                Some((n, Placed::Dropped(r))) => {
                    self.tfs[n as usize].end = Some(End::Dropped(r.name()))
                }
                Some((_, Placed::Waiting)) => unreachable!("place_next never answers Waiting"),
            }
        }
    }

    /// Reserves TF `n` on EPN `e` (or drops it if `e` cannot hold it) and starts its
    /// transfers once its STFs are read out.
    fn start_tf(&mut self, n: u64, e: u32, now: Time) -> Result<(), crate::ConfigError> {
        let bytes = self.tfs[n as usize].bytes;
        self.tfs[n as usize].epn = e;
        let ep = &mut self.epns[e as usize];
        if ep.used + bytes > self.buffer {
            self.tfs[n as usize].end = Some(End::Dropped("epn_buffer_full"));
            // The policy counted the TF in when it chose `e`: it hears the EPN's load as
            // it is (as the runtime's next load report would tell it).
            self.report(e);
            return Ok(());
        }
        let used = ep.used + bytes;
        ep.set(now, used);
        ep.receiving += 1;
        let ready = self.tfs[n as usize].ready;
        if ready > now {
            self.q.at(ready, Ev::Ready(n));
            self.report(e);
            return Ok(());
        }
        self.send_tf(n, now)
    }

    /// Starts the STF transfers of TF `n` to its EPN, each as its FLP's tokens allow.
    fn send_tf(&mut self, n: u64, now: Time) -> Result<(), crate::ConfigError> {
        let sizes = &self.tfs[n as usize].sizes;
        if self.agg && sizes.iter().any(|&b| b != sizes[0]) {
            return Err(
                format!("TF {n}: STF sizes differ between FLPs; set aggregate = false").into(),
            );
        }
        if self.agg {
            self.tfs[n as usize].sizes.truncate(1);
        }
        let senders: Vec<u32> = (0..self.tfs[n as usize].sizes.len() as u32)
            .filter(|&f| self.tfs[n as usize].sizes[f as usize] > 0.0)
            .collect();
        self.tfs[n as usize].left = senders.len() as u32;
        let e = self.tfs[n as usize].epn;
        match self.tokens.as_mut() {
            None => senders.into_iter().for_each(|f| self.start_flow(n, f)),
            Some(t) => {
                for g in t.want(e, n, senders) {
                    self.start_flow(g.tf, g.flp);
                }
            }
        }
        let tf = &self.tfs[n as usize];
        let deadline = tf.issued + secs(self.cfg.build_timeout_s);
        self.q.at(deadline.max(now), Ev::Timeout(n));
        if tf.left == 0 {
            self.built(n, now);
        }
        self.report(self.tfs[n as usize].epn);
        Ok(())
    }

    /// FLP `f`'s STF of TF `n` starts to flow to the TF's EPN.
    fn start_flow(&mut self, n: u64, f: u32) {
        let tf = &self.tfs[n as usize];
        let (e, bytes) = (tf.epn, tf.sizes[f as usize]);
        let id = self.net.start(
            &[self.flp_links[f as usize], self.epn_links[e as usize]],
            f64::INFINITY,
            bytes * 8.0,
            n,
        );
        if self.flow_tf.len() <= id as usize {
            self.flow_tf.resize(id as usize + 1, 0);
            self.flow_flp.resize(id as usize + 1, 0);
        }
        self.flow_tf[id as usize] = n;
        self.flow_flp[id as usize] = f;
        self.tfs[n as usize].flows.push(id);
        self.flows_started += 1;
        self.changed = true;
    }

    /// The transfer of flow `id` ended: its tokens go to the STFs that may start now.
    fn release(&mut self, id: FlowId) {
        let Some(tokens) = self.tokens.as_mut() else {
            return;
        };
        let n = self.flow_tf[id as usize];
        let g = fanin_sched::Grant {
            epn: self.tfs[n as usize].epn,
            tf: n,
            flp: self.flow_flp[id as usize],
        };
        for next in tokens.done(g) {
            debug_assert!(
                self.tfs[next.tf as usize].end.is_none(),
                "an ended TF waited"
            );
            self.start_flow(next.tf, next.flp);
        }
    }

    /// TF `n` exists now (its time): its STFs' sizes and read-out. The timer places it
    /// at once with the size model's mean (all an ICN can know before the data exist);
    /// on-data once its last STF is read out and announced, with its size. Its bytes.
    fn issue(
        &mut self,
        n: u64,
        t: Time,
        (flps, size): (u32, StfSize),
    ) -> Result<f64, crate::ConfigError> {
        let cfg = self.cfg;
        let sizes: Vec<f64> = (0..flps)
            .map(|f| size.sample(cfg.seed, f, n) as f64)
            .collect();
        let bytes: f64 = sizes.iter().sum();
        let delays = readout(cfg, flps, n);
        let ready = t + delays.iter().copied().max().unwrap_or(0);
        let stf_bytes: Vec<u64> = sizes.iter().map(|&b| b as u64).collect();
        self.tfs.push(Tf {
            epn: u32::MAX,
            issued: t,
            ready,
            bytes,
            sizes,
            flows: Vec::new(),
            left: 0,
            end: None,
        });
        match cfg.schedule {
            SimSchedule::Timer => {
                let guess = (size.mean() * flps as f64).round() as u64;
                self.place_new(n, guess, t)?;
            }
            SimSchedule::OnData => self.announce(n, t, &delays, &stf_bytes),
        }
        Ok(bytes)
    }

    /// On-data: every FLP's announcement of TF `n` reaches the ICN `announce_us` after
    /// its STF is read out; the runtime's rule (`fanin_sched::Gather`) says when the TF
    /// is complete, and it is placed then.
    fn announce(&mut self, n: u64, t: Time, delays: &[Time], sizes: &[u64]) {
        let lag = secs(self.cfg.announce_us / 1e6);
        let mut heard: Vec<(Time, u32)> = (0..sizes.len() as u32)
            .map(|f| (t + delays.get(f as usize).copied().unwrap_or(0) + lag, f))
            .collect();
        heard.sort_unstable();
        for (at, f) in heard {
            if let Heard::Complete { .. } = self.gather.announce(n, f, sizes[f as usize], at) {
                self.q.at(at, Ev::Place(n));
            }
        }
        // Every STF of the model is read out: nothing stays open (and the arrival
        // order the rule keeps is dropped).
        let open = self.gather.pop_oldest();
        debug_assert!(open.is_none(), "TF {n} not complete");
    }

    /// A new TF to the policy: assigned, waiting, or dropped.
    fn place_new(&mut self, n: u64, bytes: u64, now: Time) -> Result<(), crate::ConfigError> {
        match self.placer.issue(n, bytes) {
            Placed::Assigned(e) => self.start_tf(n, e, now)?,
            Placed::Dropped(r) => self.tfs[n as usize].end = Some(End::Dropped(r.name())),
            Placed::Waiting => self.waited += 1,
        }
        Ok(())
    }

    /// Every STF of TF `n` arrived: it is complete and queues for processing.
    fn built(&mut self, n: u64, now: Time) {
        let tf = &mut self.tfs[n as usize];
        tf.sizes = Vec::new();
        tf.end = Some(End::Completed);
        self.latencies.push((now - tf.issued) as f64 / SEC as f64);
        self.completed_bytes += tf.bytes;
        let e = tf.epn;
        let ep = &mut self.epns[e as usize];
        ep.receiving -= 1;
        ep.queue.push_back(n);
        self.start_processing(e, now);
        self.report(e);
    }

    /// Ends TF `n` while it still arrives: stops its flows (their tokens go on), takes
    /// its waiting STFs back, frees its reservation.
    fn abort(&mut self, n: u64, now: Time, end: End) {
        self.tfs[n as usize].end = Some(end);
        if let Some(tokens) = self.tokens.as_mut() {
            tokens.cancel(n);
        }
        let flows = std::mem::take(&mut self.tfs[n as usize].flows);
        for id in flows {
            self.net.stop(id);
            self.release(id);
        }
        self.tfs[n as usize].sizes = Vec::new();
        let tf = &mut self.tfs[n as usize];
        self.changed = true;
        let (e, bytes) = (tf.epn, tf.bytes);
        let ep = &mut self.epns[e as usize];
        ep.receiving -= 1;
        let used = ep.used - bytes;
        ep.set(now, used);
        self.report(e);
    }

    /// Flows that finished at `t` end; true if one of them completed its TF.
    fn flows_finished(&mut self, t: Time) -> bool {
        let mut built = false;
        for id in self.net.finished() {
            let n = self.flow_tf[id as usize];
            self.net.stop(id);
            self.changed = true;
            let tf = &mut self.tfs[n as usize];
            if let Some(k) = tf.flows.iter().position(|&x| x == id) {
                tf.flows.swap_remove(k);
            }
            tf.left -= 1;
            if tf.left == 0 && tf.end.is_none() {
                self.built(n, t);
                built = true;
            }
            self.release(id);
        }
        built
    }

    /// EPN `e` processed TF `n` (unless it failed since: another `epoch`); true if so.
    fn processed(&mut self, e: u32, n: u64, epoch: u32, t: Time) -> bool {
        if epoch != self.epns[e as usize].epoch {
            return false;
        }
        let bytes = self.tfs[n as usize].bytes;
        let ep = &mut self.epns[e as usize];
        ep.busy -= 1;
        let used = ep.used - bytes;
        ep.set(t, used);
        self.start_processing(e, t);
        self.report(e);
        true
    }

    /// EPN `e` fails at `t`: TFs still arriving at it are lost with it (built ones were
    /// reported), and it starts empty when it comes back.
    fn fail(&mut self, e: u32, t: Time) {
        self.placer.policy_mut().remove_epn(e);
        let lost: Vec<u64> = (0..self.tfs.len() as u64)
            .filter(|&n| {
                let tf = &self.tfs[n as usize];
                tf.epn == e && tf.end.is_none()
            })
            .collect();
        for n in lost {
            self.abort(n, t, End::Dropped("epn_lost"));
        }
        let ep = &mut self.epns[e as usize];
        ep.epoch += 1;
        ep.queue.clear();
        ep.busy = 0;
        ep.receiving = 0;
        ep.set(t, 0.0);
    }
    /// The run ends at `end`; its summary (`totals`: STF bytes issued, EPN failures and
    /// the most flows at once, counted by the event loop).
    fn summary(
        mut self,
        scale: Scale,
        end: Time,
        (stf_bytes_total, failures, peak_flows): (f64, u64, usize),
    ) -> AliceSummary {
        let (cfg, agg) = (self.cfg, self.agg);
        let unscheduled = self.end_run(end);
        let mut incomplete_by_reason = BTreeMap::new();
        let mut dropped_by_reason = BTreeMap::new();
        let mut completed = 0u64;
        for tf in &self.tfs {
            match tf.end {
                Some(End::Completed) => completed += 1,
                Some(End::Incomplete(r)) => {
                    *incomplete_by_reason.entry(r.to_string()).or_insert(0) += 1
                }
                Some(End::Dropped(r)) => *dropped_by_reason.entry(r.to_string()).or_insert(0) += 1,
                None => {}
            }
        }
        let incomplete: u64 = incomplete_by_reason.values().sum();
        let dropped: u64 = dropped_by_reason.values().sum();
        let issued = self.tfs.len() as u64 - unscheduled;
        let mut latencies = std::mem::take(&mut self.latencies);
        latencies.sort_by(f64::total_cmp);
        let pct = |p: f64| -> f64 { fanin_report::percentile(&latencies, p).unwrap_or(0.0) };
        let secs_total = end as f64 / SEC as f64;
        let net = &self.net;
        let util = |links: &[u32]| -> Vec<f64> {
            links
                .iter()
                .map(|&l| net.links[l as usize].carried / (net.links[l as usize].cap * secs_total))
                .collect()
        };
        let fu = util(&self.flp_links);
        let eu = util(&self.epn_links);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        AliceSummary {
            policy: cfg.policy.name().to_string(),
            stf_bytes_mean: stf_bytes_total / (issued.max(1) as f64 * scale.flps as f64),
            scale,
            issued,
            completed,
            incomplete,
            dropped,
            incomplete_by_reason,
            dropped_by_reason,
            invariant_ok: issued == completed + incomplete + dropped,
            latency_mean_s: mean(&latencies),
            latency_p50_s: pct(0.5),
            latency_p99_s: pct(0.99),
            latency_max_s: latencies.last().copied().unwrap_or(0.0),
            buffer_mean_frac: self.epns.iter().map(|e| e.area).sum::<f64>()
                / (self.epns.len() as f64 * self.buffer * secs_total),
            buffer_peak_frac: self.epns.iter().map(|e| e.peak).fold(0.0, f64::max) / self.buffer,
            flp_link_util: mean(&fu),
            epn_link_util: mean(&eu),
            epn_link_util_max: eu.iter().copied().fold(0.0, f64::max),
            goodput_tbps: self.completed_bytes * 8.0 / cfg.duration_s.max(1e-9) / 1e12,
            epn_failures: failures,
            waited: self.waited,
            flows: self.flows_started,
            solves: self.net.solves,
            events: self.q.processed,
            peak_flows,
            aggregated: agg,
        }
    }

    /// The run ends at `end`: TFs still waiting for an EPN are dropped, those still
    /// arriving end incomplete, and the EPNs' buffer areas are closed. Returns the TFs
    /// never scheduled (on-data, their last announcement still on its way), which stay
    /// outside the ledger as at the runtime's ICN.
    fn end_run(&mut self, end: Time) -> u64 {
        self.net.advance(end);
        for n in self.placer.drain_waiting() {
            self.tfs[n as usize].end = Some(End::Dropped("wait_timeout"));
        }
        // On-data, a TF whose last announcement was still on its way at the end was never
        // scheduled: outside the ledger, as the runtime's ICN keeps it (it has no EPN).
        let mut unscheduled = 0u64;
        for n in 0..self.tfs.len() as u64 {
            match (self.tfs[n as usize].end, self.tfs[n as usize].epn) {
                (Some(_), _) => {}
                (None, u32::MAX) => unscheduled += 1,
                (None, _) => self.abort(n, end, End::Incomplete("run_stopped")),
            }
        }
        for ep in &mut self.epns {
            let u = ep.used;
            ep.set(end, u);
        }
        unscheduled
    }

    fn start_processing(&mut self, e: u32, now: Time) {
        let ep = &mut self.epns[e as usize];
        while ep.busy < self.cfg.processing_slots {
            let Some(n) = ep.queue.pop_front() else {
                break;
            };
            let mut s = match self.proc {
                Proc::Fixed(v) => v,
                Proc::Uniform(a, b) => a + (b - a) * self.rng_proc.gen::<f64>(),
                Proc::Exp(m) => exp_draw(&mut self.rng_proc, m),
            };
            if ep.slow {
                s *= self.cfg.slow_factor;
            }
            ep.busy += 1;
            self.q.at(
                now + secs(s),
                Ev::ProcDone {
                    epn: e,
                    tf: n,
                    epoch: ep.epoch,
                },
            );
        }
    }
}

/// Runs one configuration with its policy.
impl<'a> Sim<'a> {
    /// The links, the EPNs (some slow) and the policy of a run of `cfg` at `scale`.
    fn new(cfg: &'a AliceConfig, scale: &Scale, proc: Proc) -> Sim<'a> {
        let mut net = Fluid::new();
        let agg = cfg.aggregate;
        let flp_links: Vec<u32> = (0..if agg { 1 } else { scale.flps })
            .map(|_| net.add_link(scale.flp_nic_gbps * 1e9))
            .collect();
        let epn_share = if agg { scale.flps as f64 } else { 1.0 };
        let epn_links: Vec<u32> = (0..scale.epns)
            .map(|_| net.add_link(scale.epn_nic_gbps * 1e9 / epn_share))
            .collect();
        let mut rng_slow = rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ 0xc0ac_29b7_c97c_50dd);
        let epns: Vec<Epn> = (0..scale.epns)
            .map(|_| Epn {
                used: 0.0,
                peak: 0.0,
                area: 0.0,
                since: 0,
                queue: VecDeque::new(),
                busy: 0,
                receiving: 0,
                slow: rng_slow.gen_bool(cfg.slow_epn_frac),
                epoch: 0,
            })
            .collect();
        let mut sim = Sim {
            cfg,
            net,
            q: Queue::new(),
            placer: Placer::new(policy_config(cfg).build()),
            gather: Gather::new(scale.flps),
            epns,
            tfs: Vec::new(),
            flp_links,
            epn_links,
            flow_tf: Vec::new(),
            flow_flp: Vec::new(),
            tokens: cfg
                .flp_tokens
                .map(|t| fanin_sched::TokenManager::new(t, cfg.epn_tokens.unwrap_or(1))),
            waited: 0,
            buffer: cfg.epn_buffer_gb * 1e9,
            agg,
            changed: false,
            latencies: Vec::new(),
            completed_bytes: 0.0,
            flows_started: 0,
            rng_proc: rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ 0x4528_21e6_38d0_1377),
            proc,
        };
        // Capacity weights (weighted round robin): a slow EPN weighs 1 / slow_factor.
        for e in 0..scale.epns {
            let w = if sim.epns[e as usize].slow {
                (10.0 / cfg.slow_factor.max(1e-9)).round().max(1.0) as u32
            } else {
                10
            };
            if cfg.epn_weights.is_empty() {
                sim.placer.policy_mut().set_weight(e, w);
            }
            sim.placer.policy_mut().add_epn(e);
            sim.report(e);
        }
        sim
    }
}

pub fn run(cfg: &AliceConfig) -> Result<AliceSummary, crate::ConfigError> {
    let (scale, size, proc) = cfg.check()?;
    let mut sim = Sim::new(cfg, &scale, proc);
    let issuing = Issuing {
        n_tfs: (cfg.duration_s * scale.tf_rate_hz).round() as u64,
        period: 1.0 / scale.tf_rate_hz,
        flps: scale.flps,
        size,
    };
    let end = secs(cfg.duration_s) + secs(cfg.drain_s);
    if issuing.n_tfs > 0 {
        sim.q.at(0, Ev::Issue(0));
    }
    let mut fails = Failures::new(cfg, end);
    fails.first(scale.epns, &mut sim.q);
    let quantum = secs(cfg.recompute_ms / 1e3);
    let mut resolve_at: Option<Time> = None;
    let mut finish_at: Option<Time> = None;
    let mut tally = Tally::default();
    while let Some((t, ev)) = sim.q.pop() {
        if t > end {
            break;
        }
        sim.net.advance(t);
        sim.changed = false;
        // Something freed buffer or changed membership: waiting TFs may be placed.
        let retry = match ev {
            Ev::Resolve => {
                if resolve_at == Some(t) {
                    resolve_at = None;
                    sim.net.solve();
                }
                false
            }
            Ev::Finish => {
                if finish_at == Some(t) {
                    finish_at = None;
                }
                sim.flows_finished(t)
            }
            ev => sim.step(ev, t, &issuing, (&mut fails, &mut tally))?,
        };
        if retry && sim.placer.waiting_len() > 0 {
            sim.place_waiting(t)?;
        }
        if sim.changed && resolve_at.is_none() {
            // The next multiple of the quantum (now, when exact).
            let at = t.checked_div(quantum).map_or(t, |k| (k + 1) * quantum);
            resolve_at = Some(at);
            sim.q.at(at, Ev::Resolve);
        }
        if let Some(f) = sim.net.next_finish() {
            if finish_at.is_none_or(|x| f < x) {
                finish_at = Some(f);
                sim.q.at(f, Ev::Finish);
            }
        }
    }
    let totals = (tally.stf_bytes, fails.count, tally.peak_flows);
    Ok(sim.summary(scale, end, totals))
}

/// The TFs a run issues: how many, how often, from how many FLPs, of what size.
struct Issuing {
    n_tfs: u64,
    period: f64,
    flps: u32,
    size: StfSize,
}

/// What the summary counts beside the simulation's own state.
#[derive(Default)]
struct Tally {
    stf_bytes: f64,
    peak_flows: usize,
}

/// EPN failures and returns at exponential times (means `mtbf_s`, `mttr_s`) from their
/// own random stream, none at or after the run's end.
struct Failures {
    rng: rand_pcg::Pcg64Mcg,
    mtbf_s: f64,
    mttr_s: f64,
    end: Time,
    count: u64,
}

impl Failures {
    fn new(cfg: &AliceConfig, end: Time) -> Self {
        Failures {
            rng: rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ 0xbe54_66cf_34e9_0c6c),
            mtbf_s: cfg.mtbf_s,
            mttr_s: cfg.mttr_s,
            end,
            count: 0,
        }
    }

    fn draw(&mut self, mean: f64) -> Time {
        secs(exp_draw(&mut self.rng, mean))
    }

    /// Every EPN's first failure (none without an MTBF).
    fn first(&mut self, epns: u32, q: &mut Queue<Ev>) {
        if self.mtbf_s <= 0.0 {
            return;
        }
        for e in 0..epns {
            let t = self.draw(self.mtbf_s);
            if t < self.end {
                q.at(t, Ev::Fail(e));
            }
        }
    }

    /// EPN `e` failed at `t`: its return.
    fn failed(&mut self, e: u32, t: Time, q: &mut Queue<Ev>) {
        self.count += 1;
        let back = t + self.draw(self.mttr_s);
        if back < self.end {
            q.at(back, Ev::Return(e));
        }
    }

    /// EPN `e` returned at `t`: its next failure.
    fn returned(&mut self, e: u32, t: Time, q: &mut Queue<Ev>) {
        let next = t + self.draw(self.mtbf_s);
        if next < self.end {
            q.at(next, Ev::Fail(e));
        }
    }
}

impl Sim<'_> {
    /// One event other than the run loop's own timers (Resolve, Finish); true when
    /// waiting TFs may be placed now.
    fn step(
        &mut self,
        ev: Ev,
        t: Time,
        issuing: &Issuing,
        (fails, tally): (&mut Failures, &mut Tally),
    ) -> Result<bool, crate::ConfigError> {
        match ev {
            Ev::Issue(n) => {
                if n + 1 < issuing.n_tfs {
                    let next = secs((n + 1) as f64 * issuing.period);
                    self.q.at(next, Ev::Issue(n + 1));
                }
                tally.stf_bytes += self.issue(n, t, (issuing.flps, issuing.size))?;
                tally.peak_flows = tally.peak_flows.max(self.net.active().len());
            }
            Ev::Place(n) => {
                let bytes = self.tfs[n as usize].bytes.round() as u64;
                self.place_new(n, bytes, t)?;
            }
            Ev::Ready(n) => {
                let tf = &self.tfs[n as usize];
                if tf.end.is_none() && tf.epn != u32::MAX && tf.flows.is_empty() {
                    self.send_tf(n, t)?;
                }
            }
            Ev::Timeout(n) => {
                let tf = &self.tfs[n as usize];
                if tf.end.is_none() && tf.epn != u32::MAX {
                    self.abort(n, t, End::Incomplete("build_timeout"));
                    return Ok(true);
                }
            }
            Ev::ProcDone { epn, tf, epoch } => return Ok(self.processed(epn, tf, epoch, t)),
            Ev::Fail(e) => {
                self.fail(e, t);
                fails.failed(e, t, &mut self.q);
                return Ok(true);
            }
            Ev::Return(e) => {
                self.placer.policy_mut().add_epn(e);
                self.report(e);
                fails.returned(e, t, &mut self.q);
                return Ok(true);
            }
            Ev::Resolve | Ev::Finish => unreachable!("the run loop's own timers"),
        }
        Ok(false)
    }
}

/// How long after its time each FLP's STF of TF `n` is read out: uniform(0,
/// readout_ms), drawn from (seed, n) alone (order-independent); empty: none at all.
fn readout(cfg: &AliceConfig, flps: u32, n: u64) -> Vec<Time> {
    if cfg.readout_ms <= 0.0 {
        return Vec::new();
    }
    let mut rng =
        rand_pcg::Pcg64Mcg::seed_from_u64(cfg.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..flps)
        .map(|_| secs(rng.gen::<f64>() * cfg.readout_ms / 1e3))
        .collect()
}

/// The run's policy with its parameters, as the runtime configures it.
fn policy_config(cfg: &AliceConfig) -> PolicyConfig {
    PolicyConfig {
        kind: cfg.policy,
        epn_weights: cfg.epn_weights.clone(),
        least_loaded: cfg.least_loaded,
    }
}
