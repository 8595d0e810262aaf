//! Who is in the run: registration, mid-run (re)joins, leases, the registry's view,
//! and what a departure does to the schedule (its TFs re-assigned or dropped).

use std::net::SocketAddr;
use std::time::Duration;

use fanin_proto::{EpnEntry, Message, Register, RejectCode, Role};
use fanin_sched::{EpnId, FlpId};

use super::{ConnId, IcnCore, Level, Peer, Phase, REGISTRY_LEFT_GRACE};
use crate::icn::summary::MemberEvent;
use crate::registry::{self, diff, Change, Membership};

impl IcnCore {
    fn reject(&mut self, conn: ConnId, peer: SocketAddr, code: RejectCode, reason: String) {
        self.log(Level::Warn, format!("rejected {peer}: {reason}"));
        self.metrics.error("rejected");
        self.send_raw(conn, Message::Reject { code, reason });
        self.close(conn);
    }

    pub(super) fn on_register(&mut self, conn: ConnId, peer: SocketAddr, reg: Register) {
        if let Some(msg) = self.unknown_id(&reg) {
            return self.reject(conn, peer, RejectCode::UnknownId, msg);
        }
        let midrun = matches!(self.phase, Phase::Running | Phase::Draining);
        if self.phase != Phase::Registering && !midrun {
            let msg = format!(
                "{} registration refused: run {} is {:?}",
                reg.role.name(),
                self.cfg.run_id,
                self.phase
            );
            let code = match self.phase {
                Phase::Stopping | Phase::Done => RejectCode::RunOver,
                _ => RejectCode::WrongPhase,
            };
            return self.reject(conn, peer, code, msg);
        }
        if midrun {
            return self.on_rejoin(conn, peer, reg);
        }
        let cfg = &self.cfg.run.cfg;
        let (table, want) = match reg.role {
            Role::Epn => (&self.epns, cfg.epns),
            Role::Flp => (&self.flps, cfg.flps),
        };
        let taken = |id: u32| Some(self.peers.get(table.get(&id)?)?.addr);
        // A node that names its id hears that the id is taken before that the run is
        // full: its holder may be a dead connection about to close, so it tries again.
        let holder = reg.node_id.and_then(|id| Some((id, taken(id)?)));
        if let Some((id, addr)) = holder {
            let msg = format!(
                "{} id {id} is already registered from {addr}",
                reg.role.name()
            );
            return self.reject(conn, peer, RejectCode::IdInUse, msg);
        }
        if table.len() as u32 >= want {
            let msg = format!(
                "run expects {want} {}s and all have registered",
                reg.role.name()
            );
            return self.reject(conn, peer, RejectCode::RunFull, msg);
        }
        let id = reg.node_id.unwrap_or_else(|| match reg.role {
            // FLP ids are 0..flps: take the lowest free one.
            Role::Flp => (0..cfg.flps).find(|i| !table.contains_key(i)).unwrap_or(0),
            Role::Epn => (0..).find(|i| !table.contains_key(i)).unwrap_or(0),
        });
        debug_assert!(taken(id).is_none(), "a free id, as the run is not full");
        if let Some(msg) = bad_data_addr(&reg, id) {
            return self.reject(conn, peer, RejectCode::Other, msg);
        }
        let p = self.new_peer(peer, &reg, id, None);
        self.log(Level::Info, format!("registered {}", p.name()));
        match p.role {
            Role::Epn => self.epns.insert(id, conn),
            Role::Flp => self.flps.insert(id, conn),
        };
        self.peers.insert(conn, p);
        self.ack(conn, id);
        self.set_levels();
        if self.epns.len() as u32 == self.cfg.run.cfg.epns
            && self.flps.len() as u32 == self.cfg.run.cfg.flps
            || self.all_alive_back()
        {
            self.prepare();
        }
    }

    /// Why the id asked for is not one of this run's (FLPs 0..flps, EPNs 0..epns).
    fn unknown_id(&self, reg: &Register) -> Option<String> {
        let cfg = &self.cfg.run.cfg;
        let count = match reg.role {
            Role::Flp => cfg.flps,
            Role::Epn => cfg.epns,
        };
        let name = reg.role.name();
        reg.node_id
            .filter(|id| *id >= count)
            .map(|id| format!("unknown {name} id {id} (this run has {name}s 0..{count})"))
    }

