//! What runtime and simulation experiments share in presenting results: experiment files
//! as TOML documents, result directories with sanitised names, percentiles, and the text
//! table writer.

pub mod dir;
pub mod doc;
pub mod plot;
pub mod stats;
pub mod text;

pub use dir::{experiment_root, row_dir, sanitize, timestamp};
pub use stats::{median, percentile};
pub use text::{align, csv_fields, csv_quoted};
