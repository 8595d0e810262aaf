//! The EPN's decisions without I/O: the ICN's frames and the STFs that arrived go into
//! the TF builder; TF reports, load reports and freed buffers come out.
//!
//! The tokio shell feeds data-connection events, control frames, 20 ms ticks and the
//! sinks' verdicts in, and carries the actions out: frames to the ICN, built TFs to the
//! sinks, buffers back to the pool, the goat's death.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use fanin_proto::{Message, Reason, TfReport, TfStatus};
use fanin_sched::{EpnId, FlpId, TfId};

use super::builder::{Arrival, Builder, Built, Out};
use super::order::Order;
use crate::metrics::Metrics;

/// Ticks (20 ms) between two load reports to the ICN: 100 ms.
pub const LOAD_REPORT_TICKS: u64 = 5;

/// Reports kept until the ICN releases them, at most (the oldest go first, counted).
const MAX_UNRELEASED: usize = 1 << 16;

/// What happens to the EPN during a run.
#[derive(Debug)]
pub enum Input<P> {
    /// An STF arrived on a data connection (`target`: the EPN its FLP addressed).
    Stf {
        tf: TfId,
        flp: FlpId,
        target: EpnId,
        bytes: u64,
        payload: P,
    },
    /// An STF could not be kept (no room, bad CRC) and was read away.
    Lost {
        tf: TfId,
        flp: FlpId,
        reason: Reason,
    },
    /// FLP `flp` has no data connection to this EPN any more: an STF it wrote into one
    /// that was reset may never come, so every TF still waiting for one of its STFs
    /// starts its build time-out now, if none of its STFs started it yet.
    FlpGone { flp: FlpId },
    /// A frame from the ICN.
    Control(Message),
    /// 20 ms passed; the build buffer has `free_bytes` free.
    Tick { free_bytes: u64 },
    /// The sinks are done with a built TF: accepted, or failed/refused (the reason).
    Delivered {
        tf: TfId,
        outcome: Result<(), Reason>,
        stfs: Vec<(FlpId, P)>,
    },
    /// The ICN is lost, the run kept for one that takes it over: TFs built from now on
    /// are held back until that ICN's RunStart (its Abandons of TFs that ended, or go
    /// on at another EPN, come before it).
    IcnLost,
}

/// When a handed-on TF counts as complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompleteOn {
    /// When every sink accepted it (a sink failure drops it, named).
    Accepted,
    /// When built; the sinks' verdicts are only counted.
    Built,
}

/// How built TFs leave the EPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub complete_on: CompleteOn,
    /// Hand TFs on in TF-id order, giving the oldest up after this many newer ones.
    pub in_order: Option<usize>,
}

/// What the EPN asks its shell to do, in order.
#[derive(Debug, PartialEq)]
pub enum Action<P> {
    /// A frame to the ICN.
    Control(Message),
    /// A frame to the ICN that may be skipped when its queue is full (load reports).
    ControlLossy(Message),
    /// The builder no longer holds this payload: back to the build buffer.
    Free(P),
    /// A complete TF for the sinks; `Input::Delivered` comes back.
    Deliver(Built<P>),
    /// Fault injection ("goat"): crash now, after this many complete TFs.
    Die { complete: u64 },
    /// The run stopped: every TF is reported, the EPN may leave.
    Stopped,
}

/// The EPN of one run.
pub struct EpnCore<P> {
    me: EpnId,
    builder: Builder<P>,
    complete: u64,
    die_after_tfs: Option<u64>,
    ticks: u64,
    metrics: Arc<Metrics>,
    scratch: Vec<Out<P>>,
    out: VecDeque<Action<P>>,
    /// With sinks: how TFs leave; `None` builds and discards.
    delivery: Option<Delivery>,
    order: Option<Order<P>>,
    /// TFs at the sinks: (STFs, bytes) for their report.
    at_sinks: HashMap<TfId, (u32, u64)>,
    /// TFs at the sinks the ICN abandoned meanwhile: freed without a report.
    abandoned: std::collections::HashSet<TfId>,
    /// RunStop came: `Stopped` once the sinks returned every TF.
    stopping: bool,
    /// Reports sent and not yet released by the ICN: an ICN that takes over a failed
    /// one learns them again (they may have died with it).
    unreleased: BTreeMap<TfId, TfReport>,
    /// Pull mode: tell the ICN of every STF that arrived (its transfer's tokens go on).
    pull: bool,
    /// The ICN is lost: TFs built meanwhile are held back here, neither handed on nor
    /// reported complete, until an ICN that took the run over starts it. The ICN that
    /// lost this EPN may have given them to another EPN; if it did not die, its answer
    /// to the rejoin ends this run (and what waits here) instead.
    away: bool,
    held_back: BTreeMap<TfId, Out<P>>,
}