    fn new_peer(
        &self,
        addr: SocketAddr,
        reg: &Register,
        id: u32,
        joined: Option<Duration>,
    ) -> Peer {
        Peer {
            role: reg.role,
            id,
            addr,
            data_addr: reg.data_addr.clone(),
            ready: false,
            stats: false,
            last_seen: self.now,
            joined_at: joined,
            known_epns: Vec::new(),
            awaiting: Vec::new(),
        }
    }

    fn ack(&mut self, conn: ConnId, node_id: u32) {
        let run_id = self.cfg.run_id;
        // Taking over: nodes of the run keep what they hold and tell.
        let resume = self.gathered.is_some();
        self.send(
            conn,
            Message::RegisterAck {
                node_id,
                run_id,
                resume,
            },
        );
        let state = self.state_msg();
        self.send(conn, state);
    }

    pub(super) fn set_levels(&self) {
        self.metrics.set_level("epns", self.epns.len() as u64);
        self.metrics.set_level("flps", self.flps.len() as u64);
    }

    /// A node (re)joins a running run: it gets the run parameters now and becomes part
    /// of the schedule once connected (FLP: to every EPN; EPN: from every FLP).
    fn on_rejoin(&mut self, conn: ConnId, peer: SocketAddr, reg: Register) {
        let id = match (reg.role, reg.node_id) {
            (_, Some(id)) => id,
            (Role::Flp, None) => match (0..self.cfg.run.cfg.flps)
                .find(|i| !self.flps.contains_key(i) && !self.is_joining(Role::Flp, *i))
            {
                Some(i) => i,
                None => {
                    let msg = "every FLP id of this run is taken".to_string();
                    return self.reject(conn, peer, RejectCode::RunFull, msg);
                }
            },
            (Role::Epn, None) => match (0..self.cfg.run.cfg.epns)
                .find(|i| !self.epns.contains_key(i) && !self.is_joining(Role::Epn, *i))
            {
                Some(i) => i,
                None => {
                    let msg = "every EPN id of this run is taken".to_string();
                    return self.reject(conn, peer, RejectCode::RunFull, msg);
                }
            },
        };
        let taken = match reg.role {
            Role::Flp => self.flps.contains_key(&id),
            Role::Epn => self.epns.contains_key(&id),
        } || self.is_joining(reg.role, id);
        if taken {
            let msg = format!("{} id {id} is already in the run", reg.role.name());
            return self.reject(conn, peer, RejectCode::IdInUse, msg);
        }
        if let Some(msg) = bad_data_addr(&reg, id) {
            return self.reject(conn, peer, RejectCode::Other, msg);
        }
        let p = self.new_peer(peer, &reg, id, Some(self.now));
        let t = self.now_us() as f64 / 1e6;
        self.log(
            Level::Info,
            format!("t={t:.3}s {} joins the running run", p.name()),
        );
        self.peers.insert(conn, p);
        self.ack(conn, id);
        let node = format!("{} {id}", reg.role.name());
        self.member_event(&node, "joining", 0, 0, String::new());
        let prep = self.prepare_msg();
        self.send(conn, Message::Prepare(prep));
        if reg.role == Role::Flp {
            let list = self.epn_list();
            if let Some(p) = self.peers.get_mut(&conn) {
                p.known_epns = list.iter().map(|e| (e.epn_id, e.addr.clone())).collect();
            }
            self.send(conn, Message::EpnList(list));
        }
    }

    /// Is a (re)joining node with this role and id still connecting?
    pub(super) fn is_joining(&self, role: Role, id: u32) -> bool {
        self.peers
            .values()
            .any(|p| p.role == role && p.id == id && p.joined_at.is_some())
    }

    pub(super) fn member_event(
        &mut self,
        node: &str,
        kind: &str,
        reassigned: u64,
        dropped: u64,
        detail: String,
    ) {
        let t_s = self.now_us() as f64 / 1e6;
        // The live status shows the newest few, however many the summary keeps.
        if self.recent_members.len() >= super::status::RECENT {
            self.recent_members.pop_front();
        }
        self.recent_members
            .push_back((t_s, format!("{node} {kind}")));
        if self.membership.len() >= super::MAX_EVENTS {
            self.events_not_kept += 1;
            return;
        }
        self.membership.push(MemberEvent {
            t_s,
            node: node.to_string(),
            kind: kind.to_string(),
            reassigned,
            dropped,
            detail,
            policy_us: 0.0,
        });
    }

    /// The EPNs in the schedule, for an FLP's EpnList.
    pub(super) fn epn_list(&self) -> Vec<EpnEntry> {
        self.epns
            .iter()
            .filter_map(|(&epn_id, c)| {
                self.peers.get(c).map(|p| EpnEntry {
                    epn_id,
                    addr: p.data_addr.clone(),
                })
            })
            .collect()
    }

