//! Simulation configuration: the ANTARES-shaped topology, transport, transmission
//! scheme, workload and run length; presets for the thesis's detector scales.

use fanin_sched::PolicyKind;
use serde::{Deserialize, Serialize};

use crate::workload::Bio;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Tcp,
    Udp,
}

/// One simulation run. Defaults are the thesis's Table 4.1 (10-string scale).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// `antares-sector`, `antares-2-string` or `antares-10-string` set the scale below.
    pub preset: Option<String>,
    pub strings: u32,
    pub sectors_per_string: u32,
    pub lcms_per_sector: u32,
    /// Farm PCs (EPNs); default: LCMs / 3.
    pub pcs: Option<u32>,
    pub lcm_mbps: f64,
    pub mlcm_mbps: f64,
    pub pc_mbps: f64,
    pub lcm_delay_us: f64,
    pub shore_delay_us: f64,
    pub pc_delay_us: f64,
    /// Drop-tail queue limit of every port, in packets ...
    pub queue_packets: u32,
    /// ... or in bytes, when set.
    pub queue_bytes: Option<u64>,
    /// Bit error rate of the detector-to-shore links.
    pub ber: f64,
    pub transport: Transport,
    pub mss: u32,
    pub min_rto_ms: f64,
    /// Restart slow start after an idle period longer than the RTO (RFC 5681 §4.1).
    pub slow_start_restart: bool,
    /// Delayed transmission group size; absent = direct transmission.
    pub k: Option<u32>,
    /// Receiver-driven transfers: each PC asks its LCMs for at most this many fragments
    /// at once and an LCM sends only when asked (`fanin_sched::TokenManager`); absent =
    /// push.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull: Option<u32>,
    /// With `pull`: at most this many PCs read from one LCM at once (ALICE: 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flp_tokens: Option<u32>,
    pub policy: PolicyKind,
    pub slice_ms: f64,
    /// Fragment size without bioluminescence.
    pub fragment_bytes: u32,
    /// A size model instead (as the runtime's STF sizes): `uniform(20000,40000)`,
    /// `sine(MEAN,AMPL,PERIOD)`, `random(MEAN,SPREAD)`; overrides `fragment_bytes`.
    pub fragment_size: Option<String>,
    pub bio: Bio,
    /// Each fragment leaves its sender after a uniform random delay in [0, jitter]
    /// (sender software timing); 0 = perfectly synchronised senders.
    pub jitter_us: f64,
    pub duration_s: f64,
    /// Time after the last slice for late fragments to arrive.
    pub relax_s: f64,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            preset: None,
            strings: 10,
            sectors_per_string: 6,
            lcms_per_sector: 5,
            pcs: None,
            lcm_mbps: 50.0,
            mlcm_mbps: 1000.0,
            pc_mbps: 500.0,
            lcm_delay_us: 50.0,
            shore_delay_us: 300.0,
            pc_delay_us: 50.0,
            queue_packets: 100,
            queue_bytes: None,
            ber: 0.0,
            transport: Transport::Tcp,
            mss: 1460,
            min_rto_ms: 200.0,
            slow_start_restart: true,
            k: None,
            pull: None,
            flp_tokens: None,
            policy: PolicyKind::StaticModulo,
            slice_ms: 10.0,
            fragment_bytes: 30_000,
            fragment_size: None,
            bio: Bio::None,
            jitter_us: 0.0,
            duration_s: 60.0,
            relax_s: 10.0,
            seed: 1,
        }
    }
}

/// Most LCMs or PCs in one packet-level run (the route table is hosts x nodes).
pub const MAX_HOSTS: u64 = 5_000;
/// Most fragments in one run (each is recorded).
pub const MAX_FRAGMENTS: u64 = 50_000_000;

pub const PRESETS: &[&str] = &["antares-sector", "antares-2-string", "antares-10-string"];

