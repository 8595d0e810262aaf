//! The EPN's TF builder: collects the STFs of each TF until it holds one from every FLP,
//! closes TFs on time-out, and detects split TFs, duplicates and late STFs. Pure: no I/O.

use std::collections::{HashMap, VecDeque};

use fanin_proto::{Reason, TfReport, TfStatus};
use fanin_sched::{EpnId, FlpId, TfId};

/// What the builder asks its caller to do.
#[derive(Debug, PartialEq)]
pub enum Out<P> {
    /// Send this report to the ICN.
    Report(TfReport),
    /// The builder no longer holds this payload: return its bytes to the build buffer.
    Free(P),
    /// A complete TF for the sinks (hand-off mode): its report waits for them.
    Built(Built<P>),
}

/// A complete TF handed on: its STFs in FLP order, with their payloads.
#[derive(Debug, PartialEq)]
pub struct Built<P> {
    pub tf: TfId,
    pub stfs: Vec<(FlpId, P)>,
    pub bytes: u64,
}

/// Running totals, published as metrics and sent to the ICN at run end.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BuildCounters {
    pub stfs: u64,
    pub bytes: u64,
    pub complete: u64,
    pub incomplete: u64,
    pub dropped: u64,
    /// TFs closed because an FLP addressed its STF to another EPN.
    pub split_flagged: u64,
    /// TFs closed holding STFs but never assigned here (yet).
    pub orphans: u64,
    /// Orphans whose assignment arrived after all: not split after all.
    pub orphans_claimed: u64,
    /// STFs addressed by their FLP to another EPN.
    pub split_stfs: u64,
    pub duplicate_stfs: u64,
    /// STFs of a TF already closed here.
    pub late_stfs: u64,
    pub crc_errors: u64,
    pub unknown_flp_stfs: u64,
    /// STFs discarded because their TF was already dropped.
    pub discarded_stfs: u64,
    /// TFs the ICN abandoned (an FLP could not send its STF).
    pub abandoned: u64,
}

impl BuildCounters {
    /// TFs whose STFs went to more than one EPN, or that were never assigned here.
    pub fn split_tfs(&self) -> u64 {
        (self.split_flagged + self.orphans).saturating_sub(self.orphans_claimed)
    }

    pub fn named(&self) -> [(&'static str, u64); 14] {
        [
            ("stfs_built", self.stfs),
            ("bytes_built", self.bytes),
            ("tfs_complete", self.complete),
            ("tfs_incomplete", self.incomplete),
            ("tfs_dropped", self.dropped),
            ("split_tfs", self.split_tfs()),
            ("orphan_tfs_claimed", self.orphans_claimed),
            ("split_stfs", self.split_stfs),
            ("duplicate_stfs", self.duplicate_stfs),
            ("late_stfs", self.late_stfs),
            ("crc_errors", self.crc_errors),
            ("unknown_flp_stfs", self.unknown_flp_stfs),
            ("discarded_stfs", self.discarded_stfs),
            ("tfs_abandoned", self.abandoned),
        ]
    }
}

/// Where an STF came from and where its FLP meant it to go.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub tf: TfId,
    pub flp: FlpId,
    /// The EPN the FLP addressed the STF to.
    pub target: EpnId,
    pub bytes: u64,
    pub now_us: u64,
}

struct Slot<P> {
    /// The ICN told us this TF is ours.
    assigned: bool,
    /// Arrival of the first STF or, with none yet, `FLP_GONE_GRACE_US` after the data
    /// connection of an FLP whose STF it waits for ended (the build time-out runs from
    /// here).
    first_us: Option<u64>,
    /// Which FLPs' STFs are held (one bit per FLP).
    have: Vec<u64>,
    /// The held payloads and their FLPs: memory grows with STFs held, not with the
    /// FLP count.
    parts: Vec<(FlpId, P)>,
    bytes: u64,
    /// Some FLP addressed its STF of this TF to another EPN.
    split: bool,
    /// Some STF failed its CRC check.
    corrupt: bool,
    dropped: Option<Reason>,
}

