//! Built-TF records: how an EPN hands a TF to its sinks (an `exec` command's stdin, the
//! file writer, the tap), little-endian, CRC-checked; the reader never panics.
//!
//! A stream is an optional 16-byte file header, then records: a 32-byte TF header and,
//! per STF, a 24-byte STF header and its payload (docs/sinks.md has the table). Records
//! of version 1 (16-byte STF headers without their own CRC) are still read.

use std::io::Read;

use crate::error::DecodeError;
use crate::wire::Reader;

/// First 8 bytes of a TF file (`file:` sink, burst saver).
pub const FILE_MAGIC: [u8; 8] = *b"FANINTF1";
pub const FILE_HEADER_LEN: usize = 16;
/// First 4 bytes of every TF record: "FTF1".
pub const TF_MAGIC: u32 = u32::from_le_bytes(*b"FTF1");
/// Version 2: each STF header carries a CRC of itself, so a damaged FLP id or length is
/// an error at once (version 1's were covered by nothing).
pub const TF_RECORD_VERSION: u16 = 2;
pub const TF_HEADER_LEN: usize = 32;
pub const STF_RECORD_HEADER_LEN: usize = 24;
/// A version 1 record's STF header: FLP id, payload CRC, length.
pub const STF_RECORD_HEADER_LEN_V1: usize = 16;
/// Most STFs one record may claim (checked before anything is allocated).
pub const MAX_RECORD_STFS: u32 = 1 << 20;
/// Most bytes reserved for a kept payload before its bytes arrive: a larger one grows
/// as it is read, so a forged length costs no more than this until the stream ends.
pub const RESERVE_AT_MOST: u64 = 64 << 20;

/// The TF header of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TfHeader {
    pub run_id: u64,
    pub tf_id: u64,
    pub stfs: u32,
}

/// The header of one STF in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StfRecordHeader {
    pub flp_id: u32,
    /// CRC32C of the payload.
    pub crc: u32,
    pub len: u64,
}

pub fn encode_file_header(epn_id: u32) -> [u8; FILE_HEADER_LEN] {
    let mut b = [0u8; FILE_HEADER_LEN];
    b[..8].copy_from_slice(&FILE_MAGIC);
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[12..].copy_from_slice(&epn_id.to_le_bytes());
    b
}

/// A field whose value is not one this format allows.
fn invalid(field: &'static str, value: u64) -> DecodeError {
    DecodeError::InvalidValue { field, value }
}

/// A stored CRC32C (`field`) checked against the bytes it covers.
fn check_crc(field: &'static str, stored: u32, covered: &[u8]) -> Result<(), DecodeError> {
    match stored == crc32c::crc32c(covered) {
        true => Ok(()),
        false => Err(invalid(field, stored as u64)),
    }
}

/// The EPN id a file header names.
pub fn decode_file_header(b: &[u8]) -> Result<u32, DecodeError> {
    let mut r = Reader::new(b);
    let magic: [u8; 8] = r.array("file magic")?;
    if magic != FILE_MAGIC {
        return Err(invalid("file magic", u64::from_le_bytes(magic)));
    }
    match r.u32("file version")? {
        1 => r.u32("file epn_id"),
        v => Err(invalid("file version", v as u64)),
    }
}

