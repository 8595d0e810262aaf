//! Pull mode: the ICN hands out transfer tokens (`fanin_sched::TokenManager`, as ALICE's
//! TfScheduler) and tells an FLP to send a TF's STF only when the transfer has them.
//!
//! A transfer's tokens come back when its EPN says the STF arrived (`StfReceived`), when
//! its FLP says its send ended (`StfSent`) or drops the STF, or when the FLP or EPN
//! leaves; a TF that ends or moves stops waiting.

use fanin_proto::Message;
use fanin_sched::{EpnId, FlpId, Grant, TfId};

use super::{IcnCore, Phase};

/// How long the transfers of a TF that ended may wait for their word: longer than an
/// FLP's stall limit (`flp::sender::STALL_TIMEOUT`, 10 s), so a live FLP always answers
/// first.
pub(super) const ENDED_GRANT_GRACE: std::time::Duration = std::time::Duration::from_secs(12);

impl IcnCore {
    /// Pull mode: `epn` wants the STFs of `tf` from every FLP of the run, and the FLPs
    /// whose transfer has tokens are told now. False in push mode (tell every FLP).
    pub(super) fn want_stfs(&mut self, tf: TfId, epn: EpnId) -> bool {
        let flps: Vec<FlpId> = self.flps.keys().copied().collect();
        let Some(t) = self.transfers.as_mut() else {
            return false;
        };
        // A TF that moved to another EPN stops waiting for the old one.
        t.cancel(tf);
        let grants = t.want(epn, tf, flps);
        self.tell(grants);
        true
    }

    /// Tells each granted transfer's FLP to send. The tokens of a transfer whose FLP or
    /// EPN is gone go on at once, and after RunStop nobody is told anything.
    fn tell(&mut self, grants: Vec<Grant>) {
        let mut todo = std::collections::VecDeque::from(grants);
        let stopped = matches!(self.phase, Phase::Stopping | Phase::Done);
        while let Some(g) = todo.pop_front() {
            let flp = self.flps.get(&g.flp).copied();
            match flp.filter(|_| !stopped && self.epns.contains_key(&g.epn)) {
                Some(conn) => {
                    let assign = Message::Assign {
                        tf_id: g.tf,
                        epn_id: g.epn,
                    };
                    self.send(conn, assign);
                }
                None => todo.extend(self.transfers.as_mut().expect("pull mode").done(g)),
            }
        }
        self.publish_waiting();
    }

    /// The transfer of `tf`'s STF from `flp` to `epn` ended (the EPN's or the FLP's word):
    /// the tokens go on. A transfer this ICN did not grant (from before a take-over, or
    /// reported twice) is ignored.
    pub(super) fn transfer_ended(&mut self, flp: FlpId, tf: TfId, epn: EpnId) {
        let Some(t) = self.transfers.as_mut() else {
            return self.metrics.error("unexpected_message");
        };
        let g = Grant { epn, tf, flp };
        if !t.is_out(&g) {
            return self.metrics.stf("transfer_not_granted", "", 1);
        }
        let next = t.done(g);
        self.tell(next);
    }

    /// FLP `flp` dropped its STF of `tf`: its transfers of that TF end.
    pub(super) fn transfer_dropped(&mut self, flp: FlpId, tf: TfId) {
        self.end_transfers(|g| g.tf == tf && g.flp == flp);
    }

    /// `tf` ended: nobody waits for its STFs. A transfer under way keeps its tokens
    /// until its word comes (`StfReceived`, `StfSent`, a drop) or a peer leaves: its FLP
    /// is still sending, and a TF that ends early (a time-out, another FLP's drop) must
    /// not let it serve more than T EPNs at once. A word that never comes (an STF lost
    /// after its FLP's write succeeded, on a connection that then closed) cannot hold
    /// them for good: after `ENDED_GRANT_GRACE` they go on anyway.
    pub(super) fn transfers_of_tf_over(&mut self, tf: TfId) {
        self.transfers_of_tf_unplaced(tf);
        if self.transfers.as_ref().is_some_and(|t| t.under_way(tf)) {
            self.ended_grants
                .push_back((self.now + ENDED_GRANT_GRACE, tf));
        }
    }

    /// The transfers of TFs that ended more than `ENDED_GRANT_GRACE` ago and still have
    /// no word: their tokens go on (counted `transfer_expired`).
    pub(super) fn expire_ended_grants(&mut self) {
        while let Some(&(at, tf)) = self.ended_grants.front() {
            if at > self.now {
                return;
            }
            self.ended_grants.pop_front();
            let left = self.transfers.as_ref().is_some_and(|t| t.under_way(tf));
            if left {
                self.metrics.stf("transfer_expired", "", 1);
                self.end_transfers(|g| g.tf == tf);
            }
        }
    }

    /// `tf` waits for an EPN again (its EPN died and none has room), or ended: nobody
    /// wants its STFs until it is placed.
    pub(super) fn transfers_of_tf_unplaced(&mut self, tf: TfId) {
        if let Some(t) = self.transfers.as_mut() {
            t.cancel(tf);
        }
        self.publish_waiting();
    }

    /// Pull mode: FLP `flp` announced the STF of `tf` late (on-data) and the TF is open
    /// on `epn`: the STF is wanted unless a transfer of it is wanted or under way
    /// already. False in push mode (the caller tells the FLP).
    pub(super) fn want_late_stf(&mut self, tf: TfId, epn: EpnId, flp: FlpId) -> bool {
        let Some(t) = self.transfers.as_mut() else {
            return false;
        };
        if !t.open(tf, flp) {
            let grants = t.want(epn, tf, [flp]);
            self.tell(grants);
        }
        true
    }

    /// FLP `flp` left: its transfers end and nobody waits for its STFs.
    pub(super) fn transfers_of_flp_over(&mut self, flp: FlpId) {
        if let Some(t) = self.transfers.as_mut() {
            t.forget_flp(flp);
        }
        self.end_transfers(|g| g.flp == flp);
    }

    /// EPN `epn` left: its transfers end (it reports no arrival any more; its TFs are
    /// wanted again by the EPNs they move to).
    pub(super) fn transfers_of_epn_over(&mut self, epn: EpnId) {
        if let Some(t) = self.transfers.as_mut() {
            t.forget_epn(epn);
        }
        self.end_transfers(|g| g.epn == epn);
    }

    /// RunStop: no STF is wanted any more (each grant would only be ended at once).
    pub(super) fn transfers_stopped(&mut self) {
        if let Some(t) = self.transfers.as_mut() {
            t.forget_wants();
        }
        self.publish_waiting();
    }

    /// The STFs waiting for tokens, as a gauge.
    pub(super) fn publish_waiting(&self) {
        if let Some(t) = &self.transfers {
            self.metrics
                .set_level("stfs_waiting_for_tokens", t.waiting() as u64);
        }
    }

    /// Ends every transfer under way that `which` picks, and hands its tokens on.
    fn end_transfers(&mut self, which: impl Fn(&Grant) -> bool) {
        if let Some(t) = self.transfers.as_mut() {
            let next = t.end_where(which);
            self.tell(next);
        }
    }
}
