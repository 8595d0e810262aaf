//! Decoding errors: every way a sequence of bytes can fail to be a fanin frame.
//! Each variant names the field at fault so the receiver can log a one-line error.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("bad magic 0x{0:08x} (not a fanin peer)")]
    BadMagic(u32),
    #[error("protocol version {got} not supported (this build speaks {want})")]
    Version { got: u8, want: u8 },
    #[error("reserved header flags 0x{0:04x} set")]
    Flags(u16),
    #[error("frame length {length} exceeds the limit {limit}")]
    Oversized { length: u32, limit: u32 },
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("invalid value {value} for field {field}")]
    InvalidValue { field: &'static str, value: u64 },
    #[error("field {field}: invalid UTF-8")]
    Utf8 { field: &'static str },
    #[error("{extra} trailing bytes after {what}")]
    Trailing { what: &'static str, extra: usize },
    #[error("STF payload length {declared} does not match the {actual} bytes in the frame")]
    PayloadLength { declared: u32, actual: usize },
}
