//! Hedera (Al-Fares et al., NSDI 2010) as a periodic controller on the flow model: elephant
//! detection, demand estimation, placement (worst fit, first fit, annealing, balanced).

use rand::{Rng, SeedableRng};

use super::topo::FatTree;

/// How Hedera places the elephants it detects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Seed 002 §4.3.5: each elephant still on its ECMP route goes to the path with the
    /// most available bandwidth (capacity minus measured load, minimum over the path's
    /// links, host links included; ties to Floodlight's first route). Placed flows stay.
    WorstFit,
    /// Hedera paper: the first path whose links can all take the flow's estimated
    /// demand on top of earlier reservations; reservations end with their flows.
    FirstFit,
    /// Hedera paper: simulated annealing over one core switch per destination host,
    /// minimising the capacity exceeded by the elephants' estimated demands.
    Annealing,
    /// Beyond the seeds: every round re-places all elephants to minimise the sum of
    /// squared link utilisations (best response until no flow gains by moving), which
    /// spreads load evenly instead of only avoiding overload.
    Balanced,
}

impl Placement {
    pub const ALL: &'static [Placement] = &[
        Placement::WorstFit,
        Placement::FirstFit,
        Placement::Annealing,
        Placement::Balanced,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Placement::WorstFit => "worst-fit",
            Placement::FirstFit => "first-fit",
            Placement::Annealing => "annealing",
            Placement::Balanced => "balanced",
        }
    }
}

/// Hedera's demand estimator (Fig. 5 of the paper): the max-min fair rates the flows
/// would get if only the hosts' NICs limited them. `flows[i] = (src, dst)`; the result
/// is each flow's demand as a fraction of a NIC's rate. Senders split what their
/// converged flows leave equally; over-subscribed receivers cap their receiver-limited
/// flows at an equal share of what the smaller flows leave; repeat until nothing moves.
pub fn estimate_demands(hosts: u32, flows: &[(u32, u32)]) -> Vec<f64> {
    let n = flows.len();
    let mut demand = vec![0.0f64; n];
    let mut conv = vec![false; n];
    let mut by_src: Vec<Vec<usize>> = vec![Vec::new(); hosts as usize];
    let mut by_dst: Vec<Vec<usize>> = vec![Vec::new(); hosts as usize];
    for (i, &(s, d)) in flows.iter().enumerate() {
        by_src[s as usize].push(i);
        by_dst[d as usize].push(i);
    }
    let mut rl = vec![false; n];
    for _round in 0..1000 {
        let before = demand.clone();
        let before_conv = conv.clone();
        for fs in &by_src {
            sender_shares(fs, &mut demand, &conv);
        }
        for fs in by_dst.iter().filter(|fs| !fs.is_empty()) {
            receiver_caps(fs, &mut demand, &mut conv, &mut rl);
        }
        if demand == before && conv == before_conv {
            break;
        }
    }
    demand
}

/// One sender's flows `fs`: the unconverged ones split equally what the converged
/// ones leave of its NIC.
fn sender_shares(fs: &[usize], demand: &mut [f64], conv: &[bool]) {
    let (mut df, mut nu) = (0.0, 0usize);
    for &f in fs {
        if conv[f] {
            df += demand[f];
        } else {
            nu += 1;
        }
    }
    if nu > 0 {
        let es = ((1.0 - df) / nu as f64).max(0.0);
        for &f in fs {
            if !conv[f] {
                demand[f] = es;
            }
        }
    }
}

