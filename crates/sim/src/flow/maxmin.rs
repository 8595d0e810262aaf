//! Max-min fair rates by progressive filling (water-filling) over shared links.
//! Owns only the arithmetic: links with capacities, flows with paths and demand caps.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A link's fair share when it was queued, ordered smallest first (ties: lower link id
/// first). Shares only grow while filling (flows freeze at the current level, which is
/// at most any link's share), so a queued share is a lower bound: a popped entry whose
/// link's share has grown since is queued again with the new value.
#[derive(PartialEq)]
struct Share {
    share: f64,
    link: u32,
}

impl Eq for Share {}

impl Ord for Share {
    fn cmp(&self, o: &Self) -> Ordering {
        // BinaryHeap is a max-heap: reverse for smallest share first.
        o.share
            .total_cmp(&self.share)
            .then_with(|| o.link.cmp(&self.link))
    }
}

impl PartialOrd for Share {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Scratch space reused between solves (no allocation in the steady state).
#[derive(Default)]
pub struct Solver {
    rem: Vec<f64>,
    n: Vec<u32>,
    start: Vec<u32>,
    members: Vec<u32>,
    fill: Vec<u32>,
    /// Every flow's links, copied contiguously (flow i: plinks[poff[i]..poff[i + 1]]).
    plinks: Vec<u32>,
    poff: Vec<u32>,
    frozen: Vec<bool>,
    by_demand: Vec<u32>,
    heap: BinaryHeap<Share>,
}

/// The flows as the solver sees them: flow `i` crosses `path(i)` and has a demand cap
/// `demand(i)` (same unit as the capacities, `f64::INFINITY` for an elastic flow).
pub trait Flows {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn path(&self, i: usize) -> &[u32];
    fn demand(&self, i: usize) -> f64;
}

impl Flows for [(Vec<u32>, f64)] {
    fn len(&self) -> usize {
        <[_]>::len(self)
    }
    fn path(&self, i: usize) -> &[u32] {
        &self[i].0
    }
    fn demand(&self, i: usize) -> f64 {
        self[i].1
    }
}

impl Solver {
    /// Max-min fair rates: every flow gets its demand or is limited by a saturated link
    /// on which no flow has a larger rate. `rates[i]` is flow `i`'s rate (same unit as
    /// `caps`). A flow with no links and no finite demand gets `f64::INFINITY`.
    pub fn solve<F: Flows + ?Sized>(&mut self, caps: &[f64], flows: &F, rates: &mut Vec<f64>) {
        rates.clear();
        rates.resize(flows.len(), 0.0);
        self.rem.clear();
        self.rem.extend_from_slice(caps);
        self.index(caps.len(), flows);
        self.order_demands(flows);
        self.heap.clear();
        for l in 0..caps.len() {
            if self.n[l] > 0 {
                self.heap.push(Share {
                    share: self.rem[l] / self.n[l] as f64,
                    link: l as u32,
                });
            }
        }
        let mut next_demand = 0usize;
        let mut left = flows.len();
        while left > 0 {
            let link = self.smallest_share();
            while next_demand < self.by_demand.len()
                && self.frozen[self.by_demand[next_demand] as usize]
            {
                next_demand += 1;
            }
            let dem = self
                .by_demand
                .get(next_demand)
                .map(|&f| (flows.demand(f as usize), f));
            match (link, dem) {
                (None, None) => {
                    // Only unconstrained flows remain.
                    for (i, r) in rates.iter_mut().enumerate() {
                        if !self.frozen[i] {
                            *r = f64::INFINITY;
                        }
                    }
                    break;
                }
                (l, Some((d, f))) if l.is_none_or(|(s, _)| d <= s) => {
                    self.freeze(f as usize, d, u32::MAX, rates);
                    left -= 1;
                }
                (Some((s, l)), _) => left -= self.saturate(l, s, rates),
                (None, Some(_)) => unreachable!("covered by the guard above"),
            }
        }
    }

