//! Event-building workloads: one fragment per sender per time slice, fixed size or the
//! ANTARES bioluminescence model (bursts, optional cutoff), direct or delayed sending.

use rand::Rng;

use crate::engine::{Time, SEC};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bio {
    /// No bursts: every fragment has the normal size.
    None,
    /// Bursts (seed 004 §4.3.3): fragments are large during a burst.
    Bursts,
    /// Bursts, but only the first and last `cutoff_slices` of a burst are sent.
    Cutoff,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BioModel {
    pub kind: Bio,
    /// Fragment size outside bursts.
    pub normal: u32,
    /// Fragment size during a burst.
    pub burst: u32,
    /// Expected fraction of time a sender spends in bursts.
    pub fraction: f64,
    /// Burst length is uniform in [0, max_burst].
    pub max_burst: Time,
    pub cutoff_slices: u64,
}

/// One sender's burst state.
#[derive(Debug, Default, Clone, Copy)]
pub struct BurstState {
    /// Slices of the current burst: its length, and how many have passed.
    len: u64,
    pos: u64,
}

/// The fragment a sender produces for one slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    Send(u32),
    /// Produced but not sent (cutoff during a burst).
    Suppressed,
}

impl BioModel {
    /// Probability per slice of a burst starting, so that the expected fraction of
    /// time in bursts is `fraction`: f = E[L] / (E[L] + slice / p).
    pub fn start_probability(&self, slice: Time) -> f64 {
        let mean_len = self.max_burst as f64 / 2.0;
        if self.fraction <= 0.0 || mean_len <= 0.0 {
            return 0.0;
        }
        (slice as f64 * self.fraction / (mean_len * (1.0 - self.fraction))).min(1.0)
    }

    /// Advances a sender by one slice and returns its fragment.
    pub fn next(&self, st: &mut BurstState, slice: Time, rng: &mut impl Rng) -> Fragment {
        if self.kind == Bio::None {
            return Fragment::Send(self.normal);
        }
        if st.pos >= st.len && rng.gen::<f64>() < self.start_probability(slice) {
            let secs = rng.gen::<f64>() * self.max_burst as f64;
            st.len = ((secs / slice as f64).round() as u64).max(1);
            st.pos = 0;
        }
        if st.pos < st.len {
            let i = st.pos;
            st.pos += 1;
            let edge = i < self.cutoff_slices || i >= st.len.saturating_sub(self.cutoff_slices);
            if self.kind == Bio::Cutoff && !edge {
                return Fragment::Suppressed;
            }
            return Fragment::Send(self.burst);
        }
        Fragment::Send(self.normal)
    }
}

/// Delayed transmission (barrel shifting, seed 004 §3.3): sender i waits i div k slices.
pub fn delay_slices(sender: u32, k: Option<u32>) -> u64 {
    match k {
        None => 0,
        Some(k) => (sender / k.max(1)) as u64,
    }
}

pub fn antares_bio(kind: Bio) -> BioModel {
    BioModel {
        kind,
        normal: if kind == Bio::None { 30_000 } else { 25_000 },
        burst: 150_000,
        fraction: 0.05,
        max_burst: 3 * SEC,
        cutoff_slices: 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::MS;
    use rand::SeedableRng;

    #[test]
    fn bursts_take_the_configured_fraction_of_time() {
        let m = antares_bio(Bio::Bursts);
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        let mut in_burst = 0u64;
        let n = 300 * 20_000u64;
        let mut states = vec![BurstState::default(); 300];
        for _ in 0..20_000 {
            for st in &mut states {
                if m.next(st, 10 * MS, &mut rng) == Fragment::Send(150_000) {
                    in_burst += 1;
                }
            }
        }
        let f = in_burst as f64 / n as f64;
        assert!((0.04..0.06).contains(&f), "fraction in burst {f}");
    }

    #[test]
    fn cutoff_sends_only_the_edges_of_a_burst() {
        let m = BioModel {
            fraction: 0.5,
            ..antares_bio(Bio::Cutoff)
        };
        let mut st = BurstState { len: 10, pos: 0 };
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(1);
        let got: Vec<_> = (0..10)
            .map(|_| m.next(&mut st, 10 * MS, &mut rng))
            .collect();
        let sent: Vec<bool> = got.iter().map(|f| matches!(f, Fragment::Send(_))).collect();
        assert_eq!(
            sent,
            vec![true, true, true, true, false, false, true, true, true, true]
        );
    }

    #[test]
    fn delayed_transmission_groups_k_senders() {
        let d: Vec<u64> = (0..10).map(|i| delay_slices(i, Some(4))).collect();
        assert_eq!(d, vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
        assert_eq!(delay_slices(299, None), 0);
    }
}
