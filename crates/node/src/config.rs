//! Run configuration: what the ICN runs (counts, rate, length, STF sizes, policy, limits).
//! Parsed from TOML or flags, then validated so every bad value names its field.

use std::time::Duration;

use fanin_proto::SizeWire;
use fanin_sched::policy::LeastLoadedConfig;
use fanin_sched::{parse_bytes, Policy, PolicyConfig, PolicyKind, StfSize};
use serde::{Deserialize, Serialize};

/// One run, as written in an experiment file's `[run]` table or `config.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Number of FLPs (their ids are 0..flps).
    pub flps: u32,
    /// Number of EPNs expected before the run starts.
    pub epns: u32,
    /// TFs issued per second; 0 = unthrottled (bounded by `max_inflight`).
    pub rate_hz: f64,
    /// Run length as a TF count ...
    pub tfs: Option<u64>,
    /// ... or as a duration in seconds (used when `tfs` is absent).
    pub duration_s: Option<f64>,
    /// STF size model: `1MiB`, `uniform(MIN,MAX)`, `sine(MEAN,AMPL,PERIOD)`, `random(MEAN,SPREAD)`.
    pub stf_size: String,
    pub policy: PolicyKind,
    /// `weighted-round-robin`: weight of EPN i (EPNs beyond the list weigh 1).
    pub epn_weights: Vec<u32>,
    /// `least-loaded`: headroom, TFs in building, and what to do when no EPN has room
    /// (`when_none_ready = "wait"` holds the TF, `"drop"` drops it with a reason).
    pub least_loaded: LeastLoadedConfig,
    /// EPN: a TF whose first STF arrived this long ago and is still incomplete is closed.
    pub build_timeout_ms: u64,
    /// FLPs add a CRC32C of each payload; EPNs check it.
    pub crc: bool,
    /// FLP send buffer limit: bytes of STFs queued for the network and, with `reassign`,
    /// kept until their TF ends.
    pub flp_buffer: ByteSize,
    /// EPN build buffer limit (bytes of STFs held for TFs being built).
    pub epn_buffer: ByteSize,
    /// TFs the ICN lets be in flight at once; over it: wait (unthrottled) or drop (paced).
    pub max_inflight: u64,
    /// Zero TF loss on an EPN crash: FLPs keep each STF (within `flp_buffer`) until its
    /// TF ends; when an EPN dies the ICN re-assigns its TFs and the FLPs re-send them.
    pub reassign: bool,
    /// A node silent this long (heartbeats every 100 ms) is out of the schedule
    /// (embedded registry only).
    pub lease_ms: u64,
    /// Membership registry: `embedded` (the ICN, with leases), `zookeeper` (`fanin run`
    /// starts a private ZooKeeper server for the run), or `zk://HOST:PORT/PATH`.
    pub registry: Registry,
    /// tickTime of the ZooKeeper server `fanin run` starts (`registry = "zookeeper"`).
    pub zk_tick_ms: u64,
    /// Session time-out every node asks ZooKeeper for (the server bounds it to
    /// 2..20 x tickTime): how long a frozen or cut-off node stays registered.
    pub zk_session_timeout_ms: u64,
    /// Seed of the STF size model and payload contents.
    pub seed: u64,
    /// How long the ICN waits at run end for outstanding TFs (default: 2 x build timeout + 2 s).
    pub drain_timeout_ms: Option<u64>,
    /// How long the ICN waits for all nodes to register and connect.
    pub prerun_timeout_s: f64,
    /// A run that loses more than this percentage of its TFs is not `valid` (experiments
    /// that measure loss, like the TDR's, set 100).
    pub max_loss_pct: f64,
    /// `timer`: the ICN issues TF ids at `rate_hz`; `on-data`: the FLPs' sources make
    /// the STFs and announce them, and the ICN schedules each TF once all are announced.
    pub schedule: ScheduleKind,
    /// On-data: a TF some FLP has not announced this long after the first announcement
    /// is stale ...
    pub stf_stale_ms: u64,
    /// ... and is built incomplete from the STFs that exist, or dropped (`stf_stale`).
    pub on_stale: OnStale,
    /// `push`: every FLP sends its STF as soon as it learns the TF's EPN; `pull`: the
    /// ICN hands out transfer tokens (`fanin_sched::TokenManager`, as ALICE's
    /// TfScheduler) and tells each FLP when to send, so an EPN reads ...
    pub transfer: Transfer,
    /// ... at most `epn_tokens` STFs at once, from FLPs that each serve at most
    /// `flp_tokens` EPNs at once (ALICE: 2).
    pub flp_tokens: u32,
    pub epn_tokens: u32,
}

