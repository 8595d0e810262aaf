//! Built-TF files read back (`fanin inspect`) and the burst saver's trigger
//! (`fanin trigger`): the user's side of the EPN sinks of docs/sinks.md.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use fanin_proto::tf_record::{decode_file_header, RecordError, RecordReader, FILE_HEADER_LEN};

/// What one file holds.
#[derive(Debug, Default)]
pub struct Inspection {
    pub epn: u32,
    /// (TF id, STFs, bytes, CRCs good) per record, in file order.
    pub tfs: Vec<(u64, u32, u64, bool)>,
    pub crc_errors: u64,
    /// The file ends inside a record (a crash while writing): the records before are whole.
    pub truncated: Option<String>,
}

impl Inspection {
    pub fn bytes(&self) -> u64 {
        self.tfs.iter().map(|t| t.2).sum()
    }

    /// One line per TF, then the totals.
    pub fn render(&self, path: &Path, list: bool) -> String {
        let mut s = String::new();
        if list {
            for (tf, stfs, bytes, ok) in &self.tfs {
                let crc = if *ok { "ok" } else { "BAD" };
                s.push_str(&format!("tf {tf} stfs {stfs} bytes {bytes} crc {crc}\n"));
            }
        }
        s.push_str(&format!(
            "{}: EPN {}, {} TFs, {} bytes, {} CRC errors\n",
            path.display(),
            self.epn,
            self.tfs.len(),
            self.bytes(),
            self.crc_errors
        ));
        if let Some(t) = &self.truncated {
            s.push_str(&format!(
                "{}: {t}; every TF before it is whole\n",
                path.display()
            ));
        }
        s
    }
}

/// Reads a TF file written by the `file:` or `burst` sink, checking every CRC.
pub fn inspect(path: &Path) -> anyhow::Result<Inspection> {
    let f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut r = std::io::BufReader::with_capacity(1 << 20, f);
    let mut head = [0u8; FILE_HEADER_LEN];
    r.read_exact(&mut head)
        .with_context(|| format!("{}: not a fanin TF file (no file header)", path.display()))?;
    let epn = decode_file_header(&head)
        .map_err(|e| anyhow::anyhow!("{}: not a fanin TF file ({e})", path.display()))?;
    let mut records = RecordReader::new(r, 0);
    let mut out = Inspection {
        epn,
        ..Default::default()
    };
    loop {
        match records.next_record() {
            Ok(Some(rec)) => {
                let ok = rec.crc_ok();
                out.crc_errors += rec.stfs.iter().filter(|s| !s.1).count() as u64;
                out.tfs
                    .push((rec.header.tf_id, rec.header.stfs, rec.bytes(), ok));
            }
            Ok(None) => return Ok(out),
            Err(e @ RecordError::Truncated { .. }) => {
                out.truncated = Some(e.to_string());
                return Ok(out);
            }
            Err(e) => anyhow::bail!("{}: after {} TFs: {e}", path.display(), out.tfs.len()),
        }
    }
}

/// Asks the EPN whose metrics port is `epn` to save its burst ring: its reply.
pub fn trigger(epn: SocketAddr) -> anyhow::Result<String> {
    let a = crate::http::request("EPN", epn, ("POST", "/trigger"), None, &[])?;
    let body = a.body.trim();
    anyhow::ensure!(a.code == 200, "EPN at {epn}: HTTP {}: {body}", a.code);
    Ok(body.to_string())
}
