//! The nodes model's network: when a control frame or an STF sent now arrives. Links
//! are FIFO with a latency; partitions hold traffic until they heal (TCP retransmits).
//!
//! STFs leave an FLP's uplink one after another at the link rate and enter the EPN's
//! downlink the same way (store and forward per STF: incast queues at the EPN).

use std::collections::BTreeMap;

use crate::engine::{Time, US};

/// One end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum End {
    Icn,
    Flp(u32),
    Epn(u32),
}

impl End {
    pub fn name(self) -> String {
        match self {
            End::Icn => "ICN".into(),
            End::Flp(i) => format!("FLP {i}"),
            End::Epn(i) => format!("EPN {i}"),
        }
    }
}

/// The network's parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// One-way latency of every link, µs.
    pub latency_us: u64,
    /// Every FLP uplink and EPN downlink, Gbit/s.
    pub link_gbps: f64,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            latency_us: 50,
            link_gbps: 10.0,
        }
    }
}

/// Links, partitions and slow ends.
pub struct Net {
    cfg: NetConfig,
    /// (a, b, from, until): a and b cannot reach each other meanwhile.
    partitions: Vec<(End, End, Time, Time)>,
    /// End -> (until, extra latency): its frames are slow meanwhile.
    slow: BTreeMap<End, (Time, Time)>,
    /// The last delivery per (connection, direction): frames never overtake.
    fifo: BTreeMap<(u64, bool), Time>,
    uplink: BTreeMap<u32, Time>,
    downlink: BTreeMap<u32, Time>,
}

impl Net {
    pub fn new(cfg: NetConfig) -> Net {
        assert!(cfg.link_gbps > 0.0, "validated by the scenario");
        Net {
            cfg,
            partitions: Vec::new(),
            slow: BTreeMap::new(),
            fifo: BTreeMap::new(),
            uplink: BTreeMap::new(),
            downlink: BTreeMap::new(),
        }
    }

    pub fn latency(&self) -> Time {
        self.cfg.latency_us * US
    }

    pub fn partition(&mut self, a: End, b: End, from: Time, until: Time) {
        self.partitions.push((a, b, from, until));
    }

    pub fn slow(&mut self, end: End, until: Time, extra: Time) {
        self.slow.insert(end, (until, extra));
    }

    /// The first time at or after `t` at which `a` and `b` reach each other.
    pub fn heal(&self, a: End, b: End, mut t: Time) -> Time {
        loop {
            let cut = self.partitions.iter().find(|&&(x, y, from, until)| {
                ((x, y) == (a, b) || (x, y) == (b, a)) && from <= t && t < until
            });
            match cut {
                Some(&(_, _, _, until)) => t = until,
                None => return t,
            }
        }
    }

    fn extra(&self, e: End, t: Time) -> Time {
        match self.slow.get(&e) {
            Some(&(until, extra)) if t < until => extra,
            _ => 0,
        }
    }

    /// When a control frame sent at `now` from `from` to `to` on `conn` arrives.
    pub fn control(&mut self, now: Time, conn: u64, from: End, to: End) -> Time {
        let sent = self.heal(from, to, now);
        let t = sent + self.latency() + self.extra(from, now) + self.extra(to, now);
        let last = self.fifo.entry((conn, from < to)).or_insert(0);
        *last = (*last).max(t);
        *last
    }

    /// An STF of `bytes` written now by `flp` to `epn`: (written out of the FLP, arrived
    /// in full at the EPN).
    pub fn stf(&mut self, now: Time, flp: u32, epn: u32, bytes: u64) -> (Time, Time) {
        let wire = (bytes as f64 * 8.0 / self.cfg.link_gbps).ceil() as Time;
        let up = self.uplink.entry(flp).or_insert(0);
        let start = now.max(*up);
        let start = self.heal(End::Flp(flp), End::Epn(epn), start);
        let written = start + wire;
        self.uplink.insert(flp, written);
        let down = self.downlink.entry(epn).or_insert(0);
        let arrived = (written + self.cfg.latency_us * US).max(*down + wire);
        *down = arrived;
        (written, arrived)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::MS;

    #[test]
    fn a_partition_holds_frames_until_it_heals_and_order_is_kept() {
        let mut n = Net::new(NetConfig::default());
        n.partition(End::Icn, End::Flp(0), 0, 5 * MS);
        let a = n.control(MS, 1, End::Flp(0), End::Icn);
        assert_eq!(a, 5 * MS + 50 * US);
        // The other direction and other ends are not cut.
        assert_eq!(n.control(MS, 1, End::Icn, End::Epn(0)), MS + 50 * US);
        // A later frame on the same connection never overtakes.
        n.slow(End::Flp(0), 10 * MS, 0);
        assert!(n.control(6 * MS, 1, End::Flp(0), End::Icn) >= a);
    }

    #[test]
    fn stfs_queue_on_the_uplink_and_at_the_epn() {
        let mut n = Net::new(NetConfig {
            latency_us: 0,
            link_gbps: 8.0,
        });
        // 1000 bytes at 8 Gbit/s: 1 µs on the wire.
        assert_eq!(n.stf(0, 0, 0, 1000), (1000, 1000));
        assert_eq!(n.stf(0, 0, 0, 1000), (2000, 2000));
        // A second FLP into the same EPN waits for its downlink.
        assert_eq!(n.stf(0, 1, 0, 1000), (1000, 3000));
    }
}