/// What an EPN holds, as the `TfsHeld` frames it tells an ICN taking over the run
/// (`HELD_BATCH` TFs and reports at most per frame; one frame when it holds nothing).
pub fn tfs_held(building: &[TfId], reports: &[TfReport]) -> Vec<Message> {
    let n = fanin_proto::HELD_BATCH;
    let frames = building.len().max(reports.len()).div_ceil(n).max(1);
    let (mut b, mut r) = (building.chunks(n), reports.chunks(n));
    (0..frames)
        .map(|_| Message::TfsHeld {
            building: b.next().unwrap_or_default().to_vec(),
            reports: r.next().unwrap_or_default().to_vec(),
        })
        .collect()
}

impl<P> EpnCore<P> {
    pub fn new(builder: Builder<P>, die_after_tfs: Option<u64>, metrics: Arc<Metrics>) -> Self {
        metrics.set_level("tfs_held_back", 0); // a kept run dropped before may have set it
        EpnCore {
            me: builder.me(),
            builder,
            complete: 0,
            die_after_tfs,
            ticks: 0,
            metrics,
            scratch: Vec::new(),
            out: VecDeque::new(),
            delivery: None,
            order: None,
            at_sinks: HashMap::new(),
            abandoned: Default::default(),
            stopping: false,
            unreleased: BTreeMap::new(),
            pull: false,
            away: false,
            held_back: BTreeMap::new(),
        }
    }

    /// What this EPN holds, for an ICN taking over the run: the TFs it is building
    /// (or handing on), and its reports the ICN has not released.
    pub fn held(&self) -> (Vec<TfId>, Vec<TfReport>) {
        let mut building: Vec<TfId> = self.builder.building_ids().collect();
        building.extend(self.at_sinks.keys().copied());
        building.extend(self.order.iter().flat_map(|o| o.held_ids()));
        building.extend(self.held_back.keys().copied());
        building.sort_unstable();
        building.dedup();
        (building, self.unreleased.values().cloned().collect())
    }

    /// Complete TFs go to sinks (the builder must hand them off).
    pub fn with_delivery(mut self, d: Delivery) -> Self {
        self.order = d.in_order.map(Order::new);
        self.delivery = Some(d);
        self
    }

    /// TFs at the sinks, waiting for their turn, or held back while the ICN is away.
    pub fn delivering(&self) -> usize {
        self.at_sinks.len() + self.order.as_ref().map_or(0, |o| o.held()) + self.held_back.len()
    }

    /// TFs handed on after a newer one (in-order delivery only).
    pub fn out_of_order(&self) -> u64 {
        self.order.as_ref().map_or(0, |o| o.out_of_order)
    }

    /// Pull mode: every arriving STF is reported to the ICN (`StfReceived`).
    pub fn with_pull(mut self, pull: bool) -> Self {
        self.pull = pull;
        self
    }

    /// Feeds one input at `now_us` (µs since the run's start at this EPN).
    pub fn handle(&mut self, now_us: u64, input: Input<P>) {
        let mut out = std::mem::take(&mut self.scratch);
        let input = match input {
            // The run stopped: what still arrives is late, and builds nothing.
            Input::Stf { payload, .. } if self.stopping => {
                self.builder.counters.late_stfs += 1;
                return self.out.push_back(Action::Free(payload));
            }
            Input::Lost { .. } if self.stopping => return,
            other => other,
        };
        if let (true, Input::Stf { tf, flp, .. } | Input::Lost { tf, flp, .. }) =
            (self.pull, &input)
        {
            let m = Message::StfReceived {
                tf_id: *tf,
                flp_id: *flp,
            };
            self.metrics.stf("transfer_ended", "", 1);
            self.out.push_back(Action::Control(m));
        }
        match input {
            Input::Stf {
                tf,
                flp,
                target,
                bytes,
                payload,
            } => {
                let a = Arrival {
                    tf,
                    flp,
                    target,
                    bytes,
                    now_us,
                };
                self.builder.stf(a, payload, &mut out);
            }
            Input::Lost { tf, reason, .. } => self.builder.lost_stf(tf, reason, now_us, &mut out),
            Input::Control(m) => self.on_control(m, &mut out),
            Input::Tick { free_bytes } => self.on_tick(now_us, free_bytes, &mut out),
            Input::FlpGone { flp } => self.builder.flp_gone(flp, now_us),
            Input::Delivered { tf, outcome, stfs } => self.delivered(tf, outcome, stfs),
            Input::IcnLost => self.away = true,
        }
        self.settle(&mut out);
        self.scratch = out;
        if self.stopping && self.delivering() == 0 {
            self.stopping = false;
            debug_assert_eq!(self.builder.building(), 0, "TFs left at stop");
            self.out.push_back(Action::Stopped);
        }
    }

