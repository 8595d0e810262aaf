//! Frames the ICN holds back while the rows file cannot take the rows written before
//! them: a frame that frees STFs never leaves first, and each connection's frames keep
//! their order (a later Assign never overtakes a held Abandon of the same TF).

use std::collections::{HashSet, VecDeque};

use fanin_proto::Message;

use super::core::ConnId;

pub struct Held {
    queue: VecDeque<(ConnId, Message)>,
    /// Connections with a frame in `queue`: their later frames wait behind it.
    conns: HashSet<ConnId>,
    limit: usize,
}

/// A frame that lets its receivers free STFs (FLPs) or a TF (EPNs).
pub fn frees(msg: &Message) -> bool {
    matches!(msg, Message::Release { .. } | Message::Abandon { .. })
}

impl Held {
    /// At most `limit` frames wait.
    pub fn new(limit: usize) -> Held {
        assert!(limit > 0);
        Held {
            queue: VecDeque::new(),
            conns: HashSet::new(),
            limit,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// `msg` to `conn` must wait for the rows: it frees STFs, or frames to `conn` wait.
    pub fn must_wait(&self, conn: ConnId, msg: &Message) -> bool {
        frees(msg) || self.conns.contains(&conn)
    }

    /// Holds `msg` for `conn`, after those held already; at the limit, gives it back.
    pub fn push(&mut self, conn: ConnId, msg: Message) -> Result<(), Message> {
        if self.queue.len() >= self.limit {
            return Err(msg);
        }
        self.conns.insert(conn);
        self.queue.push_back((conn, msg));
        Ok(())
    }

    /// Every frame held, in order, and how many were left out: with `drop_frees`, those
    /// that free STFs (the run stopped, or holding gave up).
    pub fn take(&mut self, drop_frees: bool) -> (Vec<(ConnId, Message)>, usize) {
        self.conns.clear();
        let all = self.queue.len();
        let out: Vec<_> = (self.queue.drain(..))
            .filter(|(_, m)| !(drop_frees && frees(m)))
            .collect();
        let left_out = all - out.len();
        (out, left_out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(tf_id: u64) -> Message {
        Message::Release { tf_id }
    }

    fn assign(tf_id: u64) -> Message {
        Message::Assign { tf_id, epn_id: 0 }
    }

    #[test]
    fn a_connection_with_a_frame_held_waits_behind_it_and_others_do_not() {
        let mut h = Held::new(8);
        assert!(!h.must_wait(1, &assign(5)), "nothing held: at once");
        assert!(h.must_wait(1, &release(4)), "a Release waits for its row");
        h.push(1, release(4)).unwrap();
        assert!(
            h.must_wait(1, &assign(5)),
            "behind the Release to the same peer"
        );
        assert!(!h.must_wait(2, &assign(5)), "another peer's frame goes on");
        h.push(1, assign(5)).unwrap();
        assert_eq!(h.take(false), (vec![(1, release(4)), (1, assign(5))], 0));
        assert!(h.is_empty());
        assert!(!h.must_wait(1, &assign(6)), "taken: at once again");
    }

    #[test]
    fn a_full_hold_gives_frames_back_and_a_stop_leaves_out_the_frees() {
        let mut h = Held::new(2);
        h.push(1, release(1)).unwrap();
        h.push(1, assign(2)).unwrap();
        assert_eq!(h.push(1, release(3)), Err(release(3)));
        assert_eq!(h.take(true), (vec![(1, assign(2))], 1));
    }
}
