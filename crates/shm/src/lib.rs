//! The shared-memory STF ring of docs/sources.md: a read-out process writes STFs into
//! fixed slots of a file in /dev/shm, the FLP reads them in place and frees each slot.
//!
//! `Writer` is the read-out's side (the Rust client; C and Python ones are in
//! `examples/`), `Reader` the FLP's. The layout is version 1, little-endian; each field
//! has one writer at a time and a slot's `state` is stored last (release) and read
//! first (acquire), so a READY slot's bytes are complete.

mod layout;
mod reader;
mod writer;

pub use layout::{ring_path, RingError, MAX_SLOT_SIZE, VERSION};
pub use reader::{Payload, Reader, Slot};
pub use writer::Writer;

#[cfg(test)]
mod tests;
