//! The FLP's decisions without I/O: which STF goes to which EPN queue, what the send
//! buffer holds and for how long, what is dropped (and why), what the ICN is told.
//!
//! The tokio shell feeds control frames, finished connects and finished sends in, and
//! carries the actions out: frames to the ICN, STF jobs to a sender task per EPN, data
//! connections to open. Sender tasks only write bytes; every byte count lives here.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use fanin_proto::{EpnEntry, HeldStf, Message, Reason, StfInfo};
use fanin_sched::{EpnId, StfSize, TfId};

use crate::budget::ByteBudget;
use crate::metrics::{Metrics, StfCounter};

/// STFs queued per EPN connection at most (besides the byte limit).
pub const QUEUE_PER_EPN: usize = 4096;

/// Most STFs kept for a re-send at once (besides the byte limit, which zero-byte STFs
/// would not reach).
const MAX_KEPT: usize = 1 << 20;

/// STFs announced in one frame at most (16 bytes each, well inside a control frame).
pub const ANNOUNCE_BATCH: usize = 1024;

/// One STF for a sender task to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StfJob {
    pub tf: TfId,
    pub epn: EpnId,
    pub len: u64,
    /// Which connection to the EPN the job was queued for (a restarted EPN gets a new
    /// one; what the old one hands back does not count against the new queue).
    pub queue: u64,
}

/// What happens to the FLP once the run's parameters are known.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A frame from the ICN.
    Control(Message),
    /// A data connection to an EPN (announced mid-run) was set up, or could not be.
    Connected { epn: EpnId, ok: bool },
    /// A sender task finished with a job: written (`ok`), or its connection failed.
    Sent { job: StfJob, ok: bool },
    /// Time for a heartbeat (every 100 ms).
    Heartbeat,
    /// On-data: the source produced an STF (the shell asked `has_room` first).
    Produced(StfInfo),
    /// On-data: announce what was produced since the last flush.
    Flush,
    /// On-data: the source ended (`ok`) or failed: announce the rest, then tell the ICN.
    SourceEnded { ok: bool, detail: String },
    /// The run goes on no more here (its ICN was lost and no take-over resumed it, or it
    /// stopped during one), and every send has ended. `over`: the run is over (ended, or
    /// another run answered), not joined afresh.
    RunLost { over: bool },
}

/// What the FLP asks its shell to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A frame to the ICN.
    Control(Message),
    /// A frame to the ICN that may be skipped when its queue is full (heartbeats).
    ControlLossy(Message),
    /// Hand an STF to the sender of its EPN.
    Queue(StfJob),
    /// Open a data connection to an EPN that joined mid-run (answer with `Connected`).
    Connect(EpnEntry),
    /// The run stopped: flush the senders, say goodbye, leave.
    Stop,
    /// On-data: the STF's TF is over and no send uses it: give it back to the source.
    Free(TfId),
    /// On-data: the run scheduled the STF's TF; the source notes it (a ring, in the slot).
    Scheduled(TfId),
}

/// An STF the FLP holds (sent or queued and, with `retain`, kept until released).
#[derive(Debug, Clone, Copy)]
struct Kept {
    len: u64,
    /// The queue (an EPN's connection) it was last queued on, if any, and its EPN.
    queue: Option<u64>,
    epn: Option<EpnId>,
    /// Sends of it in progress.
    sending: u32,
    /// The ICN released its TF: freed once no send uses it.
    released: bool,
    /// The ICN assigned its TF (to an EPN, which may have refused it).
    scheduled: bool,
}

/// One EPN's queue: its share of the send buffer and the STFs in it.
struct Queue {
    id: u64,
    bytes: ByteBudget,
    jobs: usize,
    /// Its connection failed: nothing more is written (STFs kept or dropped).
    failed: bool,
}

/// The most of the send buffer one EPN's queue may hold: half of it with two EPNs or
/// more, so one that stops reading cannot starve the rest (an unthrottled ICN keeps
/// fewer TFs in flight than this holds). On-data, an STF's bytes are held from
/// production on: a queue adds none, so it needs no share of its own (and a source's
/// STF may be larger than half).
pub fn epn_share(send_buffer: u64, stf_max: u64, epns: usize, on_data: bool) -> u64 {
    match epns >= 2 && !on_data {
        true => (send_buffer / 2).max(stf_max),
        false => send_buffer,
    }
}

/// The FLP of one run.
pub struct FlpCore {
    me: u32,
    size: StfSize,
    seed: u64,
    retain: bool,
    /// The send buffer: bytes queued for the network and, with `retain`, kept until the
    /// ICN releases their TF.
    budget: ByteBudget,
    /// No single EPN may hold more than this share (one that stops reading cannot starve
    /// the others).
    share: u64,
    queues: HashMap<EpnId, Queue>,
    next_queue: u64,
    /// Zero-loss mode and on-data: STFs held until the ICN releases their TF.
    kept: HashMap<TfId, Kept>,
    /// On-data: the source's STFs are the payloads (held from production to release).
    on_data: bool,
    announce: Vec<StfInfo>,
    /// On-data: the source waits for room in the send buffer.
    held: bool,
    /// Pull mode: tell the ICN when each send ended (its transfer tokens go on).
    pull: bool,
    metrics: Arc<Metrics>,
    /// STFs sent whole and their bytes, counted once per STF.
    sent: StfCounter,
    out: VecDeque<Action>,
}