/// One receiver's flows `fs`, if they over-subscribe its NIC: its receiver-limited
/// flows (`rl`) are capped at an equal share of what the smaller flows leave, and
/// converge there.
fn receiver_caps(fs: &[usize], demand: &mut [f64], conv: &mut [bool], rl: &mut [bool]) {
    let mut dt = 0.0;
    for &f in fs {
        rl[f] = true;
        dt += demand[f];
    }
    if dt <= 1.0 + 1e-12 {
        return;
    }
    let mut es = 1.0 / fs.len() as f64;
    let mut ds = 0.0;
    loop {
        let mut changed = false;
        let mut nr = 0usize;
        for &f in fs {
            if !rl[f] {
                continue;
            }
            if demand[f] < es {
                ds += demand[f];
                rl[f] = false;
                changed = true;
            } else {
                nr += 1;
            }
        }
        if nr > 0 {
            es = (1.0 - ds) / nr as f64;
        }
        if !changed {
            break;
        }
    }
    for &f in fs {
        if rl[f] {
            demand[f] = es;
            conv[f] = true;
        }
    }
}

/// A flow as the controller sees it in one round.
#[derive(Debug, Clone)]
pub struct Seen {
    pub src: u32,
    pub dst: u32,
    /// Measured rate, bit/s.
    pub rate: f64,
    /// The flow's own sending rate (a UDP flow never wants more), bit/s.
    pub cap: f64,
    /// Current path index.
    pub path: usize,
    /// Already placed by Hedera (no longer on its ECMP route).
    pub placed: bool,
    /// Caller's key, stable over the flow's life (for reservations).
    pub key: u64,
}

/// The Hedera controller's state between rounds.
pub struct Controller {
    pub placement: Placement,
    /// Elephant threshold as a fraction of the host link rate (the papers: 10 %).
    pub threshold: f64,
    pub anneal_iterations: u32,
    /// First fit: reserved bit/s per link, and each placed flow's reservation.
    reserved: Vec<f64>,
    reservations: Vec<(u64, Vec<u32>, f64)>,
    /// Annealing: the core switch of each destination host (the paper's state).
    core_of_host: Vec<u32>,
    rng: rand_pcg::Pcg64Mcg,
}

impl Controller {
    pub fn new(placement: Placement, tree: &FatTree, links: usize, seed: u64) -> Controller {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
        // The annealer's first state: a random core per destination host.
        let core_of_host = (0..tree.hosts)
            .map(|_| rng.gen_range(0..tree.cores()))
            .collect();
        Controller {
            placement,
            threshold: 0.1,
            anneal_iterations: 1000,
            reserved: vec![0.0; links],
            reservations: Vec::new(),
            core_of_host,
            rng,
        }
    }

    /// A flow ended: free its reservation (first fit).
    pub fn release(&mut self, key: u64) {
        if let Some(i) = self.reservations.iter().position(|r| r.0 == key) {
            let (_, links, d) = self.reservations.swap_remove(i);
            for l in links {
                self.reserved[l as usize] = (self.reserved[l as usize] - d).max(0.0);
            }
        }
    }

    /// One control round. `loads[l]` is link l's measured load and `caps[l]` its
    /// capacity (bit/s). Returns (index into `flows`, new path) for every flow Hedera
    /// routes this round; the caller marks them placed.
    pub fn round(
        &mut self,
        tree: &FatTree,
        caps: &[f64],
        loads: &[f64],
        flows: &[Seen],
    ) -> Vec<(usize, usize)> {
        let thr = self.threshold * tree.host_bps;
        let big: Vec<usize> = (0..flows.len())
            .filter(|&i| flows[i].rate >= thr && tree.n_paths(flows[i].src, flows[i].dst) > 1)
            .collect();
        if big.is_empty() {
            return Vec::new();
        }
        // Natural demands of all elephants (bit/s), capped at each flow's own rate.
        let pairs: Vec<(u32, u32)> = big.iter().map(|&i| (flows[i].src, flows[i].dst)).collect();
        let est = estimate_demands(tree.hosts, &pairs);
        let demand: Vec<f64> = big
            .iter()
            .zip(&est)
            .map(|(&i, e)| (e * tree.host_bps).min(flows[i].cap))
            .collect();
        match self.placement {
            Placement::WorstFit => worst_fit(tree, caps, loads, flows, &big, &demand),
            Placement::FirstFit => self.first_fit(tree, caps, flows, &big, &demand),
            Placement::Annealing => self.anneal(tree, caps, flows, &big, &demand),
            Placement::Balanced => balanced(tree, caps, loads, flows, &big, &demand),
        }
    }

