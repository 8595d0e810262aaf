//! Network faults on a testbed: a partition between two hosts (or a host and the ICN's),
//! a slow host link, a reset connection, a node's ZooKeeper traffic cut until its session
//! expires. Each is `tc` filters and classes, or `ss -K`, inside the hosts' namespaces.
//!
//! The kernel here has neither netem nor gact, so nothing needs them: a cut sends the
//! packets to a class whose queue holds nothing (the kernel drops them), a slow link is
//! its htb class at a lower rate.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use anyhow::bail;

use super::spec::{self, argv, Spec};
use crate::experiment::{ControlNet, Placement};

/// A host link's class whose queue holds nothing: what a filter sends there is dropped.
const CUT_CLASS: &str = "1:3";
/// A host link's ordinary class (htb's default).
const PASS_CLASS: &str = "1:1";
/// The filter priorities faults use: session expiries' ZooKeeper cuts first (they must
/// win over a partition's filter that keeps ZooKeeper's traffic), then partitions; the
/// testbed's random loss comes after them all.
const EXPIRY_PRIOS: std::ops::Range<u32> = 10..500;
const PARTITION_PRIOS: std::ops::Range<u32> = 500..spec::LOSS_PRIO;

pub type Argv = Vec<String>;

/// A fault in force: the commands that undo it.
type Undo = Vec<Argv>;

/// The network faults of one run on a testbed: where each node runs, and what is in
/// force (undone by `heal`, or all at once by `heal_all` when the run ends).
pub struct NetFaults {
    spec: Spec,
    control: ControlNet,
    /// Host of each node by the runtime's name (`ICN`, `FLP 0`, `EPN 2`).
    hosts: BTreeMap<String, u32>,
    icn_host: u32,
    /// The run's ZooKeeper client port on the ICN's host (its own server), if any.
    zk_port: Option<u16>,
    /// The session time-out ZooKeeper grants: the asked one within 2..=20 ticks.
    session_ms: u64,
    tick_ms: u64,
    state: Mutex<State>,
}

struct State {
    next_expiry: u32,
    next_partition: u32,
    in_force: BTreeMap<u32, Undo>,
    /// Slow links in force: key -> (host, rate); a host runs at the lowest of its own.
    slow: BTreeMap<u32, (u32, u64)>,
    next_slow: u32,
    /// The run ended (`heal_all`): nothing is applied any more.
    closed: bool,
}

/// What a network fault asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum NetFault {
    /// `node` and `peer` (the ICN when absent) cannot reach each other. From the ICN, a
    /// node keeps its ZooKeeper traffic: that is `ExpireSession`.
    Partition { peer: Option<String> },
    /// `node`'s links send at `rate_bps`.
    Slow { rate_bps: u64 },
    /// `node`'s connections to the ICN (no peer) or to EPN `peer` are reset (RST).
    Reset { peer: Option<String> },
    /// `node`'s ZooKeeper traffic is cut until its session has expired.
    ExpireSession,
}

impl NetFaults {
    /// `zk`: the run's own ZooKeeper server's port, tick and asked session time-out.
    pub fn new(spec: Spec, place: &Placement, zk: Option<(u16, u64, u64)>) -> Self {
        let mut hosts = BTreeMap::from([("ICN".to_string(), place.icn)]);
        for (i, h) in place.flps.iter().enumerate() {
            hosts.insert(format!("FLP {i}"), *h);
        }
        for (i, h) in place.epns.iter().enumerate() {
            hosts.insert(format!("EPN {i}"), *h);
        }
        NetFaults {
            spec,
            control: place.control,
            hosts,
            icn_host: place.icn,
            zk_port: zk.map(|z| z.0),
            session_ms: zk.map_or(0, |(_, tick, asked)| asked.clamp(2 * tick, 20 * tick)),
            tick_ms: zk.map_or(0, |z| z.1),
            state: Mutex::new(State {
                next_expiry: EXPIRY_PRIOS.start,
                next_partition: PARTITION_PRIOS.start,
                in_force: BTreeMap::new(),
                slow: BTreeMap::new(),
                // Keys of their own, apart from the filter priorities.
                next_slow: spec::LOSS_PRIO,
                closed: false,
            }),
        }
    }