/// A bounded map of recently closed TFs, oldest forgotten first.
struct Recent<V> {
    map: HashMap<TfId, V>,
    order: VecDeque<TfId>,
    cap: usize,
}

impl<V> Recent<V> {
    fn new(cap: usize) -> Self {
        Recent {
            map: HashMap::new(),
            order: VecDeque::new(),
            cap,
        }
    }
    fn insert(&mut self, tf: TfId, v: V) {
        if self.map.insert(tf, v).is_none() {
            self.order.push_back(tf);
            if self.order.len() > self.cap {
                let old = self.order.pop_front().expect("non-empty");
                self.map.remove(&old);
            }
        }
    }
    fn get_mut(&mut self, tf: TfId) -> Option<&mut V> {
        self.map.get_mut(&tf)
    }
    fn contains(&self, tf: TfId) -> bool {
        self.map.contains_key(&tf)
    }
}

/// Closed TFs remembered, to recognise late STFs and late assignments.
pub const RECENT_TFS: usize = 1 << 16;

/// How long after an FLP's data connection ended a TF with no STF yet still waits
/// before its build time-out starts: an FLP's stall limit (10 s), time for it to come
/// back (restarted from its ring, rejoining, after a take-over) and send.
pub const FLP_GONE_GRACE_US: u64 = crate::flp::sender::STALL_TIMEOUT.as_micros() as u64;

/// Where FLP `flp` is in a slot's `have` bits: (word, mask).
fn flp_bit(flp: FlpId) -> (usize, u64) {
    (flp as usize / 64, 1u64 << (flp % 64))
}

pub struct Builder<P> {
    me: EpnId,
    flps: u32,
    timeout_us: u64,
    max_slots: usize,
    slots: HashMap<TfId, Slot<P>>,
    /// Closed TFs; `Some` holds the report still owed if the TF's assignment arrives
    /// (it was closed before the ICN's Assign came).
    closed: Recent<Option<(TfStatus, Reason)>>,
    /// Complete TFs go out as `Out::Built` (to sinks) instead of being reported and freed.
    hand_off: bool,
    pub counters: BuildCounters,
}

impl<P> Builder<P> {
    /// `max_slots` bounds the TFs in building at once; beyond it new TFs are dropped
    /// (`epn_slot_limit`).
    pub fn new(me: EpnId, flps: u32, timeout_us: u64, max_slots: usize) -> Self {
        assert!(flps > 0 && max_slots > 0, "validated by the caller");
        Builder {
            me,
            flps,
            timeout_us,
            max_slots,
            slots: HashMap::new(),
            closed: Recent::new(RECENT_TFS),
            hand_off: false,
            counters: BuildCounters::default(),
        }
    }

    /// Complete TFs are handed on (`Out::Built`); their report is the caller's.
    pub fn with_hand_off(mut self) -> Self {
        self.hand_off = true;
        self
    }

    /// TFs currently in building.
    pub fn me(&self) -> EpnId {
        self.me
    }

    pub fn building(&self) -> usize {
        self.slots.len()
    }

    /// `tf` has a slot: it is being built.
    pub fn is_building(&self, tf: TfId) -> bool {
        self.slots.contains_key(&tf)
    }

