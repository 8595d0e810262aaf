//! The k-ary fat tree (Al-Fares et al.) on the flow model, with any number of hosts per
//! edge switch (seed 002's variant: k = 4, 10 hosts per edge switch, 80 hosts).

use crate::flow::{Fluid, LinkId};

/// A built fat tree: the link ids of every one-way link, and its equal-cost paths.
/// Core switch `c` connects to aggregation switch `c / (k/2)` of every pod (as the
/// thesis's Mininet script); edge switches connect to every aggregation switch of
/// their pod.
#[derive(Debug, Clone)]
pub struct FatTree {
    pub k: u32,
    pub hosts_per_edge: u32,
    pub hosts: u32,
    pub host_bps: f64,
    pub switch_bps: f64,
    host_up: Vec<LinkId>,
    host_down: Vec<LinkId>,
    /// [pod][edge][agg]
    edge_up: Vec<LinkId>,
    /// [pod][agg][edge]
    agg_down: Vec<LinkId>,
    /// [pod][core]: aggregation switch `core / (k/2)` of the pod to core `core`.
    pub core_up: Vec<LinkId>,
    /// [pod][core]: core to the pod's aggregation switch.
    pub core_down: Vec<LinkId>,
}

impl FatTree {
    /// A network holding only this fat tree; rates in Mbit/s.
    pub fn network(
        k: u32,
        hosts_per_edge: u32,
        switch_mbps: f64,
        host_mbps: f64,
    ) -> (Fluid, FatTree) {
        let mut net = Fluid::new();
        let tree = FatTree::build(
            &mut net,
            k,
            hosts_per_edge,
            switch_mbps * 1e6,
            host_mbps * 1e6,
        );
        (net, tree)
    }

    pub fn build(
        net: &mut Fluid,
        k: u32,
        hosts_per_edge: u32,
        switch_bps: f64,
        host_bps: f64,
    ) -> FatTree {
        assert!(k >= 2 && k & 1 == 0, "k must be even and at least 2");
        assert!(hosts_per_edge >= 1);
        let h = k / 2;
        let hosts = k * h * hosts_per_edge;
        let mut t = FatTree {
            k,
            hosts_per_edge,
            hosts,
            host_bps,
            switch_bps,
            host_up: Vec::new(),
            host_down: Vec::new(),
            edge_up: Vec::new(),
            agg_down: Vec::new(),
            core_up: Vec::new(),
            core_down: Vec::new(),
        };
        for _ in 0..hosts {
            t.host_up.push(net.add_link(host_bps));
            t.host_down.push(net.add_link(host_bps));
        }
        for _ in 0..k * h * h {
            t.edge_up.push(net.add_link(switch_bps));
            t.agg_down.push(net.add_link(switch_bps));
        }
        for _ in 0..k * h * h {
            t.core_up.push(net.add_link(switch_bps));
            t.core_down.push(net.add_link(switch_bps));
        }
        t
    }

    fn half(&self) -> u32 {
        self.k / 2
    }

    pub fn cores(&self) -> u32 {
        self.half() * self.half()
    }

    pub fn pod_of(&self, host: u32) -> u32 {
        host / (self.hosts_per_edge * self.half())
    }

    /// Edge switch of a host within its pod.
    pub fn edge_of(&self, host: u32) -> u32 {
        (host / self.hosts_per_edge) % self.half()
    }

    /// Number of equal-cost shortest paths between two hosts.
    pub fn n_paths(&self, src: u32, dst: u32) -> usize {
        if self.pod_of(src) != self.pod_of(dst) {
            self.cores() as usize
        } else if self.edge_of(src) != self.edge_of(dst) {
            self.half() as usize
        } else {
            1
        }
    }

    /// The core switch path `i` crosses (inter-pod paths only): path i is via core i.
    pub fn core_of(&self, src: u32, dst: u32, i: usize) -> Option<u32> {
        (self.pod_of(src) != self.pod_of(dst)).then_some(i as u32)
    }

