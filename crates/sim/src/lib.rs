//! fanin's discrete-event simulator: a packet-level network with TCP and UDP, and
//! event-building workloads whose destinations come from `fanin_sched`, unchanged.

pub mod compare;
pub mod config;
pub mod engine;
pub mod event;
pub mod experiment;
pub mod fabric;
pub mod flow;
pub mod net;
pub mod nodes;
pub mod stats;
pub mod tcp;
pub mod workload;
pub mod world;

pub use config::{SimConfig, Transport};
pub use stats::SimSummary;
pub use world::World;

/// A simulation that cannot run as configured; the message names the value (the same
/// error as a bad size or policy in `fanin_sched`).
pub use fanin_sched::ParseError as ConfigError;

/// The largest seed of `fanin sim --seed` and the fat tree: the seeds of its repetitions
/// follow it and are written to TOML (signed 64-bit).
pub const MAX_SEED: u64 = 1 << 62;

/// Runs one configuration to its end and returns the world (fragments, counters).
pub fn simulate(cfg: SimConfig) -> Result<World, ConfigError> {
    let cfg = cfg.resolve()?;
    let mut w = World::new(cfg);
    w.run();
    Ok(w)
}