    fn first_fit(
        &mut self,
        tree: &FatTree,
        caps: &[f64],
        flows: &[Seen],
        big: &[usize],
        demand: &[f64],
    ) -> Vec<(usize, usize)> {
        let mut moves = Vec::new();
        for (k, &i) in big.iter().enumerate() {
            let f = &flows[i];
            if self.reservations.iter().any(|r| r.0 == f.key) {
                continue;
            }
            let d = demand[k];
            for p in 0..tree.n_paths(f.src, f.dst) {
                let links = tree.path(f.src, f.dst, p);
                if links
                    .iter()
                    .all(|&l| caps[l as usize] - self.reserved[l as usize] >= d - 1e-9)
                {
                    for &l in &links {
                        self.reserved[l as usize] += d;
                    }
                    self.reservations.push((f.key, links, d));
                    moves.push((i, p));
                    break;
                }
            }
        }
        moves
    }

    fn anneal(
        &mut self,
        tree: &FatTree,
        caps: &[f64],
        flows: &[Seen],
        big: &[usize],
        demand: &[f64],
    ) -> Vec<(usize, usize)> {
        let cores = tree.cores();
        let half = tree.k / 2;
        let path_of = |state: &[u32], f: &Seen| -> usize {
            let c = state[f.dst as usize];
            match tree.n_paths(f.src, f.dst) {
                1 => 0,
                n if n == cores as usize => c as usize,
                _ => (c / half) as usize,
            }
        };
        let energy = |state: &[u32]| -> f64 {
            let mut load = vec![0.0; caps.len()];
            for (k, &i) in big.iter().enumerate() {
                for l in tree.path(flows[i].src, flows[i].dst, path_of(state, &flows[i])) {
                    load[l as usize] += demand[k];
                }
            }
            load.iter()
                .zip(caps)
                .map(|(l, c)| (l - c).max(0.0))
                .sum::<f64>()
        };
        let mut state = self.core_of_host.clone();
        let mut e = energy(&state);
        let mut best = (e, state.clone());
        let t0 = tree.host_bps;
        let iters = self.anneal_iterations.max(1);
        for it in 0..iters {
            if best.0 <= 0.0 {
                break;
            }
            let temp = t0 * (1.0 - it as f64 / iters as f64);
            let mut next = state.clone();
            let h = self.rng.gen_range(0..tree.hosts) as usize;
            if self.rng.gen_bool(0.5) {
                // Swap the cores of two hosts of the same pod (the paper's neighbour).
                let pod = tree.pod_of(h as u32);
                let per_pod = tree.hosts / tree.k;
                let g = (pod * per_pod + self.rng.gen_range(0..per_pod)) as usize;
                next.swap(h, g);
            } else {
                next[h] = self.rng.gen_range(0..cores);
            }
            let en = energy(&next);
            let accept = en <= e || (temp > 0.0 && self.rng.gen::<f64>() < ((e - en) / temp).exp());
            if accept {
                state = next;
                e = en;
                if e < best.0 {
                    best = (e, state.clone());
                }
            }
        }
        self.core_of_host = best.1;
        big.iter()
            .map(|&i| (i, path_of(&self.core_of_host, &flows[i])))
            .collect()
    }
}

