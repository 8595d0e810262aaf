//! fanin wire format: explicit, versioned, little-endian frames (see docs/protocol.md).
//! No raw structs on the wire; decoding returns an error, never panics, on any input.

pub mod error;
pub mod frame;
pub mod message;
pub mod tf_record;
pub mod wire;

pub use error::DecodeError;
pub use frame::{FrameHeader, HEADER_LEN, MAGIC, VERSION};
pub use message::{
    EpnEntry, HeldStf, Message, MsgType, NodeStats, Nonce, Prepare, Proof, Reason, Register,
    RejectCode, Role, RunState, Schedule, SizeWire, StfHeader, StfInfo, TfReport, TfStatus,
    HELD_BATCH, STF_HEADER_LEN,
};

/// Body limit for what a node sends on its control connection (its largest frames,
/// StfAnnounce and StfsHeld batches, take under 48 KiB), and for a Challenge.
pub const MAX_CONTROL_BODY: u32 = 64 << 10;

/// Body limit for what the ICN sends a node once it joined: an EpnList of the largest
/// run (10 000 EPNs, each 6 bytes and an address of up to 58 characters) takes 640 KB.
pub const MAX_ICN_BODY: u32 = 1 << 20;

/// Body limit for a connection's first frame, read before its peer has proved the run
/// secret (a Register body: at most 1064 bytes; a DataHello: 44), so a stranger's frame
/// costs a listener no more than this.
pub const MAX_HANDSHAKE_BODY: u32 = 2 << 10;
