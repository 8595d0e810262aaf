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
    /// The session time-out, as the server grants it (2 to 20 ticks).
    pub timeout: Time,
    /// The open sessions (a node's process) and the zxid of each one's znode.
    sessions: BTreeMap<(End, u64), i64>,
}

impl SimZk {
    pub fn new(timeout_ms: u64, tick_ms: u64) -> SimZk {
        let granted = timeout_ms.clamp(2 * tick_ms, 20 * tick_ms);
        SimZk {
            members: Membership::default(),
            zxid: 0,
            timeout: granted * MS,
            sessions: BTreeMap::new(),
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

/// How often a node whose id is still held by its previous process's znode tries again.
const ID_TAKEN_RETRY: Time = 100 * MS;

impl World {
    /// The incarnation on `conn` registers its znode (after its RegisterAck, as the
    /// runtime does). A restarted process waits until the znode of the process before it
    /// expired; a rejoin of the same process replaces its znode.
    pub fn zk_create(&mut self, conn: ConnId) {
        let Some(end) = self.current(conn) else {
            return;
        };
        let gen = self.proc(end).gen;
        let Some(zk) = self.zk.as_mut() else { return };
        if zk.sessions.keys().any(|&(e, g)| e == end && g != gen) {
            self.q.after(ID_TAKEN_RETRY, Ev::ZkCreate { conn });
            return;
        }
        zk.zxid += 1;
        let (role, id) = role_id(end);
        let reg = Registered {
            addr: peer_addr(conn).to_string(),
            incarnation: zk.zxid,
        };
        zk.members.of_mut(role).insert(id, reg);
        zk.sessions.insert((end, gen), zk.zxid);
        self.zk_changed();
    }

    /// The session of process `gen` of `end` ended: its znode goes. A process that still
    /// lives (frozen, or its session was expired under it) registers again once it can.
    pub fn zk_expire(&mut self, end: End, gen: u64, again: bool) {
        let Some(zk) = self.zk.as_mut() else { return };
        let Some(zxid) = zk.sessions.remove(&(end, gen)) else {
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
        let p = self.proc(end);
        if let (true, Some(conn)) = (again && p.gen == gen && !p.gone, p.conn) {
            let back = self.q.now().max(p.frozen_until) + 2 * self.net.latency();
            self.q.at(back, Ev::ZkCreate { conn });
        }
    }

    /// Process `gen` of `end` died, or is frozen from `since` to `until` (freezes that
    /// overlap are one silence): its session expires one time-out after its silence
    /// began, unless it is back before.
    pub fn zk_silent(&mut self, end: End, gen: u64, frozen: Option<(Time, Time)>) {
        let Some(zk) = &self.zk else { return };
        let since = match frozen {
            Some((since, until)) if until - since < zk.timeout => return,
            Some((since, _)) => since,
            None => self.q.now(),
        };
        // (A silence whose session expired already: expiring it again does nothing.)
        let at = (since + zk.timeout).max(self.q.now());
        self.q.at(at, Ev::ZkExpire { end, gen });
    }

    fn zk_changed(&mut self) {
        let snapshot = self.zk.as_ref().expect("a registry").members.clone();
        self.q.after(self.net.latency(), Ev::ZkWatch(snapshot));
    }

    pub fn zk_watch(&mut self, m: Membership) {
        self.feed_icn(Input::Membership(m));
    }
}
