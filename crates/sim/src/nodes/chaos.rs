//! The fault campaign: scenarios drawn from a seed (cluster size, policy, rate, buffers,
//! a schedule of faults), each run in the nodes model and held to every promise.
//!
//! A seed is the whole case: `fanin chaos --seed N` runs it again, byte for byte; a
//! failing case is shrunk to the fewest faults that still fail (`--keep I,J`).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

use fanin_node::config::{OnStale, Registry, ScheduleKind};
use fanin_node::RunConfig;
use fanin_sched::PolicyKind;

use super::check::{violations, Expect};
use super::{simulate, Fault, FaultKind, NetConfig, Outcome, Peer, Scenario};

/// One case of the campaign.
#[derive(Debug, Clone)]
pub struct Case {
    pub seed: u64,
    pub scenario: Scenario,
    pub expect: Expect,
}

/// Which faults a case may draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kinds {
    /// Every kind the nodes model injects.
    All,
    /// What a real run on loopback injects: kills and freezes of processes.
    Processes,
}

/// The case of `seed`: every other seed is a general fault schedule (only accounting
/// promised); the rest kill EPNs with re-assignment on (zero loss promised).
pub fn case(seed: u64) -> Case {
    case_of(seed, Kinds::All)
}

/// The case of `seed` drawing only faults of `kinds`.
pub fn case_of(seed: u64, kinds: Kinds) -> Case {
    let mut rng = Pcg64::seed_from_u64(seed);
    let expect = if seed.is_multiple_of(2) {
        Expect::ZeroLoss
    } else {
        Expect::Accounted
    };
    let net = NetConfig {
        latency_us: rng.gen_range(10..=200),
        link_gbps: *[1.0, 10.0, 40.0].choose(&mut rng).expect("non-empty"),
    };
    let run = random_run(&mut rng, expect, net.link_gbps);
    let len_ms = (run.tfs.unwrap_or(0) as f64 * 1e3 / run.rate_hz) as u64;
    let zk = run.registry == Registry::ZooKeeper;
    let mut faults = match expect {
        Expect::ZeroLoss => epn_kills(&mut rng, run.epns, len_ms),
        Expect::Accounted => any_faults(&mut rng, (run.flps, run.epns), len_ms, (kinds, zk)),
    };
    if kinds == Kinds::All && zk {
        faults.extend(icn_faults(seed, len_ms, expect));
        faults.sort_by_key(|f| f.at_ms);
    }
    Case {
        seed,
        scenario: Scenario { run, net, faults },
        expect,
    }
}

/// A run: zero-loss cases offer at most half of what one EPN's link takes (the last
/// survivor may get every TF); general ones may overload (drops, named, are allowed).
fn random_run(rng: &mut Pcg64, expect: Expect, link_gbps: f64) -> RunConfig {
    let flps = rng.gen_range(1..=4);
    let epns = rng.gen_range(2..=6);
    let stf_kib: u64 = *[1, 16, 64, 256].choose(rng).expect("non-empty");
    let stf = stf_kib << 10;
    // Zero loss needs room for what the survivors take over; the general class
    // sometimes runs tight buffers (drops, named, are allowed there).
    let tight = expect == Expect::Accounted && rng.gen_bool(0.3);
    let (flp_buf, epn_buf) = if tight {
        (
            stf * rng.gen_range(4..=16),
            stf * u64::from(flps) * rng.gen_range(2..=8),
        )
    } else {
        (64 << 20, 512 << 20)
    };
    let mut run = RunConfig {
        flps,
        epns,
        rate_hz: match expect {
            Expect::ZeroLoss => {
                let tf_bits = (stf * u64::from(flps) * 8) as f64;
                (0.5 * link_gbps * 1e9 / tf_bits)
                    .min(2000.0)
                    .floor()
                    .max(1.0)
            }
            Expect::Accounted => f64::from(rng.gen_range(1..=20u32) * 100),
        },
        tfs: Some(rng.gen_range(50..=600)),
        duration_s: None,
        // Sizes vary (+-50 %) in a third of the runs: on-data places them by size.
        stf_size: if rng.gen_bool(0.33) {
            format!("random({stf_kib}KiB,0.5)")
        } else {
            format!("{stf_kib}KiB")
        },
        // A third of the runs schedule after the data exist (the FLPs' sources).
        schedule: if rng.gen_bool(0.33) {
            ScheduleKind::OnData
        } else {
            ScheduleKind::Timer
        },
        on_stale: *[OnStale::Incomplete, OnStale::Drop]
            .choose(rng)
            .expect("non-empty"),
        policy: *PolicyKind::ALL.choose(rng).expect("non-empty"),
        build_timeout_ms: *[300, 1000].choose(rng).expect("non-empty"),
        flp_buffer: fanin_node::config::ByteSize(flp_buf),
        epn_buffer: fanin_node::config::ByteSize(epn_buf),
        reassign: expect == Expect::ZeroLoss || rng.gen_bool(0.5),
        lease_ms: *[300, 1000].choose(rng).expect("non-empty"),
        registry: if rng.gen_bool(0.5) {
            Registry::ZooKeeper
        } else {
            Registry::Embedded
        },
        zk_session_timeout_ms: *[300, 1000, 2000].choose(rng).expect("non-empty"),
        seed: rng.gen::<u64>() >> 1, // TOML integers are signed
        prerun_timeout_s: 10.0,
        ..RunConfig::default()
    };
    pull_by_seed(&mut run);
    run
}