impl FlpCore {
    /// The FLP of a run with these parameters, connected to `epns` at the start.
    pub fn new(
        me: u32,
        (size, seed, retain, on_data): (StfSize, u64, bool, bool),
        send_buffer: u64,
        epns: &[EpnId],
        metrics: Arc<Metrics>,
    ) -> FlpCore {
        metrics.set_buffer("flp_send", 0, send_buffer);
        let mut core = FlpCore {
            me,
            size,
            seed,
            retain: retain || on_data,
            budget: ByteBudget::new(send_buffer),
            share: send_buffer, // one EPN's; each queue opened sets it (`open_queue`)
            queues: HashMap::new(),
            next_queue: 0,
            kept: HashMap::new(),
            on_data,
            announce: Vec::new(),
            held: false,
            pull: false,
            sent: metrics.stf_counter("sent", "sent"),
            metrics,
            out: VecDeque::new(),
        };
        for &e in epns {
            core.open_queue(e);
        }
        core
    }

    /// Pull mode: each ended send is reported to the ICN (`StfSent`).
    pub fn with_pull(mut self, pull: bool) -> FlpCore {
        self.pull = pull;
        self
    }

    /// Feeds one input.
    pub fn handle(&mut self, input: Input) {
        match input {
            Input::Control(m) => self.on_control(m),
            Input::Connected { epn, ok } => {
                if ok {
                    // Replaces the queue of an earlier incarnation of this EPN.
                    self.open_queue(epn);
                } else {
                    self.metrics.error("epn_unreachable");
                }
                self.send(Message::EpnReachable { epn_id: epn, ok });
            }
            Input::Sent { job, ok } => self.on_sent(job, ok),
            Input::Heartbeat => {
                let free = self.budget.limit().saturating_sub(self.budget.used());
                self.out
                    .push_back(Action::ControlLossy(Message::LoadReport {
                        free_bytes: free,
                        building: self.kept.len().min(u32::MAX as usize) as u32,
                    }));
            }
            Input::Produced(stf) => self.produced(stf),
            Input::Flush => self.flush_announce(),
            Input::SourceEnded { ok, detail } => {
                self.flush_announce();
                self.send(Message::SourceEnded { ok, detail });
            }
            Input::RunLost { over } => self.run_lost(over),
        }
        debug_assert!(self.budget.used() <= self.budget.limit());
        debug_assert!(
            !self.retain || self.kept.values().map(|k| k.len).sum::<u64>() <= self.budget.used()
        );
    }

    /// The send buffer's limit: no source STF larger can ever be taken.
    pub fn limit(&self) -> u64 {
        self.budget.limit()
    }

    /// Bytes the send buffer can take for a source's next STF (0 at the count limit;
    /// with 0, no STF fits, not even an empty one).
    pub fn room(&self) -> u64 {
        if self.kept.len() >= MAX_KEPT {
            return 0;
        }
        self.budget.limit().saturating_sub(self.budget.used())
    }

    /// The largest STF of the run's `stf_size`: what its EPNs accept.
    pub fn stf_max(&self) -> u64 {
        self.size.max()
    }

    /// On-data: can the send buffer take an STF of `size` bytes now? When it cannot,
    /// the source is held back (visibly: a level and a count per hold), never dropped.
    pub fn has_room(&mut self, size: u64) -> bool {
        let free = self.room();
        let room = free > 0 && size <= free;
        if !room && !self.held {
            self.metrics.stf("held", Reason::FlpBufferFull.name(), 1);
        }
        self.held = !room;
        self.metrics.set_level("source_held", u64::from(self.held));
        room
    }

    fn produced(&mut self, stf: StfInfo) {
        assert!(self.on_data, "an STF produced by a source in a timer run");
        let fresh = !self.kept.contains_key(&stf.tf_id);
        assert!(
            fresh,
            "TF {} produced twice (sources check their ids)",
            stf.tf_id
        );
        assert!(self.budget.try_reserve(stf.size), "produced without room");
        self.kept.insert(stf.tf_id, Kept::new(stf.size, None));
        self.metrics.stf("produced", "", 1);
        self.publish();
        self.announce.push(stf);
        if self.announce.len() >= ANNOUNCE_BATCH {
            self.flush_announce();
        }
    }