    /// Carries the builder's outputs, releasing in-order TFs and giving up the oldest
    /// as often as the order queue asks.
    fn settle(&mut self, out: &mut Vec<Out<P>>) {
        loop {
            for o in out.drain(..) {
                self.carry(o);
            }
            // While the ICN is away the order queue stands too: what waits there may go
            // on at another EPN (an ICN taking over abandons it here).
            let Some(order) = self.order.as_mut().filter(|_| !self.away) else {
                return;
            };
            let mut ready = Vec::new();
            let give_up = order.release(&mut ready);
            ready.into_iter().for_each(|b| self.deliver(b));
            match give_up {
                Some(tf) => self.builder.give_up(tf, out),
                None => return,
            }
            if out.is_empty() {
                // Nothing left to close (it had no slot): forget it.
                self.order
                    .as_mut()
                    .expect("checked")
                    .closed(give_up.expect("some"));
            }
        }
    }

    /// Hands a built TF to the sinks; complete now unless it waits for their verdict.
    fn deliver(&mut self, b: Built<P>) {
        let d = self.delivery.expect("only hand-off builders build");
        let stfs = b.stfs.len() as u32;
        if d.complete_on == CompleteOn::Built {
            self.report(TfReport::complete(b.tf, stfs, b.bytes));
        }
        let old = self.at_sinks.insert(b.tf, (stfs, b.bytes));
        assert!(old.is_none(), "TF {} handed on twice", b.tf);
        self.out.push_back(Action::Deliver(b));
    }

    fn delivered(&mut self, tf: TfId, outcome: Result<(), Reason>, stfs: Vec<(FlpId, P)>) {
        let (n, bytes) = self.at_sinks.remove(&tf).expect("a TF at the sinks");
        for (_, p) in stfs {
            self.out.push_back(Action::Free(p));
        }
        if self.abandoned.remove(&tf) {
            return; // the ICN ended it already
        }
        if let Err(r) = outcome {
            self.metrics.stf("sink_verdict", r.name(), 1);
        }
        if self.delivery.expect("sinks").complete_on == CompleteOn::Accepted {
            self.report(match outcome {
                Ok(()) => TfReport::complete(tf, n, bytes),
                Err(reason) => TfReport {
                    tf_id: tf,
                    status: TfStatus::Dropped,
                    reason,
                    stfs: n,
                    bytes,
                },
            });
        }
    }

    pub fn poll_action(&mut self) -> Option<Action<P>> {
        self.out.pop_front()
    }

    pub fn builder(&self) -> &Builder<P> {
        &self.builder
    }

