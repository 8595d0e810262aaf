//! STF size models: fixed, uniform, and the original O2Balancer's "sine" and "random".
//! Sizes are a pure function of (seed, FLP, TF), so runtime and simulator agree exactly.

use crate::{FlpId, TfId};

/// How big each STF is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StfSize {
    /// Every STF has this many bytes.
    Fixed(u64),
    /// Independent per STF, uniform in [min, max].
    Uniform { min: u64, max: u64 },
    /// All FLPs follow one sine wave over TF ids:
    /// `mean + amplitude * sin(2 pi tf / period)` (a luminosity-like cycle).
    Sine {
        mean: u64,
        amplitude: u64,
        period: u64,
    },
    /// One random factor per TF, shared by all its FLPs: uniform in
    /// [mean (1 - spread), mean (1 + spread)] (correlated, event-like fluctuation).
    Random { mean: u64, spread: f64 },
}

impl StfSize {
    /// Size in bytes of the STF that `flp` sends for `tf`.
    pub fn sample(&self, seed: u64, flp: FlpId, tf: TfId) -> u64 {
        match *self {
            StfSize::Fixed(n) => n,
            StfSize::Uniform { min, max } => {
                let h = mix(seed ^ mix(tf) ^ mix(0x1000_0000 + flp as u64));
                min + h % (max - min + 1)
            }
            StfSize::Sine {
                mean,
                amplitude,
                period,
            } => {
                let phase = (tf % period) as f64 / period as f64;
                let v = mean as f64 + amplitude as f64 * (std::f64::consts::TAU * phase).sin();
                v.round().max(0.0) as u64
            }
            StfSize::Random { mean, spread } => {
                let h = mix(seed ^ mix(tf));
                let u = (h >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
                let f = 1.0 - spread + 2.0 * spread * u;
                (mean as f64 * f).round().max(0.0) as u64
            }
        }
    }

    /// Size in bytes of the whole TF `tf`: the sum of the STFs of FLPs `0..flps`
    /// (what the ICN passes to a policy in `TfRequest::bytes`). Only `uniform` differs
    /// per FLP; the other models cost one sample.
    pub fn tf_bytes(&self, seed: u64, flps: u32, tf: TfId) -> u64 {
        match self {
            StfSize::Uniform { .. } => {
                (0..flps).fold(0u64, |sum, f| sum.saturating_add(self.sample(seed, f, tf)))
            }
            _ => self.sample(seed, 0, tf).saturating_mul(flps as u64),
        }
    }

    /// The largest size this model can produce.
    pub fn max(&self) -> u64 {
        match *self {
            StfSize::Fixed(n) => n,
            StfSize::Uniform { max, .. } => max,
            StfSize::Sine {
                mean, amplitude, ..
            } => mean.saturating_add(amplitude),
            StfSize::Random { mean, spread } => (mean as f64 * (1.0 + spread)).ceil() as u64,
        }
    }

    /// The mean STF size, for rate and goodput estimates.
    pub fn mean(&self) -> f64 {
        match *self {
            StfSize::Fixed(n) => n as f64,
            StfSize::Uniform { min, max } => (min + max) as f64 / 2.0,
            StfSize::Sine { mean, .. } | StfSize::Random { mean, .. } => mean as f64,
        }
    }

    fn validate(self) -> Result<StfSize, String> {
        match self {
            StfSize::Uniform { min, max } if min > max => {
                Err(format!("uniform: min {min} is larger than max {max}"))
            }
            StfSize::Sine {
                mean, amplitude, ..
            } if amplitude > mean => Err(format!(
                "sine: amplitude {amplitude} is larger than mean {mean}"
            )),
            StfSize::Sine { period: 0, .. } => Err("sine: period must be at least 1 TF".into()),
            StfSize::Random { spread, .. } if !(0.0..=1.0).contains(&spread) => {
                Err(format!("random: spread {spread} must be within 0..=1"))
            }
            s => Ok(s),
        }
    }
}

impl std::str::FromStr for StfSize {
    type Err = crate::ParseError;

    /// Accepts `1MiB`, `uniform(1KiB,2MiB)`, `sine(MEAN,AMPLITUDE,PERIOD_TFS)`,
    /// `random(MEAN,SPREAD)`.
    fn from_str(s: &str) -> Result<StfSize, crate::ParseError> {
        parse_size(s).map_err(crate::ParseError)
    }
}

/// STF size model from text (see `FromStr`).
fn parse_size(s: &str) -> Result<StfSize, String> {
    {
        let s = s.trim();
        let Some(open) = s.find('(') else {
            return bytes_of(s).map(StfSize::Fixed);
        };
        let name = &s[..open];
        let args = s[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("STF size {s:?}: missing ')'"))?;
        let args: Vec<&str> = args.split(',').map(str::trim).collect();
        let want = |n: usize| {
            if args.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "STF size {s:?}: {name} takes {n} arguments, got {}",
                    args.len()
                ))
            }
        };
        let size = match name {
            "fixed" => {
                want(1)?;
                StfSize::Fixed(bytes_of(args[0])?)
            }
            "uniform" => {
                want(2)?;
                StfSize::Uniform {
                    min: bytes_of(args[0])?,
                    max: bytes_of(args[1])?,
                }
            }
            "sine" => {
                want(3)?;
                StfSize::Sine {
                    mean: bytes_of(args[0])?,
                    amplitude: bytes_of(args[1])?,
                    period: args[2]
                        .parse()
                        .map_err(|_| format!("sine: period {:?} is not a TF count", args[2]))?,
                }
            }
            "random" => {
                want(2)?;
                StfSize::Random {
                    mean: bytes_of(args[0])?,
                    spread: args[1]
                        .parse()
                        .map_err(|_| format!("random: spread {:?} is not a number", args[1]))?,
                }
            }
            _ => {
                return Err(format!(
                    "STF size {s:?}: unknown model {name:?} (fixed, uniform, sine, random)"
                ))
            }
        };
        size.validate()
    }
}

