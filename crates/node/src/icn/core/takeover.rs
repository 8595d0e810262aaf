//! The take-over of a run whose ICN failed: the rows of the TFs that ended before, what
//! the returning FLPs and EPNs hold, and the ledger rebuilt from them at the start.
//!
//! A TF the failed ICN issued either has a row (it ended; rows reach the file before
//! the Release that lets FLPs free its STFs), or its STFs are still held by the FLPs,
//! or an EPN is building it or reported it. At the start every such TF ends exactly
//! once: as its EPN reported it, with the EPN building it, with the EPN it was queued
//! for, or re-assigned by the policy; a timer id nobody holds is placed again with
//! re-assignment on (FLPs make timer STFs at the Assign), else dropped `icn_lost`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fanin_proto::{HeldStf, Message, Reason, StfInfo, TfReport, TfStatus};
use fanin_sched::{EpnId, FlpId, Placed, TfId};

use super::issuing::drop_reason;
use super::{ConnId, IcnCore, Level};
use crate::icn::ledger::TfRow;

/// What an ICN taking over a run starts from (the shell reads it from the registry and
/// the results directory).
#[derive(Debug, Clone, Default)]
pub struct Takeover {
    /// How many ICNs led the run before this one.
    pub epoch: u64,
    /// How long the run had been going at the take-over: its time axis goes on.
    pub elapsed: Duration,
    /// The TFs that ended under the earlier ICNs (their rows).
    pub rows: Vec<TfRow>,
}

/// Timer runs: how far past the last row an id a node holds may be (nodes hold at most
/// their buffers' worth of TFs; an id beyond is not this run's, and would cost memory).
const MAX_AHEAD: u64 = 1 << 22;

/// TF ids that ended. Timer runs: bits from the run's first id (a long run stays
/// small; ids are the ICN's, dense). On-data: a set (ids are the sources', anywhere).
enum Ended {
    Dense { base: TfId, bits: Vec<u64> },
    Sparse(BTreeSet<TfId>),
}

impl Default for Ended {
    fn default() -> Self {
        Ended::Sparse(BTreeSet::new())
    }
}

impl Ended {
    fn insert(&mut self, tf: TfId) {
        match self {
            Ended::Dense { base, bits } => {
                let Some(i) = tf.checked_sub(*base) else {
                    return; // not this run's (refused before)
                };
                let (word, bit) = ((i / 64) as usize, i % 64);
                if bits.len() <= word {
                    bits.resize(word + 1, 0);
                }
                bits[word] |= 1 << bit;
            }
            Ended::Sparse(set) => {
                set.insert(tf);
            }
        }
    }

    fn contains(&self, tf: TfId) -> bool {
        match self {
            Ended::Dense { base, bits } => {
                let Some(i) = tf.checked_sub(*base) else {
                    return false;
                };
                let (word, bit) = ((i / 64) as usize, i % 64);
                bits.get(word).is_some_and(|w| w & (1 << bit) != 0)
            }
            Ended::Sparse(set) => set.contains(&tf),
        }
    }
}

/// What the returning nodes hold, gathered until the run goes on.
#[derive(Default)]
pub(crate) struct Gathered {
    ended: Ended,
    /// The highest TF id any row or node knows.
    max_id: Option<TfId>,
    /// Per TF, the FLPs holding its STF: (FLP, size, EPN it was queued for).
    stfs: BTreeMap<TfId, Vec<(FlpId, u64, Option<EpnId>)>>,
    /// Per TF, the EPNs building it (more than one when the failed ICN had moved it
    /// away from an EPN it counted lost, and that EPN kept its run).
    building: BTreeMap<TfId, Vec<EpnId>>,
    reports: BTreeMap<TfId, (EpnId, TfReport)>,
    /// EPNs that came back with their run (a TF stays only with one of them).
    resumed: BTreeSet<EpnId>,
    /// The run had started before (its start was noted, or TFs ended): false when the
    /// failed ICN died in the pre-run, and this run starts now, as a fresh one does.
    pub(super) started: bool,
    /// Ids a node may hold: timer runs, this run's and not absurdly far past the rows;
    /// on-data, any (they are the sources').
    ids: std::ops::Range<TfId>,
    /// Held ids refused as outside `ids`.
    refused: u64,
    /// Reports of TFs that ended, to release at the start (an EPN in its pre-run reads
    /// nothing but its parameters).
    releases: BTreeSet<(EpnId, TfId)>,
}