    /// How long a session expiry's cut lasts: the server expires a session a tick or
    /// two after its time-out (as ZooKeeper grants it); twice that, plus two ticks.
    pub fn expiry_cut_s(&self) -> f64 {
        (2 * self.session_ms + 2 * self.tick_ms) as f64 / 1e3
    }

    /// Readies every host of the run: what an earlier run may have left (its fault
    /// filters, a slow rate) is undone, and each link gets its cut class.
    pub fn prepare(&self) -> anyhow::Result<()> {
        for h in self.used_hosts() {
            let ns = self.spec.host_ns(h);
            for (dev, _, _) in self.devs(h) {
                for pref in super::filter_prefs(&ns, dev)? {
                    if pref < EXPIRY_PRIOS.start {
                        bail!("testbed {}: host {h} {dev} has a filter at priority {pref}, ahead of network faults (made by an older fanin): take the testbed down and up again", self.spec.name);
                    }
                    if pref < PARTITION_PRIOS.end {
                        super::sh(&filter_del(&ns, dev, pref))?;
                    }
                }
            }
            for c in self.rate_commands(h, None) {
                super::sh(&c)?;
            }
            for (dev, _, rate) in self.devs(h) {
                super::sh(&spec::htb_class_cmd("replace", &ns, dev, CUT_CLASS, &rate))?;
                super::sh(&argv(&[
                    "tc", "-n", &ns, "qdisc", "replace", "dev", dev, "parent", CUT_CLASS, "handle",
                    "30:", "pfifo", "limit", "0",
                ]))?;
            }
        }
        Ok(())
    }

    fn used_hosts(&self) -> Vec<u32> {
        let mut hosts: Vec<u32> = self.hosts.values().copied().collect();
        hosts.sort();
        hosts.dedup();
        hosts
    }

    /// Host `h`'s devices: (name, its address, the class rate it had at `up`).
    fn devs(&self, h: u32) -> Vec<(&'static str, Ipv4Addr, String)> {
        let rate = |l: &spec::Link| format!("{}bit", l.shaping.rate_bps);
        let links = self.spec.links(h);
        links.iter().map(|l| (l.dev, l.ip, rate(l))).collect()
    }

    fn host(&self, node: &str) -> anyhow::Result<u32> {
        match self.hosts.get(node) {
            Some(h) => Ok(*h),
            None => bail!("{node}: not placed on the testbed"),
        }
    }

    /// The host of `peer` (the ICN's when absent), which must not be `node`'s own.
    fn peer_host(&self, node: &str, peer: Option<&str>) -> anyhow::Result<u32> {
        let (h, p) = (self.host(node)?, peer.unwrap_or("ICN"));
        let ph = self.host(p)?;
        if ph == h {
            bail!("{node} and {p} run on the same host {h}: the network cannot part them");
        }
        Ok(ph)
    }

    /// Commands that apply `f` to `node` (filters at `prio` and the next) and the ones
    /// that undo it, last applied first undone (none for a reset). A slow link: those
    /// for `node` alone (`start` keeps overlapping ones at the lowest rate).
    pub fn commands(&self, node: &str, f: &NetFault, prio: u32) -> anyhow::Result<(Undo, Undo)> {
        let h = self.host(node)?;
        match f {
            NetFault::Partition { peer } => {
                let ph = self.peer_host(node, peer.as_deref())?;
                // From the ICN's host a node keeps its ZooKeeper session.
                let keep = peer.is_none().then_some(self.zk_port).flatten();
                Ok(self.cut_between(h, ph, keep, None, prio))
            }
            NetFault::ExpireSession => {
                let Some(port) = self.zk_port else {
                    bail!("{node}: expire-session needs the run's own ZooKeeper server");
                };
                self.peer_host(node, None)?;
                Ok(self.cut_between(h, self.icn_host, None, Some(port), prio))
            }
            NetFault::Slow { rate_bps } => {
                let apply = self.rate_commands(h, Some(*rate_bps));
                Ok((apply, self.rate_commands(h, None)))
            }
            NetFault::Reset { peer } => Ok((vec![self.reset(node, h, peer.as_deref())?], vec![])),
        }
    }