/// A quarter of the runs pull with transfer tokens, from the run's own seed (no draw of
/// its own, so the cases drawn before pull mode existed stay as they were).
fn pull_by_seed(run: &mut RunConfig) {
    if run.seed % 4 == 3 {
        run.transfer = fanin_node::config::Transfer::Pull;
        run.flp_tokens = 1 + (run.seed >> 8) as u32 % 3;
        run.epn_tokens = 1 + (run.seed >> 16) as u32 % 2;
    }
}

/// After the pre-run (it takes about a millisecond): a node lost in the pre-run makes
/// the ICN give the run up, by design, and that promises nothing about TFs.
const FIRST_FAULT_MS: u64 = 20;

fn when(rng: &mut Pcg64, len_ms: u64) -> u64 {
    rng.gen_range(FIRST_FAULT_MS..=len_ms.max(FIRST_FAULT_MS))
}

/// Up to three EPN kills, never of every EPN at once: each restarts, or stays down
/// when at least one other EPN never dies.
fn epn_kills(rng: &mut Pcg64, epns: u32, len_ms: u64) -> Vec<Fault> {
    let mut ids: Vec<u32> = (0..epns).collect();
    ids.shuffle(rng);
    let n = rng.gen_range(1..=3.min(epns as usize - 1));
    let mut faults: Vec<Fault> = ids[..n]
        .iter()
        .map(|&e| Fault {
            at_ms: when(rng, len_ms),
            node: Peer::Epn(e),
            kind: FaultKind::Kill {
                restart_ms: rng.gen_bool(0.5).then(|| rng.gen_range(50..=2000)),
            },
        })
        .collect();
    faults.sort_by_key(|f| f.at_ms);
    faults
}

/// With ZooKeeper, half the cases also kill the ICN or freeze it (for less or more than
/// its session), once or twice; the standby takes the run over. Drawn from a stream of
/// the seed's own, so the cases drawn before ICN faults existed keep their other faults.
/// Zero-loss cases only kill it: a frozen ICN releases nothing and grants no transfer,
/// so buffers fill and builds time out (named drops, but drops).
fn icn_faults(seed: u64, len_ms: u64, expect: Expect) -> Vec<Fault> {
    let mut rng = Pcg64::seed_from_u64(seed ^ 0x1C4E_5EED_0F1C_4E5E);
    if rng.gen_bool(0.5) {
        return Vec::new();
    }
    let n = rng.gen_range(1..=2);
    (0..n)
        .map(|_| Fault {
            at_ms: when(&mut rng, len_ms),
            node: Peer::Icn,
            kind: if expect == Expect::ZeroLoss || rng.gen_bool(0.5) {
                FaultKind::Kill { restart_ms: None }
            } else {
                FaultKind::Freeze {
                    ms: rng.gen_range(100..=3000),
                }
            },
        })
        .collect()
}

