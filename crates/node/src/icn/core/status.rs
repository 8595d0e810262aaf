//! The ICN's live status as JSON (`GET /status` on its metrics port, the live page):
//! phase, counts, ends by reason, each EPN's last load, the latest membership changes.
//!
//! Built from the core's state on demand; reading it changes nothing.

use serde_json::{json, Value};

use super::{IcnCore, Phase};

/// Membership changes shown (the newest).
pub(super) const RECENT: usize = 20;

impl IcnCore {
    pub fn status(&self) -> Value {
        let phase = match self.phase {
            Phase::Registering => "registering",
            Phase::Preparing => "preparing",
            Phase::Ready => "ready",
            Phase::Running => "running",
            Phase::Draining => "draining",
            Phase::Stopping => "stopping",
            Phase::Done => "done",
        };
        let ended: serde_json::Map<String, Value> = self
            .metrics
            .run_snapshot()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .filter_map(|(k, n)| Some((k.strip_prefix("tfs.")?.to_string(), json!(n))))
            .collect();
        let epns: Vec<Value> = self
            .epns
            .keys()
            .map(|e| {
                let load = self.last_load.get(e);
                json!({
                    "epn": e,
                    "free_bytes": load.map(|l| l.free_bytes),
                    "building": load.map(|l| l.building),
                })
            })
            .collect();
        let membership: Vec<Value> = self
            .recent_members
            .iter()
            .map(|(t_s, what)| json!({"t_s": t_s, "what": what}))
            .collect();
        json!({
            "run_id": self.cfg.run_id,
            "state": self.run_state().name(),
            "phase": phase,
            "paused_s": self.paused().as_secs_f64(),
            "t_s": self.now_us() as f64 / 1e6,
            "flps": self.flps.len(),
            "issued": self.ledger.issued,
            "completed": self.tally.completed,
            "incomplete": self.tally.incomplete,
            "dropped": self.tally.dropped,
            "in_flight": self.ledger.pending(),
            "ended": ended,
            "epns": epns,
            "membership": membership,
        })
    }
}