    /// Filters on both hosts sending what goes to the other to the cut class: all of it,
    /// all but ZooKeeper (`keep`), or only ZooKeeper (`only`; `b` is its host).
    fn cut_between(
        &self,
        a: u32,
        b: u32,
        keep: Option<u16>,
        only: Option<u16>,
        prio: u32,
    ) -> (Undo, Undo) {
        let (mut apply, mut undo) = (Vec::new(), Vec::new());
        let mut add = |ns: &str, dev: &str, p: u32, m: &[&str], class: &str| {
            apply.push(filter(ns, dev, p, m, class));
            undo.push(filter_del(ns, dev, p));
        };
        for (from, to) in [(a, b), (b, a)] {
            let ns = self.spec.host_ns(from);
            // Towards ZooKeeper's host the port is the destination; from it, the source.
            let port_dir = if to == b { "dport" } else { "sport" };
            for ((dev, _, _), (_, to_ip, _)) in self.devs(from).into_iter().zip(self.devs(to)) {
                let dst = format!("{to_ip}/32");
                let to_host = ["match", "ip", "dst", dst.as_str()];
                let port = keep.or(only).map(|p| p.to_string()).unwrap_or_default();
                let to_port = [&to_host[..], &["match", "ip", port_dir, &port, "0xffff"]].concat();
                if keep.is_some() {
                    add(&ns, dev, prio, &to_port, PASS_CLASS);
                }
                let cut: &[&str] = if only.is_some() { &to_port } else { &to_host };
                add(&ns, dev, prio + 1, cut, CUT_CLASS);
            }
        }
        undo.reverse();
        (apply, undo)
    }

    /// Host `h`'s links, both ways (its own transmit side and the switch's port towards
    /// it, as the model slows frames from and to a node), at `rate_bps`, or at the rate
    /// they had at `up` (`None`).
    fn rate_commands(&self, h: u32, rate_bps: Option<u64>) -> Undo {
        let (ns, sw) = (self.spec.host_ns(h), self.spec.switch_ns());
        let mut c = Vec::new();
        for l in self.spec.links(h) {
            let line = l.shaping.rate_bps;
            let rate = format!("{}bit", rate_bps.map_or(line, |r| r.max(8_000)));
            c.push(spec::htb_class_cmd("change", &ns, l.dev, PASS_CLASS, &rate));
            c.push(spec::htb_class_cmd(
                "change", &sw, &l.port, PASS_CLASS, &rate,
            ));
        }
        c
    }

    /// `ss -K` in `node`'s namespace: its TCP connections to the ICN's control address
    /// (ZooKeeper's port aside), or to EPN `peer`'s data address. Both ends see a reset.
    fn reset(&self, node: &str, h: u32, peer: Option<&str>) -> anyhow::Result<Argv> {
        let ns = self.spec.host_ns(h);
        let mut c = argv(&["ip", "netns", "exec", &ns, "ss", "-K", "-t", "-n", "dst"]);
        match peer {
            None => {
                let ph = self.peer_host(node, None)?;
                c.push(self.control_ip(ph).to_string());
                if let Some(p) = self.zk_port {
                    c.extend(argv(&["and", "not", "dport", "=", &format!(":{p}")]));
                }
            }
            Some(p) => {
                let ph = self.peer_host(node, Some(p))?;
                c.push(self.spec.data_ip(ph).to_string());
            }
        }
        Ok(c)
    }

    fn control_ip(&self, h: u32) -> Ipv4Addr {
        match (self.control, self.spec.aux_ip(h)) {
            (ControlNet::Aux, Some(ip)) => ip,
            _ => self.spec.data_ip(h),
        }
    }

