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
/// A simulation that cannot run as configured; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<String> for ConfigError {
    fn from(s: String) -> Self {
        ConfigError(s)
    }
}

impl From<&str> for ConfigError {
    fn from(s: &str) -> Self {
        ConfigError(s.to_string())
    }
}

impl From<fanin_sched::ParseError> for ConfigError {
    fn from(e: fanin_sched::ParseError) -> Self {
        ConfigError(e.0)
    }
}

pub fn simulate(cfg: SimConfig) -> Result<World, ConfigError> {
    let cfg = cfg.resolve()?;
    let mut w = World::new(cfg);
    w.run();
    Ok(w)
}
