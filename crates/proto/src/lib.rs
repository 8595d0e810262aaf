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

/// Body limit for control connections (ICN <-> FLP/EPN). An EpnList of 2000 EPNs
/// takes about 55 KiB.
pub const MAX_CONTROL_BODY: u32 = 64 << 10;

/// Body limit for a connection's first frame, read before its peer has proved the run
/// secret (a Register body: at most 1064 bytes; a DataHello: 44), so a stranger's frame
/// costs a listener no more than this.
pub const MAX_HANDSHAKE_BODY: u32 = 2 << 10;