    /// Applies `f` to `node`; the key to `heal` it with (none: nothing to undo). The
    /// commands run under the lock, so a run that ends meanwhile (`heal_all`) undoes
    /// all of it or finds nothing to undo and refuses what comes later. A fault applied
    /// in part is undone at once.
    pub fn start(&self, node: &str, f: &NetFault) -> anyhow::Result<Option<u32>> {
        let mut s = self.state.lock().expect("net faults lock");
        if s.closed {
            bail!("{node}: the run is over");
        }
        let key = match f {
            NetFault::ExpireSession => next(&mut s.next_expiry, &EXPIRY_PRIOS, node)?,
            NetFault::Partition { .. } => next(&mut s.next_partition, &PARTITION_PRIOS, node)?,
            NetFault::Slow { .. } | NetFault::Reset { .. } => {
                s.next_slow += 1;
                s.next_slow
            }
        };
        if let NetFault::Slow { rate_bps } = f {
            // `heal` works out the rate that remains.
            let h = self.host(node)?;
            s.slow.insert(key, (h, *rate_bps));
            let lowest = slowest(&s.slow, h).unwrap_or(*rate_bps);
            run_all(&self.rate_commands(h, Some(lowest)))?;
            return Ok(Some(key));
        }
        let (apply, undo) = self.commands(node, f, key)?;
        if let Err(e) = run_all(&apply) {
            let _ = run_all(&undo);
            return Err(e);
        }
        if matches!(f, NetFault::Reset { .. }) {
            return Ok(None);
        }
        s.in_force.insert(key, undo);
        Ok(Some(key))
    }

    /// Undoes the fault `key` (every command is tried; the first error is returned).
    pub fn heal(&self, key: u32) -> anyhow::Result<()> {
        let mut s = self.state.lock().expect("net faults lock");
        self.heal_locked(&mut s, key)
    }

    fn heal_locked(&self, s: &mut State, key: u32) -> anyhow::Result<()> {
        if let Some((h, _)) = s.slow.remove(&key) {
            let rate = slowest(&s.slow, h);
            return run_all(&self.rate_commands(h, rate));
        }
        let undo = s.in_force.remove(&key).unwrap_or_default();
        run_all(&undo)
    }

    /// Undoes every fault still in force and refuses later ones (the run is over);
    /// failures are logged.
    pub fn heal_all(&self) {
        let mut s = self.state.lock().expect("net faults lock");
        s.closed = true;
        let keys: Vec<u32> = s.in_force.keys().chain(s.slow.keys()).copied().collect();
        for k in keys {
            if let Err(e) = self.heal_locked(&mut s, k) {
                tracing::warn!("healing a network fault: {e:#}");
            }
        }
    }
}

/// The next free pair of filter priorities in `range`.
fn next(at: &mut u32, range: &std::ops::Range<u32>, node: &str) -> anyhow::Result<u32> {
    if *at + 1 >= range.end {
        bail!("{node}: more network faults in one run than filter priorities");
    }
    *at += 2;
    Ok(*at - 2)
}

/// The lowest rate of the slow links in force on host `h`.
fn slowest(slow: &BTreeMap<u32, (u32, u64)>, h: u32) -> Option<u64> {
    slow.values()
        .filter(|(x, _)| *x == h)
        .map(|(_, r)| *r)
        .min()
}