    fn on_control(&mut self, m: Message, out: &mut Vec<Out<P>>) {
        let me = self.me;
        match m {
            // Assigned again after a take-over, reported already: the report again.
            Message::Assign { tf_id, epn_id }
                if epn_id == me && self.unreleased.contains_key(&tf_id) =>
            {
                let r = self.unreleased[&tf_id].clone();
                self.out.push_back(Action::Control(Message::TfReport(r)));
            }
            Message::Assign { tf_id, epn_id } if epn_id == me => {
                self.builder.assigned(tf_id, out);
                // Waited for in order only while it is built here: assigned again after a
                // take-over, a TF built already (at the sinks, say) would never come.
                if let Some(o) = self
                    .order
                    .as_mut()
                    .filter(|_| self.builder.is_building(tf_id))
                {
                    o.assigned(tf_id);
                }
            }
            Message::Assign { tf_id, epn_id } => {
                tracing::warn!("EPN {me}: ICN sent the assignment of TF {tf_id} to EPN {epn_id}");
                self.metrics.error("foreign_assign");
            }
            Message::Abandon { tf_id, reason } => {
                tracing::debug!("EPN {me}: ICN abandoned TF {tf_id} ({})", reason.name());
                self.builder.abandon(tf_id, out);
                if let Some(o) = self.held_back.remove(&tf_id) {
                    if let Out::Built(b) = o {
                        out.extend(b.stfs.into_iter().map(|(_, p)| Out::Free(p)));
                    }
                    let n = self.held_back.len() as u64;
                    self.metrics.set_level("tfs_held_back", n);
                }
                let held = self.order.as_mut().and_then(|o| o.take(tf_id));
                for (_, p) in held.into_iter().flat_map(|b| b.stfs) {
                    out.push(Out::Free(p));
                }
                if self.at_sinks.contains_key(&tf_id) {
                    self.abandoned.insert(tf_id);
                }
            }
            Message::RunStart { run_id, .. } => {
                tracing::info!("EPN {me}: run {run_id} started");
                self.go_on(out);
            }
            Message::Release { tf_id } => {
                self.unreleased.remove(&tf_id);
            }
            Message::RunState { state, run_number } => {
                self.metrics.set_run_state(state, run_number)
            }
            Message::RunStop { run_id } => {
                tracing::info!("EPN {me}: run {run_id} stopping");
                if self.away {
                    self.free_held(out);
                }
                self.builder.stop(out);
                self.stopping = true;
            }
            other => {
                tracing::warn!("EPN {me}: unexpected {:?} from the ICN", other.msg_type());
                self.metrics.error("unexpected_message");
            }
        }
    }

    fn on_tick(&mut self, now_us: u64, free_bytes: u64, out: &mut Vec<Out<P>>) {
        self.builder.tick(now_us, out);
        self.ticks += 1;
        if self.ticks >= LOAD_REPORT_TICKS {
            self.ticks = 0;
            // For buffer-aware policies.
            let building = self.builder.building() + self.delivering();
            let building = building.min(u32::MAX as usize) as u32;
            self.out
                .push_back(Action::ControlLossy(Message::LoadReport {
                    free_bytes,
                    building,
                }));
        }
    }

    /// The run (taken over) goes on: what was held back goes on too.
    fn go_on(&mut self, out: &mut Vec<Out<P>>) {
        self.away = false;
        if !self.held_back.is_empty() {
            let me = self.me;
            let n = self.held_back.len();
            tracing::info!("EPN {me}: {n} TFs built while the ICN was away go on");
            out.extend(std::mem::take(&mut self.held_back).into_values());
            self.metrics.set_level("tfs_held_back", 0);
        }
    }

    /// The run ended while the ICN was away, so no ICN takes it over: what waited for
    /// one (held back, or in the order queue) is freed, unreported and not handed on. The
    /// ICN that ended the run accounted for those TFs.
    fn free_held(&mut self, out: &mut Vec<Out<P>>) {
        for (_, o) in std::mem::take(&mut self.held_back) {
            if let Out::Built(b) = o {
                out.extend(b.stfs.into_iter().map(|(_, p)| Out::Free(p)));
            }
        }
        self.metrics.set_level("tfs_held_back", 0);
        if let Some(order) = self.order.as_mut() {
            let held: Vec<TfId> = order.held_ids().collect();
            for b in held.into_iter().filter_map(|tf| order.take(tf)) {
                out.extend(b.stfs.into_iter().map(|(_, p)| Out::Free(p)));
            }
        }
    }

    fn hold_back(&mut self, tf: TfId, o: Out<P>) {
        if self.held_back.contains_key(&tf) {
            // Built again (its STFs came again after the builder forgot it): one copy.
            debug_assert!(false, "TF {tf} built twice while the ICN was away");
            self.metrics.error("built_twice_while_away");
            if let Out::Built(b) = o {
                let free = b.stfs.into_iter().map(|(_, p)| Action::Free(p));
                self.out.extend(free);
            }
            return;
        }
        self.held_back.insert(tf, o);
        self.metrics
            .set_level("tfs_held_back", self.held_back.len() as u64);
    }

    fn carry(&mut self, o: Out<P>) {
        match o {
            Out::Built(b) if self.away => self.hold_back(b.tf, Out::Built(b)),
            Out::Report(r) if self.away && r.status == TfStatus::Complete => {
                self.hold_back(r.tf_id, Out::Report(r))
            }
            Out::Report(r) => {
                if let Some(order) = self.order.as_mut() {
                    order.closed(r.tf_id);
                }
                self.report(r)
            }
            Out::Free(p) => self.out.push_back(Action::Free(p)),
            Out::Built(b) => match self.order.as_mut() {
                Some(order) => order.built(b),
                None => self.deliver(b),
            },
        }
    }