/// One to six faults of every kind, on any node.
fn any_faults(
    rng: &mut Pcg64,
    (flps, epns): (u32, u32),
    len_ms: u64,
    (kinds, zk): (Kinds, bool),
) -> Vec<Fault> {
    let n_kinds = match kinds {
        Kinds::All if zk => 7,
        Kinds::All => 6,
        Kinds::Processes => 2,
    };
    let n = rng.gen_range(1..=6);
    let mut faults: Vec<Fault> = (0..n)
        .map(|_| {
            let node = if rng.gen_bool(0.5) {
                Peer::Flp(rng.gen_range(0..flps))
            } else {
                Peer::Epn(rng.gen_range(0..epns))
            };
            let ms = rng.gen_range(10..=1500);
            let kind = match rng.gen_range(0..n_kinds) {
                0 => FaultKind::Kill {
                    restart_ms: rng.gen_bool(0.7).then(|| rng.gen_range(50..=2000)),
                },
                1 => FaultKind::Freeze { ms },
                2 => FaultKind::ResetControl,
                3 if matches!(node, Peer::Flp(_)) => FaultKind::ResetData {
                    epn: rng.gen_range(0..epns),
                },
                6 => FaultKind::ExpireSession,
                3 | 4 => {
                    let peer = match node {
                        Peer::Flp(_) if rng.gen_bool(0.5) => {
                            Some(Peer::Epn(rng.gen_range(0..epns)))
                        }
                        Peer::Epn(_) if rng.gen_bool(0.5) => {
                            Some(Peer::Flp(rng.gen_range(0..flps)))
                        }
                        _ => None,
                    };
                    FaultKind::Partition { peer, ms }
                }
                _ => FaultKind::Slow {
                    extra_us: rng.gen_range(100..=50_000),
                    ms,
                },
            };
            Fault {
                at_ms: when(rng, len_ms),
                node,
                kind,
            }
        })
        .collect();
    faults.sort_by_key(|f| f.at_ms);
    faults
}

/// A case's run and its broken promises.
pub fn run_case(c: &Case) -> anyhow::Result<(Outcome, Vec<String>)> {
    let o = simulate(&c.scenario)?;
    let v = violations(&o, c.expect);
    Ok((o, v))
}

/// The case with only the faults at `keep` (indices into its schedule).
pub fn keep_faults(c: &Case, keep: &[usize]) -> Case {
    let mut c = c.clone();
    let all = std::mem::take(&mut c.scenario.faults);
    c.scenario.faults = keep.iter().filter_map(|&i| all.get(i).copied()).collect();
    c
}

/// The fewest faults (indices) with which the case still breaks a promise: drops one
/// fault at a time while it still fails.
pub fn shrink(c: &Case) -> Vec<usize> {
    let mut keep: Vec<usize> = (0..c.scenario.faults.len()).collect();
    let mut i = 0;
    while i < keep.len() {
        let mut fewer = keep.clone();
        fewer.remove(i);
        let fails = run_case(&keep_faults(c, &fewer)).is_ok_and(|(_, v)| !v.is_empty());
        if fails {
            keep = fewer;
        } else {
            i += 1;
        }
    }
    keep
}

/// What a campaign did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub seeds: u64,
    pub failed: Vec<(u64, Vec<String>)>,
    pub sim_ns: u128,
    pub faults: u64,
    pub icn_faults: u64,
    pub takeovers: u64,
    pub tfs: u64,
    pub events: u64,
}

impl Tally {
    pub fn add(&mut self, seed: u64, o: &Outcome, v: Vec<String>) {
        self.seeds += 1;
        self.sim_ns += u128::from(o.sim_ns);
        self.faults += o.seen.faults_injected;
        self.icn_faults += o.seen.icn_faults;
        self.takeovers += o.seen.takeovers;
        self.tfs += o.summary.issued;
        self.events += o.events;
        if !v.is_empty() {
            self.failed.push((seed, v));
        }
    }

    /// "seeds 2000, violations 0, simulated 3412.5 s, faults 7012 (ICN 900, take-overs
    /// 700), TFs 650123, events N".
    pub fn line(&self) -> String {
        format!(
            "seeds {}, violations {}, simulated {:.1} s, faults {} (ICN {}, take-overs {}), TFs {}, events {}",
            self.seeds,
            self.failed.len(),
            self.sim_ns as f64 / 1e9,
            self.faults,
            self.icn_faults,
            self.takeovers,
            self.tfs,
            self.events
        )
    }
}