    /// Per-link member lists (compressed rows: link l's flows are
    /// members[start[l]..start[l + 1]]), from a compact copy of the paths, so the flows
    /// themselves are read once, in order. Every flow starts unfrozen.
    fn index<F: Flows + ?Sized>(&mut self, nl: usize, flows: &F) {
        self.n.clear();
        self.n.resize(nl, 0);
        let nf = flows.len();
        self.plinks.clear();
        self.poff.clear();
        self.poff.reserve(nf + 1);
        for i in 0..nf {
            self.poff.push(self.plinks.len() as u32);
            for &l in flows.path(i) {
                self.n[l as usize] += 1;
                self.plinks.push(l);
            }
        }
        self.poff.push(self.plinks.len() as u32);
        self.start.clear();
        self.start.reserve(nl + 1);
        let mut acc = 0u32;
        for &c in &self.n {
            self.start.push(acc);
            acc += c;
        }
        self.start.push(acc);
        self.members.clear();
        self.members.resize(acc as usize, 0);
        self.fill.clear();
        self.fill.extend_from_slice(&self.start[..nl]);
        for i in 0..nf {
            for k in self.poff[i]..self.poff[i + 1] {
                let l = self.plinks[k as usize] as usize;
                self.members[self.fill[l] as usize] = i as u32;
                self.fill[l] += 1;
            }
        }
        self.frozen.clear();
        self.frozen.resize(nf, false);
    }

    /// The flows with a finite demand, smallest demand first (ties: lower flow id).
    fn order_demands<F: Flows + ?Sized>(&mut self, flows: &F) {
        self.by_demand.clear();
        self.by_demand
            .extend((0..flows.len() as u32).filter(|&i| flows.demand(i as usize).is_finite()));
        self.by_demand.sort_by(|&a, &b| {
            flows
                .demand(a as usize)
                .total_cmp(&flows.demand(b as usize))
                .then(a.cmp(&b))
        });
    }

    /// The smallest current link share and its link, if a link still has unfrozen
    /// flows: finished links are dropped from the heap, grown shares requeued.
    fn smallest_share(&mut self) -> Option<(f64, u32)> {
        while let Some(top) = self.heap.peek() {
            let l = top.link as usize;
            if self.n[l] == 0 {
                self.heap.pop();
                continue;
            }
            let now = self.rem[l] / self.n[l] as f64;
            if now > top.share * (1.0 + 1e-12) + 1e-12 {
                self.heap.pop();
                self.heap.push(Share {
                    share: now,
                    link: l as u32,
                });
                continue;
            }
            break;
        }
        let s = self.heap.peek()?;
        Some((
            self.rem[s.link as usize] / self.n[s.link as usize] as f64,
            s.link,
        ))
    }

    /// Link `l` is saturated at `share`: its unfrozen flows freeze there. Returns how many.
    fn saturate(&mut self, l: u32, share: f64, rates: &mut [f64]) -> usize {
        let (a, b) = (
            self.start[l as usize] as usize,
            self.start[l as usize + 1] as usize,
        );
        let mut frozen = 0;
        for k in a..b {
            let f = self.members[k] as usize;
            if !self.frozen[f] {
                self.freeze(f, share, l, rates);
                frozen += 1;
            }
        }
        self.n[l as usize] = 0;
        frozen
    }

    fn freeze(&mut self, f: usize, rate: f64, at: u32, rates: &mut [f64]) {
        self.frozen[f] = true;
        rates[f] = rate;
        for k in self.poff[f]..self.poff[f + 1] {
            let l = self.plinks[k as usize];
            let li = l as usize;
            if l != at {
                self.rem[li] = (self.rem[li] - rate).max(0.0);
            }
            self.n[li] -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn solve(caps: &[f64], flows: &[(Vec<u32>, f64)]) -> Vec<f64> {
        let mut r = Vec::new();
        Solver::default().solve(caps, flows, &mut r);
        r
    }

    const INF: f64 = f64::INFINITY;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-9, "{a:?} != {b:?}");
        }
    }

    #[test]
    fn three_flows_over_two_links() {
        // Link 0 (10) carries flows 0 and 1; link 1 (4) carries flows 1 and 2.
        // Link 1 is the bottleneck at 2 each; flow 0 takes the rest of link 0: 8.
        let r = solve(
            &[10.0, 4.0],
            &[(vec![0], INF), (vec![0, 1], INF), (vec![1], INF)],
        );
        close(&r, &[8.0, 2.0, 2.0]);
    }

