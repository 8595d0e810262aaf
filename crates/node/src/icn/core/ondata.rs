//! On-data scheduling (`schedule = "on-data"`): the FLPs' STF announcements, a TF
//! scheduled once every FLP announced it or when it goes stale, late and repeated STFs.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use fanin_proto::{Message, Reason, StfInfo};
use fanin_sched::{FlpId, TfId};

use super::{ConnId, IcnCore, Level, Now, Phase};
use crate::config::{OnStale, MAX_STF_BYTES};

/// TF ids remembered as scheduled, to answer late announcements (older ones: below the
/// floor, also answered as over).
const SCHEDULED_KEPT: usize = 1 << 20;

/// One TF some FLPs announced: which, and the bytes so far.
struct Announced {
    flps: Vec<u64>,
    count: u32,
    bytes: u64,
}

impl Announced {
    fn new(flps: u32) -> Announced {
        let words = (flps as usize).div_ceil(64);
        Announced {
            flps: vec![0; words],
            count: 0,
            bytes: 0,
        }
    }

    /// Adds an FLP's STF; false if it had announced this TF already.
    fn add(&mut self, flp: FlpId, size: u64) -> bool {
        let (w, bit) = (flp as usize / 64, 1u64 << (flp % 64));
        if self.flps[w] & bit != 0 {
            return false;
        }
        self.flps[w] |= bit;
        self.count += 1;
        self.bytes = self.bytes.saturating_add(size);
        true
    }
}

/// The ICN's view of the data: TFs announced but not scheduled, in arrival order.
#[derive(Default)]
pub(crate) struct OnData {
    announced: BTreeMap<TfId, Announced>,
    /// When each TF was first announced, in run time without pauses (oldest first):
    /// its stale deadline.
    arrivals: VecDeque<(Now, TfId)>,
    /// TFs every FLP announced, to schedule (in order) when not paused.
    complete: VecDeque<TfId>,
    /// TFs scheduled (recent ones), and below `floor` all are taken as scheduled.
    scheduled: BTreeSet<TfId>,
    floor: TfId,
    /// The size of each TF in flight (placement of a re-assigned TF needs it).
    pub(crate) sizes: HashMap<TfId, u64>,
    /// FLPs whose source ended (or failed).
    sources_ended: BTreeSet<FlpId>,
}

impl OnData {
    fn was_scheduled(&self, tf: TfId) -> bool {
        tf < self.floor || self.scheduled.contains(&tf)
    }

    fn mark_scheduled(&mut self, tf: TfId) {
        self.scheduled.insert(tf);
        while self.scheduled.len() > SCHEDULED_KEPT {
            let oldest = self.scheduled.pop_first().expect("non-empty");
            self.floor = self.floor.max(oldest + 1);
        }
    }
}

impl IcnCore {
    fn stale_after(&self) -> Duration {
        Duration::from_millis(self.cfg.run.cfg.stf_stale_ms)
    }

    /// Time with the pauses before taken out (stale deadlines do not run while paused).
    fn active_now(&self) -> Now {
        self.now.saturating_sub(self.paused_total)
    }

    /// TFs announced and not scheduled (reported when the run ends).
    pub(super) fn unscheduled(&self) -> usize {
        self.ondata.announced.len()
    }

    /// An FLP joined the run again: its (new) source produces again.
    pub(super) fn source_restarted(&mut self, flp: FlpId) {
        self.ondata.sources_ended.remove(&flp);
    }

    /// An FLP announced STFs its source produced.
    pub(super) fn on_announce(&mut self, conn: ConnId, flp: FlpId, list: Vec<StfInfo>) {
        if !self.cfg.run.on_data() || self.run_t0.is_none() {
            self.metrics.error("unexpected_message");
            return;
        }
        for s in list {
            self.announce_one(conn, flp, s);
        }
    }