/// Runs every command; the first error, after trying them all.
fn run_all(cmds: &[Argv]) -> anyhow::Result<()> {
    let mut first = None;
    for c in cmds {
        if let Err(e) = super::sh(c) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

fn filter_del(ns: &str, dev: &str, prio: u32) -> Argv {
    let mut c = argv(&[
        "tc", "-n", ns, "filter", "del", "dev", dev, "parent", "1:", "prio",
    ]);
    c.push(prio.to_string());
    c
}

fn filter(ns: &str, dev: &str, prio: u32, matches: &[&str], class: &str) -> Argv {
    let mut c = argv(&[
        "tc", "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
    ]);
    c.push(prio.to_string());
    c.push("u32".into());
    c.extend(argv(matches));
    c.extend(argv(&["classid", class]));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults() -> NetFaults {
        let spec = spec::preset("pi-cluster").unwrap();
        let place = Placement {
            name: spec.name.clone(),
            control: ControlNet::Aux,
            icn: 1,
            flps: vec![2, 3],
            epns: vec![4, 5],
        };
        NetFaults::new(spec, &place, Some((2181, 200, 1000)))
    }

    fn joined(c: &[Argv]) -> Vec<String> {
        c.iter().map(|a| a.join(" ")).collect()
    }

    #[test]
    fn a_partition_cuts_both_directions_on_both_networks() {
        let n = faults();
        let p = NetFault::Partition {
            peer: Some("EPN 1".into()),
        };
        let (apply, undo) = n.commands("FLP 0", &p, 10).unwrap();
        let a = joined(&apply);
        assert_eq!(a.len(), 4, "{a:#?}");
        assert!(
            a[0].contains("-n pi-cluster-h2 filter add dev eth0"),
            "{a:#?}"
        );
        assert!(a[0].contains("prio 11 u32 match ip dst 192.168.1.5/32 classid 1:3"));
        assert!(a[1].contains("dev eth1") && a[1].contains("192.168.2.5/32"));
        assert!(a[2].contains("pi-cluster-h5") && a[2].contains("192.168.1.2/32"));
        // Only the cut filters exist, and only they are deleted.
        assert_eq!(undo.len(), 4);
        assert!(joined(&undo).iter().all(|c| c.ends_with("prio 11")));
    }

    #[test]
    fn from_the_icn_a_node_keeps_zookeeper_and_an_expiry_cuts_only_it() {
        let n = faults();
        let (apply, undo) = n
            .commands("EPN 0", &NetFault::Partition { peer: None }, 20)
            .unwrap();
        let a = joined(&apply);
        assert!(a[0].contains("prio 20") && a[0].contains("dport 2181 0xffff classid 1:1"));
        assert!(a[1].contains("prio 21") && a[1].ends_with("192.168.1.1/32 classid 1:3"));
        // The ICN's host: ZooKeeper's replies have it as their source port.
        assert!(a
            .iter()
            .any(|c| c.contains("pi-cluster-h1") && c.contains("sport 2181")));
        assert_eq!(undo.len(), 8);
        let (apply, _) = n.commands("EPN 0", &NetFault::ExpireSession, 30).unwrap();
        let a = joined(&apply);
        assert_eq!(a.len(), 4);
        assert!(
            a.iter().all(|c| c.contains("2181 0xffff classid 1:3")),
            "{a:#?}"
        );
    }

    #[test]
    fn resets_slow_links_and_bad_peers() {
        let n = faults();
        let (r, undo) = n
            .commands("FLP 1", &NetFault::Reset { peer: None }, 10)
            .unwrap();
        assert_eq!(
            r[0].join(" "),
            "ip netns exec pi-cluster-h3 ss -K -t -n dst 192.168.2.1 and not dport = :2181"
        );
        assert!(undo.is_empty());
        let (r, _) = n
            .commands(
                "FLP 1",
                &NetFault::Reset {
                    peer: Some("EPN 0".into()),
                },
                10,
            )
            .unwrap();
        assert!(r[0].join(" ").ends_with("dst 192.168.1.4"));
        let (s, u) = n
            .commands(
                "EPN 1",
                &NetFault::Slow {
                    rate_bps: 1_000_000,
                },
                10,
            )
            .unwrap();
        assert!(joined(&s)[0].contains("change dev eth0 parent 1: classid 1:1 htb rate 1000000bit"));
        assert!(joined(&u)[0].contains("rate 100000000bit"));
        let e = n
            .commands(
                "FLP 0",
                &NetFault::Partition {
                    peer: Some("FLP 0".into()),
                },
                10,
            )
            .unwrap_err();
        assert!(e.to_string().contains("same host"), "{e}");
        assert!(n.commands("EPN 9", &NetFault::ExpireSession, 10).is_err());
    }
}
