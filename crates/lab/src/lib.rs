//! fanin's laboratory: runtime experiment files, launching clusters of real processes
//! (on loopback or a testbed), fault injection, tables, plots and benchmarks.
//! The `fanin` binary parses arguments and calls in here; tests use it the same way.

pub mod bench;
pub mod bench_metrics;
pub mod bench_sink;
pub mod bench_source;
pub mod bench_transport;
pub mod chaos;
pub mod chaos_real;
pub mod cluster;
pub mod ctl;
pub mod experiment;
pub mod faults;
pub mod http;
pub mod node_plan;
pub mod orchestrate;
pub mod overrides;
pub mod plot;
pub mod ports;
pub mod process;
pub mod run_report;
pub mod table;
pub mod testbed;
pub mod tf_files;

pub use overrides::{clock_run_id, RunOverrides};