/// `transfer` in a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transfer {
    #[default]
    Push,
    Pull,
}

/// `schedule` in a configuration (the wire's `Schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    #[default]
    Timer,
    OnData,
}

impl ScheduleKind {
    pub fn wire(self) -> fanin_proto::Schedule {
        match self {
            ScheduleKind::Timer => fanin_proto::Schedule::Timer,
            ScheduleKind::OnData => fanin_proto::Schedule::OnData,
        }
    }
}

/// What the ICN does with a stale TF (on-data scheduling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnStale {
    #[default]
    Incomplete,
    Drop,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            flps: 2,
            epns: 6,
            rate_hz: 200.0,
            tfs: None,
            duration_s: Some(18.0),
            stf_size: "1MiB".into(),
            policy: PolicyKind::RoundRobin,
            epn_weights: Vec::new(),
            least_loaded: LeastLoadedConfig::default(),
            build_timeout_ms: 1000,
            crc: true,
            flp_buffer: ByteSize(256 << 20),
            epn_buffer: ByteSize(1 << 30),
            max_inflight: 10_000,
            reassign: true,
            lease_ms: 1000,
            registry: Registry::Embedded,
            zk_tick_ms: 200,
            zk_session_timeout_ms: 2000,
            seed: 1,
            drain_timeout_ms: None,
            prerun_timeout_s: 60.0,
            max_loss_pct: 1.0,
            schedule: ScheduleKind::Timer,
            stf_stale_ms: 1000,
            on_stale: OnStale::Incomplete,
            transfer: Transfer::Push,
            flp_tokens: 2,
            epn_tokens: 1,
        }
    }
}

/// A `RunConfig` whose values were checked and parsed.
#[derive(Debug, Clone)]
pub struct Checked {
    pub cfg: RunConfig,
    pub stf_size: StfSize,
    pub flp_buffer: u64,
    pub epn_buffer: u64,
    /// Exactly how many TFs the ICN issues, when known in advance.
    pub total_tfs: Option<u64>,
    /// Configured run duration (for the +-1 % validity check), when paced.
    pub configured_duration: Option<Duration>,
}

/// Largest STF accepted (the frame length field is 32 bits; stay well inside it).
pub const MAX_STF_BYTES: u64 = 1 << 30;
/// Most FLPs or EPNs in one run.
pub const MAX_NODES: u32 = 10_000;

fn field_err(field: &str, msg: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("config field `{field}`: {msg}")
}

impl RunConfig {
    /// The configured policy with its parameters (weights, least-loaded settings).
    pub fn policy_config(&self) -> PolicyConfig {
        PolicyConfig {
            kind: self.policy,
            epn_weights: self.epn_weights.clone(),
            least_loaded: self.least_loaded,
        }
    }

    /// The configured policy, built.
    pub fn build_policy(&self) -> Box<dyn Policy> {
        self.policy_config().build()
    }