/// Seed 002's worst fit (see [`Placement::WorstFit`]). The working view starts from the
/// measured loads; a moved flow leaves its measured rate on the old path's links and
/// adds its estimated demand to the new path's.
fn worst_fit(
    tree: &FatTree,
    caps: &[f64],
    loads: &[f64],
    flows: &[Seen],
    big: &[usize],
    demand: &[f64],
) -> Vec<(usize, usize)> {
    let mut view = loads.to_vec();
    let mut moves = Vec::new();
    for (k, &i) in big.iter().enumerate() {
        let f = &flows[i];
        if f.placed {
            continue;
        }
        for l in tree.path(f.src, f.dst, f.path) {
            view[l as usize] -= f.rate;
        }
        let mut best = (f64::NEG_INFINITY, 0usize);
        for p in 0..tree.n_paths(f.src, f.dst) {
            let avail = tree
                .path(f.src, f.dst, p)
                .iter()
                .map(|&l| caps[l as usize] - view[l as usize])
                .fold(f64::INFINITY, f64::min);
            if avail > best.0 + 1e-9 {
                best = (avail, p);
            }
        }
        for l in tree.path(f.src, f.dst, best.1) {
            view[l as usize] += demand[k];
        }
        moves.push((i, best.1));
    }
    moves
}

/// See [`Placement::Balanced`]: mice keep their measured load; elephants are placed
/// largest first on the path that adds least to the sum of squared utilisations, then
/// moved one at a time while that sum drops (a potential game: it converges).
fn balanced(
    tree: &FatTree,
    caps: &[f64],
    loads: &[f64],
    flows: &[Seen],
    big: &[usize],
    demand: &[f64],
) -> Vec<(usize, usize)> {
    // Mice keep their measured load.
    let mut base = loads.to_vec();
    for &i in big {
        let f = &flows[i];
        for l in tree.path(f.src, f.dst, f.path) {
            base[l as usize] = (base[l as usize] - f.rate).max(0.0);
        }
    }
    let paths: Vec<Vec<Vec<u32>>> = big
        .iter()
        .map(|&i| {
            let f = &flows[i];
            (0..tree.n_paths(f.src, f.dst))
                .map(|p| tree.path(f.src, f.dst, p))
                .collect()
        })
        .collect();
    let mut order: Vec<usize> = (0..big.len()).collect();
    order.sort_by(|&a, &b| demand[b].total_cmp(&demand[a]).then(a.cmp(&b)));
    // Two candidates: improve the current placement, and build one from scratch
    // (largest first); keep the current one unless the other is really better.
    let current: Vec<usize> = big.iter().map(|&i| flows[i].path).collect();
    let (keep, pk) = improve(caps, &base, &paths, demand, &order, Some(current));
    let (fresh, pf) = improve(caps, &base, &paths, demand, &order, None);
    let choice = if pf < pk - 1e-6 * pk.max(1e-12) {
        fresh
    } else {
        keep
    };
    big.iter()
        .zip(&choice)
        .filter(|(&i, &p)| flows[i].path != p || !flows[i].placed)
        .map(|(&i, &p)| (i, p))
        .collect()
}

