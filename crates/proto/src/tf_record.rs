//! Built-TF records: how an EPN hands a TF to its sinks (an `exec` command's stdin, the
//! file writer, the tap), little-endian, CRC-checked; the reader never panics.
//!
//! A stream is an optional 16-byte file header, then records: a 32-byte TF header and,
//! per STF, a 16-byte STF header and its payload (docs/sinks.md has the table).

use std::io::Read;

use crate::error::DecodeError;
use crate::wire::Reader;

/// First 8 bytes of a TF file (`file:` sink, burst saver).
pub const FILE_MAGIC: [u8; 8] = *b"FANINTF1";
pub const FILE_HEADER_LEN: usize = 16;
/// First 4 bytes of every TF record: "FTF1".
pub const TF_MAGIC: u32 = u32::from_le_bytes(*b"FTF1");
pub const TF_RECORD_VERSION: u16 = 1;
pub const TF_HEADER_LEN: usize = 32;
pub const STF_RECORD_HEADER_LEN: usize = 16;
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

/// The EPN id a file header names.
pub fn decode_file_header(b: &[u8]) -> Result<u32, DecodeError> {
    let mut r = Reader::new(b);
    let magic: [u8; 8] = r.array("file magic")?;
    if magic != FILE_MAGIC {
        let value = u64::from_le_bytes(magic);
        return Err(DecodeError::InvalidValue {
            field: "file magic",
            value,
        });
    }
    match r.u32("file version")? {
        1 => r.u32("file epn_id"),
        v => Err(DecodeError::InvalidValue {
            field: "file version",
            value: v as u64,
        }),
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
        let mut r = Reader::new(b);
        let magic = r.u32("tf magic")?;
        if magic != TF_MAGIC {
            let value = magic as u64;
            return Err(DecodeError::InvalidValue {
                field: "tf magic",
                value,
            });
        }
        let version = r.u16("tf version")?;
        if version != TF_RECORD_VERSION {
            let value = version as u64;
            return Err(DecodeError::InvalidValue {
                field: "tf version",
                value,
            });
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
        let crc = r.u32("tf header crc")?;
        if crc != crc32c::crc32c(&b[..28]) {
            let value = crc as u64;
            return Err(DecodeError::InvalidValue {
                field: "tf header crc",
                value,
            });
        }
        if h.stfs > MAX_RECORD_STFS {
            let value = h.stfs as u64;
            return Err(DecodeError::InvalidValue {
                field: "tf stfs",
                value,
            });
        }
        Ok(h)
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

    pub fn encode(&self) -> [u8; STF_RECORD_HEADER_LEN] {
        let mut b = [0u8; STF_RECORD_HEADER_LEN];
        b[0..4].copy_from_slice(&self.flp_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.crc.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<StfRecordHeader, DecodeError> {
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
        let header = TfHeader::decode(&h)?;
        let mut rec = TfRecord {
            header,
            stfs: Vec::with_capacity(header.stfs.min(1024) as usize),
            payloads: Vec::new(),
        };
        for _ in 0..header.stfs {
            let mut sh = [0u8; STF_RECORD_HEADER_LEN];
            if self.fill(&mut sh)? < STF_RECORD_HEADER_LEN {
                return Err(self.truncated("STF header"));
            }
            let s = StfRecordHeader::decode(&sh)?;
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
        fn mutated_records_never_panic(pos in 0usize..48, bit in 0u8..8) {
            let mut bytes = sample();
            let p = pos % bytes.len();
            bytes[p] ^= 1 << bit;
            let _ = RecordReader::new(bytes.as_slice(), 1 << 16).next_record();
        }
    }
}