    /// Checks every value; the first bad one is named in a one-line error.
    pub fn check(&self) -> anyhow::Result<Checked> {
        in_range("flps", self.flps, 1, MAX_NODES, "")?;
        in_range("epns", self.epns, 1, MAX_NODES, "")?;
        if !rate_ok(self.rate_hz) {
            let why = format!("{} is not {RATES} (0 = unthrottled)", self.rate_hz);
            return Err(field_err("rate_hz", why));
        }
        let stf_size: StfSize = self
            .stf_size
            .parse()
            .map_err(|e| field_err("stf_size", e))?;
        in_range(
            "stf_size",
            stf_size.max(),
            0,
            MAX_STF_BYTES,
            " (bytes of the largest STF)",
        )?;
        let flp_buffer = buffer("flp_buffer", self.flp_buffer, stf_size)?;
        let epn_buffer = buffer("epn_buffer", self.epn_buffer, stf_size)?;
        self.check_largest_tf_fits(epn_buffer, stf_size)?;
        in_range("build_timeout_ms", self.build_timeout_ms, 1, 3_600_000, "")?;
        if let Some(d) = self.drain_timeout_ms {
            // The default (2 x build_timeout_ms + 2 s) may reach this too.
            in_range("drain_timeout_ms", d, 1, 2 * 3_600_000 + 2000, "")?;
        }
        self.check_policy()?;
        self.check_membership()?;
        in_range("max_inflight", self.max_inflight, 1, 10_000_000, "")?;
        if !(self.prerun_timeout_s > 0.0 && self.prerun_timeout_s <= 3600.0) {
            return Err(field_err("prerun_timeout_s", "must be within (0, 3600]"));
        }
        if !(0.0..=100.0).contains(&self.max_loss_pct) {
            return Err(field_err("max_loss_pct", "must be within [0, 100]"));
        }
        in_range("stf_stale_ms", self.stf_stale_ms, 1, 3_600_000, "")?;
        in_range(
            "flp_tokens",
            self.flp_tokens,
            1,
            MAX_NODES,
            " (EPNs per FLP at once)",
        )?;
        in_range(
            "epn_tokens",
            self.epn_tokens,
            1,
            MAX_NODES,
            " (STFs per EPN at once)",
        )?;
        let (total_tfs, configured_duration) = self.length()?;
        Ok(Checked {
            cfg: self.clone(),
            stf_size,
            flp_buffer,
            epn_buffer,
            total_tfs,
            configured_duration,
        })
    }

    /// The policies' own checks, shared with the simulators (`crates/sched`).
    fn check_policy(&self) -> anyhow::Result<()> {
        fanin_sched::policy::check_weights(&self.epn_weights, MAX_NODES as usize)
            .map_err(|e| field_err("epn_weights", e))?;
        self.least_loaded
            .check()
            .map_err(|(field, why)| field_err(field, why))
    }

    /// Least-loaded places a TF on an EPN with `headroom_percent` of its size free: with
    /// `when_none_ready = "wait"`, a TF no EPN buffer can so take would wait for good, and
    /// every TF after it. (With "drop" it is dropped, `no_epn_buffer`: accounted.)
    fn check_largest_tf_fits(&self, epn_buffer: u64, size: StfSize) -> anyhow::Result<()> {
        let waits = self.least_loaded.when_none_ready == fanin_sched::policy::WhenNoneReady::Wait;
        if self.policy != PolicyKind::LeastLoaded || !waits {
            return Ok(());
        }
        let headroom = self.least_loaded.headroom_percent;
        let need = (self.least_loaded).need(size.max().saturating_mul(self.flps as u64));
        if need <= epn_buffer {
            return Ok(());
        }
        let why = format!(
            "{epn_buffer} bytes cannot take the largest TF, which would wait for good under least-loaded: {} FLPs x {} bytes x {headroom} % headroom = {need} bytes",
            self.flps,
            size.max()
        );
        Err(field_err("epn_buffer", why))
    }

    fn check_membership(&self) -> anyhow::Result<()> {
        let beats = " (heartbeats come every 100 ms)";
        in_range("lease_ms", self.lease_ms, 300, 3_600_000, beats)?;
        if let Registry::Url(u) = &self.registry {
            Registry::parse(u).map_err(|e| field_err("registry", e))?;
        }
        in_range("zk_tick_ms", self.zk_tick_ms, 10, 60_000, "")?;
        in_range(
            "zk_session_timeout_ms",
            self.zk_session_timeout_ms,
            100,
            600_000,
            "",
        )
    }