/// Best response on the sum of squared utilisations, from `start` or (None) from an
/// empty network placing flows in `order`. Returns the placement and its potential.
fn improve(
    caps: &[f64],
    base: &[f64],
    paths: &[Vec<Vec<u32>>],
    demand: &[f64],
    order: &[usize],
    start: Option<Vec<usize>>,
) -> (Vec<usize>, f64) {
    let cost = |view: &[f64], links: &[u32], d: f64| -> f64 {
        links
            .iter()
            .map(|&l| {
                let (v, c) = (view[l as usize], caps[l as usize]);
                d * (2.0 * v + d) / (c * c)
            })
            .sum()
    };
    let mut view = base.to_vec();
    let mut choice = match start {
        Some(c) => {
            for (k, &p) in c.iter().enumerate() {
                for &l in &paths[k][p] {
                    view[l as usize] += demand[k];
                }
            }
            c
        }
        None => vec![usize::MAX; paths.len()],
    };
    for _pass in 0..50 {
        let mut changed = false;
        for &k in order {
            let d = demand[k];
            let mut best = (f64::INFINITY, usize::MAX);
            if choice[k] != usize::MAX {
                for &l in &paths[k][choice[k]] {
                    view[l as usize] -= d;
                }
                best = (cost(&view, &paths[k][choice[k]], d), choice[k]);
            }
            let stay = best.0;
            for (p, links) in paths[k].iter().enumerate() {
                let c = cost(&view, links, d);
                // Move only for a real gain (measurement noise must not shuffle flows).
                let gain = if stay.is_finite() {
                    1e-6 * stay.max(1e-12)
                } else {
                    0.0
                };
                if c < best.0 - gain {
                    best = (c, p);
                }
            }
            if best.1 != choice[k] {
                changed = true;
                choice[k] = best.1;
            }
            for &l in &paths[k][choice[k]] {
                view[l as usize] += d;
            }
        }
        if !changed {
            break;
        }
    }
    let potential = view.iter().zip(caps).map(|(v, c)| (v / c) * (v / c)).sum();
    (choice, potential)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::Fluid;

    fn close(a: &[f64], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-9, "{a:?} != {b:?}");
        }
    }

    #[test]
    fn demand_estimator_hand_computed() {
        // Host 0 sends to 1, 2, 3, 4: a quarter each (sender-limited). Host 3 also gets
        // a flow from 1 and from 2: over-subscribed, it leaves 0 -> 3 its quarter and
        // splits the other 0.75 between 1 -> 3 and 2 -> 3 (0.375 each). Host 1 gives
        // what is left, 0.625, to its second flow 1 -> 4 (host 4 gets 0.875 in all).
        let flows = [(0, 3), (0, 1), (0, 2), (1, 3), (2, 3), (0, 4), (1, 4)];
        let d = estimate_demands(5, &flows);
        close(&d, &[0.25, 0.25, 0.25, 0.375, 0.375, 0.25, 0.625]);
        // One flow each way: the whole NIC. Two senders to one receiver: a half each.
        close(&estimate_demands(2, &[(0, 1), (1, 0)]), &[1.0, 1.0]);
        close(&estimate_demands(3, &[(0, 2), (1, 2)]), &[0.5, 0.5]);
        // A receiver-limited flow's sender gives the rest to its other flow:
        // 0 -> 2 and 1 -> 2 get 0.5 each at host 2; host 0's flow 0 -> 1 gets 0.5 too.
        close(
            &estimate_demands(3, &[(0, 2), (1, 2), (0, 1)]),
            &[0.5, 0.5, 0.5],
        );
    }

    fn seen(src: u32, dst: u32, rate: f64, path: usize, key: u64) -> Seen {
        Seen {
            src,
            dst,
            rate,
            cap: 12e6,
            path,
            placed: false,
            key,
        }
    }

    fn tree(switch_bps: f64, host_bps: f64) -> (FatTree, Vec<f64>) {
        let mut n = Fluid::new();
        let t = FatTree::build(&mut n, 4, 2, switch_bps, host_bps);
        let caps = n.links.iter().map(|l| l.cap).collect();
        (t, caps)
    }

    fn loads_of(t: &FatTree, caps: &[f64], flows: &[Seen]) -> Vec<f64> {
        let mut l = vec![0.0; caps.len()];
        for f in flows {
            for x in t.path(f.src, f.dst, f.path) {
                l[x as usize] += f.rate;
            }
        }
        l
    }

    #[test]
    fn first_fit_takes_the_first_path_with_room() {
        // Hosts 0 and 1 share edge switch 0 of pod 0 and send to hosts 4, 5 (pod 1) at
        // the full 1 Mbit/s of their NICs over 1 Mbit/s switch links. The first takes
        // path 0 (core 0); the second finds edge 0 -> aggregation 0 reserved, so not
        // path 0 or 1 (both via aggregation 0): path 2 (core 2).
        let (t, caps) = tree(1e6, 1e6);
        let flows = vec![seen(0, 4, 1e6, 0, 1), seen(1, 5, 1e6, 0, 2)];
        let mut c = Controller::new(Placement::FirstFit, &t, caps.len(), 1);
        let loads = loads_of(&t, &caps, &flows);
        assert_eq!(c.round(&t, &caps, &loads, &flows), vec![(0, 0), (1, 2)]);
        // Placed flows are not moved again; a released reservation frees its path.
        assert_eq!(c.round(&t, &caps, &loads, &flows), vec![]);
        c.release(2);
        c.release(1);
        let third = vec![seen(1, 5, 1e6, 2, 3)];
        assert_eq!(c.round(&t, &caps, &loads, &third), vec![(0, 0)]);
    }

    #[test]
    fn worst_fit_picks_the_most_available_path() {
        // 10 Mbit/s everywhere. An elephant 0 -> 4 on path 0, and a mouse (below 10 %)
        // 2 -> 6 also on path 0: it shares aggregation 0 -> core 0 and core 0 -> pod 1,
        // not the edge links. Path 1 (core 1) has 10 free, path 0 only 9.95, paths
        // 2 and 3 carry a placed 5 Mbit/s flow 1 -> 5: worst fit moves 0 -> 4 to path 1.
        let (t, caps) = tree(10e6, 10e6);
        let mut placed = seen(1, 5, 5e6, 2, 3);
        placed.placed = true;
        let flows = vec![seen(0, 4, 1e6, 0, 1), seen(2, 6, 0.05e6, 0, 2), placed];
        let loads = loads_of(&t, &caps, &flows);
        let mut c = Controller::new(Placement::WorstFit, &t, caps.len(), 1);
        assert_eq!(c.round(&t, &caps, &loads, &flows), vec![(0, 1)]);
        // With 1 Mbit/s host links (the thesis), every path's narrowest link is the
        // host link: all tie and the first route wins, so worst fit moves nothing.
        let (t, caps) = tree(10e6, 1e6);
        let flows = vec![seen(0, 4, 1e6, 0, 1), seen(2, 6, 0.05e6, 0, 2)];
        let loads = loads_of(&t, &caps, &flows);
        let mut c = Controller::new(Placement::WorstFit, &t, caps.len(), 1);
        assert_eq!(c.round(&t, &caps, &loads, &flows), vec![(0, 0)]);
    }

    #[test]
    fn balanced_spreads_four_elephants_over_four_cores() {
        // Hosts 0-3 (pod 0) send to hosts 4-7 (pod 1), all on path 0 (core 0).
        let (t, caps) = tree(10e6, 1e6);
        let flows: Vec<_> = (0..4).map(|h| seen(h, 4 + h, 1e6, 0, h as u64)).collect();
        let loads = loads_of(&t, &caps, &flows);
        let mut c = Controller::new(Placement::Balanced, &t, caps.len(), 1);
        let moves = c.round(&t, &caps, &loads, &flows);
        let mut cores: Vec<usize> = moves.iter().map(|m| m.1).collect();
        cores.sort();
        assert_eq!(cores, vec![0, 1, 2, 3]);
    }

    #[test]
    fn annealing_finds_a_placement_without_overload() {
        // As the first-fit case: the two flows must leave edge 0 by different
        // aggregation switches, i.e. their destinations need cores of different halves.
        let (t, caps) = tree(1e6, 1e6);
        let flows = vec![seen(0, 4, 1e6, 0, 1), seen(1, 5, 1e6, 0, 2)];
        let loads = loads_of(&t, &caps, &flows);
        let mut c = Controller::new(Placement::Annealing, &t, caps.len(), 9);
        // Start from the worst state: both destinations on core 0.
        c.core_of_host = vec![0; t.hosts as usize];
        let moves = c.round(&t, &caps, &loads, &flows);
        assert_eq!(moves.len(), 2);
        let (a, b) = (moves[0].1 as u32 / 2, moves[1].1 as u32 / 2);
        assert_ne!(a, b, "{moves:?}");
    }
}