impl std::fmt::Display for StfSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StfSize::Fixed(n) => write!(f, "{n}"),
            StfSize::Uniform { min, max } => write!(f, "uniform({min},{max})"),
            StfSize::Sine {
                mean,
                amplitude,
                period,
            } => write!(f, "sine({mean},{amplitude},{period})"),
            StfSize::Random { mean, spread } => write!(f, "random({mean},{spread})"),
        }
    }
}

/// The detector's clock of an on-data synthetic source, once for the FLP and the
/// simulators: TF `n` is due `n / rate` after the run started (no rate: as fast as the
/// send buffer allows), and `total` TFs are made (0: until the run stops).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetectorClock {
    pub rate_hz: Option<f64>,
    pub total: u64,
}

impl DetectorClock {
    /// Seconds after the run's start at which TF `tf` is due.
    pub fn due_s(&self, tf: TfId) -> f64 {
        self.rate_hz.map_or(0.0, |r| tf as f64 / r)
    }

    /// The first TF of a source that starts `elapsed_s` into the run: the ones due
    /// before were the run's before it (None: no clock, it starts where it is).
    pub fn first_at(&self, elapsed_s: f64) -> Option<TfId> {
        self.rate_hz.map(|r| (elapsed_s * r).floor() as TfId)
    }

    /// Every TF made, when `next` is the next one.
    pub fn ended(&self, next: TfId) -> bool {
        self.total > 0 && next >= self.total
    }
}

/// Parses a byte count: `58750`, `58750B`, `64KiB`, `1MiB`, `2GiB`, `10kB`, `1MB`, `1GB`.
pub fn parse_bytes(s: &str) -> Result<u64, crate::ParseError> {
    bytes_of(s).map_err(crate::ParseError)
}

fn bytes_of(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        u => {
            return Err(format!(
                "byte size {s:?}: unknown unit {u:?} (B, kB, KiB, MB, MiB, GB, GiB)"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("byte size {s:?}: {num:?} is not a number"))?;
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > (1u64 << 53) as f64 {
        return Err(format!("byte size {s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// SplitMix64 finaliser: a fast, well-mixed, stateless hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("58750").unwrap(), 58750);
        assert_eq!(parse_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("1.5 KiB").unwrap(), 1536);
        assert_eq!(parse_bytes("10kB").unwrap(), 10_000);
        assert!(parse_bytes("1 parsec")
            .unwrap_err()
            .0
            .contains("unknown unit"));
        assert!(parse_bytes("MiB").unwrap_err().0.contains("not a number"));
    }

    #[test]
    fn parses_models_and_prints_them_back() {
        for s in [
            "1048576",
            "uniform(10,20)",
            "sine(100,50,8)",
            "random(100,0.25)",
        ] {
            let m: StfSize = s.parse().unwrap();
            assert_eq!(m.to_string(), s);
        }
        assert!("uniform(20,10)".parse::<StfSize>().is_err());
        assert!("sine(10,20,5)".parse::<StfSize>().is_err());
        assert!("random(10,2)".parse::<StfSize>().is_err());
        assert!("gauss(1,2)"
            .parse::<StfSize>()
            .unwrap_err()
            .0
            .contains("unknown model"));
        assert!("uniform(1)"
            .parse::<StfSize>()
            .unwrap_err()
            .0
            .contains("2 arguments"));
    }

    #[test]
    fn tf_bytes_is_the_sum_of_the_flps_stfs() {
        for s in [
            "1000",
            "uniform(10,20)",
            "sine(100,50,8)",
            "random(100,0.25)",
        ] {
            let m: StfSize = s.parse().unwrap();
            for tf in 0..50 {
                let sum: u64 = (0..7).map(|f| m.sample(3, f, tf)).sum();
                assert_eq!(m.tf_bytes(3, 7, tf), sum, "{s} tf {tf}");
            }
            assert_eq!(m.tf_bytes(3, 0, 1), 0, "{s}");
        }
    }

    #[test]
    fn uniform_stays_in_range_and_varies_per_flp() {
        let m = StfSize::Uniform { min: 100, max: 200 };
        let mut differ = false;
        for tf in 0..1000 {
            let a = m.sample(1, 0, tf);
            let b = m.sample(1, 1, tf);
            assert!((100..=200).contains(&a) && (100..=200).contains(&b));
            differ |= a != b;
            assert_eq!(a, m.sample(1, 0, tf), "deterministic");
        }
        assert!(differ);
    }

    #[test]
    fn sine_follows_the_wave_for_all_flps() {
        let m = StfSize::Sine {
            mean: 1000,
            amplitude: 500,
            period: 4,
        };
        let got: Vec<_> = (0..5).map(|tf| m.sample(9, 3, tf)).collect();
        assert_eq!(got, vec![1000, 1500, 1000, 500, 1000]);
        assert_eq!(m.sample(9, 0, 1), m.sample(9, 7, 1));
        assert_eq!(m.max(), 1500);
    }

    #[test]
    fn random_is_shared_by_the_flps_of_a_tf() {
        let m = StfSize::Random {
            mean: 1000,
            spread: 0.5,
        };
        let mut seen = std::collections::BTreeSet::new();
        for tf in 0..200 {
            let a = m.sample(5, 0, tf);
            assert_eq!(a, m.sample(5, 1, tf));
            assert!((500..=1500).contains(&a));
            seen.insert(a);
        }
        assert!(seen.len() > 50);
        assert_ne!(m.sample(5, 0, 3), m.sample(6, 0, 3), "seed changes sizes");
    }
}