    /// The run's length: TFs issued (when known) and its duration (when paced).
    fn length(&self) -> anyhow::Result<(Option<u64>, Option<Duration>)> {
        let paced = |n: u64| Some(Duration::from_secs_f64(n as f64 / self.rate_hz));
        match (self.tfs, self.duration_s) {
            (Some(n), _) => {
                in_range("tfs", n, 1, 1 << 40, "")?;
                Ok((Some(n), if self.rate_hz > 0.0 { paced(n) } else { None }))
            }
            (None, Some(d)) if d.is_finite() && d > 0.0 && d <= 7.0 * 86400.0 => {
                if self.rate_hz > 0.0 {
                    let n = (d * self.rate_hz).round().max(1.0) as u64;
                    Ok((Some(n), paced(n)))
                } else {
                    Ok((None, Some(Duration::from_secs_f64(d))))
                }
            }
            (None, Some(d)) => Err(field_err(
                "duration_s",
                format!("{d} is not within (0, 604800]"),
            )),
            (None, None) => Err(field_err("tfs", "set `tfs` or `duration_s`")),
        }
    }
}

/// A buffer size in bytes that holds at least the largest STF.
fn buffer(field: &str, b: ByteSize, size: StfSize) -> anyhow::Result<u64> {
    if b.0 < size.max() {
        let msg = format!(
            "{} bytes cannot hold the largest STF ({} bytes)",
            b.0,
            size.max()
        );
        return Err(field_err(field, msg));
    }
    Ok(b.0)
}

/// Where a run's membership lives: the ICN itself (leases), a private ZooKeeper that
/// `fanin run` starts, or a ZooKeeper at `zk://HOST:PORT/PATH`. Written as that string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Registry {
    Embedded,
    ZooKeeper,
    Url(String),
}

impl Registry {
    /// `embedded`, `zookeeper`, or a URL the ZooKeeper client accepts.
    pub fn parse(s: &str) -> anyhow::Result<Registry> {
        match s {
            "embedded" => Ok(Registry::Embedded),
            "zookeeper" => Ok(Registry::ZooKeeper),
            url => {
                crate::registry::RegistryUrl::parse(url)
                    .map_err(|e| anyhow::anyhow!("{e} (or `embedded`, `zookeeper`)"))?;
                Ok(Registry::Url(url.to_string()))
            }
        }
    }
}

impl TryFrom<String> for Registry {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Registry::parse(&s).map_err(|e| format!("{e:#}"))
    }
}

impl From<Registry> for String {
    fn from(r: Registry) -> String {
        r.to_string()
    }
}

impl std::fmt::Display for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Registry::Embedded => f.write_str("embedded"),
            Registry::ZooKeeper => f.write_str("zookeeper"),
            Registry::Url(u) => f.write_str(u),
        }
    }
}

/// A byte count, written as a number or with a unit (`256MiB`, `1.5 GB`); parsed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ByteText", into = "String")]
pub struct ByteSize(pub u64);

/// A byte count as TOML holds it.
#[derive(Deserialize)]
#[serde(untagged)]
enum ByteText {
    Number(u64),
    Text(String),
}

impl TryFrom<ByteText> for ByteSize {
    type Error = String;
    fn try_from(t: ByteText) -> Result<Self, String> {
        match t {
            ByteText::Number(n) => Ok(ByteSize(n)),
            ByteText::Text(s) => parse_bytes(&s).map(ByteSize).map_err(|e| e.to_string()),
        }
    }
}

impl std::str::FromStr for ByteSize {
    type Err = fanin_sched::ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_bytes(s).map(ByteSize)
    }
}

impl From<ByteSize> for String {
    fn from(b: ByteSize) -> String {
        b.to_string()
    }
}