impl TfHeader {
    pub fn encode(&self) -> [u8; TF_HEADER_LEN] {
        let mut b = [0u8; TF_HEADER_LEN];
        b[0..4].copy_from_slice(&TF_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&TF_RECORD_VERSION.to_le_bytes());
        // 6..8: flags, zero
        b[8..16].copy_from_slice(&self.run_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.tf_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.stfs.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<TfHeader, DecodeError> {
        Self::decode_versioned(b).map(|(h, _)| h)
    }

    /// The header and its record version (1 or 2: how long its STF headers are).
    pub fn decode_versioned(b: &[u8]) -> Result<(TfHeader, u16), DecodeError> {
        let mut r = Reader::new(b);
        let magic = r.u32("tf magic")?;
        if magic != TF_MAGIC {
            return Err(invalid("tf magic", magic as u64));
        }
        let version = r.u16("tf version")?;
        if !(1..=TF_RECORD_VERSION).contains(&version) {
            return Err(invalid("tf version", version as u64));
        }
        let flags = r.u16("tf flags")?;
        if flags != 0 {
            return Err(DecodeError::Flags(flags));
        }
        let h = TfHeader {
            run_id: r.u64("tf run_id")?,
            tf_id: r.u64("tf tf_id")?,
            stfs: r.u32("tf stfs")?,
        };
        check_crc("tf header crc", r.u32("tf header crc")?, &b[..28])?;
        if h.stfs > MAX_RECORD_STFS {
            return Err(invalid("tf stfs", h.stfs as u64));
        }
        Ok((h, version))
    }
}

impl StfRecordHeader {
    /// The header of `payload` from FLP `flp_id` (its CRC computed here).
    pub fn of(flp_id: u32, payload: &[u8]) -> StfRecordHeader {
        StfRecordHeader {
            flp_id,
            crc: crc32c::crc32c(payload),
            len: payload.len() as u64,
        }
    }

    /// Version 2: the fields, a CRC32C of bytes 0..16, 4 reserved zero bytes.
    pub fn encode(&self) -> [u8; STF_RECORD_HEADER_LEN] {
        let mut b = [0u8; STF_RECORD_HEADER_LEN];
        b[0..4].copy_from_slice(&self.flp_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.crc.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        let crc = crc32c::crc32c(&b[..16]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// A version 2 header (24 bytes), its own CRC checked.
    pub fn decode(b: &[u8]) -> Result<StfRecordHeader, DecodeError> {
        let h = Self::decode_v1(b)?;
        let mut r = Reader::new(b.get(16..).unwrap_or_default());
        check_crc("stf header crc", r.u32("stf header crc")?, &b[..16])?;
        match r.u32("stf reserved")? {
            0 => Ok(h),
            v => Err(invalid("stf reserved", v as u64)),
        }
    }

    /// A version 1 header (16 bytes: no CRC of its own).
    pub fn decode_v1(b: &[u8]) -> Result<StfRecordHeader, DecodeError> {
        let mut r = Reader::new(b);
        Ok(StfRecordHeader {
            flp_id: r.u32("stf flp_id")?,
            crc: r.u32("stf crc")?,
            len: r.u64("stf len")?,
        })
    }
}

/// One record read back: its header and, per STF, the header, whether the payload
/// matched its CRC, and the payload when the reader keeps payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfRecord {
    pub header: TfHeader,
    pub stfs: Vec<(StfRecordHeader, bool)>,
    pub payloads: Vec<Vec<u8>>,
}

impl TfRecord {
    pub fn crc_ok(&self) -> bool {
        self.stfs.iter().all(|(_, ok)| *ok)
    }
    pub fn bytes(&self) -> u64 {
        self.stfs.iter().map(|(h, _)| h.len).sum()
    }
}

/// Why reading a stream of records stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("the stream ends inside TF record {index} ({what})")]
    Truncated { index: u64, what: &'static str },
    #[error("STF payload of {len} bytes is over the reader's limit {limit}")]
    TooLarge { len: u64, limit: u64 },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads records one by one from any byte stream; payloads are kept when at most
/// `keep_payload_bytes` (else only checked), so a forged length never allocates.
pub struct RecordReader<R> {
    src: R,
    keep_payload_bytes: u64,
    /// Keep only this FLP's payloads (the others are read and checked).
    only_flp: Option<u32>,
    index: u64,
}

impl<R: Read> RecordReader<R> {
    pub fn new(src: R, keep_payload_bytes: u64) -> Self {
        RecordReader {
            src,
            keep_payload_bytes,
            only_flp: None,
            index: 0,
        }
    }

    /// Keeps the payloads of FLP `flp` alone: a record's `payloads` are that FLP's.
    pub fn only_flp(mut self, flp: u32) -> Self {
        self.only_flp = Some(flp);
        self
    }

    /// The next record; `Ok(None)` at a clean end of the stream.
    pub fn next_record(&mut self) -> Result<Option<TfRecord>, RecordError> {
        let mut h = [0u8; TF_HEADER_LEN];
        match self.fill(&mut h)? {
            0 => return Ok(None),
            n if n < TF_HEADER_LEN => return Err(self.truncated("TF header")),
            _ => {}
        }
        let (header, version) = TfHeader::decode_versioned(&h)?;
        let mut rec = TfRecord {
            header,
            stfs: Vec::with_capacity(header.stfs.min(1024) as usize),
            payloads: Vec::new(),
        };
        let head_len = match version {
            1 => STF_RECORD_HEADER_LEN_V1,
            _ => STF_RECORD_HEADER_LEN,
        };
        for _ in 0..header.stfs {
            let mut sh = [0u8; STF_RECORD_HEADER_LEN];
            if self.fill(&mut sh[..head_len])? < head_len {
                return Err(self.truncated("STF header"));
            }
            let s = match version {
                1 => StfRecordHeader::decode_v1(&sh)?,
                _ => StfRecordHeader::decode(&sh)?,
            };
            // STFs come in FLP order, each FLP once: a repeated or reordered id is damage.
            if rec.stfs.last().is_some_and(|(p, _)| p.flp_id >= s.flp_id) {
                let field = "stf flp_id (not after the previous STF's)";
                return Err(invalid(field, s.flp_id as u64).into());
            }
            let wanted = self.only_flp.is_none_or(|f| f == s.flp_id);
            let ok = self.payload(s, wanted, &mut rec.payloads)?;
            rec.stfs.push((s, ok));
        }
        self.index += 1;
        Ok(Some(rec))
    }

    /// Reads one payload, checking its CRC; kept if `wanted` and small enough.
    fn payload(
        &mut self,
        s: StfRecordHeader,
        wanted: bool,
        keep: &mut Vec<Vec<u8>>,
    ) -> Result<bool, RecordError> {
        let keeping = wanted && s.len <= self.keep_payload_bytes;
        if wanted && !keeping && self.keep_payload_bytes > 0 {
            let limit = self.keep_payload_bytes;
            return Err(RecordError::TooLarge { len: s.len, limit });
        }
        let reserve = if keeping {
            s.len.min(RESERVE_AT_MOST)
        } else {
            0
        };
        let mut kept = Vec::with_capacity(reserve as usize);
        let (mut left, mut crc) = (s.len, 0u32);
        let mut chunk = vec![0u8; (1 << 20).min(s.len as usize).max(1)];
        while left > 0 {
            let n = (left as usize).min(chunk.len());
            if self.fill(&mut chunk[..n])? < n {
                return Err(self.truncated("STF payload"));
            }
            crc = crc32c::crc32c_append(crc, &chunk[..n]);
            if keeping {
                kept.extend_from_slice(&chunk[..n]);
            }
            left -= n as u64;
        }
        if keeping {
            keep.push(kept);
        }
        Ok(crc == s.crc)
    }

    fn truncated(&self, what: &'static str) -> RecordError {
        RecordError::Truncated {
            index: self.index,
            what,
        }
    }

    /// Reads until `buf` is full or the stream ends; the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.src.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }
}

/// The bytes of one whole record (tests, the tap); writers stream the parts instead.
pub fn encode_record(header: TfHeader, stfs: &[(u32, &[u8])]) -> Vec<u8> {
    assert_eq!(header.stfs as usize, stfs.len(), "header counts the STFs");
    let len: usize = stfs
        .iter()
        .map(|(_, p)| STF_RECORD_HEADER_LEN + p.len())
        .sum();
    let mut out = Vec::with_capacity(TF_HEADER_LEN + len);
    out.extend_from_slice(&header.encode());
    for (flp, p) in stfs {
        out.extend_from_slice(&StfRecordHeader::of(*flp, p).encode());
        out.extend_from_slice(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<u8> {
        let h = TfHeader {
            run_id: 7,
            tf_id: 42,
            stfs: 2,
        };
        encode_record(h, &[(0, b"abc".as_slice()), (1, b"defgh".as_slice())])
    }

    #[test]
    fn a_record_reads_back_with_its_payloads_and_crcs() {
        let bytes = sample();
        let mut r = RecordReader::new(bytes.as_slice(), 1 << 20);
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!(rec.header.tf_id, 42);
        assert_eq!(rec.payloads, vec![b"abc".to_vec(), b"defgh".to_vec()]);
        assert!(rec.crc_ok());
        assert_eq!(rec.bytes(), 8);
        assert!(r.next_record().unwrap().is_none());
    }

    /// One FLP's reader (replay) keeps that FLP's payload alone, and still checks the
    /// others' CRCs.
    #[test]
    fn a_reader_for_one_flp_keeps_only_its_payload() {
        let mut bytes = sample();
        let last = bytes.len() - 1;
        bytes[last] ^= 1; // FLP 1's payload
        let mut r = RecordReader::new(bytes.as_slice(), 1 << 20).only_flp(0);
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!(rec.payloads, vec![b"abc".to_vec()]);
        let crcs: Vec<bool> = rec.stfs.iter().map(|s| s.1).collect();
        assert_eq!(crcs, [true, false]);
    }

    #[test]
    fn a_flipped_payload_byte_fails_its_crc_and_a_cut_record_is_named() {
        let mut bytes = sample();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let rec = RecordReader::new(bytes.as_slice(), 0)
            .next_record()
            .unwrap()
            .unwrap();
        assert_eq!(
            rec.stfs.iter().map(|s| s.1).collect::<Vec<_>>(),
            [true, false]
        );
        let cut = &bytes[..bytes.len() - 2];
        let err = RecordReader::new(cut, 0).next_record().unwrap_err();
        assert!(err.to_string().contains("ends inside TF record 0"), "{err}");
    }

    /// A damaged STF header is an error at once: an FLP id turned into another's would
    /// hand one FLP's bytes to another's reader, and a length turned large would read the
    /// rest of a file as one payload and look like a file cut off by a crash.
    #[test]
    fn a_damaged_stf_header_is_an_error_naming_it() {
        for at in [TF_HEADER_LEN, TF_HEADER_LEN + 11] {
            let mut bytes = sample();
            bytes[at] ^= 1;
            let err = RecordReader::new(bytes.as_slice(), 1 << 20)
                .only_flp(1)
                .next_record()
                .unwrap_err();
            assert!(err.to_string().contains("stf header crc"), "{at}: {err}");
        }
    }

    /// STFs come in FLP order, each FLP once.
    #[test]
    fn stfs_out_of_flp_order_are_refused() {
        let h = TfHeader {
            run_id: 7,
            tf_id: 42,
            stfs: 2,
        };
        for order in [[1u32, 0], [1, 1]] {
            let bytes = encode_record(h, &[(order[0], b"abc".as_slice()), (order[1], b"de")]);
            let err = RecordReader::new(bytes.as_slice(), 1 << 20)
                .next_record()
                .unwrap_err();
            assert!(err.to_string().contains("stf flp_id"), "{order:?}: {err}");
        }
    }

    /// Files written before version 2 (16-byte STF headers) still read.
    #[test]
    fn version_1_records_still_read() {
        let mut tf = TfHeader {
            run_id: 7,
            tf_id: 42,
            stfs: 2,
        }
        .encode();
        tf[4..6].copy_from_slice(&1u16.to_le_bytes());
        let crc = crc32c::crc32c(&tf[..28]);
        tf[28..32].copy_from_slice(&crc.to_le_bytes());
        let mut bytes = tf.to_vec();
        for (flp, p) in [(0u32, b"abc".as_slice()), (1, b"defgh")] {
            let head = StfRecordHeader::of(flp, p).encode();
            bytes.extend_from_slice(&head[..STF_RECORD_HEADER_LEN_V1]);
            bytes.extend_from_slice(p);
        }
        let rec = RecordReader::new(bytes.as_slice(), 1 << 20)
            .next_record()
            .unwrap()
            .unwrap();
        assert_eq!(rec.payloads, vec![b"abc".to_vec(), b"defgh".to_vec()]);
        assert!(rec.crc_ok());
    }

    #[test]
    fn a_file_header_names_its_epn() {
        assert_eq!(decode_file_header(&encode_file_header(9)), Ok(9));
        assert!(decode_file_header(b"NOTAFILE12345678").is_err());
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut r = RecordReader::new(bytes.as_slice(), 1 << 16);
            for _ in 0..4 {
                if !matches!(r.next_record(), Ok(Some(_))) { break; }
            }
        }

        #[test]
        fn mutated_records_never_panic(pos in 0usize..96, bit in 0u8..8) {
            let mut bytes = sample();
            let p = pos % bytes.len();
            bytes[p] ^= 1 << bit;
            let _ = RecordReader::new(bytes.as_slice(), 1 << 16).next_record();
        }
    }
}
