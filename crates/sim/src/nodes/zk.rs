//! The nodes model's ZooKeeper (`registry = "zookeeper"`): each node incarnation's
//! ephemeral znode, sessions that expire when their node dies or freezes for longer than
//! the session time-out, and the snapshots the ICN's membership watch delivers.
//!
//! As in the runtime, a node whose session expired while it lived registers again (a new
//! znode, a new incarnation) once it can; a node that leaves the run deregisters.

use std::collections::BTreeMap;

use fanin_node::icn::core::{ConnId, Input};
use fanin_node::registry::{Membership, Registered, Role};

use super::net::End;
use super::world::{peer_addr, Ev, World};
use crate::engine::{Time, MS};

pub struct SimZk {
    pub members: Membership,
    zxid: i64,
    /// The session time-out.
    pub timeout: Time,
    /// The znode of each incarnation (control connection): its node and zxid.
    znodes: BTreeMap<ConnId, (End, i64)>,
}

impl SimZk {
    pub fn new(timeout_ms: u64) -> SimZk {
        SimZk {
            members: Membership::default(),
            zxid: 0,
            timeout: timeout_ms * MS,
            znodes: BTreeMap::new(),
        }
    }
}

fn role_id(end: End) -> (Role, u32) {
    match end {
        End::Flp(i) => (Role::Flp, i),
        End::Epn(i) => (Role::Epn, i),
        End::Icn => unreachable!("the ICN has no member znode"),
    }
}

impl World {
    /// The incarnation on `conn` creates its znode (if it still lives).
    pub fn zk_create(&mut self, conn: ConnId) {
        let Some(end) = self.current(conn) else {
            return;
        };
        let Some(zk) = self.zk.as_mut() else { return };
        zk.zxid += 1;
        // A node registers again under its id: its earlier znode is replaced.
        zk.znodes.retain(|_, (e, _)| *e != end);
        let (role, id) = role_id(end);
        let reg = Registered {
            addr: peer_addr(conn).to_string(),
            incarnation: zk.zxid,
        };
        zk.members.of_mut(role).insert(id, reg);
        zk.znodes.insert(conn, (end, zk.zxid));
        self.zk_changed();
    }

    /// The session of the incarnation on `conn` ended: its znode goes. A node that still
    /// lives (frozen, or its session was expired under it) registers again once it can.
    pub fn zk_expire(&mut self, conn: ConnId, again: bool) {
        let Some(zk) = self.zk.as_mut() else { return };
        let Some((end, zxid)) = zk.znodes.remove(&conn) else {
            return;
        };
        let (role, id) = role_id(end);
        if zk
            .members
            .of(role)
            .get(&id)
            .is_some_and(|r| r.incarnation == zxid)
        {
            zk.members.of_mut(role).remove(&id);
            self.zk_changed();
        }
        if again && self.current(conn).is_some() {
            let back = self.q.now().max(self.frozen_until(end)) + 2 * self.net.latency();
            self.q.at(back, Ev::ZkCreate { conn });
        }
    }

    /// The node on `conn` died or froze at `now` (for `ms`, if frozen): its session
    /// expires one time-out later unless it is back before.
    pub fn zk_silent(&mut self, conn: ConnId, frozen_ms: Option<u64>) {
        let Some(zk) = &self.zk else { return };
        if frozen_ms.is_some_and(|ms| ms * MS < zk.timeout) {
            return;
        }
        let at = self.q.now() + zk.timeout;
        self.q.at(at, Ev::ZkExpire { conn });
    }

    fn zk_changed(&mut self) {
        let snapshot = self.zk.as_ref().expect("a registry").members.clone();
        self.q.after(self.net.latency(), Ev::ZkWatch(snapshot));
    }

    pub fn zk_watch(&mut self, m: Membership) {
        self.feed_icn(Input::Membership(m));
    }
}