    /// The TFs in building, in no particular order.
    pub fn building_ids(&self) -> impl Iterator<Item = TfId> + '_ {
        self.slots.keys().copied()
    }

    /// The slot of `tf`, created if there is room. Without room the TF is closed as
    /// dropped (`epn_slot_limit`), reported now if it is ours, else when assigned.
    fn slot(&mut self, tf: TfId, assigned: bool, out: &mut Vec<Out<P>>) -> Option<&mut Slot<P>> {
        if !self.slots.contains_key(&tf) {
            if self.slots.len() >= self.max_slots {
                let owed = (TfStatus::Dropped, Reason::EpnSlotLimit);
                if assigned {
                    self.closed.insert(tf, None);
                    self.report(tf, owed, 0, 0, out);
                } else {
                    self.closed.insert(tf, Some(owed));
                }
                return None;
            }
            let words = (self.flps as usize).div_ceil(64);
            self.slots.insert(
                tf,
                Slot {
                    assigned,
                    first_us: None,
                    have: vec![0; words],
                    parts: Vec::new(),
                    bytes: 0,
                    split: false,
                    corrupt: false,
                    dropped: None,
                },
            );
        }
        self.slots.get_mut(&tf)
    }

    fn report(
        &mut self,
        tf: TfId,
        (status, reason): (TfStatus, Reason),
        stfs: u32,
        bytes: u64,
        out: &mut Vec<Out<P>>,
    ) {
        match status {
            TfStatus::Complete => self.counters.complete += 1,
            TfStatus::Incomplete => self.counters.incomplete += 1,
            TfStatus::Dropped => self.counters.dropped += 1,
        }
        out.push(Out::Report(TfReport {
            tf_id: tf,
            status,
            reason,
            stfs,
            bytes,
        }));
    }

    /// The ICN assigned `tf` to this EPN.
    pub fn assigned(&mut self, tf: TfId, out: &mut Vec<Out<P>>) {
        if let Some(owed) = self.closed.get_mut(tf) {
            // Closed before the assignment came: report what happened to it, once.
            if let Some(x) = owed.take() {
                if !matches!(x.1, Reason::EpnSlotLimit | Reason::Split) {
                    self.counters.orphans_claimed += 1;
                }
                self.report(tf, x, 0, 0, out);
            }
            return;
        }
        let Some(s) = self.slot(tf, true, out) else {
            return;
        };
        s.assigned = true;
        if let Some(r) = s.dropped {
            self.close(tf, TfStatus::Dropped, r, out);
        } else {
            self.try_complete(tf, out);
        }
    }

    /// The ICN ended `tf` already: free what it holds, report nothing, and treat
    /// its later STFs as late.
    pub fn abandon(&mut self, tf: TfId, out: &mut Vec<Out<P>>) {
        if let Some(s) = self.slots.remove(&tf) {
            out.extend(s.parts.into_iter().map(|(_, p)| Out::Free(p)));
        }
        match self.closed.get_mut(tf) {
            Some(owed) => *owed = None,
            None => {
                self.closed.insert(tf, None);
                self.counters.abandoned += 1;
            }
        }
    }

    /// An STF arrived.
    pub fn stf(&mut self, a: Arrival, payload: P, out: &mut Vec<Out<P>>) {
        let Arrival {
            tf,
            flp,
            target,
            bytes,
            now_us,
        } = a;
        if flp >= self.flps {
            self.counters.unknown_flp_stfs += 1;
            return out.push(Out::Free(payload));
        }
        if self.closed.contains(tf) {
            self.counters.late_stfs += 1;
            return out.push(Out::Free(payload));
        }
        let me = self.me;
        let Some(s) = self.slot(tf, false, out) else {
            return out.push(Out::Free(payload));
        };
        s.first_us.get_or_insert(now_us);
        if target != me {
            s.split = true;
            self.counters.split_stfs += 1;
            return out.push(Out::Free(payload));
        }
        if s.dropped.is_some() {
            self.counters.discarded_stfs += 1;
            return out.push(Out::Free(payload));
        }
        let (w, bit) = flp_bit(flp);
        if s.have[w] & bit != 0 {
            self.counters.duplicate_stfs += 1;
            return out.push(Out::Free(payload));
        }
        s.have[w] |= bit;
        s.parts.push((flp, payload));
        s.bytes += bytes;
        self.counters.stfs += 1;
        self.counters.bytes += bytes;
        self.try_complete(tf, out);
    }

    /// An STF arrived but could not be kept (`epn_buffer_full`) or was corrupt (`crc_error`).
    pub fn lost_stf(&mut self, tf: TfId, reason: Reason, now_us: u64, out: &mut Vec<Out<P>>) {
        if self.closed.contains(tf) {
            self.counters.late_stfs += 1;
            return;
        }
        let Some(s) = self.slot(tf, false, out) else {
            return;
        };
        s.first_us.get_or_insert(now_us);
        if reason == Reason::CrcError {
            s.corrupt = true;
            self.counters.crc_errors += 1;
            return;
        }
        if s.dropped.is_none() {
            s.dropped = Some(reason);
            // Free what we hold now: the TF cannot complete.
            out.extend(s.parts.drain(..).map(|(_, p)| Out::Free(p)));
            s.have.iter_mut().for_each(|w| *w = 0);
            s.bytes = 0;
            if s.assigned {
                self.close(tf, TfStatus::Dropped, reason, out);
            }
        }
    }

    fn try_complete(&mut self, tf: TfId, out: &mut Vec<Out<P>>) {
        let flps = self.flps as usize;
        if let Some(s) = self.slots.get(&tf) {
            if s.assigned && !s.split && !s.corrupt && s.dropped.is_none() && s.parts.len() == flps
            {
                self.close(tf, TfStatus::Complete, Reason::None, out);
            }
        }
    }

    fn close(&mut self, tf: TfId, status: TfStatus, reason: Reason, out: &mut Vec<Out<P>>) {
        let Some(s) = self.slots.remove(&tf) else {
            return;
        };
        let (stfs, bytes) = (s.parts.len() as u32, s.bytes);
        if s.assigned && status == TfStatus::Complete && self.hand_off {
            let mut parts = s.parts;
            parts.sort_unstable_by_key(|(flp, _)| *flp);
            self.counters.complete += 1;
            self.closed.insert(tf, None);
            let built = Built {
                tf,
                stfs: parts,
                bytes,
            };
            return out.push(Out::Built(built));
        }
        out.extend(s.parts.into_iter().map(|(_, p)| Out::Free(p)));
        if s.split {
            self.counters.split_flagged += 1;
        }
        if !s.assigned {
            // STFs of a TF the ICN has not given us: split, unless its Assign still comes.
            if !s.split {
                self.counters.orphans += 1;
            }
            self.closed.insert(tf, Some((status, reason)));
            return;
        }
        self.closed.insert(tf, None);
        self.report(tf, (status, reason), stfs, bytes, out);
    }

    fn close_incomplete(&mut self, tf: TfId, default: Reason, out: &mut Vec<Out<P>>) {
        let Some(s) = self.slots.get(&tf) else {
            return;
        };
        let (status, reason) = match (s.dropped, s.split, s.corrupt) {
            (Some(r), _, _) => (TfStatus::Dropped, r),
            (None, true, _) => (TfStatus::Incomplete, Reason::Split),
            (None, false, true) => (TfStatus::Incomplete, Reason::CrcError),
            (None, false, false) => (TfStatus::Incomplete, default),
        };
        self.close(tf, status, reason, out);
    }

    /// FLP `flp` has no data connection here any more: every TF still waiting for its
    /// STF whose time-out has not started starts it `FLP_GONE_GRACE_US` from now (an
    /// assigned TF none of whose STFs came, each lost in a reset connection, would
    /// otherwise never end, and in pull mode hold this EPN's transfer tokens for good;
    /// the grace lets an FLP that connects again, restarted or rejoining, still send).
    pub fn flp_gone(&mut self, flp: FlpId, now_us: u64) {
        let (w, bit) = flp_bit(flp);
        for s in self.slots.values_mut() {
            if s.have.get(w).is_some_and(|x| x & bit == 0) {
                s.first_us
                    .get_or_insert(now_us.saturating_add(FLP_GONE_GRACE_US));
            }
        }
    }

    /// Closes TFs whose first STF arrived more than the time-out ago.
    pub fn tick(&mut self, now_us: u64, out: &mut Vec<Out<P>>) {
        let mut due: Vec<TfId> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.first_us
                    .is_some_and(|f| now_us.saturating_sub(f) >= self.timeout_us)
            })
            .map(|(&tf, _)| tf)
            .collect();
        due.sort_unstable();
        for tf in due {
            self.close_incomplete(tf, Reason::BuildTimeout, out);
        }
    }

    /// The delivery order gives up waiting for `tf`: closed incomplete
    /// (`order_given_up`), its later STFs are late.
    pub fn give_up(&mut self, tf: TfId, out: &mut Vec<Out<P>>) {
        self.close_incomplete(tf, Reason::OrderGivenUp, out);
    }

    /// Run end: closes everything still in building.
    pub fn stop(&mut self, out: &mut Vec<Out<P>>) {
        let mut all: Vec<TfId> = self.slots.keys().copied().collect();
        all.sort_unstable();
        for tf in all {
            self.close_incomplete(tf, Reason::RunStopped, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tf: TfId, flp: FlpId, target: EpnId, bytes: u64, now_us: u64) -> Arrival {
        Arrival {
            tf,
            flp,
            target,
            bytes,
            now_us,
        }
    }

    fn reports(out: &[Out<u32>]) -> Vec<(TfId, TfStatus, Reason)> {
        out.iter()
            .filter_map(|o| match o {
                Out::Report(r) => Some((r.tf_id, r.status, r.reason)),
                _ => None,
            })
            .collect()
    }

    fn freed(out: &[Out<u32>]) -> Vec<u32> {
        let mut v: Vec<u32> = out
            .iter()
            .filter_map(|o| match o {
                Out::Free(p) => Some(*p),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn builds_when_all_flps_arrived_and_the_tf_is_ours() {
        let mut b = Builder::new(1, 3, 1000, 16);
        let mut out = vec![];
        b.assigned(5, &mut out);
        b.stf(at(5, 0, 1, 10, 0), 100, &mut out);
        b.stf(at(5, 2, 1, 10, 1), 102, &mut out);
        assert!(reports(&out).is_empty());
        b.stf(at(5, 1, 1, 10, 2), 101, &mut out);
        assert_eq!(reports(&out), vec![(5, TfStatus::Complete, Reason::None)]);
        assert_eq!(freed(&out), vec![100, 101, 102]);
        assert_eq!(b.building(), 0);
        assert_eq!(b.counters.complete, 1);
        assert_eq!(b.counters.bytes, 30);
    }

    #[test]
    fn stfs_before_the_assignment_wait_for_it() {
        let mut b = Builder::new(1, 2, 1000, 16);
        let mut out = vec![];
        b.stf(at(9, 0, 1, 1, 0), 1, &mut out);
        b.stf(at(9, 1, 1, 1, 0), 2, &mut out);
        assert!(reports(&out).is_empty());
        b.assigned(9, &mut out);
        assert_eq!(reports(&out), vec![(9, TfStatus::Complete, Reason::None)]);
    }

    #[test]
    fn time_out_closes_incomplete_and_late_stfs_are_counted() {
        let mut b = Builder::new(0, 2, 1000, 16);
        let mut out = vec![];
        b.assigned(1, &mut out);
        b.stf(at(1, 0, 0, 1, 100), 7, &mut out);
        b.tick(1099, &mut out);
        assert!(reports(&out).is_empty());
        b.tick(1100, &mut out);
        assert_eq!(
            reports(&out),
            vec![(1, TfStatus::Incomplete, Reason::BuildTimeout)]
        );
        assert_eq!(freed(&out), vec![7]);
        out.clear();
        b.stf(at(1, 1, 0, 1, 1200), 8, &mut out);
        assert_eq!(freed(&out), vec![8]);
        assert_eq!(b.counters.late_stfs, 1);
        assert!(reports(&out).is_empty());
    }

    #[test]
    fn assigned_tfs_without_stfs_do_not_time_out_but_end_at_stop() {
        let mut b = Builder::<u32>::new(0, 2, 10, 16);
        let mut out = vec![];
        b.assigned(3, &mut out);
        b.tick(1_000_000, &mut out);
        assert!(out.is_empty());
        b.stop(&mut out);
        assert_eq!(
            reports(&out),
            vec![(3, TfStatus::Incomplete, Reason::RunStopped)]
        );
    }

    /// TF 1 has no STF, TF 2 has FLP 1's (at 495 µs); FLP 1's data connection ends at
    /// 500 µs. TF 1's time-out runs from the grace after that; TF 2's from its STF.
    #[test]
    fn an_flp_gone_starts_the_time_out_of_tfs_waiting_for_its_stf() {
        let mut b = Builder::new(0, 2, 10, 16);
        let mut out = vec![];
        (1..=2).for_each(|tf| b.assigned(tf, &mut out));
        b.tick(400, &mut out);
        assert!(out.is_empty(), "no STF yet: no clock");
        b.stf(at(2, 1, 0, 1, 495), 21, &mut out);
        b.flp_gone(1, 500);
        b.tick(504, &mut out);
        assert!(reports(&out).is_empty());
        b.tick(505, &mut out);
        let tf2 = (2, TfStatus::Incomplete, Reason::BuildTimeout);
        assert_eq!(reports(&out), vec![tf2]);
        let from = 500 + FLP_GONE_GRACE_US;
        b.tick(from + 9, &mut out);
        assert_eq!(reports(&out).len(), 1);
        b.tick(from + 10, &mut out);
        let tf1 = (1, TfStatus::Incomplete, Reason::BuildTimeout);
        assert_eq!(reports(&out), vec![tf2, tf1]);
        assert_eq!(b.building(), 0);
    }

    #[test]
    fn duplicates_are_counted_and_freed() {
        let mut b = Builder::new(0, 2, 1000, 16);
        let mut out = vec![];
        b.assigned(1, &mut out);
        b.stf(at(1, 0, 0, 1, 0), 1, &mut out);
        b.stf(at(1, 0, 0, 1, 0), 2, &mut out);
        assert_eq!(b.counters.duplicate_stfs, 1);
        assert_eq!(freed(&out), vec![2]);
        assert!(reports(&out).is_empty());
    }

    #[test]
    fn an_stf_addressed_elsewhere_splits_the_tf() {
        let mut b = Builder::new(0, 2, 1000, 16);
        let mut out = vec![];
        b.assigned(4, &mut out);
        b.stf(at(4, 0, 0, 1, 0), 1, &mut out);
        b.stf(at(4, 1, 3, 1, 0), 2, &mut out); // FLP 1 thinks EPN 3 builds TF 4
        b.tick(1000, &mut out);
        assert_eq!(
            reports(&out),
            vec![(4, TfStatus::Incomplete, Reason::Split)]
        );
        assert_eq!(b.counters.split_tfs(), 1);
        assert_eq!(b.counters.split_stfs, 1);
        assert_eq!(freed(&out), vec![1, 2]);
    }

    #[test]
    fn stfs_of_a_tf_never_assigned_here_count_as_split_without_report() {
        let mut b = Builder::new(0, 2, 1000, 16);
        let mut out = vec![];
        b.stf(at(8, 0, 0, 1, 0), 1, &mut out);
        b.stf(at(8, 1, 0, 1, 0), 2, &mut out);
        b.tick(1000, &mut out);
        assert!(reports(&out).is_empty());
        assert_eq!(b.counters.split_tfs(), 1);
        assert_eq!(freed(&out), vec![1, 2]);
    }

    #[test]
    fn an_assignment_after_the_time_out_still_gets_its_report() {
        let mut b = Builder::new(0, 2, 1000, 16);
        let mut out = vec![];
        b.stf(at(8, 0, 0, 1, 0), 1, &mut out);
        b.tick(1000, &mut out);
        assert_eq!(b.counters.split_tfs(), 1);
        b.assigned(8, &mut out);
        assert_eq!(
            reports(&out),
            vec![(8, TfStatus::Incomplete, Reason::BuildTimeout)]
        );
        assert_eq!(b.counters.split_tfs(), 0, "it was ours after all");
        b.assigned(8, &mut out); // reported once only
        assert_eq!(reports(&out).len(), 1);
    }

    #[test]
    fn buffer_full_drops_the_tf_and_frees_what_it_held() {
        let mut b = Builder::new(0, 3, 1000, 16);
        let mut out = vec![];
        b.assigned(2, &mut out);
        b.stf(at(2, 0, 0, 1, 0), 1, &mut out);
        b.lost_stf(2, Reason::EpnBufferFull, 0, &mut out);
        assert_eq!(
            reports(&out),
            vec![(2, TfStatus::Dropped, Reason::EpnBufferFull)]
        );
        assert_eq!(freed(&out), vec![1]);
        out.clear();
        b.stf(at(2, 2, 0, 1, 0), 3, &mut out);
        assert_eq!(freed(&out), vec![3]);
        assert!(reports(&out).is_empty());
    }

    #[test]
    fn crc_error_makes_the_tf_incomplete_with_that_reason() {
        let mut b = Builder::new(0, 2, 1000, 16);
        let mut out = vec![];
        b.assigned(6, &mut out);
        b.stf(at(6, 0, 0, 1, 0), 1, &mut out);
        b.lost_stf(6, Reason::CrcError, 0, &mut out);
        b.tick(1000, &mut out);
        assert_eq!(
            reports(&out),
            vec![(6, TfStatus::Incomplete, Reason::CrcError)]
        );
        assert_eq!(b.counters.crc_errors, 1);
    }

    #[test]
    fn slot_limit_drops_new_tfs_with_a_named_reason() {
        let mut b = Builder::new(0, 2, 1000, 2);
        let mut out = vec![];
        b.assigned(1, &mut out);
        b.assigned(2, &mut out);
        b.assigned(3, &mut out);
        assert_eq!(
            reports(&out),
            vec![(3, TfStatus::Dropped, Reason::EpnSlotLimit)]
        );
        out.clear();
        b.stf(at(3, 0, 0, 1, 0), 9, &mut out);
        assert_eq!(freed(&out), vec![9]);
        assert_eq!(b.building(), 2);
        // An STF of a TF not yet assigned finds no room: the report waits for the Assign.
        out.clear();
        b.stf(at(4, 0, 0, 1, 0), 10, &mut out);
        assert_eq!(freed(&out), vec![10]);
        assert!(reports(&out).is_empty());
        b.assigned(4, &mut out);
        assert_eq!(
            reports(&out),
            vec![(4, TfStatus::Dropped, Reason::EpnSlotLimit)]
        );
        assert_eq!(b.counters.split_tfs(), 0);
    }

    #[test]
    fn abandoned_tfs_free_their_stfs_and_later_ones_are_late() {
        let mut b = Builder::new(0, 2, 1000, 4);
        let mut out = vec![];
        b.assigned(3, &mut out);
        b.stf(at(3, 0, 0, 1, 0), 1, &mut out);
        b.abandon(3, &mut out);
        assert_eq!(freed(&out), vec![1]);
        assert_eq!(b.building(), 0);
        b.stf(at(3, 1, 0, 1, 5), 2, &mut out);
        b.tick(1_000_000, &mut out);
        b.stop(&mut out);
        assert!(reports(&out).is_empty());
        assert_eq!(b.counters.abandoned, 1);
        assert_eq!(b.counters.late_stfs, 1);
        // Abandoning a TF never seen still keeps its late STFs out.
        b.abandon(4, &mut out);
        assert_eq!(b.counters.abandoned, 2);
    }

    #[test]
    fn unknown_flp_is_counted() {
        let mut b = Builder::new(0, 2, 1000, 2);
        let mut out = vec![];
        b.stf(at(1, 5, 0, 1, 0), 9, &mut out);
        assert_eq!(b.counters.unknown_flp_stfs, 1);
        assert_eq!(freed(&out), vec![9]);
        assert_eq!(b.building(), 0);
    }
}