    /// A node that joined mid-run is connected: put it in the schedule (EPNs only once
    /// every FLP has reached them).
    pub(super) fn rejoin_ready(&mut self, conn: ConnId) {
        let Some(p) = self.peers.get(&conn) else {
            return;
        };
        match p.role {
            Role::Flp => self.flp_rejoin_ready(conn),
            Role::Epn => {
                let id = p.id;
                let entry = EpnEntry {
                    epn_id: id,
                    addr: p.data_addr.clone(),
                };
                let flps: Vec<(FlpId, ConnId)> = self.flps.iter().map(|(&f, &c)| (f, c)).collect();
                self.joining
                    .insert(id, (conn, flps.iter().map(|(f, _)| *f).collect()));
                for (_, c) in flps {
                    self.send(c, Message::EpnList(vec![entry.clone()]));
                }
                self.maybe_epn_joined(id);
            }
        }
    }

    fn flp_rejoin_ready(&mut self, conn: ConnId) {
        let p = &self.peers[&conn];
        let id = p.id;
        // EPNs that entered the schedule (or came back elsewhere) since this FLP got its
        // list: it connects to them first.
        let missing: Vec<EpnEntry> = self
            .epn_list()
            .into_iter()
            .filter(|e| !p.known_epns.contains(&(e.epn_id, e.addr.clone())))
            .collect();
        if !missing.is_empty() {
            if let Some(p) = self.peers.get_mut(&conn) {
                p.known_epns
                    .extend(missing.iter().map(|e| (e.epn_id, e.addr.clone())));
                p.awaiting = missing.iter().map(|e| e.epn_id).collect();
            }
            self.send(conn, Message::EpnList(missing));
            return;
        }
        let ms = p.joined_at.map(|t| ms_since(self.now, t)).unwrap_or(0.0);
        if let Some(p) = self.peers.get_mut(&conn) {
            p.joined_at = None;
            p.ready = true;
        }
        self.flps.insert(id, conn);
        self.source_restarted(id);
        self.set_levels();
        // EPNs still joining wait for this FLP too.
        let pending: Vec<EpnEntry> = self
            .joining
            .iter()
            .filter_map(|(&e, (c, _))| {
                self.peers.get(c).map(|p| EpnEntry {
                    epn_id: e,
                    addr: p.data_addr.clone(),
                })
            })
            .collect();
        for entry in pending {
            if let Some((_, waiting)) = self.joining.get_mut(&entry.epn_id) {
                waiting.push(id);
            }
            self.send(conn, Message::EpnList(vec![entry]));
        }
        let run_id = self.cfg.run_id;
        self.send(
            conn,
            Message::RunStart {
                run_id,
                elapsed_us: self.now_us(),
            },
        );
        let detail = format!("{ms:.1} ms after registering");
        self.member_event(&format!("FLP {id}"), "rejoined", 0, 0, detail);
        self.log(
            Level::Info,
            format!("FLP {id} rejoined ({ms:.1} ms after registering)"),
        );
    }

    /// An FLP reports it cannot reach an EPN (a failed data connection, or a failed
    /// connect while joining): the EPN leaves the schedule, its TFs move.
    pub(super) fn epn_unreachable(&mut self, flp: FlpId, epn: EpnId) {
        let conn = self
            .epns
            .get(&epn)
            .copied()
            .or_else(|| self.joining.get(&epn).map(|(c, _)| *c));
        if let Some(c) = conn {
            self.metrics.error("epn_unreachable");
            self.peer_gone(c, &format!("FLP {flp} cannot reach it on the data network"));
        }
    }

    /// A joining EPN that every FLP reached enters the schedule.
    pub(super) fn maybe_epn_joined(&mut self, epn: EpnId) {
        let Some((conn, waiting)) = self.joining.get(&epn) else {
            return;
        };
        let conn = *conn;
        // FLPs that left meanwhile do not count.
        let waiting: Vec<FlpId> = waiting
            .iter()
            .copied()
            .filter(|f| self.flps.contains_key(f))
            .collect();
        if !waiting.is_empty() {
            self.joining.insert(epn, (conn, waiting));
            return;
        }
        self.joining.remove(&epn);
        let now = self.now;
        let Some(p) = self.peers.get_mut(&conn) else {
            return;
        };
        let ms = p.joined_at.map(|t| ms_since(now, t)).unwrap_or(0.0);
        p.joined_at = None;
        p.ready = true;
        self.epns.insert(epn, conn);
        let t0 = (self.cfg.stopwatch_ns)();
        self.placer.policy_mut().add_epn(epn);
        let policy_us = (self.cfg.stopwatch_ns)().saturating_sub(t0) as f64 / 1e3;
        self.set_levels();
        let run_id = self.cfg.run_id;
        self.send(
            conn,
            Message::RunStart {
                run_id,
                elapsed_us: self.now_us(),
            },
        );
        let detail = format!("{ms:.1} ms after registering");
        self.member_event(&format!("EPN {epn}"), "rejoined", 0, 0, detail);
        if let Some(e) = self.membership.last_mut() {
            e.policy_us = policy_us;
        }
        let line = format!("EPN {epn} rejoined the schedule ({ms:.1} ms after registering)");
        self.log(Level::Info, line);
    }

