//! The `replay:DIR` source: the STFs of this FLP in TF files an EPN's `file:` sink wrote
//! (every `*.fanin` in DIR, name order), at a given rate or as fast as room allows.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use fanin_proto::tf_record::{decode_file_header, RecordError, RecordReader, FILE_HEADER_LEN};
use fanin_proto::StfInfo;
use tokio::time::Instant;

use super::{Event, Payload, Produced, SourceError};
use crate::config::MAX_STF_BYTES;

/// One file: its reader and its next STF of this FLP.
struct Head {
    path: String,
    reader: RecordReader<BufReader<File>>,
    next: Option<(u64, Bytes)>,
    done: bool,
}

pub struct Replay {
    me: u32,
    heads: Vec<Head>,
    /// The next STF, read but not produced (it did not fit, or is not due).
    pending: Option<(u64, Bytes)>,
    rate_hz: Option<f64>,
    t0: Instant,
    made: u64,
    skipped: u64,
    /// TFs produced so far: a TF in two files (a killed EPN's file may hold one its
    /// successor built again) is produced once.
    seen: IdRanges,
    duplicates: u64,
    /// Files that end in a cut-off record, or before their header (an EPN killed as it
    /// wrote): read up to there.
    cut_short: u64,
    /// The run the recording holds, and the file that first showed it: a directory
    /// holding two runs is refused, as merging them by TF id would splice the runs.
    run: Option<(u64, String)>,
    what: String,
}

impl Replay {
    pub fn open(dir: &Path, me: u32, rate_hz: Option<f64>, what: String) -> anyhow::Result<Replay> {
        let read = std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("{what}: {}: {e}", dir.display()))?;
        let mut files: Vec<PathBuf> = read
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "fanin"))
            .collect();
        files.sort();
        if files.is_empty() {
            anyhow::bail!("{what}: {}: no *.fanin files", dir.display());
        }
        // A file shorter than its header: its EPN was killed before writing a record.
        let (whole, empty): (Vec<PathBuf>, Vec<PathBuf>) = files.into_iter().partition(|p| {
            std::fs::metadata(p).map_or(true, |m| m.len() >= FILE_HEADER_LEN as u64)
        });
        for p in &empty {
            tracing::warn!(
                "{what}: {}: no file header (its EPN stopped first); skipped",
                p.display()
            );
        }
        let heads = whole
            .iter()
            .map(|p| open_file(p, me).map_err(|e| anyhow::anyhow!("{what}: {}: {e}", p.display())))
            .collect::<anyhow::Result<_>>()?;
        Ok(Replay {
            me,
            heads,
            pending: None,
            rate_hz: rate_hz.filter(|r| *r > 0.0),
            t0: Instant::now(),
            made: 0,
            skipped: 0,
            seen: IdRanges::default(),
            duplicates: 0,
            cut_short: empty.len() as u64,
            run: None,
            what,
        })
    }

    /// The pacing clock started `elapsed` ago (a rejoining FLP catches up: what is
    /// due already goes at once, and the ICN frees what is over).
    pub fn start(&mut self, elapsed: Duration) {
        self.t0 = Instant::now()
            .checked_sub(elapsed)
            .unwrap_or_else(Instant::now);
    }

    pub async fn next(&mut self, room: u64) -> Result<Event, SourceError> {
        if self.pending.is_none() {
            match self.read_next()? {
                Some(p) => self.pending = Some(p),
                None => {
                    let what = format!(
                        "replayed {} STFs ({} TFs without one of FLP {}, {} in two files, {} files cut short)",
                        self.made, self.skipped, self.me, self.duplicates, self.cut_short
                    );
                    return Ok(Event::Ended(what));
                }
            }
        }
        if let Some(r) = self.rate_hz {
            // Paced by position in the recording: TFs without this FLP's STF take theirs.
            let at = Duration::from_secs_f64((self.made + self.skipped) as f64 / r);
            tokio::time::sleep_until(self.t0 + at).await;
        }
        let size = self.pending.as_ref().map_or(0, |(_, b)| b.len() as u64);
        if size > room || room == 0 {
            return Ok(Event::Held(size));
        }
        let (tf_id, bytes) = self.pending.take().expect("pending");
        self.made += 1;
        Ok(Event::Stf(Produced {
            info: StfInfo { tf_id, size },
            payload: Payload::Owned(bytes),
        }))
    }

    /// The next STF of this FLP, the lowest TF id first over every file's next one
    /// (several EPNs' files interleave; a file in build order need not be in id
    /// order). Blocking reads of local files; one STF per file is held.
    fn read_next(&mut self) -> Result<Option<(u64, Bytes)>, SourceError> {
        loop {
            for i in 0..self.heads.len() {
                self.fill(i)?;
            }
            let first = self
                .heads
                .iter_mut()
                .filter(|h| h.next.is_some())
                .min_by_key(|h| h.next.as_ref().map(|(tf, _)| *tf));
            let Some((tf, bytes)) = first.and_then(|h| h.next.take()) else {
                return Ok(None);
            };
            if self.seen.insert(tf) {
                return Ok(Some((tf, bytes)));
            }
            self.duplicates += 1;
        }
    }

    /// Reads file `i` up to its next STF of this FLP.
    fn fill(&mut self, i: usize) -> Result<(), SourceError> {
        let me = self.me;
        let h = &mut self.heads[i];
        while h.next.is_none() && !h.done {
            let rec = match h.reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => {
                    h.done = true;
                    break;
                }
                Err(e @ RecordError::Truncated { .. }) => {
                    // Its EPN stopped mid-record: the records before it are whole.
                    tracing::warn!("{}: {}: {e}; the file ends there", self.what, h.path);
                    self.cut_short += 1;
                    h.done = true;
                    break;
                }
                Err(e) => return Err(SourceError(format!("{}: {}: {e}", self.what, h.path))),
            };
            let tf = rec.header.tf_id;
            match &self.run {
                None => self.run = Some((rec.header.run_id, h.path.clone())),
                Some((run, first)) if *run != rec.header.run_id => {
                    let msg = format!(
                        "{}: {}: TF {tf}: run_id {} differs from run {run} in {first}; replay one run per directory",
                        self.what, h.path, rec.header.run_id
                    );
                    return Err(SourceError(msg));
                }
                Some(_) => {}
            }
            let Some(k) = rec.stfs.iter().position(|(s, _)| s.flp_id == me) else {
                self.skipped += 1;
                continue;
            };
            if !rec.stfs[k].1 {
                let msg = format!(
                    "{}: {}: TF {tf}: CRC of FLP {me}'s STF does not match",
                    self.what, h.path
                );
                return Err(SourceError(msg));
            }
            // Only this FLP's payloads are kept: the first is the one at `k`.
            let Some(payload) = rec.payloads.into_iter().next() else {
                let msg = format!(
                    "{}: {}: TF {tf}: FLP {me}'s STF not read",
                    self.what, h.path
                );
                return Err(SourceError(msg));
            };
            h.next = Some((tf, Bytes::from(payload)));
        }
        Ok(())
    }
}

