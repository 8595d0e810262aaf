//! Synthetic STF payloads: a cache-sized pseudo-random pattern repeated from a per-TF
//! offset, written as an iovec chain with no user-space copy (as iperf3 repeats its buffer).

use bytes::{Buf, Bytes};
use fanin_proto::{HEADER_LEN, STF_HEADER_LEN};
use rand::{RngCore, SeedableRng};
use std::io::IoSlice;

/// Pattern length: fits in a core's L2 cache, so sending measures the transport,
/// not DRAM bandwidth of a payload generator.
pub const PATTERN_LEN: usize = 256 * 1024;
const PREFIX: usize = HEADER_LEN + STF_HEADER_LEN;

pub struct Pattern(Bytes);

impl Pattern {
    pub fn new(seed: u64, flp: u32) -> Pattern {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ ((flp as u64) << 32));
        let mut v = vec![0u8; PATTERN_LEN];
        rng.fill_bytes(&mut v);
        Pattern(Bytes::from(v))
    }

    fn offset(tf: u64) -> usize {
        (tf.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % PATTERN_LEN
    }

    /// The payload of `tf` as consecutive slices of the pattern.
    fn pieces(&self, tf: u64, len: usize) -> impl Iterator<Item = &[u8]> {
        let mut pos = 0;
        let off = Self::offset(tf);
        std::iter::from_fn(move || {
            if pos >= len {
                return None;
            }
            let p = (off + pos) % PATTERN_LEN;
            let n = (PATTERN_LEN - p).min(len - pos);
            pos += n;
            Some(&self.0[p..p + n])
        })
    }

    /// CRC32C of the payload of `tf`.
    pub fn crc(&self, tf: u64, len: usize) -> u32 {
        self.pieces(tf, len).fold(0, crc32c::crc32c_append)
    }

    /// The payload bytes of `tf`, materialised (tests check what EPNs hand on).
    pub fn bytes(&self, tf: u64, len: usize) -> Vec<u8> {
        self.pieces(tf, len).flatten().copied().collect()
    }

    /// The whole STF frame (prefix, then payload) as a `Buf` for vectored writes.
    pub fn frame(&self, prefix: [u8; PREFIX], tf: u64, len: usize) -> StfBuf<'_> {
        StfBuf {
            prefix,
            prefix_pos: 0,
            pat: &self.0,
            off: Self::offset(tf),
            pos: 0,
            len,
        }
    }
}

pub struct StfBuf<'a> {
    prefix: [u8; PREFIX],
    prefix_pos: usize,
    pat: &'a [u8],
    off: usize,
    /// Payload bytes already consumed.
    pos: usize,
    len: usize,
}

impl StfBuf<'_> {
    fn payload_chunk(&self, pos: usize) -> &[u8] {
        let p = (self.off + pos) % PATTERN_LEN;
        let n = (PATTERN_LEN - p).min(self.len - pos);
        &self.pat[p..p + n]
    }
}

impl Buf for StfBuf<'_> {
    fn remaining(&self) -> usize {
        (PREFIX - self.prefix_pos) + (self.len - self.pos)
    }

    fn chunk(&self) -> &[u8] {
        if self.prefix_pos < PREFIX {
            &self.prefix[self.prefix_pos..]
        } else if self.pos < self.len {
            self.payload_chunk(self.pos)
        } else {
            &[]
        }
    }

    fn advance(&mut self, mut cnt: usize) {
        let from_prefix = cnt.min(PREFIX - self.prefix_pos);
        self.prefix_pos += from_prefix;
        cnt -= from_prefix;
        assert!(cnt <= self.len - self.pos, "advance past the end of an STF");
        self.pos += cnt;
    }

    fn chunks_vectored<'b>(&'b self, dst: &mut [IoSlice<'b>]) -> usize {
        let mut n = 0;
        if n < dst.len() && self.prefix_pos < PREFIX {
            dst[n] = IoSlice::new(&self.prefix[self.prefix_pos..]);
            n += 1;
        }
        let mut pos = self.pos;
        while n < dst.len() && pos < self.len {
            let c = self.payload_chunk(pos);
            dst[n] = IoSlice::new(c);
            pos += c.len();
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(mut b: StfBuf<'_>, step: usize, vectored: bool) -> Vec<u8> {
        let mut out = Vec::new();
        while b.has_remaining() {
            let mut k = 0;
            if vectored {
                let mut v = [IoSlice::new(&[]); 3];
                let cnt = b.chunks_vectored(&mut v);
                for s in &v[..cnt] {
                    let take = s.len().min(step - k);
                    out.extend_from_slice(&s[..take]);
                    k += take;
                    if k == step {
                        break;
                    }
                }
            } else {
                let c = b.chunk();
                k = c.len().min(step);
                out.extend_from_slice(&c[..k]);
            }
            b.advance(k);
        }
        out
    }

    #[test]
    fn frame_bytes_are_prefix_then_payload_however_it_is_consumed() {
        let p = Pattern::new(3, 1);
        let prefix = [7u8; PREFIX];
        for len in [0, 1, 1000, PATTERN_LEN - 1, PATTERN_LEN * 3 + 17] {
            let mut want = prefix.to_vec();
            want.extend_from_slice(&p.bytes(42, len));
            assert_eq!(want.len(), PREFIX + len);
            for (step, vec) in [(1, false), (13, true), (70_000, true), (usize::MAX, true)] {
                if step == 1 && len > 2000 {
                    continue;
                }
                assert_eq!(
                    drain(p.frame(prefix, 42, len), step, vec),
                    want,
                    "len {len} step {step}"
                );
            }
        }
    }

    #[test]
    fn crc_matches_the_materialised_payload_and_tfs_differ() {
        let p = Pattern::new(9, 0);
        let len = PATTERN_LEN * 2 + 5;
        assert_eq!(p.crc(5, len), crc32c::crc32c(&p.bytes(5, len)));
        assert_ne!(p.bytes(5, 64), p.bytes(6, 64));
        assert_ne!(Pattern::new(9, 1).bytes(5, 64), p.bytes(5, 64));
    }
}