    /// Path `i` (of `n_paths`) from `src` to `dst` as one-way link ids, host links
    /// included. Inter-pod path i goes via core i (aggregation switch i / (k/2));
    /// intra-pod path i via aggregation switch i.
    pub fn path(&self, src: u32, dst: u32, i: usize) -> Vec<LinkId> {
        let h = self.half();
        let (ps, pd) = (self.pod_of(src), self.pod_of(dst));
        let (es, ed) = (self.edge_of(src), self.edge_of(dst));
        let up = |pod: u32, e: u32, a: u32| self.edge_up[((pod * h + e) * h + a) as usize];
        let down = |pod: u32, a: u32, e: u32| self.agg_down[((pod * h + a) * h + e) as usize];
        let mut p = vec![self.host_up[src as usize]];
        if ps != pd {
            let core = i as u32;
            let a = core / h;
            p.push(up(ps, es, a));
            p.push(self.core_up[(ps * h * h + core) as usize]);
            p.push(self.core_down[(pd * h * h + core) as usize]);
            p.push(down(pd, a, ed));
        } else if es != ed {
            let a = i as u32;
            p.push(up(ps, es, a));
            p.push(down(ps, a, ed));
        }
        p.push(self.host_down[dst as usize]);
        p
    }

    /// Aggregation-to-core links (core ports' receive side) and core-to-aggregation
    /// links (transmit side): the links the thesis's metrics are computed on.
    pub fn core_links(&self) -> (&[LinkId], &[LinkId]) {
        (&self.core_up, &self.core_down)
    }
}

/// SplitMix64 finaliser: the switch hash behind ECMP and the seeded draws.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Per-flow ECMP: a hash of the flow's 5-tuple (source, destination, ports; UDP) and
/// the switches' hash seed picks one of `n` equal-cost paths.
pub fn ecmp_index(src: u32, dst: u32, sport: u16, dport: u16, salt: u64, n: usize) -> usize {
    let key = ((src as u64) << 32) ^ dst as u64;
    let ports = ((sport as u64) << 16) | dport as u64;
    (mix(mix(key ^ salt) ^ ports ^ (17 << 40)) % n as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thesis_fat_tree_has_80_hosts_and_the_right_paths() {
        let mut n = Fluid::new();
        let t = FatTree::build(&mut n, 4, 10, 10e6, 1e6);
        assert_eq!(t.hosts, 80);
        assert_eq!(t.cores(), 4);
        // 80 hosts x 2 + 4 pods x 4 edge-agg x 2 + 16 agg-core x 2 one-way links.
        assert_eq!(n.links.len(), 160 + 32 + 32);
        assert_eq!(
            (t.pod_of(19), t.pod_of(20), t.edge_of(9), t.edge_of(10)),
            (0, 1, 0, 1)
        );
        assert_eq!(t.n_paths(0, 5), 1);
        assert_eq!(t.n_paths(0, 15), 2);
        assert_eq!(t.n_paths(0, 30), 4);
        assert_eq!(t.path(0, 5, 0).len(), 2);
        assert_eq!(t.path(0, 15, 1).len(), 4);
        // Four paths between pods, each through a different core link pair.
        let cores: Vec<_> = (0..4).map(|i| t.path(0, 30, i)[2]).collect();
        assert_eq!(cores, t.core_up[0..4].to_vec());
        for i in 0..4 {
            assert_eq!(t.path(0, 30, i)[3], t.core_down[4 + i]);
            assert!(n.links[t.path(0, 30, i)[0] as usize].cap == 1e6);
        }
    }

    #[test]
    fn ecmp_hash_spreads_flows_evenly_over_paths() {
        for n in [2usize, 4, 16] {
            let mut count = vec![0u32; n];
            let flows = 8000;
            for f in 0..flows {
                let (src, dst) = (f % 80, (f * 7 + 13) % 80);
                count[ecmp_index(src, dst, 10_000 + (f / 80) as u16, 7000, 42, n)] += 1;
            }
            let expect = flows as f64 / n as f64;
            // Chi-square with n - 1 degrees of freedom, far below the 0.1 % tail.
            let chi2: f64 = count
                .iter()
                .map(|&c| (c as f64 - expect).powi(2) / expect)
                .sum();
            assert!(chi2 < 3.0 * n as f64 + 10.0, "n={n} {count:?} chi2={chi2}");
        }
        // Deterministic, and the salt changes the choice for some flows.
        assert_eq!(ecmp_index(1, 2, 3, 4, 5, 4), ecmp_index(1, 2, 3, 4, 5, 4));
        let moved = (0..100)
            .filter(|&s| ecmp_index(1, 40, s, 7000, 1, 4) != ecmp_index(1, 40, s, 7000, 2, 4))
            .count();
        assert!(moved > 40, "{moved}");
    }
}