impl std::fmt::Display for ByteSize {
    /// The largest binary unit that divides the count exactly (parses back the same).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if n != 0 && n.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

/// The TF rates a run or a replay takes, in words: 0 (unthrottled; a replay: as fast
/// as room allows), or 0.001 Hz (one TF in 1000 s: slower, a run's TFs would spread over
/// more time than a clock counts) to 1 MHz.
pub const RATES: &str = "0 or within 0.001..=1000000 Hz";

/// Is `hz` one of `RATES`? (NaN is not.)
pub fn rate_ok(hz: f64) -> bool {
    hz == 0.0 || (1e-3..=1e6).contains(&hz)
}

/// The one range check: `field` must be within `lo..=hi`; `note` explains the bound.
pub fn in_range<T: PartialOrd + std::fmt::Display>(
    field: &str,
    v: T,
    lo: T,
    hi: T,
    note: &str,
) -> anyhow::Result<()> {
    if v < lo || v > hi {
        return Err(field_err(
            field,
            format!("{v} is not within {lo}..={hi}{note}"),
        ));
    }
    Ok(())
}

impl Checked {
    /// TFs in flight the ICN allows when unthrottled: `max_inflight`, but never more
    /// than the buffers hold, so back-pressure replaces drops. Every FLP holds one STF
    /// per TF in flight (until its TF ends, with `reassign`) in `flp_buffer`, and its
    /// queue for any one EPN holds no more than that EPN's share of it (and
    /// `QUEUE_PER_EPN` STFs): were every TF in flight for an EPN that lags (push), its
    /// queue still holds them. (A TF that ended, built incomplete, may leave its STF in
    /// the queue until written: the tenth kept free and the window's halving on slow TFs
    /// cover that.) The EPNs together hold theirs in `epns x epn_buffer`. Sizes are
    /// counted at their largest, with a tenth kept free.
    pub fn unthrottled_inflight(&self) -> u64 {
        use crate::flp::core::{epn_share, QUEUE_PER_EPN};
        let stf = self.stf_size.max().max(1);
        let flps = self.cfg.flps as u64;
        let by_flp = self.flp_buffer / stf;
        let epns = self.cfg.epns as usize;
        // Pulled, an FLP queues only the transfers an EPN asked for.
        let by_share = match self.cfg.transfer {
            Transfer::Pull => by_flp,
            Transfer::Push => {
                let share = epn_share(self.flp_buffer, stf, epns, self.on_data());
                (share / stf).min(QUEUE_PER_EPN as u64)
            }
        };
        let by_epns = (epns as u64).saturating_mul(self.epn_buffer) / (stf * flps);
        let bound = by_flp.min(by_share).min(by_epns) * 9 / 10;
        self.cfg.max_inflight.min(bound.max(1))
    }

    pub fn build_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.build_timeout_ms)
    }
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(
            self.cfg
                .drain_timeout_ms
                .unwrap_or(2 * self.cfg.build_timeout_ms + 2000),
        )
    }
    /// The ICN issues TFs on its own clock at `rate_hz`.
    pub fn paced(&self) -> bool {
        self.cfg.rate_hz > 0.0 && !self.on_data()
    }

    /// The FLPs' data decide when a TF exists (`schedule = "on-data"`).
    pub fn on_data(&self) -> bool {
        self.cfg.schedule == ScheduleKind::OnData
    }
}

/// STF size model <-> its wire form in `Prepare`.
pub fn size_to_wire(s: StfSize) -> SizeWire {
    match s {
        StfSize::Fixed(n) => SizeWire {
            kind: 1,
            a: n,
            b: 0,
            c: 0,
        },
        StfSize::Uniform { min, max } => SizeWire {
            kind: 2,
            a: min,
            b: max,
            c: 0,
        },
        StfSize::Sine {
            mean,
            amplitude,
            period,
        } => SizeWire {
            kind: 3,
            a: mean,
            b: amplitude,
            c: period,
        },
        StfSize::Random { mean, spread } => SizeWire {
            kind: 4,
            a: mean,
            b: (spread * 1e6).round() as u64,
            c: 0,
        },
    }
}

pub fn size_from_wire(w: SizeWire) -> anyhow::Result<StfSize> {
    let s = match w.kind {
        1 => StfSize::Fixed(w.a),
        2 if w.a <= w.b => StfSize::Uniform { min: w.a, max: w.b },
        3 if w.c > 0 && w.b <= w.a && w.a.checked_add(w.b).is_some() => StfSize::Sine {
            mean: w.a,
            amplitude: w.b,
            period: w.c,
        },
        4 if w.b <= 1_000_000 => StfSize::Random {
            mean: w.a,
            spread: w.b as f64 / 1e6,
        },
        _ => anyhow::bail!("prepare.size: invalid STF size model {w:?}"),
    };
    if s.max() > MAX_STF_BYTES {
        anyhow::bail!(
            "prepare.size: largest STF {} exceeds {MAX_STF_BYTES}",
            s.max()
        );
    }
    Ok(s)
}