    fn announce_one(&mut self, conn: ConnId, flp: FlpId, s: StfInfo) {
        let tf = s.tf_id;
        if self.ledger.is_pending(tf) {
            // Scheduled and open: this FLP's STF still goes to the TF's EPN (a late
            // STF, or one a restarted FLP announces again).
            self.metrics.stf("announced_late", "", 1);
            if let Some(epn_id) = self.ledger.assigned(tf) {
                self.send(conn, Message::Assign { tf_id: tf, epn_id });
            }
            return;
        }
        if self.phase != Phase::Running && !self.ondata.was_scheduled(tf) {
            // The run ends: it stays with its source (a ring slot READY for the next
            // run; RunStop frees the rest); after RunStop the FLP reads nothing more.
            self.metrics.stf("not_scheduled", "", 1);
            return;
        }
        let over = self.ondata.was_scheduled(tf);
        if over || s.size > MAX_STF_BYTES {
            if !over {
                let line = format!("FLP {flp}: STF of TF {tf}: size {} is over 1 GiB", s.size);
                self.log(Level::Warn, line);
                self.metrics.error("bad_announce");
            }
            self.metrics.stf("late", "", 1);
            self.send(conn, Message::Release { tf_id: tf });
            return;
        }
        let flps = self.cfg.run.cfg.flps;
        let now = self.active_now();
        let d = &mut self.ondata;
        let entry = d.announced.entry(tf).or_insert_with(|| {
            d.arrivals.push_back((now, tf));
            Announced::new(flps)
        });
        if flp < flps && entry.add(flp, s.size) && entry.count == flps {
            d.complete.push_back(tf);
        }
        // Bounded: past max_inflight TFs announced and waiting, the oldest is scheduled
        // as it is (stale unless complete). A paused run holds them all (the FLPs'
        // buffers bound them).
        while self.ondata.announced.len() as u64 > self.cfg.run.cfg.max_inflight
            && self.paused_at.is_none()
        {
            let Some((_, oldest)) = self.ondata.arrivals.pop_front() else {
                break;
            };
            self.stale(oldest);
        }
    }

    /// An FLP's source ended (`ok`) or failed.
    pub(super) fn on_source_ended(&mut self, flp: FlpId, ok: bool, detail: String) {
        let t = self.now_us() as f64 / 1e6;
        // A failure's line names the FLP and its source already.
        let line = if ok {
            format!("t={t:.3}s FLP {flp}: source ended: {detail}")
        } else {
            format!("t={t:.3}s source failed: {detail}")
        };
        let level = if ok { Level::Info } else { Level::Error };
        self.log(level, line.clone());
        self.note(line);
        self.ondata.sources_ended.insert(flp);
    }

    /// Schedules what the data allow: complete TFs in order, then stale ones. Ends
    /// the run at its TF count, or when every source ended and nothing waits.
    pub(super) fn pump_on_data(&mut self) {
        if self.phase != Phase::Running || self.paused_at.is_some() {
            return;
        }
        while let Some(tf) = self.ondata.complete.pop_front() {
            if let Some(a) = self.ondata.announced.remove(&tf) {
                self.schedule(tf, a.bytes);
            }
            if self.phase != Phase::Running {
                return;
            }
        }
        let (stale, now) = (self.stale_after(), self.active_now());
        while let Some(&(at, tf)) = self.ondata.arrivals.front() {
            let gone = !self.ondata.announced.contains_key(&tf);
            if !gone && at + stale > now {
                break;
            }
            self.ondata.arrivals.pop_front();
            if !gone {
                self.stale(tf);
            }
            if self.phase != Phase::Running {
                return;
            }
        }
        let flps = self.cfg.run.cfg.flps as usize;
        if self.ondata.sources_ended.len() >= flps && self.ondata.announced.is_empty() {
            self.begin_drain();
        }
    }

    /// When the oldest announced TF goes stale (None: nothing waits, or paused).
    pub(super) fn stale_deadline(&self) -> Option<Now> {
        let (at, _) = self.ondata.arrivals.front()?;
        let at = *at + self.stale_after() + self.paused_total;
        self.paused_at.is_none().then_some(at)
    }

    /// A TF not every FLP announced in time: built from what exists, or dropped.
    fn stale(&mut self, tf: TfId) {
        let Some(a) = self.ondata.announced.remove(&tf) else {
            return; // scheduled already
        };
        if a.count == self.cfg.run.cfg.flps {
            return self.schedule(tf, a.bytes); // complete after all (a bound's eviction)
        }
        self.metrics.tf("stale", "stf_stale");
        match self.cfg.run.cfg.on_stale {
            OnStale::Incomplete => self.schedule(tf, a.bytes),
            OnStale::Drop => {
                self.count_scheduled(tf);
                let row = self
                    .ledger
                    .issue_dropped(tf, Reason::StfStale, self.now_us());
                self.ended(&row);
                self.end_at_count();
            }
        }
    }

    /// Places a TF whose size is known now.
    fn schedule(&mut self, tf: TfId, bytes: u64) {
        self.count_scheduled(tf);
        self.ondata.sizes.insert(tf, bytes);
        self.place_issued(tf, bytes);
        self.end_at_count();
    }

    fn count_scheduled(&mut self, tf: TfId) {
        self.ondata.mark_scheduled(tf);
        self.next_tf += 1;
    }

    /// The run's TF count reached: drain.
    fn end_at_count(&mut self) {
        let total = self.cfg.run.total_tfs;
        if self.phase == Phase::Running && total.is_some_and(|t| self.next_tf >= t) {
            self.begin_drain();
        }
    }
}
