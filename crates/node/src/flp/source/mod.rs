//! Where an FLP's STFs come from (`--source`): synthetic payloads, a shared-memory ring,
//! a command's stdout, or recorded TF files. Each yields STFs only when they fit.
//!
//! A source never takes an STF the send buffer has no room for: `next(room)` answers
//! `Held` instead, and the shell asks again once room was freed. What it yields is
//! produced: the FLP core announces it and holds it until the ICN releases its TF.

mod exec;
mod replay;
mod shm;
mod synthetic;

use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use fanin_proto::{Prepare, Schedule, StfInfo};
use fanin_sched::{StfSize, TfId};

/// A source that stops inside an STF for this long has stalled: an error.
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

/// `--source SPEC`.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum SourceSpec {
    /// Pseudo-random payloads of the run's STF size model.
    #[default]
    Synthetic,
    /// `shm:NAME`: the ring /dev/shm/NAME a read-out fills.
    Shm { name: String },
    /// `exec:CMD`: framed STFs on the stdout of `sh -c CMD`.
    Exec { cmd: String },
    /// `replay:DIR[,rate=HZ]`: the STFs of this FLP in DIR's `*.fanin` files.
    Replay {
        dir: std::path::PathBuf,
        rate_hz: Option<f64>,
    },
}

impl FromStr for SourceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "synthetic" {
            return Ok(SourceSpec::Synthetic);
        }
        let err = |e: &str| format!("source `{s}`: {e}");
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| err("expected synthetic, shm:NAME, exec:CMD or replay:DIR"))?;
        match kind {
            "shm" if valid_ring_name(rest) => Ok(SourceSpec::Shm { name: rest.into() }),
            "shm" => Err(err("NAME must be 1-200 letters, digits, '-', '_' or '.'")),
            "exec" if !rest.trim().is_empty() => Ok(SourceSpec::Exec { cmd: rest.into() }),
            "exec" => Err(err("exec needs a command")),
            "replay" => replay_spec(rest).map_err(|e| err(&e)),
            _ => Err(err("unknown kind (synthetic, shm, exec, replay)")),
        }
    }
}

fn valid_ring_name(n: &str) -> bool {
    (1..=200).contains(&n.len())
        && !n.starts_with('.')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn replay_spec(rest: &str) -> Result<SourceSpec, String> {
    let mut parts = rest.split(',');
    let dir = parts.next().unwrap_or_default();
    if dir.is_empty() {
        return Err("replay needs a directory".into());
    }
    let mut rate_hz = None;
    for p in parts {
        match p.split_once('=') {
            Some(("rate", v)) => match v.parse::<f64>() {
                Ok(r) if crate::config::rate_ok(r) => rate_hz = Some(r),
                _ => return Err(format!("rate `{v}` is not {}", crate::config::RATES)),
            },
            _ => return Err(format!("unknown option `{p}` (rate=HZ)")),
        }
    }
    Ok(SourceSpec::Replay {
        dir: dir.into(),
        rate_hz,
    })
}

impl std::fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceSpec::Synthetic => f.write_str("synthetic"),
            SourceSpec::Shm { name } => write!(f, "shm:{name}"),
            SourceSpec::Exec { cmd } => write!(f, "exec:{cmd}"),
            SourceSpec::Replay { dir, rate_hz } => {
                write!(f, "replay:{}", dir.display())?;
                rate_hz.map_or(Ok(()), |r| write!(f, ",rate={r}"))
            }
        }
    }
}

/// An STF's bytes, wherever they live.
#[derive(Clone)]
pub enum Payload {
    /// Made from the run's pattern when written (timer runs, the synthetic source).
    Synthetic,
    /// Read into memory (exec, replay).
    Owned(Bytes),
    /// In place in a shared-memory ring: sent from there, no copy.
    Shared(fanin_shm::Payload),
}

impl Payload {
    /// The bytes, for payloads that are not made on the fly.
    pub fn slice(&self) -> Option<&[u8]> {
        match self {
            Payload::Synthetic => None,
            Payload::Owned(b) => Some(b),
            Payload::Shared(p) => Some(p.as_slice()),
        }
    }
}

/// One STF a source produced.
pub struct Produced {
    pub info: StfInfo,
    pub payload: Payload,
}

/// What a source has to say.
pub enum Event {
    Stf(Produced),
    /// The next STF (this size) does not fit in the room given.
    Held(u64),
    /// No STF follows (the reason, for the ICN's log).
    Ended(String),
}

/// A source's failure: one line naming the field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// An open source of one FLP for one run.
pub enum Source {
    Synthetic(synthetic::Synthetic),
    Shm(shm::Shm),
    Exec(exec::Exec),
    Replay(replay::Replay),
}

impl Source {
    /// Opens `spec` for FLP `me` in the run `prep` describes (errors name the FLP).
    pub fn open(
        spec: &SourceSpec,
        me: u32,
        prep: &Prepare,
        size: StfSize,
    ) -> anyhow::Result<Source> {
        let on_data = prep.schedule == Schedule::OnData;
        if !on_data && *spec != SourceSpec::Synthetic {
            anyhow::bail!(
                "FLP {me}: source {spec} needs schedule = \"on-data\" (this run's is timer)"
            );
        }
        let what = format!("FLP {me}: source {spec}");
        let rate = (prep.rate_mhz > 0).then(|| prep.rate_mhz as f64 / 1000.0);
        Ok(match spec {
            SourceSpec::Synthetic => {
                Source::Synthetic(synthetic::Synthetic::new(me, prep, size, rate))
            }
            SourceSpec::Shm { name } => Source::Shm(shm::Shm::attach(name, what, prep.run_id)?),
            SourceSpec::Exec { cmd } => Source::Exec(exec::Exec::spawn(cmd, me, what)?),
            SourceSpec::Replay { dir, rate_hz } => {
                Source::Replay(replay::Replay::open(dir, me, rate_hz.or(rate), what)?)
            }
        })
    }

    /// The next STF that fits in `room` bytes (cancel-safe: nothing is lost when the
    /// future is dropped).
    pub async fn next(&mut self, room: u64) -> Result<Event, SourceError> {
        match self {
            Source::Synthetic(s) => Ok(s.next(room).await),
            Source::Shm(s) => s.next(room).await,
            Source::Exec(s) => s.next(room).await,
            Source::Replay(s) => s.next(room).await,
        }
    }

    /// The run started `elapsed` ago (0, or this FLP joins mid-run): the clocks that
    /// pace a source start there.
    pub fn start(&mut self, elapsed: Duration) {
        match self {
            Source::Synthetic(s) => s.start(elapsed),
            Source::Replay(s) => s.start(elapsed),
            Source::Shm(_) | Source::Exec(_) => {}
        }
    }

    /// The ICN released `tf` and no send uses it: its STF goes back to the source.
    pub fn free(&mut self, tf: TfId) {
        if let Source::Shm(s) = self {
            s.free(tf);
        }
    }

    /// The run scheduled `tf`: a ring notes it in the STF's slot (read by a successor if
    /// this FLP dies before the Release).
    pub fn scheduled(&mut self, tf: TfId) {
        if let Source::Shm(s) = self {
            s.scheduled(tf);
        }
    }

    /// STFs found at open that an earlier run had scheduled, freed then (a ring's).
    pub fn freed_at_open(&self) -> u64 {
        match self {
            Source::Shm(s) => s.freed_at_attach,
            _ => 0,
        }
    }
}