impl SimConfig {
    /// Applies the preset's scale, if any, and checks every value.
    pub fn resolve(mut self) -> Result<SimConfig, crate::ConfigError> {
        self.apply_preset()?;
        self.check_ranges()?;
        let lcms = (self.strings as u64)
            .checked_mul(self.sectors_per_string as u64)
            .and_then(|v| v.checked_mul(self.lcms_per_sector as u64))
            .unwrap_or(u64::MAX);
        if lcms == 0 || lcms > MAX_HOSTS {
            return Err(format!(
                "`strings` x `sectors_per_string` x `lcms_per_sector` = {lcms} LCMs is not within 1..={MAX_HOSTS}"
            ).into());
        }
        if self.pcs.is_some_and(|p| p == 0 || p as u64 > MAX_HOSTS) {
            return Err(format!("`pcs` must be within 1..={MAX_HOSTS}").into());
        }
        if self.mss < 100 || self.mss > 65_000 {
            return Err(format!("`mss` {} is not within 100..=65000", self.mss).into());
        }
        if self.queue_packets == 0 || self.queue_packets > 1_000_000 {
            return Err("`queue_packets` must be within 1..=1000000".into());
        }
        if self.queue_bytes.is_some_and(|b| b == 0 || b > 1 << 40) {
            return Err("`queue_bytes` must be within 1..=2^40".into());
        }
        if self.fragment_bytes > 100_000_000 {
            return Err("`fragment_bytes` must be at most 100000000".into());
        }
        if self.seed > i64::MAX as u64 {
            return Err(format!("`seed` must be at most {}", i64::MAX).into());
        }
        if let Some(m) = &self.fragment_size {
            let size: fanin_sched::StfSize =
                m.parse().map_err(|e| format!("`fragment_size`: {e}"))?;
            if size.max() > 100_000_000 {
                return Err(format!(
                    "`fragment_size`: largest fragment {} is over 100 MB",
                    size.max()
                )
                .into());
            }
            if self.bio != Bio::None {
                return Err("`fragment_size` and `bio` cannot be combined".into());
            }
        }
        self.check_scheme()?;
        let slices = (self.duration_s * 1000.0 / self.slice_ms).round();
        if slices * lcms as f64 > MAX_FRAGMENTS as f64 {
            return Err(format!(
                "{slices} slices x {lcms} LCMs is more than {MAX_FRAGMENTS} fragments (`duration_s`, `slice_ms`)"
            ).into());
        }
        Ok(self)
    }

    /// The preset's scale: strings, sectors per string, 5 LCMs per sector.
    fn apply_preset(&mut self) -> Result<(), crate::ConfigError> {
        let Some(p) = self.preset.as_deref() else {
            return Ok(());
        };
        let (strings, sectors) = match p {
            "antares-sector" => (1, 1),
            "antares-2-string" => (2, 6),
            "antares-10-string" => (10, 6),
            other => {
                return Err(
                    format!("preset {other:?} is not known ({})", PRESETS.join(", ")).into(),
                )
            }
        };
        self.strings = strings;
        self.sectors_per_string = sectors;
        self.lcms_per_sector = 5;
        Ok(())
    }