    /// The registry's view changed: nodes whose znode vanished (their session expired)
    /// leave the schedule. Joins are ignored: nodes join through the control connection.
    pub(super) fn on_membership(&mut self, new: Membership) {
        let old = self
            .registry_members
            .replace(new.clone())
            .unwrap_or_default();
        for change in diff(&old, &new) {
            let Change::Left(m) = change else { continue };
            if new.addr(m.role, m.id) == Some(m.addr.as_str()) {
                continue; // re-registered by the same node (a new session): still here
            }
            let conn = self
                .peers
                .iter()
                .find(|(_, p)| {
                    registry::runtime::role(p.role) == m.role
                        && p.id == m.id
                        && p.addr.to_string() == m.addr
                })
                .map(|(&c, _)| c);
            if let Some(c) = conn {
                // A znode can vanish briefly while its node re-registers (a new session):
                // a node that sent a heartbeat just now is alive.
                if self.now.saturating_sub(self.peers[&c].last_seen) < REGISTRY_LEFT_GRACE {
                    self.metrics.error("registry_left_ignored");
                    continue;
                }
                self.metrics.error("registry_left");
                self.peer_gone(c, "registry: its znode is gone (session expired)");
            }
        }
        if self.phase == Phase::Registering && self.all_alive_back() {
            self.prepare();
        }
    }

    /// Leases are the failure detector while running without a registry's view.
    pub(super) fn leases_active(&self) -> bool {
        matches!(self.phase, Phase::Running | Phase::Draining) && self.registry_members.is_none()
    }

    /// Ends the lease of peers that sent nothing for `lease_ms` (heartbeats every 100 ms).
    /// With a registry, its session time-out is the failure detector instead.
    pub(super) fn check_leases(&mut self) {
        self.last_lease_check = self.now;
        if !self.leases_active() {
            return;
        }
        let lease = Duration::from_millis(self.cfg.run.cfg.lease_ms);
        let now = self.now;
        let mut expired: Vec<(ConnId, u128)> = self
            .peers
            .iter()
            .filter(|(_, p)| p.joined_at.is_none() && now.saturating_sub(p.last_seen) > lease)
            .map(|(&c, p)| (c, now.saturating_sub(p.last_seen).as_millis()))
            .collect();
        expired.sort_unstable();
        for (c, ms) in expired {
            self.metrics.error("lease_expired");
            self.peer_gone(c, &format!("lease expired: nothing for {ms} ms"));
        }
    }

    /// A peer's connection ended (or it was dropped for not reading).
    pub(super) fn peer_gone(&mut self, conn: ConnId, why: &str) {
        let Some(p) = self.peers.remove(&conn) else {
            return;
        };
        self.close(conn);
        if p.joined_at.is_some() {
            return self.left_while_joining(conn, &p, why);
        }
        match p.role {
            Role::Epn => {
                self.last_load.remove(&p.id);
                self.load_recorded.remove(&p.id);
                let gone = self.epns.remove(&p.id);
                self.transfers_of_epn_over(p.id);
                gone
            }
            Role::Flp => {
                let gone = self.flps.remove(&p.id);
                self.transfers_of_flp_over(p.id);
                gone
            }
        };
        match p.role {
            Role::Epn => self.joiners_skip_epn(p.id),
            // EPNs joining need no confirmation from a gone FLP.
            Role::Flp => {
                for e in self.joining.keys().copied().collect::<Vec<_>>() {
                    self.maybe_epn_joined(e);
                }
            }
        }
        self.set_levels();
        let name = p.name();
        match self.phase {
            Phase::Registering => {
                self.log(Level::Info, format!("{name} left before the run: {why}"))
            }
            // A take-over goes on without it (the run's TFs must all end here).
            Phase::Preparing | Phase::Ready if self.gathered.is_some() => {
                let line = format!("{name} left during the take-over's pre-run ({why}); the run goes on without it");
                self.log(Level::Warn, line.clone());
                self.note(line);
                self.maybe_all_ready();
            }
            Phase::Preparing | Phase::Ready => {
                self.fatal = Some(format!("{name} left during the pre-run: {why}"));
                self.phase = Phase::Done;
            }
            Phase::Running | Phase::Draining => self.lost_midrun(&p, why),
            Phase::Stopping => {
                if !p.stats {
                    let line = format!("{name} left before sending its counters: {why}");
                    self.log(Level::Warn, line);
                }
                self.maybe_all_stats();
            }
            Phase::Done => {}
        }
    }