fn open_file(path: &Path, me: u32) -> Result<Head, String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let mut head = [0u8; FILE_HEADER_LEN];
    std::io::Read::read_exact(&mut f, &mut head).map_err(|e| format!("file header: {e}"))?;
    decode_file_header(&head).map_err(|e| e.to_string())?;
    Ok(Head {
        path: path.display().to_string(),
        reader: RecordReader::new(BufReader::new(f), MAX_STF_BYTES).only_flp(me),
        next: None,
        done: false,
    })
}

/// A set of TF ids kept as ranges: a recording's ids are mostly contiguous, so it takes
/// memory in proportion to its gaps, not to its length.
#[derive(Default)]
struct IdRanges {
    /// First id of each range -> its last id (inclusive: `u64::MAX` fits).
    ranges: BTreeMap<u64, u64>,
}

impl IdRanges {
    /// Adds `id`; false when it was in already.
    fn insert(&mut self, id: u64) -> bool {
        let before = self.ranges.range(..=id).next_back().map(|(s, l)| (*s, *l));
        if before.is_some_and(|(_, last)| id <= last) {
            return false;
        }
        let start = match before {
            Some((s, last)) if last + 1 == id => s, // extends the range before it
            _ => id,
        };
        let after = id.checked_add(1).and_then(|n| self.ranges.remove(&n));
        self.ranges.insert(start, after.unwrap_or(id)); // joins the range after it
        true
    }
}

#[cfg(test)]
mod tests {
    /// Ids in any order, each once: duplicates are seen, and contiguous ids take one
    /// range however many there are.
    #[test]
    fn id_ranges_see_every_duplicate_and_merge_what_is_contiguous() {
        let mut s = super::IdRanges::default();
        for id in [5, 3, 4, 9, 0, 1, 2, 7, 8, 6] {
            assert!(s.insert(id), "{id} is new");
        }
        for id in 0..10 {
            assert!(!s.insert(id), "{id} again");
        }
        assert_eq!(s.ranges.len(), 1, "{:?}", s.ranges);
        assert!(s.insert(20) && s.insert(11) && !s.insert(20));
        assert_eq!(s.ranges.len(), 3, "{:?}", s.ranges);
        assert!(s.insert(10));
        assert_eq!(s.ranges.len(), 2, "{:?}", s.ranges);
        assert!((0..100_000).filter(|i| s.insert(i + 21)).count() == 100_000);
        assert_eq!(s.ranges.len(), 2, "0..=11 and 20..=100020: {:?}", s.ranges);
        assert!(s.insert(u64::MAX) && !s.insert(u64::MAX));
        assert!(s.insert(u64::MAX - 1) && !s.insert(u64::MAX - 1));
        assert_eq!(s.ranges.len(), 3, "{:?}", s.ranges);
    }