    /// Rates, times and the bit error rate, each within its range.
    fn check_ranges(&self) -> Result<(), crate::ConfigError> {
        let within = |name: &str, v: f64, lo: f64, hi: f64| {
            if v.is_finite() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("`{name}` must be within {lo}..={hi}, not {v}"))
            }
        };
        // Link rates from 1 kbit/s to 1 Pbit/s.
        within("lcm_mbps", self.lcm_mbps, 0.001, 1e9)?;
        within("mlcm_mbps", self.mlcm_mbps, 0.001, 1e9)?;
        within("pc_mbps", self.pc_mbps, 0.001, 1e9)?;
        within("slice_ms", self.slice_ms, 0.001, 3.6e6)?;
        within("duration_s", self.duration_s, 1e-6, 1e6)?;
        within("relax_s", self.relax_s, 0.0, 1e6)?;
        within("min_rto_ms", self.min_rto_ms, 0.001, 60_000.0)?;
        within("lcm_delay_us", self.lcm_delay_us, 0.0, 1e7)?;
        within("shore_delay_us", self.shore_delay_us, 0.0, 1e7)?;
        within("pc_delay_us", self.pc_delay_us, 0.0, 1e7)?;
        within("jitter_us", self.jitter_us, 0.0, 1e7)?;
        if !(0.0..1.0).contains(&self.ber) {
            return Err(format!("`ber` must be within [0, 1), not {}", self.ber).into());
        }
        Ok(())
    }

    /// The transmission scheme: direct, delayed (`k`), or pull (`pull`, `flp_tokens`).
    fn check_scheme(&self) -> Result<(), crate::ConfigError> {
        if self.k == Some(0) {
            return Err("`k` must be at least 1".into());
        }
        if self.pull.is_some_and(|n| !(1..=10_000).contains(&n))
            || self.flp_tokens.is_some_and(|n| !(1..=10_000).contains(&n))
        {
            return Err("`pull` and `flp_tokens` must be within 1..=10000".into());
        }
        if self.flp_tokens.is_some() && self.pull.is_none() {
            return Err(
                "`flp_tokens` needs `pull` (tokens limit receiver-driven transfers)".into(),
            );
        }
        if self.pull.is_some() && (self.k.is_some() || self.transport != Transport::Tcp) {
            return Err("`pull` works with `transport = \"tcp\"` and without `k`".into());
        }
        Ok(())
    }

    pub fn lcms(&self) -> u32 {
        self.strings * self.sectors_per_string * self.lcms_per_sector
    }

    pub fn pc_count(&self) -> u32 {
        self.pcs.unwrap_or((self.lcms() / 3).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_set_the_thesis_scales() {
        let s = |p: &str| {
            SimConfig {
                preset: Some(p.into()),
                ..SimConfig::default()
            }
            .resolve()
            .unwrap()
        };
        assert_eq!(
            (s("antares-sector").lcms(), s("antares-sector").pc_count()),
            (5, 1)
        );
        assert_eq!(
            (
                s("antares-2-string").lcms(),
                s("antares-2-string").pc_count()
            ),
            (60, 20)
        );
        assert_eq!(
            (
                s("antares-10-string").lcms(),
                s("antares-10-string").pc_count()
            ),
            (300, 100)
        );
    }

    #[test]
    fn bad_values_are_named() {
        let e = SimConfig {
            preset: Some("antares-11-string".into()),
            ..SimConfig::default()
        }
        .resolve()
        .unwrap_err();
        assert!(e.0.contains("antares-11-string"));
        let cases: Vec<(SimConfig, &str)> = vec![
            (
                SimConfig {
                    lcm_mbps: -1.0,
                    ..SimConfig::default()
                },
                "lcm_mbps",
            ),
            (
                SimConfig {
                    pc_mbps: 1e-9,
                    ..SimConfig::default()
                },
                "pc_mbps",
            ),
            (
                SimConfig {
                    min_rto_ms: 61_000.0,
                    ..SimConfig::default()
                },
                "min_rto_ms",
            ),
            (
                SimConfig {
                    slice_ms: 1e-9,
                    ..SimConfig::default()
                },
                "slice_ms",
            ),
            (
                SimConfig {
                    duration_s: 1e300,
                    ..SimConfig::default()
                },
                "duration_s",
            ),
            (
                SimConfig {
                    jitter_us: f64::INFINITY,
                    ..SimConfig::default()
                },
                "jitter_us",
            ),
            (
                SimConfig {
                    strings: 65536,
                    sectors_per_string: 65536,
                    ..SimConfig::default()
                },
                "strings",
            ),
            (
                SimConfig {
                    pcs: Some(u32::MAX),
                    ..SimConfig::default()
                },
                "pcs",
            ),
            (
                SimConfig {
                    slice_ms: 0.001,
                    ..SimConfig::default()
                },
                "fragments",
            ),
            (
                SimConfig {
                    seed: u64::MAX,
                    ..SimConfig::default()
                },
                "seed",
            ),
        ];
        for (c, field) in cases {
            let e = c.resolve().unwrap_err();
            assert!(e.0.contains(field), "{e} should name {field}");
        }
    }
}