impl Gathered {
    /// Notes an id some node holds: false (refused) when it cannot be this run's.
    fn saw(&mut self, tf: TfId) -> bool {
        if !self.ids.contains(&tf) {
            self.refused += 1;
            return false;
        }
        self.max_id = self.max_id.max(Some(tf));
        true
    }

    /// TFs some node holds that have no row: the failed ICN's TFs in flight. On-data,
    /// an STF never assigned anywhere is not (its TF goes back to the gathering).
    fn in_flight(&self, on_data: bool) -> BTreeSet<TfId> {
        let held = self.stfs.keys().chain(self.building.keys());
        held.chain(self.reports.keys())
            .copied()
            .filter(|&tf| !self.ended.contains(tf))
            .filter(|tf| !on_data || self.assigned(*tf))
            .collect()
    }

    /// Did the failed ICN assign this TF (an EPN has it, or an FLP queued it)?
    fn assigned(&self, tf: TfId) -> bool {
        self.building.contains_key(&tf)
            || self.reports.contains_key(&tf)
            || self
                .stfs
                .get(&tf)
                .is_some_and(|v| v.iter().any(|s| s.2.is_some()))
    }
}

impl IcnCore {
    /// Counts the earlier ICNs' rows as this run's, and starts gathering.
    pub(super) fn take_over(&mut self, t: Takeover) {
        let base = self.cfg.id_base;
        let on_data = self.cfg.run.on_data();
        // Timer runs: the ICN's ids, from the run's first. On-data: the sources' ids,
        // whatever the id base (a node of another run cannot be told by its ids).
        let (ids, ended) = match on_data {
            false => {
                let end = base.saturating_add(self.cfg.run.total_tfs.unwrap_or(u64::MAX));
                let bits = Vec::new();
                (base..end, Ended::Dense { base, bits })
            }
            true => (0..TfId::MAX, Ended::Sparse(BTreeSet::new())),
        };
        let mut g = Gathered {
            ended,
            ids,
            ..Gathered::default()
        };
        for row in &t.rows {
            if g.ended.contains(row.tf_id) || !g.saw(row.tf_id) {
                continue; // a repeated row counts once; one of another run not at all
            }
            g.ended.insert(row.tf_id);
            let bytes = match row.status {
                TfStatus::Complete => self.tf_bytes(row.tf_id),
                _ => 0,
            };
            self.ledger.carried(row, bytes);
            self.tally.count(row.status);
            if self.cfg.run.on_data() {
                self.ondata.mark_scheduled(row.tf_id); // a late announcement is answered
            }
        }
        self.next_tf = self.ids_used(&g);
        // Nodes hold at most their buffers' worth past the last row (timer runs: the
        // bits stay bounded; on-data ids may jump, and their set holds only what ended).
        if !on_data {
            let past = g.max_id.map_or(base, |m| m.saturating_add(1));
            g.ids.end = g.ids.end.min(past.saturating_add(MAX_AHEAD));
        }
        let line = format!(
            "took over run {} (take-over number {}) {:.3} s into it: {} TFs had ended",
            self.cfg.run_id,
            t.epoch + 1,
            t.elapsed.as_secs_f64(),
            t.rows.len()
        );
        self.log(Level::Warn, line.clone());
        self.note(line);
        g.started = t.elapsed > Duration::ZERO || !t.rows.is_empty();
        self.gathered = Some(g);
    }

    /// A returning FLP's STFs. After the start (a late FLP): those whose TF ended are
    /// released at once, the rest go on as they are.
    pub(super) fn on_stfs_held(&mut self, conn: ConnId, flp: FlpId, list: Vec<HeldStf>) {
        let Some(g) = self.gathered.as_mut() else {
            let ended: Vec<TfId> = list
                .iter()
                .map(|h| h.tf_id)
                .filter(|&tf| !self.ledger.is_pending(tf))
                .collect();
            for tf_id in ended {
                self.send(conn, Message::Release { tf_id });
            }
            return;
        };
        for h in list {
            if !g.saw(h.tf_id) {
                continue;
            }
            g.stfs
                .entry(h.tf_id)
                .or_default()
                .push((flp, h.size, h.epn));
        }
    }