/// Checks the run parameters an FLP or EPN received against its own limits.
/// `buffer` names the node's buffer option, e.g. `--build-buffer`.
pub fn check_prepare(p: &fanin_proto::Prepare, buffer: (&str, u64)) -> anyhow::Result<StfSize> {
    if p.flps == 0 || p.flps > MAX_NODES {
        anyhow::bail!("prepare.flps: {} is not within 1..={MAX_NODES}", p.flps);
    }
    if p.build_timeout_ms == 0 {
        anyhow::bail!("prepare.build_timeout_ms must be at least 1");
    }
    let size = size_from_wire(p.size)?;
    if buffer.1 < size.max() {
        anyhow::bail!(
            "{} {} bytes cannot hold the largest STF of this run ({} bytes)",
            buffer.0,
            buffer.1,
            size.max()
        );
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ICN tells every FLP all EPNs in one frame: the largest run's, with the
    /// longest addresses a socket address prints as, fits what a node reads.
    #[test]
    fn the_largest_epn_list_fits_what_a_node_reads() {
        let addr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535";
        let addr = addr.parse::<std::net::SocketAddr>().unwrap().to_string();
        assert_eq!(addr.len(), 58);
        let list = (0..MAX_NODES).map(|epn_id| fanin_proto::EpnEntry {
            epn_id,
            addr: addr.clone(),
        });
        let frame = fanin_proto::Message::EpnList(list.collect()).encode();
        let body = frame.len() - fanin_proto::HEADER_LEN;
        assert!(body <= fanin_proto::MAX_ICN_BODY as usize, "{body} bytes");
    }

    #[test]
    fn default_is_valid_and_counts_tfs() {
        let c = RunConfig::default().check().unwrap();
        assert_eq!(c.total_tfs, Some(3600));
        assert_eq!(c.configured_duration, Some(Duration::from_secs(18)));
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: Vec<(RunConfig, &str)> = vec![
            (
                RunConfig {
                    flps: 0,
                    ..Default::default()
                },
                "`flps`",
            ),
            (
                RunConfig {
                    rate_hz: -1.0,
                    ..Default::default()
                },
                "`rate_hz`",
            ),
            (
                RunConfig {
                    stf_size: "lots".into(),
                    ..Default::default()
                },
                "`stf_size`",
            ),
            (
                RunConfig {
                    epn_buffer: ByteSize(1),
                    ..Default::default()
                },
                "`epn_buffer`",
            ),
            (
                RunConfig {
                    tfs: Some(0),
                    ..Default::default()
                },
                "`tfs`",
            ),
            (
                RunConfig {
                    tfs: None,
                    duration_s: Some(-3.0),
                    ..Default::default()
                },
                "`duration_s`",
            ),
            (
                RunConfig {
                    build_timeout_ms: 0,
                    ..Default::default()
                },
                "`build_timeout_ms`",
            ),
        ];
        for (c, field) in cases {
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains(field), "{e} should name {field}");
        }
    }

    #[test]
    fn unknown_toml_field_is_named() {
        let e = toml::from_str::<RunConfig>("rat_hz = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rat_hz"), "{e}");
    }

    #[test]
    fn size_models_cross_the_wire() {
        for s in ["123", "uniform(1,9)", "sine(10,5,3)", "random(100,0.5)"] {
            let m: StfSize = s.parse().unwrap();
            assert_eq!(size_from_wire(size_to_wire(m)).unwrap(), m);
        }
        assert!(size_from_wire(SizeWire {
            kind: 9,
            a: 0,
            b: 0,
            c: 0
        })
        .is_err());
    }
}

#[cfg(test)]
mod check_tests {
    use super::*;

