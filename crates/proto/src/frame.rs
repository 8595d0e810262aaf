//! Frame header: the fixed 12-byte prefix of every fanin frame.
//! Owns the magic, the protocol version, the message type byte and the body length.

use crate::error::DecodeError;

/// "FNIN" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"FNIN");
/// The protocol version this build speaks. A peer with another version is refused.
pub const VERSION: u8 = 7;
/// Size of the encoded header in bytes.
pub const HEADER_LEN: usize = 12;

/// The decoded frame header. `length` is the number of body bytes that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub msg_type: u8,
    pub length: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = VERSION;
        out[5] = self.msg_type;
        // bytes 6..8: flags, reserved, always zero in version 1.
        out[8..12].copy_from_slice(&self.length.to_le_bytes());
        out
    }

    /// Decodes and validates a header. `max_body` is the receiver's limit for this
    /// connection (control frames are small, STF frames large).
    pub fn decode(bytes: &[u8], max_body: u32) -> Result<FrameHeader, DecodeError> {
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                what: "frame header",
                need: HEADER_LEN,
                have: bytes.len(),
            });
        }
        let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        if bytes[4] != VERSION {
            return Err(DecodeError::Version {
                got: bytes[4],
                want: VERSION,
            });
        }
        let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
        if flags != 0 {
            return Err(DecodeError::Flags(flags));
        }
        let length = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if length > max_body {
            return Err(DecodeError::Oversized {
                length,
                limit: max_body,
            });
        }
        Ok(FrameHeader {
            msg_type: bytes[5],
            length,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = FrameHeader {
            msg_type: 7,
            length: 1234,
        };
        assert_eq!(FrameHeader::decode(&h.encode(), 4096).unwrap(), h);
    }

    #[test]
    fn header_rejects_bad_magic_version_flags_and_size() {
        let good = FrameHeader {
            msg_type: 1,
            length: 10,
        }
        .encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            FrameHeader::decode(&b, 100),
            Err(DecodeError::BadMagic(_))
        ));
        let mut b = good;
        b[4] = 6; // the version before pull mode
        assert_eq!(
            FrameHeader::decode(&b, 100),
            Err(DecodeError::Version { got: 6, want: 7 })
        );
        let mut b = good;
        b[6] = 1;
        assert_eq!(FrameHeader::decode(&b, 100), Err(DecodeError::Flags(1)));
        assert_eq!(
            FrameHeader::decode(&good, 9),
            Err(DecodeError::Oversized {
                length: 10,
                limit: 9
            })
        );
        assert!(matches!(
            FrameHeader::decode(&good[..5], 100),
            Err(DecodeError::Truncated { .. })
        ));
    }
}