    /// A returning EPN's TFs in building and its unreleased reports.
    pub(super) fn on_tfs_held(&mut self, epn: EpnId, building: Vec<TfId>, reports: Vec<TfReport>) {
        let Some(g) = self.gathered.as_mut() else {
            for r in reports {
                self.on_report(epn, r);
            }
            return;
        };
        g.resumed.insert(epn);
        for tf in building {
            if g.saw(tf) {
                g.building.entry(tf).or_default().push(epn);
            }
        }
        let mut complete = Vec::new();
        for r in reports {
            if !g.saw(r.tf_id) {
                continue;
            }
            if g.ended.contains(r.tf_id) {
                g.releases.insert((epn, r.tf_id));
                continue;
            }
            if r.status == TfStatus::Complete {
                // Its end, written at once: should this ICN fail too before the run goes
                // on, the next one finds the row (the EPN may be gone by then).
                g.ended.insert(r.tf_id);
                if let Some((other, _)) = g.reports.remove(&r.tf_id) {
                    g.releases.insert((other, r.tf_id));
                }
                g.releases.insert((epn, r.tf_id));
                complete.push(r);
                continue;
            }
            // Not complete: the first verdict stands (a complete one would end it at
            // once); another EPN's is released at the start.
            match g.reports.get(&r.tf_id) {
                Some(&(other, _)) if other != epn => {
                    g.releases.insert((epn, r.tf_id));
                }
                Some(_) => {}
                None => {
                    g.reports.insert(r.tf_id, (epn, r));
                }
            }
        }
        for r in complete {
            self.end_reported(epn, r);
        }
    }

    /// A TF of the failed ICN ends as its EPN reported it (while gathering: its
    /// Release waits for the start).
    fn end_reported(&mut self, epn: EpnId, r: TfReport) {
        let tf = r.tf_id;
        if self.cfg.run.on_data() {
            // Scheduled: a late announcement of it is answered, never scheduled again.
            self.ondata.sizes.insert(tf, r.bytes);
            self.ondata.mark_scheduled(tf);
        }
        self.ledger.issue(tf, epn, self.now_us());
        // Ids stay ahead of what was issued (timer runs go on after the highest id).
        let past = match self.cfg.run.on_data() {
            false => (tf + 1).saturating_sub(self.cfg.id_base),
            true => self.ledger.issued,
        };
        self.next_tf = self.next_tf.max(past);
        self.on_report(epn, r);
    }

    /// The run goes on: every TF the failed ICN had in flight gets its end or its EPN,
    /// ids nobody holds are dropped, and issuing continues after the highest id known.
    pub(super) fn resume_ledger(&mut self) {
        let Some(g) = self.gathered.take() else {
            return;
        };
        let flight = g.in_flight(self.cfg.run.on_data());
        self.release_ended(&g);
        self.missing_flps_lost();
        let (mut kept, mut moved, mut reported) = (0u64, 0u64, 0u64);
        for &tf in &flight {
            match self.carry(tf, &g) {
                Carried::Reported => reported += 1,
                Carried::Kept => kept += 1,
                Carried::Moved => moved += 1,
            }
        }
        let (unheld, lost) = self.unheld(&g, &flight);
        moved += unheld;
        self.abandon_copies(&g);
        if g.refused > 0 {
            let line = format!(
                "take-over: {} ids held by nodes are not this run's; ignored",
                g.refused
            );
            self.log(Level::Warn, line.clone());
            self.note(line);
        }
        self.next_tf = self.ids_used(&g);
        self.announce_unassigned(&g, &flight);
        let t = self.now_us() as f64 / 1e6;
        let next = match self.cfg.run.on_data() {
            false => format!(
                "issuing goes on from TF {}",
                self.cfg.id_base + self.next_tf
            ),
            true => format!("{} TFs scheduled so far", self.next_tf),
        };
        let line = format!(
            "t={t:.3}s take-over: {} TFs were in flight: {reported} ended as their EPN reported, {kept} stay with their EPN, {moved} placed again, {lost} dropped (icn_lost); {next}",
            flight.len() as u64 + unheld + lost,
        );
        self.log(Level::Warn, line.clone());
        self.note(line);
    }