    fn err(f: impl FnOnce(&mut RunConfig)) -> String {
        let mut c = RunConfig::default();
        f(&mut c);
        format!("{:#}", c.check().expect_err("refused"))
    }

    #[test]
    fn the_node_bound_is_the_one_prepare_enforces() {
        let c = RunConfig {
            flps: MAX_NODES,
            ..RunConfig::default()
        };
        c.check().expect("the bound itself is allowed");
        let e = err(|c| c.flps = MAX_NODES + 1);
        assert!(e.contains("`flps`") && e.contains("1..=10000"), "{e}");
        let e = err(|c| c.epns = 0);
        assert!(e.contains("`epns`"), "{e}");
    }

    #[test]
    fn every_range_names_its_field() {
        for (e, field) in [
            (err(|c| c.rate_hz = -1.0), "rate_hz"),
            (err(|c| c.rate_hz = f64::NAN), "rate_hz"),
            (err(|c| c.lease_ms = 10), "lease_ms"),
            (
                err(|c| c.least_loaded.max_building = 0),
                "least_loaded.max_building",
            ),
            (err(|c| c.max_inflight = 0), "max_inflight"),
            (err(|c| c.flp_buffer = ByteSize(1024)), "flp_buffer"),
            (err(|c| c.tfs = Some(0)), "tfs"),
            (err(|c| c.duration_s = Some(-1.0)), "duration_s"),
        ] {
            assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}

#[cfg(test)]
mod value_tests {
    use super::*;

    #[test]
    fn byte_sizes_read_as_numbers_or_with_units_and_print_back() {
        let c: RunConfig = toml::from_str("flp_buffer = 1048576\nepn_buffer = \"2GiB\"").unwrap();
        assert_eq!(
            (c.flp_buffer, c.epn_buffer),
            (ByteSize(1 << 20), ByteSize(2 << 30))
        );
        assert_eq!(ByteSize(3 << 20).to_string(), "3MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
        let back: RunConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let e = toml::from_str::<RunConfig>("epn_buffer = \"1 XB\"").unwrap_err();
        assert!(e.to_string().contains("unknown unit"), "{e}");
    }

    #[test]
    fn registries_are_known_when_read() {
        let c: RunConfig = toml::from_str("registry = \"zookeeper\"").unwrap();
        assert_eq!(c.registry, Registry::ZooKeeper);
        let c: RunConfig = toml::from_str("registry = \"zk://127.0.0.1:2181/x\"").unwrap();
        assert_eq!(c.registry.to_string(), "zk://127.0.0.1:2181/x");
        let e = toml::from_str::<RunConfig>("registry = \"etcd\"").unwrap_err();
        assert!(e.to_string().contains("embedded"), "{e}");
    }
}

#[cfg(test)]
mod inflight_tests {
    use super::*;

    #[test]
    fn unthrottled_runs_keep_in_flight_what_the_buffers_hold() {
        let with = |tweak: fn(&mut RunConfig)| {
            let mut c = RunConfig::default();
            tweak(&mut c);
            c.check().unwrap().unthrottled_inflight()
        };
        // A change to the defaults, the bound it gives, and why.
        type Case = (fn(&mut RunConfig), u64, &'static str);
        let cases: [Case; 6] = [
            (
                |_| {},
                115,
                "one EPN's queue holds half of 256 MiB: 128 STFs, a tenth free",
            ),
            (
                |c| c.epns = 1,
                230,
                "one EPN's queue may take the whole buffer",
            ),
            (
                |c| c.stf_size = "16KiB".into(),
                3686,
                "a queue holds 4096 STFs",
            ),
            (
                |c| c.transfer = Transfer::Pull,
                230,
                "pulled, a queue holds what was asked",
            ),
            (|c| c.max_inflight = 10, 10, "max_inflight"),
            (
                |c| (c.flps, c.epns, c.epn_buffer) = (8, 1, ByteSize(16 << 20)),
                1,
                "the EPN's 16 MiB holds 2 TFs of 8 STFs",
            ),
        ];
        for (tweak, want, why) in cases {
            assert_eq!(with(tweak), want, "{why}");
        }
    }
}