    fn report(&mut self, r: TfReport) {
        self.metrics.tf(r.status.name(), r.reason.name());
        if r.status == TfStatus::Complete {
            self.complete += 1;
            if self.die_after_tfs.is_some_and(|n| self.complete > n) {
                // Dies before this report leaves: the goat built n TFs.
                let complete = self.complete - 1;
                self.out.push_back(Action::Die { complete });
            }
        }
        if self.unreleased.len() >= MAX_UNRELEASED {
            self.unreleased.pop_first();
            self.metrics.error("report_not_kept");
        }
        self.unreleased.insert(r.tf_id, r.clone());
        self.out.push_back(Action::Control(Message::TfReport(r)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EPN 3 of a run with 2 FLPs and a 1 s build time-out.
    fn epn(die_after_tfs: Option<u64>) -> (EpnCore<u32>, Arc<Metrics>) {
        let m = Metrics::new("epn", Some(3));
        let b = Builder::new(3, 2, 1_000_000, 16);
        (EpnCore::new(b, die_after_tfs, m.clone()), m)
    }

    fn drain(c: &mut EpnCore<u32>) -> Vec<Action<u32>> {
        std::iter::from_fn(|| c.poll_action()).collect()
    }

    fn stf(c: &mut EpnCore<u32>, now_us: u64, tf: TfId, flp: FlpId) -> Vec<Action<u32>> {
        let input = Input::Stf {
            tf,
            flp,
            target: 3,
            bytes: 10,
            payload: flp,
        };
        c.handle(now_us, input);
        drain(c)
    }

    fn assign(c: &mut EpnCore<u32>, tf: TfId, epn: EpnId) {
        c.handle(
            0,
            Input::Control(Message::Assign {
                tf_id: tf,
                epn_id: epn,
            }),
        );
    }

    fn reports(a: &[Action<u32>]) -> Vec<(TfId, TfStatus)> {
        a.iter()
            .filter_map(|x| match x {
                Action::Control(Message::TfReport(TfReport { tf_id, status, .. })) => {
                    Some((*tf_id, *status))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_tf_with_every_stf_is_reported_complete_and_its_buffers_freed() {
        let (mut c, m) = epn(None);
        assign(&mut c, 7, 3);
        stf(&mut c, 10, 7, 0);
        let a = stf(&mut c, 20, 7, 1);
        assert_eq!(reports(&a), [(7, TfStatus::Complete)]);
        let freed: Vec<u32> = a
            .iter()
            .filter_map(|x| match x {
                Action::Free(p) => Some(*p),
                _ => None,
            })
            .collect();
        assert_eq!(freed.len(), 2);
        assert_eq!(m.counter("tfs.complete.none"), 1);
    }

    #[test]
    fn an_assignment_for_another_epn_is_counted_not_built() {
        let (mut c, m) = epn(None);
        assign(&mut c, 7, 4);
        assert!(drain(&mut c).is_empty());
        assert_eq!(m.counter("errors.foreign_assign"), 1);
    }

    #[test]
    fn a_missing_stf_closes_the_tf_incomplete_on_time_out() {
        let (mut c, _) = epn(None);
        assign(&mut c, 7, 3);
        stf(&mut c, 0, 7, 0);
        c.handle(500_000, Input::Tick { free_bytes: 0 });
        assert!(reports(&drain(&mut c)).is_empty());
        c.handle(1_000_001, Input::Tick { free_bytes: 0 });
        assert_eq!(reports(&drain(&mut c)), [(7, TfStatus::Incomplete)]);
    }

    #[test]
    fn a_tf_waiting_for_an_flp_whose_connection_ended_times_out() {
        let (mut c, _) = epn(None);
        assign(&mut c, 7, 3);
        c.handle(5_000_000, Input::Tick { free_bytes: 0 });
        assert!(reports(&drain(&mut c)).is_empty(), "no STF: no clock");
        c.handle(6_000_000, Input::FlpGone { flp: 0 });
        let due = 7_000_000 + crate::epn::builder::FLP_GONE_GRACE_US;
        c.handle(due - 1, Input::Tick { free_bytes: 0 });
        assert!(reports(&drain(&mut c)).is_empty());
        c.handle(due, Input::Tick { free_bytes: 0 });
        assert_eq!(reports(&drain(&mut c)), [(7, TfStatus::Incomplete)]);
    }

    #[test]
    fn every_fifth_tick_reports_the_load() {
        let (mut c, _) = epn(None);
        for t in 1..LOAD_REPORT_TICKS {
            c.handle(t, Input::Tick { free_bytes: 99 });
            assert!(drain(&mut c).is_empty());
        }
        c.handle(9, Input::Tick { free_bytes: 99 });
        let load = Message::LoadReport {
            free_bytes: 99,
            building: 0,
        };
        assert_eq!(drain(&mut c), [Action::ControlLossy(load)]);
    }

    #[test]
    fn run_stop_reports_what_is_open_then_stops() {
        let (mut c, _) = epn(None);
        assign(&mut c, 7, 3);
        stf(&mut c, 0, 7, 0);
        c.handle(1, Input::Control(Message::RunStop { run_id: 1 }));
        let a = drain(&mut c);
        assert_eq!(reports(&a), [(7, TfStatus::Incomplete)]);
        assert!(matches!(a.last(), Some(Action::Stopped)));
    }

    fn sinks(complete_on: CompleteOn, in_order: Option<usize>) -> EpnCore<u32> {
        let m = Metrics::new("epn", Some(3));
        let b = Builder::new(3, 2, 1_000_000, 16).with_hand_off();
        let d = Delivery {
            complete_on,
            in_order,
        };
        EpnCore::new(b, None, m).with_delivery(d)
    }

    fn build(c: &mut EpnCore<u32>, tf: TfId) -> Vec<Action<u32>> {
        assign(c, tf, 3);
        stf(c, 0, tf, 0);
        stf(c, 0, tf, 1)
    }

    fn delivered(a: &[Action<u32>]) -> Vec<TfId> {
        a.iter()
            .filter_map(|x| match x {
                Action::Deliver(b) => Some(b.tf),
                _ => None,
            })
            .collect()
    }

    fn verdict(c: &mut EpnCore<u32>, tf: TfId, outcome: Result<(), Reason>) -> Vec<Action<u32>> {
        let stfs = vec![(0, 10), (1, 11)];
        c.handle(0, Input::Delivered { tf, outcome, stfs });
        drain(c)
    }

    #[test]
    fn a_tf_handed_to_sinks_is_reported_when_they_accept_or_fail_it() {
        let mut c = sinks(CompleteOn::Accepted, None);
        let a = build(&mut c, 7);
        assert_eq!(delivered(&a), [7]);
        assert!(reports(&a).is_empty(), "no report before the verdict");
        assert!(
            !a.iter().any(|x| matches!(x, Action::Free(_))),
            "buffers held"
        );
        let a = verdict(&mut c, 7, Ok(()));
        assert_eq!(reports(&a), [(7, TfStatus::Complete)]);
        assert_eq!(a.iter().filter(|x| matches!(x, Action::Free(_))).count(), 2);
        build(&mut c, 8);
        let a = verdict(&mut c, 8, Err(Reason::SinkFailed));
        assert_eq!(reports(&a), [(8, TfStatus::Dropped)]);
    }

    #[test]
    fn complete_on_built_reports_before_the_sinks_and_their_verdict_only_counts() {
        let mut c = sinks(CompleteOn::Built, None);
        assert_eq!(reports(&build(&mut c, 7)), [(7, TfStatus::Complete)]);
        assert!(reports(&verdict(&mut c, 7, Err(Reason::SinkRefused))).is_empty());
    }

    #[test]
    fn stop_waits_for_the_sinks_and_load_reports_count_what_they_hold() {
        let mut c = sinks(CompleteOn::Accepted, None);
        build(&mut c, 7);
        c.handle(1, Input::Control(Message::RunStop { run_id: 1 }));
        assert!(!drain(&mut c).iter().any(|a| matches!(a, Action::Stopped)));
        for t in 0..LOAD_REPORT_TICKS {
            c.handle(t, Input::Tick { free_bytes: 1 });
        }
        let load = Message::LoadReport {
            free_bytes: 1,
            building: 1,
        };
        assert_eq!(drain(&mut c), [Action::ControlLossy(load)]);
        let a = verdict(&mut c, 7, Ok(()));
        assert!(matches!(a.last(), Some(Action::Stopped)), "{a:?}");
    }

    #[test]
    fn in_order_delivery_waits_then_gives_the_oldest_up_by_name() {
        let mut c = sinks(CompleteOn::Accepted, Some(2));
        assign(&mut c, 1, 3);
        stf(&mut c, 0, 1, 0); // TF 1 misses FLP 1's STF
        assert!(delivered(&build(&mut c, 2)).is_empty());
        let a = build(&mut c, 3);
        assert_eq!(reports(&a), [(1, TfStatus::Incomplete)]);
        assert_eq!(delivered(&a), [2, 3]);
        let late = stf(&mut c, 0, 1, 1);
        assert!(matches!(late[..], [Action::Free(1)]), "{late:?}");
        assert_eq!(c.builder().counters.late_stfs, 1);
    }

    /// After a take-over the new ICN assigns again every TF it keeps in flight, TF 1
    /// among them, though it is at the sinks already: it must not hold TF 2 back, nor
    /// the run's stop.
    #[test]
    fn in_order_a_tf_assigned_again_once_built_holds_nothing_back() {
        let mut c = sinks(CompleteOn::Accepted, Some(4));
        assert_eq!(delivered(&build(&mut c, 1)), [1]);
        assign(&mut c, 1, 3);
        assert_eq!(delivered(&build(&mut c, 2)), [2], "TF 2 goes on");
        verdict(&mut c, 1, Ok(()));
        c.handle(1, Input::Control(Message::RunStop { run_id: 1 }));
        drain(&mut c);
        let a = verdict(&mut c, 2, Ok(()));
        assert!(matches!(a.last(), Some(Action::Stopped)), "{a:?}");
    }

    #[test]
    fn what_an_epn_holds_goes_out_in_frames_of_held_batch() {
        let n = fanin_proto::HELD_BATCH;
        let building: Vec<TfId> = (0..2 * n as u64 + 1).collect();
        let reports = vec![TfReport::complete(7, 1, 10)];
        let frames = super::tfs_held(&building, &reports);
        assert_eq!(frames.len(), 3);
        let (mut b, mut r) = (Vec::new(), Vec::new());
        for f in frames {
            let Message::TfsHeld { building, reports } = f else {
                panic!("{f:?}")
            };
            assert!(building.len() <= n && reports.len() <= n);
            b.extend(building);
            r.extend(reports);
        }
        assert_eq!((b, r), (building, reports));
        assert_eq!(
            super::tfs_held(&[], &[]).len(),
            1,
            "one frame when it holds nothing"
        );
    }

    #[test]
    fn an_abandoned_tf_at_the_sinks_or_in_the_order_queue_is_freed_unreported() {
        let mut c = sinks(CompleteOn::Accepted, Some(4));
        assign(&mut c, 1, 3);
        build(&mut c, 2); // held: TF 1 is older and open
        build(&mut c, 3);
        let abandon = |tf_id| Message::Abandon {
            tf_id,
            reason: Reason::FlpBufferFull,
        };
        c.handle(0, Input::Control(abandon(2)));
        let a = drain(&mut c);
        assert_eq!(a.iter().filter(|x| matches!(x, Action::Free(_))).count(), 2);
        c.handle(0, Input::Control(abandon(1))); // 3 may go now
        assert_eq!(delivered(&drain(&mut c)), [3]);
        c.handle(0, Input::Control(abandon(3)));
        assert!(reports(&verdict(&mut c, 3, Ok(()))).is_empty());
        assert_eq!(c.delivering(), 0);
    }

    #[test]
    fn stfs_after_the_stop_are_late_and_the_stop_still_comes() {
        let mut c = sinks(CompleteOn::Accepted, None);
        build(&mut c, 7);
        c.handle(1, Input::Control(Message::RunStop { run_id: 1 }));
        let a = stf(&mut c, 2, 8, 0);
        assert!(matches!(a[..], [Action::Free(0)]), "{a:?}");
        assert_eq!(c.builder().counters.late_stfs, 1);
        assert_eq!(c.builder().building(), 0);
        assert!(matches!(
            verdict(&mut c, 7, Ok(())).last(),
            Some(Action::Stopped)
        ));
    }

    #[test]
    fn tfs_built_while_the_icn_is_away_wait_for_the_run_start_of_the_one_that_took_over() {
        // With sinks: a TF built meanwhile is neither handed on nor reported.
        let mut c = sinks(CompleteOn::Built, None);
        c.handle(0, Input::IcnLost);
        for tf in [7, 8] {
            let a = build(&mut c, tf);
            assert!(delivered(&a).is_empty() && reports(&a).is_empty(), "{a:?}");
        }
        assert_eq!(
            c.held().0,
            [7, 8],
            "told as building to the ICN taking over"
        );
        // The new ICN moved TF 8 elsewhere (or it ended): its STFs are freed, unreported.
        c.handle(
            0,
            Input::Control(Message::Abandon {
                tf_id: 8,
                reason: Reason::EpnLost,
            }),
        );
        let a = drain(&mut c);
        assert_eq!(a.iter().filter(|x| matches!(x, Action::Free(_))).count(), 2);
        assert!(delivered(&a).is_empty() && reports(&a).is_empty(), "{a:?}");
        let start = Message::RunStart {
            run_id: 1,
            elapsed_us: 0,
        };
        c.handle(0, Input::Control(start.clone()));
        let a = drain(&mut c);
        assert_eq!(delivered(&a), [7]);
        assert_eq!(reports(&a), [(7, TfStatus::Complete)]);
        // Build and discard: the complete report waits the same way.
        let (mut c, m) = epn(None);
        c.handle(0, Input::IcnLost);
        assign(&mut c, 9, 3);
        stf(&mut c, 0, 9, 0);
        let a = stf(&mut c, 0, 9, 1);
        assert!(reports(&a).is_empty(), "{a:?}");
        assert_eq!(m.counter("tfs.complete.none"), 0);
        c.handle(0, Input::Control(start));
        assert_eq!(reports(&drain(&mut c)), [(9, TfStatus::Complete)]);
    }

    #[test]
    fn a_run_that_ends_while_the_icn_is_away_frees_what_waited_and_stops() {
        // In order, TF 6 waits for 5 in the order queue; else it is handed on at once.
        for (in_order, freed) in [(None, 4), (Some(16), 6)] {
            let mut c = sinks(CompleteOn::Built, in_order);
            assign(&mut c, 5, 3);
            let a = build(&mut c, 6);
            assert_eq!(delivered(&a).len(), 1 - freed / 6);
            c.handle(0, Input::IcnLost);
            build(&mut c, 7);
            build(&mut c, 8);
            let stop = Message::RunStop { run_id: 1 };
            c.handle(0, Input::Control(stop));
            let mut a = drain(&mut c);
            let frees = a.iter().filter(|x| matches!(x, Action::Free(_))).count();
            assert_eq!(frees, freed, "{a:?}");
            assert!(delivered(&a).is_empty(), "{a:?}");
            if in_order.is_none() {
                // TF 6, at the sinks, still gets its verdict before the stop.
                assert_eq!(c.delivering(), 1);
                a = verdict(&mut c, 6, Ok(()));
            }
            assert!(matches!(a.last(), Some(Action::Stopped)), "{a:?}");
            assert_eq!(c.delivering(), 0);
        }
    }

    #[test]
    fn in_order_delivery_stands_while_the_icn_is_away() {
        let mut c = sinks(CompleteOn::Built, Some(16));
        assign(&mut c, 5, 3);
        let a = build(&mut c, 6);
        assert!(delivered(&a).is_empty(), "6 waits for 5");
        c.handle(0, Input::IcnLost);
        // The ICN taking over moved 5 elsewhere: 6 still waits, for the RunStart.
        c.handle(
            0,
            Input::Control(Message::Abandon {
                tf_id: 5,
                reason: Reason::EpnLost,
            }),
        );
        let a = drain(&mut c);
        assert!(delivered(&a).is_empty() && reports(&a).is_empty(), "{a:?}");
        assert_eq!(c.held().0, [6]);
        let start = Message::RunStart {
            run_id: 1,
            elapsed_us: 0,
        };
        c.handle(0, Input::Control(start));
        let a = drain(&mut c);
        assert_eq!(delivered(&a), [6]);
        assert_eq!(reports(&a), [(6, TfStatus::Complete)]);
    }

    #[test]
    fn the_goat_dies_before_reporting_one_tf_too_many() {
        let (mut c, _) = epn(Some(1));
        for tf in 0..2 {
            assign(&mut c, tf, 3);
        }
        stf(&mut c, 0, 0, 0);
        assert!(!stf(&mut c, 0, 0, 1)
            .iter()
            .any(|a| matches!(a, Action::Die { .. })));
        stf(&mut c, 0, 1, 0);
        let a = stf(&mut c, 0, 1, 1);
        let die = a
            .iter()
            .position(|x| matches!(x, Action::Die { complete: 1 }));
        let report = a.iter().position(|x| matches!(x, Action::Control(_)));
        assert!(die.is_some() && die < report, "{a:?}");
    }
}