    use super::*;
    use fanin_proto::tf_record::{encode_file_header, encode_record, TfHeader};

    /// A file of EPN 0 holding TFs 1..=3 of run 1, each with FLP 0's and FLP 1's STF.
    fn three_tfs(stfs: impl Fn(u64) -> (Vec<u8>, Vec<u8>)) -> Vec<u8> {
        let mut bytes = encode_file_header(0).to_vec();
        for tf_id in [1, 2, 3] {
            let header = TfHeader {
                run_id: 1,
                tf_id,
                stfs: 2,
            };
            let (a, b) = stfs(tf_id);
            bytes.extend(encode_record(header, &[(0, &a), (1, &b)]));
        }
        bytes
    }

    /// FLP 0's replay of `dir`, to its end: the TF ids produced, and its end line or its
    /// error.
    async fn drain(dir: &Path) -> (Vec<u64>, Result<String, String>) {
        let mut r = Replay::open(dir, 0, None, "FLP 0: source replay".into()).unwrap();
        let mut got = Vec::new();
        loop {
            match r.next(1 << 20).await {
                Ok(Event::Stf(p)) => got.push(p.info.tf_id),
                Ok(Event::Ended(what)) => return (got, Ok(what)),
                Ok(Event::Held(_)) => panic!("room for every STF"),
                Err(e) => return (got, Err(e.0)),
            }
        }
    }

    /// Files from an EPN killed as it wrote: one ends in a cut-off record, one before its
    /// header. The whole records are replayed, and the end says how many files were cut.
    #[tokio::test]
    async fn a_file_cut_off_mid_record_is_read_up_to_there() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = three_tfs(|tf| (vec![tf as u8; 500], vec![9u8; 500]));
        bytes.truncate(bytes.len() - 300); // TF 3 cut off
        std::fs::write(dir.path().join("epn0-000000.fanin"), bytes).unwrap();
        std::fs::write(dir.path().join("epn1-000000.fanin"), b"FAN").unwrap();
        let (got, end) = drain(dir.path()).await;
        let end = end.unwrap();
        assert_eq!(got, [1, 2]);
        assert!(end.contains("2 files cut short"), "{end}");
    }

    /// An EPN that served two runs wrote both into one directory: merging them by TF id
    /// would splice the runs, so the replay stops with an error naming both.
    #[tokio::test]
    async fn a_directory_holding_two_runs_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (run_id, seq) in [(1u64, 0), (2, 1)] {
            let mut bytes = encode_file_header(0).to_vec();
            for tf_id in 0..=run_id {
                let header = TfHeader {
                    run_id,
                    tf_id,
                    stfs: 1,
                };
                bytes.extend(encode_record(header, &[(0, &[run_id as u8; 10])]));
            }
            std::fs::write(dir.path().join(format!("epn0-{seq:06}.fanin")), bytes).unwrap();
        }
        let (got, end) = drain(dir.path()).await;
        assert!(got.iter().all(|tf| *tf < 2), "{got:?}");
        let err = end.unwrap_err();
        assert!(err.contains("run_id 2 differs from run 1"), "{err}");
        assert!(
            err.contains("epn0-000001.fanin") && err.contains("epn0-000000.fanin"),
            "{err}"
        );
    }

    /// A damaged STF length in a file (another FLP's, in TF 2) is an error naming the
    /// file and the field, not a file "cut short" whose later TFs vanish unseen.
    #[tokio::test]
    async fn a_damaged_stf_length_is_an_error_not_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = three_tfs(|_| (vec![1u8; 500], vec![2u8; 500]));
        // TF 2's second STF header: its length's fourth byte (+16 MiB).
        let record = 32 + 2 * (24 + 500);
        let at = 16 + record + 32 + 24 + 500 + 8 + 3;
        bytes[at] ^= 1;
        std::fs::write(dir.path().join("epn0-000000.fanin"), bytes).unwrap();
        let err = drain(dir.path()).await.1.unwrap_err();
        assert!(
            err.contains("epn0-000000.fanin") && err.contains("stf header crc"),
            "{err}"
        );
    }
}