    #[test]
    fn parking_lot() {
        // One long flow over three unit links, one short flow on each: 1/2 each.
        let r = solve(
            &[1.0, 1.0, 1.0],
            &[
                (vec![0, 1, 2], INF),
                (vec![0], INF),
                (vec![1], INF),
                (vec![2], INF),
            ],
        );
        close(&r, &[0.5; 4]);
        // Link 2 twice as wide: its short flow gets 1.5.
        let r = solve(
            &[1.0, 1.0, 2.0],
            &[
                (vec![0, 1, 2], INF),
                (vec![0], INF),
                (vec![1], INF),
                (vec![2], INF),
            ],
        );
        close(&r, &[0.5, 0.5, 0.5, 1.5]);
    }

    #[test]
    fn demand_caps_leave_the_rest_to_others() {
        // A constant-rate flow of 1 on a link of 10 shared with two elastic ones.
        let r = solve(&[10.0], &[(vec![0], 1.0), (vec![0], INF), (vec![0], INF)]);
        close(&r, &[1.0, 4.5, 4.5]);
        // Caps above the fair share do not bind.
        let r = solve(&[10.0], &[(vec![0], 6.0), (vec![0], 7.0)]);
        close(&r, &[5.0, 5.0]);
        // A flow with no links runs at its demand; with none at all, unbounded.
        let r = solve(&[10.0], &[(vec![], 3.0), (vec![], INF)]);
        assert_eq!(r[0], 3.0);
        assert!(r[1].is_infinite());
    }

    #[test]
    fn two_level_bottlenecks() {
        // Links: a=3, b=10, c=4. Flows: f0 a; f1 a+b; f2 b+c; f3 c; f4 b.
        // a: share 1.5 (f0, f1); c: 2 (f2, f3); b: 10/3. Freeze a at 1.5 -> b has 8.5
        // for f2, f4 (4.25); c share 2 < 4.25: f2 = f3 = 2; f4 = 8.5 - 2 = 6.5.
        let r = solve(
            &[3.0, 10.0, 4.0],
            &[
                (vec![0], INF),
                (vec![0, 1], INF),
                (vec![1, 2], INF),
                (vec![2], INF),
                (vec![1], INF),
            ],
        );
        close(&r, &[1.5, 1.5, 2.0, 2.0, 6.5]);
    }

    /// Checks the defining property on random instances: feasible, and each flow is at
    /// its demand or crosses a saturated link on which it has the largest rate.
    #[test]
    fn random_instances_are_max_min_fair() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        let mut solver = Solver::default();
        let mut rates = Vec::new();
        for _ in 0..300 {
            let nl = rng.gen_range(1..8);
            let caps: Vec<f64> = (0..nl).map(|_| rng.gen_range(1..20) as f64).collect();
            let flows: Vec<(Vec<u32>, f64)> = (0..rng.gen_range(1..12))
                .map(|_| {
                    let mut p: Vec<u32> = (0..nl as u32).filter(|_| rng.gen_bool(0.4)).collect();
                    if p.is_empty() {
                        p.push(rng.gen_range(0..nl as u32));
                    }
                    let d = if rng.gen_bool(0.3) {
                        rng.gen_range(1..10) as f64
                    } else {
                        INF
                    };
                    (p, d)
                })
                .collect();
            solver.solve(&caps, flows.as_slice(), &mut rates);
            let mut load = vec![0.0; nl];
            for (f, r) in flows.iter().zip(&rates) {
                assert!(*r <= f.1 + 1e-9);
                for &l in &f.0 {
                    load[l as usize] += r;
                }
            }
            for l in 0..nl {
                assert!(load[l] <= caps[l] + 1e-9, "overloaded link");
            }
            for (i, f) in flows.iter().enumerate() {
                if (rates[i] - f.1).abs() < 1e-9 {
                    continue;
                }
                let bottleneck = f.0.iter().any(|&l| {
                    let l = l as usize;
                    load[l] >= caps[l] - 1e-9
                        && flows
                            .iter()
                            .enumerate()
                            .filter(|(_, g)| g.0.contains(&(l as u32)))
                            .all(|(j, _)| rates[j] <= rates[i] + 1e-9)
                });
                assert!(
                    bottleneck,
                    "flow {i} has no bottleneck: {flows:?} {rates:?}"
                );
            }
        }
    }
}
