//! Run parameters given on the command line that override an experiment file's `[run]`
//! (`fanin run`, `fanin icn`), applied to every configuration before it is checked.

use clap::Args;
use fanin_node::RunConfig;
use fanin_sched::PolicyKind;

/// Run parameters that can override the configuration file.
#[derive(Args, Debug, Default, Clone, PartialEq)]
pub struct RunOverrides {
    /// Number of FLPs.
    #[arg(long)]
    pub flps: Option<u32>,
    /// Number of EPNs.
    #[arg(long)]
    pub epns: Option<u32>,
    /// TF rate in Hz (0 = unthrottled).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Run length in TFs.
    #[arg(long, conflicts_with = "duration")]
    pub tfs: Option<u64>,
    /// Run length in seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// STF size: 1MiB, uniform(MIN,MAX), sine(MEAN,AMPL,PERIOD), random(MEAN,SPREAD).
    #[arg(long)]
    pub stf_size: Option<String>,
    /// Load-balancing policy: round-robin, static-modulo, whitelist, blacklist, reinit,
    /// weighted-round-robin or least-loaded.
    #[arg(long)]
    pub policy: Option<PolicyKind>,
    /// EPN build time-out in milliseconds.
    #[arg(long)]
    pub build_timeout_ms: Option<u64>,
    /// CRC32C on STF payloads (true/false).
    #[arg(long)]
    pub crc: Option<bool>,
    /// Most TFs in flight at once.
    #[arg(long)]
    pub max_inflight: Option<u64>,
    /// Seed of STF sizes and contents.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl RunOverrides {
    /// Does the command line override anything?
    pub fn is_empty(&self) -> bool {
        *self == RunOverrides::default()
    }

    pub fn apply(&self, c: &mut RunConfig) {
        if let Some(v) = self.flps {
            c.flps = v;
        }
        if let Some(v) = self.epns {
            c.epns = v;
        }
        if let Some(v) = self.rate {
            c.rate_hz = v;
        }
        if let Some(v) = self.tfs {
            c.tfs = Some(v);
            c.duration_s = None;
        }
        if let Some(v) = self.duration {
            c.duration_s = Some(v);
            c.tfs = None;
        }
        if let Some(v) = &self.stf_size {
            c.stf_size = v.clone();
        }
        if let Some(v) = self.policy {
            c.policy = v;
        }
        if let Some(v) = self.build_timeout_ms {
            c.build_timeout_ms = v;
        }
        if let Some(v) = self.crc {
            c.crc = v;
        }
        if let Some(v) = self.max_inflight {
            c.max_inflight = v;
        }
        if let Some(v) = self.seed {
            c.seed = v;
        }
    }
}

/// A run id from the wall clock (ms since the UNIX epoch).
pub fn clock_run_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
