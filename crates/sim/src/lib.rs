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
pub mod stats;
pub mod tcp;
pub mod workload;
pub mod world;

pub use config::{SimConfig, Transport};
pub use stats::SimSummary;
pub use world::World;

/// Runs one configuration to its end and returns the world (fragments, counters).
pub fn simulate(cfg: SimConfig) -> Result<World, String> {
    let cfg = cfg.resolve()?;
    let mut w = World::new(cfg);
    w.run();
    Ok(w)
}