    fn left_while_joining(&mut self, conn: ConnId, p: &Peer, why: &str) {
        // It was never in the schedule.
        if p.role == Role::Epn && self.joining.get(&p.id).is_some_and(|(c, _)| *c == conn) {
            self.joining.remove(&p.id);
        }
        let t = self.now_us() as f64 / 1e6;
        let msg = format!("t={t:.3}s {} left while joining ({why})", p.name());
        self.log(Level::Warn, msg.clone());
        self.note(msg);
        if self.phase == Phase::Stopping {
            self.maybe_all_stats();
        }
    }

    /// Joining FLPs need not reach a gone EPN.
    fn joiners_skip_epn(&mut self, epn: EpnId) {
        let mut ready: Vec<ConnId> = self
            .peers
            .iter_mut()
            .filter(|(_, q)| q.joined_at.is_some() && q.awaiting.contains(&epn))
            .filter_map(|(&c, q)| {
                q.awaiting.retain(|e| *e != epn);
                q.awaiting.is_empty().then_some(c)
            })
            .collect();
        ready.sort_unstable(); // the peers' map has no order; the simulator's output must
        for c in ready {
            self.rejoin_ready(c);
        }
    }

    /// A node of the schedule was lost while TFs flow: update the policy, move or drop
    /// the TFs in flight to it, and record the event.
    fn lost_midrun(&mut self, p: &Peer, why: &str) {
        let t = self.now_us() as f64 / 1e6;
        let node = format!("{} {}", p.role.name(), p.id);
        let name = p.name();
        let t0 = (self.cfg.stopwatch_ns)();
        if p.role == Role::Epn {
            self.placer.policy_mut().remove_epn(p.id);
        }
        let policy_us = (self.cfg.stopwatch_ns)().saturating_sub(t0) as f64 / 1e3;
        let msg = if p.role == Role::Epn && self.cfg.run.cfg.reassign {
            let (moved, lost) = self.reassign_from(p.id);
            self.member_event(&node, "lost", moved, lost, why.to_string());
            format!(
                "t={t:.3}s {name} lost ({why}); {moved} TFs in flight to it re-assigned, {lost} dropped (epn_lost)"
            )
        } else if p.role == Role::Epn {
            let rows = self.ledger.epn_lost(p.id, self.now_us());
            for r in &rows {
                self.ended(r);
            }
            self.member_event(&node, "lost", 0, rows.len() as u64, why.to_string());
            format!(
                "t={t:.3}s {name} lost ({why}); {} TFs in flight to it dropped (epn_lost)",
                rows.len()
            )
        } else {
            self.member_event(&node, "lost", 0, 0, why.to_string());
            if self.cfg.run.on_data() {
                self.source_lost(p.id);
            }
            let until = match self.cfg.run.on_data() {
                true => "its TFs wait for its STFs (stale after stf_stale_ms; after as long away, its source counts as ended)",
                false => "TFs are dropped (flp_lost)",
            };
            format!("t={t:.3}s {name} lost ({why}); {until} until it rejoins")
        };
        // The event just recorded (none when the summary's list is full).
        if let Some(e) = self.membership.last_mut().filter(|e| e.node == node) {
            e.policy_us = policy_us;
        }
        self.log(Level::Warn, msg.clone());
        self.note(msg);
    }
}

/// An EPN's data address must be HOST:PORT.
fn bad_data_addr(reg: &Register, id: u32) -> Option<String> {
    (reg.role == Role::Epn && reg.data_addr.parse::<SocketAddr>().is_err()).then(|| {
        format!(
            "EPN {id}: data address {:?} is not HOST:PORT",
            reg.data_addr
        )
    })
}

fn ms_since(now: Duration, then: Duration) -> f64 {
    now.saturating_sub(then).as_secs_f64() * 1e3
}