    /// The pacing count: timer runs go on after the highest id known, on-data ones
    /// count what they scheduled.
    fn ids_used(&self, g: &Gathered) -> u64 {
        match (self.cfg.run.on_data(), g.max_id) {
            (false, Some(max)) => max.saturating_add(1).saturating_sub(self.cfg.id_base),
            _ => self.ledger.issued,
        }
    }

    /// One TF in flight at the failure: ended, kept with its EPN, or placed again.
    fn carry(&mut self, tf: TfId, g: &Gathered) -> Carried {
        let now = self.now_us();
        if self.cfg.run.on_data() {
            // Scheduled: a late announcement of it is answered, never scheduled again.
            let bytes = g.stfs.get(&tf).map_or(0, |v| v.iter().map(|s| s.1).sum());
            self.ondata.sizes.insert(tf, bytes);
            self.ondata.mark_scheduled(tf);
        }
        let (stays, moved_to) = self.stays_with(tf, g);
        // A gathered report is never complete: one ends its TF as it arrives.
        match (g.reports.get(&tf), moved_to) {
            (Some(&(epn, ref r)), to) if to.is_none_or(|to| to == epn) => {
                debug_assert!(r.status != TfStatus::Complete, "ended on arrival");
                self.ledger.issue(tf, epn, now);
                self.on_report(epn, r.clone());
                return Carried::Reported;
            }
            (Some(&(epn, _)), Some(to)) => {
                // The failed ICN moved the TF on from this EPN (counted lost then): its
                // verdict yields to the EPN that builds it now, and it may forget it.
                if let Some(&c) = self.epns.get(&epn) {
                    self.send(c, Message::Release { tf_id: tf });
                }
                let line = format!("take-over: EPN {epn}'s report of TF {tf} yields to EPN {to}, which the TF was moved to and which builds it");
                self.log(Level::Warn, line);
            }
            _ => {}
        }
        if let Some(epn) = stays {
            self.ledger.issue(tf, epn, now);
            self.dispatch(tf, epn);
            return Carried::Kept;
        }
        self.place_again(tf);
        Carried::Moved
    }

    /// Where a TF in flight stays: the EPN the FLPs queued it for (the failed ICN's last
    /// word), else one that builds it; only one that came back with its run (a restarted
    /// one has lost it). Second: that EPN, if the FLPs queued it there and it builds it.
    fn stays_with(&self, tf: TfId, g: &Gathered) -> (Option<EpnId>, Option<EpnId>) {
        let back = |e: &EpnId| self.epns.contains_key(e) && g.resumed.contains(e);
        let queued = g.stfs.get(&tf).and_then(|v| v.iter().find_map(|s| s.2));
        let building = g.building.get(&tf).map_or(&[][..], |v| v.as_slice());
        let stays = queued
            .filter(back)
            .or_else(|| building.iter().copied().find(back));
        let moved_to = stays.filter(|s| Some(*s) == queued && building.contains(s));
        (stays, moved_to)
    }

    /// A TF of the failed ICN goes to the policy again (re-assignment).
    fn place_again(&mut self, tf: TfId) {
        let now = self.now_us();
        self.kept_unplaced.insert(tf); // the failed ICN's FLPs may keep its STFs
        match self.placer.replace(tf, self.tf_bytes(tf)) {
            Placed::Assigned(to) if self.epns.contains_key(&to) => {
                self.ledger.issue(tf, to, now);
                self.ledger.reassigned += 1;
                self.metrics.tf("reassigned", "icn_lost");
                self.dispatch(tf, to);
            }
            Placed::Waiting => self.ledger.issue_waiting(tf, now),
            Placed::Dropped(r) => {
                let row = self.ledger.issue_dropped(tf, drop_reason(r), now);
                self.ended(&row);
            }
            Placed::Assigned(_) => {
                let row = self.ledger.issue_dropped(tf, Reason::EpnLost, now);
                self.ended(&row);
            }
        }
    }