    fn flush_announce(&mut self) {
        if !self.announce.is_empty() {
            let list = std::mem::take(&mut self.announce);
            self.send(Message::StfAnnounce(list));
        }
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// What this FLP holds, for an ICN taking over the run: every STF kept (released
    /// ones whose send still runs left out), oldest first, with the EPN it went to.
    pub fn held(&self) -> Vec<HeldStf> {
        let mut held: Vec<HeldStf> = self
            .kept
            .iter()
            .filter(|(_, k)| !k.released)
            .map(|(&tf_id, k)| HeldStf {
                tf_id,
                size: k.len,
                epn: k.epn,
            })
            .collect();
        held.sort_unstable_by_key(|h| h.tf_id);
        held
    }

    /// Is the data connection to `epn` up (a queue whose writes did not fail)?
    pub fn reaches(&self, epn: EpnId) -> bool {
        self.queues.get(&epn).is_some_and(|q| !q.failed)
    }

    /// A new data connection to `epn` (an ICN that took over listed it, and the old one
    /// had failed or never was): it gets a queue of its own.
    pub fn connected_anew(&mut self, epn: EpnId) {
        self.open_queue(epn);
    }

    /// Bytes in the send buffer.
    pub fn buffered(&self) -> u64 {
        self.budget.used()
    }

    fn open_queue(&mut self, epn: EpnId) {
        // An FLP that started with one EPN shares its buffer once a second one joins.
        let epns = self.queues.len() + usize::from(!self.queues.contains_key(&epn));
        let share = epn_share(self.budget.limit(), self.size.max(), epns, self.on_data);
        if share != self.share {
            self.share = share;
            for q in self.queues.values_mut() {
                q.bytes.set_limit(share);
            }
        }
        self.next_queue += 1;
        let q = Queue {
            id: self.next_queue,
            bytes: ByteBudget::new(self.share),
            jobs: 0,
            failed: false,
        };
        self.queues.insert(epn, q);
    }

    fn send(&mut self, m: Message) {
        self.out.push_back(Action::Control(m));
    }

    fn on_control(&mut self, m: Message) {
        match m {
            Message::Assign { tf_id, epn_id } => self.on_assign(tf_id, epn_id),
            Message::Release { tf_id } => {
                if let Some(k) = self.kept.get_mut(&tf_id) {
                    k.released = true;
                    self.maybe_free(tf_id);
                }
            }
            // EPNs joining mid-run (or restarted): connect in the background.
            Message::EpnList(list) => self.out.extend(list.into_iter().map(Action::Connect)),
            Message::RunStart { .. } => {}
            Message::RunState { state, run_number } => {
                self.metrics.set_run_state(state, run_number)
            }
            Message::RunStop { .. } => self.run_stopped(),
            other => {
                tracing::warn!(
                    "FLP {}: unexpected {:?} from the ICN",
                    self.me,
                    other.msg_type()
                );
                self.metrics.error("unexpected_message");
            }
        }
    }

    /// RunStop: an STF the run scheduled is over with it (its TF ended in this run, built
    /// or not, and must not be announced into the next), so the source gets it back once
    /// no send uses it; one whose TF was never released is counted `freed` `run_stopped`
    /// (the ICN counted its TF's fate; this says the source got it back without a Release).
    /// An STF never scheduled stays with its source (a ring's slot stays READY).
    fn run_stopped(&mut self) {
        let unreleased = self.end_run(true, true);
        if unreleased > 0 {
            let me = self.me;
            tracing::warn!("FLP {me}: the run stopped before the ICN released the TFs of {unreleased} scheduled STFs: freed (run_stopped), never announced into another run");
            self.metrics
                .stf("freed", Reason::RunStopped.name(), unreleased);
        }
        self.out.push_back(Action::Stop);
    }

    /// A lost run's STFs: a released one is freed now that its sends ended. If the run
    /// is over, so is every one it scheduled, counted dropped `icn_lost`: whether its TF
    /// was built went with the ICN, and it must not be announced into another run.
    /// On-data, the source gets them back. STFs never scheduled stay with the source, as
    /// at RunStop; a run joined afresh hears every unreleased one again.
    fn run_lost(&mut self, over: bool) {
        let lost = self.end_run(over, false);
        if lost > 0 {
            let me = self.me;
            tracing::warn!("FLP {me}: its run is over while the ICN was away: {lost} STFs of TFs it scheduled are dropped (icn_lost), never announced into another run");
            self.metrics.stf("dropped", Reason::IcnLost.name(), lost);
        }
    }

    /// The run ends here: every STF kept leaves the send buffer, and the released ones
    /// go back to the source (on-data), with those it scheduled if `scheduled_too`; with
    /// `wait_for_sends`, one still being sent stays until its send ends. How many
    /// scheduled STFs went back without a Release.
    fn end_run(&mut self, scheduled_too: bool, wait_for_sends: bool) -> u64 {
        let mut unreleased = 0;
        for k in (self.kept.values_mut()).filter(|k| scheduled_too && k.scheduled && !k.released) {
            k.released = true;
            unreleased += 1;
        }
        let mut over: Vec<TfId> = Vec::new();
        for (tf, k) in std::mem::take(&mut self.kept) {
            if k.released && wait_for_sends && k.sending > 0 {
                self.kept.insert(tf, k); // freed when its send ends
                continue;
            }
            if k.released {
                over.push(tf);
            }
            self.budget.release(k.len);
        }
        debug_assert!(self.kept.values().all(|k| k.released && k.sending > 0));
        over.sort_unstable();
        if self.on_data {
            self.out.extend(over.into_iter().map(Action::Free));
        }
        self.publish();
        self.announce.clear();
        unreleased
    }

    /// Counts a dropped STF and tells the ICN why.
    fn dropped(&mut self, tf: TfId, reason: Reason) {
        self.metrics.stf("dropped", reason.name(), 1);
        let flp_id = self.me;
        self.send(Message::StfDropped {
            tf_id: tf,
            flp_id,
            reason,
        });
    }

    fn on_assign(&mut self, tf: TfId, epn: EpnId) {
        let queue = self.queues.get(&epn).map(|q| q.id);
        let kept = self.kept.get_mut(&tf).map(|k| {
            let first = !k.scheduled;
            k.scheduled = true;
            (*k, first)
        });
        if kept.is_some_and(|(_, first)| first) && self.on_data {
            self.out.push_back(Action::Scheduled(tf));
        }
        let kept = kept.map(|(k, _)| k);
        match kept {
            // Assigned again to the same connection (a late or repeated announcement).
            // Pull mode: its transfer ends now, unless a send of it is still under way
            // (that one's end is reported).
            Some(k) if k.queue.is_some() && k.queue == queue => {
                if k.sending == 0 {
                    self.transfer_ended(tf, epn);
                }
            }
            // Produced, not sent yet (on-data).
            Some(k) if k.queue.is_none() => self.first_send(tf, epn, k.len),
            // A TF already sent: its EPN died and the ICN moved it.
            Some(k) => {
                if !self.resend(tf, epn, k.len) && !self.on_data {
                    // Dropped: freed once no send of it is under way (a send's end
                    // finds its entry, and a later Assign finds it too).
                    self.kept.get_mut(&tf).expect("kept").released = true;
                    self.maybe_free(tf);
                }
            }
            None if self.on_data => {
                self.metrics.stf("not_held", "", 1);
                self.transfer_ended(tf, epn);
            }
            None => self.enqueue(tf, epn),
        }
    }

    /// Pull mode: the transfer of `tf`'s STF to `epn` ended (its send ended, or the FLP
    /// sends nothing for it: it went on this connection before, or is not here), so
    /// the ICN hands its tokens on.
    fn transfer_ended(&mut self, tf: TfId, epn: EpnId) {
        if self.pull {
            self.metrics.stf("transfer_ended", "", 1);
            self.send(Message::StfSent {
                tf_id: tf,
                epn_id: epn,
            });
        }
    }

    /// On-data: the first send of a produced STF (its bytes are in the buffer already;
    /// a refusal is reported, and the STF stays until its TF is released).
    fn first_send(&mut self, tf: TfId, epn: EpnId, n: u64) {
        let Some(q) = self.queues.get(&epn) else {
            self.metrics.error("unknown_epn");
            return self.dropped(tf, Reason::SendFailed);
        };
        if q.jobs >= QUEUE_PER_EPN || !q.bytes.try_reserve(n) {
            return self.dropped(tf, Reason::FlpQueueFull);
        }
        self.queue(tf, epn, n);
    }

    /// Frees a released STF once no send uses it.
    fn maybe_free(&mut self, tf: TfId) {
        let Some(k) = self.kept.get(&tf).copied() else {
            return;
        };
        if k.released && k.sending == 0 {
            self.kept.remove(&tf);
            self.budget.release(k.len);
            self.publish();
            if self.on_data {
                self.out.push_back(Action::Free(tf));
            }
        }
    }

    /// Puts the STF of `tf` in the queue of `epn`, or drops it with the reason.
    fn enqueue(&mut self, tf: TfId, epn: EpnId) {
        let n = self.size.sample(self.seed, self.me, tf);
        let Some(q) = self.queues.get(&epn) else {
            tracing::warn!("FLP {}: TF {tf} assigned to unknown EPN {epn}", self.me);
            self.metrics.error("unknown_epn");
            return self.dropped(tf, Reason::SendFailed);
        };
        if q.jobs >= QUEUE_PER_EPN {
            return self.dropped(tf, Reason::FlpQueueFull);
        }
        if self.kept.len() >= MAX_KEPT || !self.budget.try_reserve(n) {
            return self.dropped(tf, Reason::FlpBufferFull);
        }
        if !q.bytes.try_reserve(n) {
            self.budget.release(n);
            return self.dropped(tf, Reason::FlpQueueFull);
        }
        self.publish();
        if self.retain {
            let scheduled = true; // it is queued for its Assign
            self.kept.insert(
                tf,
                Kept {
                    scheduled,
                    ..Kept::new(n, None)
                },
            );
        }
        self.queue(tf, epn, n);
    }

    /// Re-sends a kept STF (its bytes are already in the send buffer) to the EPN that
    /// took over its TF. Returns false (and reports the drop) when it cannot be queued.
    fn resend(&mut self, tf: TfId, epn: EpnId, n: u64) -> bool {
        let Some(q) = self.queues.get(&epn) else {
            self.metrics.error("unknown_epn");
            self.dropped(tf, Reason::SendFailed);
            return false;
        };
        if q.jobs >= QUEUE_PER_EPN || !q.bytes.try_reserve(n) {
            self.dropped(tf, Reason::FlpQueueFull);
            return false;
        }
        self.metrics.stf("resent", "epn_lost", 1);
        self.queue(tf, epn, n);
        true
    }

    fn queue(&mut self, tf: TfId, epn: EpnId, len: u64) {
        let q = self.queues.get_mut(&epn).expect("queue checked");
        q.jobs += 1;
        debug_assert!(q.jobs <= QUEUE_PER_EPN);
        let queue = q.id;
        if let Some(k) = self.kept.get_mut(&tf) {
            k.queue = Some(queue);
            k.epn = Some(epn);
            k.sending += 1;
        }
        self.out.push_back(Action::Queue(StfJob {
            tf,
            epn,
            len,
            queue,
        }));
    }

    /// A sender finished a job (or could not write it).
    fn on_sent(&mut self, job: StfJob, ok: bool) {
        if !ok {
            // Sent whole, the EPN reports its arrival; a failed send ends here.
            self.transfer_ended(job.tf, job.epn);
        }
        if !self.retain {
            self.budget.release(job.len);
        }
        if let Some(k) = self.kept.get_mut(&job.tf) {
            debug_assert!(
                k.sending > 0,
                "TF {}: a send ended that was not counted",
                job.tf
            );
            k.sending = k.sending.saturating_sub(1);
        }
        self.maybe_free(job.tf);
        let first_failure = match self.queues.get_mut(&job.epn) {
            Some(q) if q.id == job.queue => {
                q.bytes.release(job.len);
                q.jobs -= 1;
                let first = !ok && !q.failed;
                q.failed |= !ok;
                first
            }
            _ => false,
        };
        self.publish();
        if ok {
            self.metrics.count_stf(&self.sent, job.len);
            return;
        }
        if first_failure {
            self.metrics.error("send_failed");
        }
        match self.retain {
            false => self.dropped(job.tf, Reason::SendFailed),
            true => self.metrics.stf("kept", "send_failed", 1),
        }
        if first_failure {
            // Tell the ICN, which takes the EPN out of the schedule (and moves its TFs,
            // whose STFs are kept here when it re-assigns) until it joins again and
            // every FLP connects afresh: later TFs do not go down a dead connection.
            self.send(Message::EpnReachable {
                epn_id: job.epn,
                ok: false,
            });
        }
    }

    fn publish(&self) {
        self.metrics
            .set_buffer("flp_send", self.budget.used(), self.budget.limit());
    }
}

impl Kept {
    fn new(len: u64, queue: Option<u64>) -> Kept {
        Kept {
            len,
            queue,
            epn: None,
            sending: 0,
            released: false,
            scheduled: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    /// An FLP with 1 KiB STFs, a send buffer of `buffer` bytes, EPNs 0 and 1.
    fn flp(retain: bool, buffer: u64) -> (FlpCore, Arc<Metrics>) {
        let m = Metrics::new("flp", Some(0));
        let size = StfSize::Fixed(KIB);
        let core = FlpCore::new(0, (size, 1, retain, false), buffer, &[0, 1], m.clone());
        (core, m)
    }

    fn drain(c: &mut FlpCore) -> Vec<Action> {
        std::iter::from_fn(|| c.poll_action()).collect()
    }

    fn assign(c: &mut FlpCore, tf: TfId, epn: EpnId) -> Vec<Action> {
        c.handle(Input::Control(Message::Assign {
            tf_id: tf,
            epn_id: epn,
        }));
        drain(c)
    }

    /// The one job among `a` (an on-data STF's first Assign also marks it scheduled).
    fn job(a: &[Action]) -> StfJob {
        let rest: Vec<&Action> = (a.iter())
            .filter(|x| !matches!(x, Action::Scheduled(_)))
            .collect();
        match rest[..] {
            [Action::Queue(j)] => *j,
            ref other => panic!("expected one job, got {other:?}"),
        }
    }

    fn dropped(a: &[Action]) -> Option<Reason> {
        a.iter().find_map(|x| match x {
            Action::Control(Message::StfDropped { reason, .. }) => Some(*reason),
            _ => None,
        })
    }

    #[test]
    fn an_assignment_queues_the_stf_for_its_epn() {
        let (mut c, _) = flp(false, 64 * KIB);
        let j = job(&assign(&mut c, 5, 1));
        assert_eq!((j.tf, j.epn, j.len), (5, 1, KIB));
        assert_eq!(c.buffered(), KIB);
        c.handle(Input::Sent { job: j, ok: true });
        assert_eq!(c.buffered(), 0, "sent and not kept: freed");
    }

    #[test]
    fn pull_mode_reports_a_transfer_that_ends_without_arriving_and_no_other() {
        let (c, _) = flp(true, 64 * KIB);
        let mut c = c.with_pull(true);
        let sent_word = |a: &[Action]| {
            a.iter()
                .filter(|x| matches!(x, Action::Control(Message::StfSent { .. })))
                .count()
        };
        let j = job(&assign(&mut c, 1, 0));
        // Assigned again to the same connection while the send is under way: the send's
        // end is reported, not this.
        assert_eq!(sent_word(&assign(&mut c, 1, 0)), 0);
        c.handle(Input::Sent { job: j, ok: true });
        assert_eq!(sent_word(&drain(&mut c)), 0, "the EPN reports an arrival");
        // Again after the send: nothing to send, the transfer ends now.
        assert_eq!(sent_word(&assign(&mut c, 1, 0)), 1);
        let j = job(&assign(&mut c, 2, 1));
        c.handle(Input::Sent { job: j, ok: false });
        let a = drain(&mut c);
        assert!(a.contains(&Action::Control(Message::StfSent {
            tf_id: 2,
            epn_id: 1
        })));
    }

    #[test]
    fn kept_stfs_stay_until_release() {
        let (mut c, _) = flp(true, 64 * KIB);
        let j = job(&assign(&mut c, 5, 1));
        c.handle(Input::Sent { job: j, ok: true });
        assert_eq!(c.buffered(), KIB, "kept for a re-send");
        c.handle(Input::Control(Message::Release { tf_id: 5 }));
        assert_eq!(c.buffered(), 0);
    }

    #[test]
    fn a_moved_tf_is_sent_again_from_the_kept_bytes() {
        let (mut c, m) = flp(true, 64 * KIB);
        let j = job(&assign(&mut c, 5, 0));
        c.handle(Input::Sent { job: j, ok: true });
        let again = job(&assign(&mut c, 5, 1));
        assert_eq!((again.epn, again.len), (1, KIB));
        assert_eq!(c.buffered(), KIB, "the same bytes, not reserved twice");
        assert_eq!(m.counter("stfs.resent.epn_lost"), 1);
    }

    #[test]
    fn a_full_send_buffer_drops_with_its_reason() {
        let (mut c, m) = flp(true, 2 * KIB);
        job(&assign(&mut c, 0, 0));
        job(&assign(&mut c, 1, 1));
        let a = assign(&mut c, 2, 0);
        assert_eq!(dropped(&a), Some(Reason::FlpBufferFull));
        assert_eq!(m.counter("stfs.dropped.flp_buffer_full"), 1);
    }

    #[test]
    fn one_epn_cannot_take_more_than_its_share() {
        let (mut c, _) = flp(false, 4 * KIB);
        job(&assign(&mut c, 0, 0));
        epn0_stops_at_half(&mut c, "half the buffer each");
    }

    #[test]
    fn an_flp_that_started_with_one_epn_shares_its_buffer_once_another_joins() {
        let m = Metrics::new("flp", Some(0));
        let size = StfSize::Fixed(KIB);
        let mut c = FlpCore::new(0, (size, 1, false, false), 4 * KIB, &[0], m.clone());
        job(&assign(&mut c, 0, 0));
        c.handle(Input::Connected { epn: 1, ok: true });
        drain(&mut c);
        epn0_stops_at_half(&mut c, "as if both had been there from the start");
    }

    /// EPN 0 holds TF 0's STF: TF 1's fits its half of the 4 KiB buffer, TF 2's is
    /// dropped, and EPN 1 still has room for TF 3's.
    fn epn0_stops_at_half(c: &mut FlpCore, why: &str) {
        job(&assign(c, 1, 0));
        assert_eq!(
            dropped(&assign(c, 2, 0)),
            Some(Reason::FlpQueueFull),
            "{why}"
        );
        job(&assign(c, 3, 1));
    }

    #[test]
    fn an_unknown_epn_is_a_send_failure() {
        let (mut c, m) = flp(false, 4 * KIB);
        let a = assign(&mut c, 0, 9);
        assert_eq!(dropped(&a), Some(Reason::SendFailed));
        assert_eq!(m.counter("errors.unknown_epn"), 1);
    }

    #[test]
    fn a_failed_connection_is_reported_once_and_keeps_the_stfs() {
        let (mut c, m) = flp(true, 64 * KIB);
        let j1 = job(&assign(&mut c, 0, 1));
        let j2 = job(&assign(&mut c, 1, 1));
        c.handle(Input::Sent { job: j1, ok: false });
        c.handle(Input::Sent { job: j2, ok: false });
        let a = drain(&mut c);
        let unreachable = a
            .iter()
            .filter(|x| matches!(x, Action::Control(Message::EpnReachable { ok: false, .. })))
            .count();
        assert_eq!(unreachable, 1);
        assert_eq!(dropped(&a), None, "kept, not dropped");
        assert_eq!(c.buffered(), 2 * KIB);
        assert_eq!(m.counter("stfs.kept.send_failed"), 2);
    }

    #[test]
    fn without_retain_a_failed_send_is_a_drop_and_reported() {
        let (mut c, _) = flp(false, 64 * KIB);
        let j = job(&assign(&mut c, 0, 1));
        c.handle(Input::Sent { job: j, ok: false });
        let a = drain(&mut c);
        assert_eq!(dropped(&a), Some(Reason::SendFailed));
        assert_eq!(c.buffered(), 0);
        // After the drop (its reason is the precise one), the ICN hears of the EPN.
        let unreachable = Action::Control(Message::EpnReachable {
            epn_id: 1,
            ok: false,
        });
        let at = |x: &Action| a.iter().position(|y| y == x);
        let drop_at = a
            .iter()
            .position(|x| matches!(x, Action::Control(Message::StfDropped { .. })));
        assert!(at(&unreachable) > drop_at, "{a:?}");
    }

    #[test]
    fn an_stf_dropped_while_its_send_is_under_way_is_freed_after_the_send() {
        let (mut c, _) = flp(true, 64 * KIB);
        let first = job(&assign(&mut c, 0, 0));
        // Moved to an EPN it cannot send to: dropped, but still being sent to EPN 0.
        assert_eq!(dropped(&assign(&mut c, 0, 9)), Some(Reason::SendFailed));
        assert_eq!(c.buffered(), KIB, "its send still reads it");
        // Moved again: sent from the same bytes.
        let again = job(&assign(&mut c, 0, 1));
        c.handle(Input::Sent {
            job: first,
            ok: false,
        });
        c.handle(Input::Sent {
            job: again,
            ok: true,
        });
        drain(&mut c);
        assert_eq!(c.buffered(), 0, "freed after its last send");
    }

    #[test]
    fn a_restarted_epn_gets_a_fresh_queue() {
        let (mut c, _) = flp(false, 4 * KIB);
        let old = job(&assign(&mut c, 0, 1));
        c.handle(Input::Connected { epn: 1, ok: true });
        let a = drain(&mut c);
        assert!(a.contains(&Action::Control(Message::EpnReachable {
            epn_id: 1,
            ok: true
        })));
        job(&assign(&mut c, 1, 1));
        // The old connection hands its job back: it does not free the new queue.
        c.handle(Input::Sent {
            job: old,
            ok: false,
        });
        drain(&mut c);
        job(&assign(&mut c, 2, 1));
        let a = assign(&mut c, 3, 1);
        assert_eq!(
            dropped(&a),
            Some(Reason::FlpQueueFull),
            "2 KiB share, 2 KiB queued"
        );
    }

    #[test]
    fn run_stop_frees_everything_kept_and_stops() {
        let (mut c, _) = flp(true, 64 * KIB);
        let j = job(&assign(&mut c, 0, 0));
        c.handle(Input::Sent { job: j, ok: true });
        c.handle(Input::Control(Message::RunStop { run_id: 1 }));
        assert_eq!(drain(&mut c), [Action::Stop]);
        assert_eq!(c.buffered(), 0);
    }

    #[test]
    fn heartbeats_report_free_buffer_and_kept_stfs() {
        let (mut c, _) = flp(true, 64 * KIB);
        job(&assign(&mut c, 0, 0));
        c.handle(Input::Heartbeat);
        let expect = Message::LoadReport {
            free_bytes: 63 * KIB,
            building: 1,
        };
        assert_eq!(drain(&mut c), [Action::ControlLossy(expect)]);
    }

    /// An on-data FLP (its source's STFs), EPNs 0 and 1.
    fn on_data(buffer: u64) -> (FlpCore, Arc<Metrics>) {
        let m = Metrics::new("flp", Some(0));
        let size = StfSize::Fixed(KIB);
        let core = FlpCore::new(0, (size, 1, false, true), buffer, &[0, 1], m.clone());
        (core, m)
    }

    fn produce(c: &mut FlpCore, tf: TfId, size: u64) {
        assert!(c.has_room(size));
        c.handle(Input::Produced(StfInfo { tf_id: tf, size }));
    }

    #[test]
    fn produced_stfs_are_announced_in_one_frame_and_sent_when_assigned() {
        let (mut c, _) = on_data(64 * KIB);
        produce(&mut c, 3, 100);
        produce(&mut c, 4, 200);
        assert!(drain(&mut c).is_empty(), "announced on flush");
        c.handle(Input::Flush);
        let want = vec![
            StfInfo {
                tf_id: 3,
                size: 100,
            },
            StfInfo {
                tf_id: 4,
                size: 200,
            },
        ];
        assert_eq!(drain(&mut c), [Action::Control(Message::StfAnnounce(want))]);
        assert_eq!(c.buffered(), 300, "held from production");
        let a = assign(&mut c, 4, 1);
        assert_eq!(a[0], Action::Scheduled(4), "the source notes it first");
        let j = job(&a);
        assert_eq!((j.tf, j.len), (4, 200));
        assert!(
            assign(&mut c, 4, 1).is_empty(),
            "the same assignment again: nothing (noted once)"
        );
        assert!(
            assign(&mut c, 9, 1).is_empty(),
            "a TF it does not hold: nothing"
        );
    }

    #[test]
    fn a_full_buffer_holds_the_source_back_visibly_and_a_release_frees_it() {
        let (mut c, m) = on_data(2 * KIB);
        produce(&mut c, 0, 2 * KIB);
        assert!(!c.has_room(1));
        assert!(!c.has_room(1));
        assert_eq!(m.counter("stfs.held.flp_buffer_full"), 1, "once per hold");
        let j = job(&assign(&mut c, 0, 0));
        c.handle(Input::Control(Message::Release { tf_id: 0 }));
        assert!(
            drain(&mut c).is_empty(),
            "a send still uses it: not freed yet"
        );
        c.handle(Input::Sent { job: j, ok: true });
        assert_eq!(drain(&mut c), [Action::Free(0)]);
        assert!(c.has_room(2 * KIB));
    }

    #[test]
    fn an_on_data_stf_whose_epn_died_is_sent_again_and_freed_only_on_release() {
        let (mut c, _) = on_data(64 * KIB);
        produce(&mut c, 0, KIB);
        let j = job(&assign(&mut c, 0, 0));
        c.handle(Input::Sent { job: j, ok: false });
        drain(&mut c);
        let again = job(&assign(&mut c, 0, 1));
        assert_eq!(again.epn, 1);
        c.handle(Input::Sent {
            job: again,
            ok: true,
        });
        assert!(drain(&mut c).is_empty());
        c.handle(Input::Control(Message::Release { tf_id: 0 }));
        assert_eq!(drain(&mut c), [Action::Free(0)]);
        assert_eq!(c.buffered(), 0);
    }

    #[test]
    fn at_run_stop_an_stf_released_while_its_send_ends_is_freed_after_the_send() {
        let (mut c, _) = on_data(64 * KIB);
        produce(&mut c, 0, KIB);
        produce(&mut c, 1, KIB);
        let j = job(&assign(&mut c, 0, 0));
        c.handle(Input::Control(Message::Release { tf_id: 0 }));
        c.handle(Input::Control(Message::RunStop { run_id: 1 }));
        assert_eq!(drain(&mut c), [Action::Stop], "TF 1 stays with its source");
        c.handle(Input::Sent { job: j, ok: true });
        assert_eq!(drain(&mut c), [Action::Free(0)]);
        assert_eq!(c.buffered(), 0);
    }

    #[test]
    fn at_run_stop_an_stf_the_run_scheduled_goes_back_to_its_source() {
        let (mut c, m) = on_data(64 * KIB);
        for tf in 0..4 {
            produce(&mut c, tf, KIB);
        }
        let sent = job(&assign(&mut c, 0, 0));
        c.handle(Input::Sent {
            job: sent,
            ok: true,
        });
        let sending = job(&assign(&mut c, 1, 0));
        let failed = job(&assign(&mut c, 2, 0));
        c.handle(Input::Sent {
            job: failed,
            ok: false,
        });
        drain(&mut c);
        c.handle(Input::Control(Message::RunStop { run_id: 1 }));
        assert_eq!(
            drain(&mut c),
            [Action::Free(0), Action::Free(2), Action::Stop],
            "TF 3 was never scheduled: it stays with its source"
        );
        assert_eq!(m.counter("stfs.freed.run_stopped"), 3);
        c.handle(Input::Sent {
            job: sending,
            ok: true,
        });
        assert_eq!(drain(&mut c), [Action::Free(1)], "once its send ended");
        assert_eq!(c.buffered(), 0);
    }

    #[test]
    fn an_empty_stf_does_not_fit_a_full_buffer() {
        let (mut c, _) = on_data(KIB);
        produce(&mut c, 0, KIB);
        assert_eq!(c.room(), 0);
        assert!(!c.has_room(0));
    }

    #[test]
    fn an_epn_list_mid_run_asks_for_connections() {
        let (mut c, _) = flp(true, 64 * KIB);
        let e = EpnEntry {
            epn_id: 7,
            addr: "127.0.0.1:1".into(),
        };
        c.handle(Input::Control(Message::EpnList(vec![e.clone()])));
        assert_eq!(drain(&mut c), [Action::Connect(e)]);
        c.handle(Input::Connected { epn: 7, ok: false });
        let a = drain(&mut c);
        assert_eq!(
            a,
            [Action::Control(Message::EpnReachable {
                epn_id: 7,
                ok: false
            })]
        );
    }
}
