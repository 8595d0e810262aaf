//! fanin runtime: the ICN, FLP and EPN processes, their transports and metrics (tokio).
//! Load-balancing decisions come from `fanin_sched`; wire encoding from `fanin_proto`.

pub mod admission;
pub mod auth;
pub mod budget;
pub mod config;
pub mod conn;
pub mod epn;
pub mod fdlimit;
pub mod flp;
pub mod host;
pub mod icn;
pub mod join;
pub mod metrics;
pub mod registry;
pub mod runctl;

pub use config::RunConfig;
pub use icn::summary::Summary;