    /// TFs that ended (their rows) whose STFs or reports nodes still hold: the failed
    /// ICN's Release was lost with it. They are freed now.
    fn release_ended(&mut self, g: &Gathered) {
        for (&tf, holders) in g.stfs.iter().filter(|(&tf, _)| g.ended.contains(tf)) {
            for &(flp, _, _) in holders {
                if let Some(&c) = self.flps.get(&flp) {
                    self.send(c, Message::Release { tf_id: tf });
                }
            }
        }
        for &(epn, tf) in &g.releases {
            if let Some(&c) = self.epns.get(&epn) {
                self.send(c, Message::Release { tf_id: tf });
            }
        }
    }

    /// EPNs building a TF that ended, or that goes on at another EPN, drop their copy
    /// (no TF is built twice).
    fn abandon_copies(&mut self, g: &Gathered) {
        for (&tf, claimants) in &g.building {
            let owner = self
                .ledger
                .assigned(tf)
                .filter(|_| self.ledger.is_pending(tf));
            for &e in claimants.iter().filter(|&&e| Some(e) != owner) {
                if let Some(&c) = self.epns.get(&e) {
                    let reason = Reason::EpnLost;
                    self.send(c, Message::Abandon { tf_id: tf, reason });
                }
            }
        }
    }

    /// FLPs of the run that did not come back count as lost from now (on-data: their
    /// sources end for the run after `stf_stale_ms`).
    fn missing_flps_lost(&mut self) {
        for flp in 0..self.cfg.run.cfg.flps {
            if !self.flps.contains_key(&flp) {
                self.source_lost(flp);
            }
        }
    }

    /// Taking over: every node the registry knows alive is back (the others died with
    /// or before the failed ICN): the run need not wait for them.
    pub(super) fn all_alive_back(&self) -> bool {
        let Some(m) = self
            .registry_members
            .as_ref()
            .filter(|_| self.gathered.is_some())
        else {
            return false;
        };
        !self.flps.is_empty()
            && !self.epns.is_empty()
            && m.flps.keys().all(|id| self.flps.contains_key(id))
            && m.epns.keys().all(|id| self.epns.contains_key(id))
    }

    /// Timer runs issue every id: one below the highest known that has no row and that
    /// no node holds was issued by the failed ICN (pull mode: its transfers not granted
    /// yet; or its EPN died). Timer STFs are made at the Assign, so with re-assignment it
    /// is placed again (as a TF of a lost EPN is); without, it is dropped `icn_lost`.
    /// Returns (placed again, dropped).
    fn unheld(&mut self, g: &Gathered, flight: &BTreeSet<TfId>) -> (u64, u64) {
        let Some(max) = g.max_id.filter(|_| !self.cfg.run.on_data()) else {
            return (0, 0);
        };
        let now = self.now_us();
        let (mut moved, mut lost) = (0, 0);
        for tf in self.cfg.id_base..=max {
            if g.ended.contains(tf) || flight.contains(&tf) {
                continue;
            }
            if self.cfg.run.cfg.reassign {
                self.place_again(tf);
                moved += 1;
            } else {
                let row = self.ledger.issue_dropped(tf, Reason::IcnLost, now);
                self.ended(&row);
                lost += 1;
            }
        }
        (moved, lost)
    }

    /// On-data: STFs produced and not scheduled yet count as announced again.
    fn announce_unassigned(&mut self, g: &Gathered, flight: &BTreeSet<TfId>) {
        if !self.cfg.run.on_data() {
            return;
        }
        for (&tf, holders) in &g.stfs {
            if g.ended.contains(tf) || flight.contains(&tf) {
                continue;
            }
            for &(flp, size, _) in holders {
                if let Some(&conn) = self.flps.get(&flp) {
                    let list = vec![StfInfo { tf_id: tf, size }];
                    self.on_announce(conn, flp, list);
                }
            }
        }
    }
}

/// What the take-over did with one TF in flight.
enum Carried {
    Reported,
    Kept,
    Moved,
}
