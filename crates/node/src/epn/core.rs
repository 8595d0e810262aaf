//! The EPN's decisions without I/O: the ICN's frames and the STFs that arrived go into
//! the TF builder; TF reports, load reports and freed buffers come out.
//!
//! The tokio shell feeds data-connection events, control frames and 20 ms ticks in, and
//! carries the actions out: frames to the ICN, buffers back to the pool, the goat's death.

use std::collections::VecDeque;
use std::sync::Arc;

use fanin_proto::{Message, Reason, TfStatus};
use fanin_sched::{EpnId, FlpId, TfId};

use super::builder::{Arrival, Builder, Out};
use crate::metrics::Metrics;

/// Ticks (20 ms) between two load reports to the ICN: 100 ms.
pub const LOAD_REPORT_TICKS: u64 = 5;

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
    Lost { tf: TfId, reason: Reason },
    /// A frame from the ICN.
    Control(Message),
    /// 20 ms passed; the build buffer has `free_bytes` free.
    Tick { free_bytes: u64 },
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
}

impl<P> EpnCore<P> {
    pub fn new(builder: Builder<P>, die_after_tfs: Option<u64>, metrics: Arc<Metrics>) -> Self {
        EpnCore {
            me: builder.me(),
            builder,
            complete: 0,
            die_after_tfs,
            ticks: 0,
            metrics,
            scratch: Vec::new(),
            out: VecDeque::new(),
        }
    }

    /// Feeds one input at `now_us` (µs since the run's start at this EPN).
    pub fn handle(&mut self, now_us: u64, input: Input<P>) {
        let mut out = std::mem::take(&mut self.scratch);
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
            Input::Lost { tf, reason } => self.builder.lost_stf(tf, reason, now_us, &mut out),
            Input::Control(m) => self.on_control(m, &mut out),
            Input::Tick { free_bytes } => self.on_tick(now_us, free_bytes, &mut out),
        }
        for o in out.drain(..) {
            self.carry(o);
        }
        self.scratch = out;
        if matches!(self.out.back(), Some(Action::Stopped)) {
            debug_assert_eq!(self.builder.building(), 0, "TFs left at stop");
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
            Message::Assign { tf_id, epn_id } if epn_id == me => self.builder.assigned(tf_id, out),
            Message::Assign { tf_id, epn_id } => {
                tracing::warn!("EPN {me}: ICN sent the assignment of TF {tf_id} to EPN {epn_id}");
                self.metrics.error("foreign_assign");
            }
            Message::Abandon { tf_id, reason } => {
                tracing::debug!("EPN {me}: ICN abandoned TF {tf_id} ({})", reason.name());
                self.builder.abandon(tf_id, out);
            }
            Message::RunStart { run_id } => tracing::info!("EPN {me}: run {run_id} started"),
            Message::RunStop { run_id } => {
                tracing::info!("EPN {me}: run {run_id} stopping");
                self.builder.stop(out);
                for o in out.drain(..) {
                    self.carry(o);
                }
                self.out.push_back(Action::Stopped);
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
            let building = self.builder.building().min(u32::MAX as usize) as u32;
            self.out
                .push_back(Action::ControlLossy(Message::LoadReport {
                    free_bytes,
                    building,
                }));
        }
    }

    fn carry(&mut self, o: Out<P>) {
        match o {
            Out::Report(r) => {
                self.metrics.tf(r.status.name(), r.reason.name());
                if r.status == TfStatus::Complete {
                    self.complete += 1;
                    if self.die_after_tfs.is_some_and(|n| self.complete > n) {
                        // Dies before this report leaves: the goat built n TFs.
                        let complete = self.complete - 1;
                        self.out.push_back(Action::Die { complete });
                    }
                }
                self.out.push_back(Action::Control(Message::TfReport(r)));
            }
            Out::Free(p) => self.out.push_back(Action::Free(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanin_proto::TfReport;

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
