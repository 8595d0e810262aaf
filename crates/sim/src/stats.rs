//! Run metrics: fragment network delay (average, 99 %, max), retransmitted segments,
//! fragment loss, and the event-building view in the runtime's accounting terms.

use serde::Serialize;

use crate::config::Transport;
use crate::engine::{Time, SEC};
use crate::world::{World, NEVER};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimSummary {
    pub lcms: u32,
    pub pcs: u32,
    pub transport: String,
    pub scheme: String,
    pub bio: String,
    pub slices: u64,
    /// Fragments produced and not suppressed (each must arrive).
    pub fragments: u64,
    pub fragments_sent: u64,
    pub fragments_suppressed: u64,
    pub fragments_arrived: u64,
    /// Produced (not suppressed) but not arrived by the end: lost in the network or
    /// never sent.
    pub fragments_lost: u64,
    pub loss_pct: f64,
    pub delay_avg_s: f64,
    pub delay_p99_s: f64,
    pub delay_max_s: f64,
    pub segments_sent: u64,
    pub segments_retransmitted: u64,
    pub retrans_pct: f64,
    pub tcp_timeouts: u64,
    pub packets_dropped: u64,
    pub packets_corrupted: u64,
    /// Event-building view: a TF (slice) is complete when every fragment sent for it
    /// arrived before the end of the relaxation period.
    pub tfs_issued: u64,
    /// TF latency: from the end of its slice (its fragments exist) to its last fragment
    /// arriving, over complete TFs (p50, p99, max).
    pub tf_latency_p50_s: f64,
    pub tf_latency_p99_s: f64,
    pub tf_latency_max_s: f64,
    /// Fragment bytes arrived per second, from the first slice's start to the last arrival.
    pub goodput_mbps: f64,
    pub tfs_complete: u64,
    pub tfs_incomplete: u64,
    pub invariant_ok: bool,
    pub events: u64,
}

fn secs(t: Time) -> f64 {
    t as f64 / SEC as f64
}

/// ((p50, p99, max) TF latency of complete TFs in s, goodput in Mbit/s).
fn building(w: &World, slice_ok: &[bool]) -> ((f64, f64, f64), f64) {
    let mut last: Vec<Time> = vec![0; slice_ok.len()];
    let (mut bytes, mut end) = (0u64, 0);
    for f in w
        .frags
        .iter()
        .filter(|f| !f.suppressed && f.arrived != NEVER)
    {
        let l = &mut last[f.slice as usize];
        *l = (*l).max(f.arrived);
        bytes += f.bytes as u64;
        end = end.max(f.arrived);
    }
    // Slice n's fragments exist at the end of the slice, (n + 1) slice lengths in.
    // A slice whose fragments were all suppressed has no latency.
    let mut lat: Vec<Time> = (0..slice_ok.len())
        .filter(|&n| slice_ok[n] && last[n] > 0)
        .map(|n| last[n].saturating_sub((n as u64 + 1) * w.slice_len()))
        .collect();
    lat.sort_unstable();
    let pct = |q: f64| fanin_report::percentile(&lat, q).map_or(0.0, secs);
    let max = lat.last().map_or(0.0, |&t| secs(t));
    let goodput = if end == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / secs(end) / 1e6
    };
    ((pct(0.5), pct(0.99), max), goodput)
}

/// What became of the fragments, counted from the fragments alone.
struct Fragments {
    /// Arrival minus send time of each fragment that arrived.
    delays: Vec<Time>,
    produced: u64,
    sent: u64,
    suppressed: u64,
    arrived: u64,
    /// Per slice seen: every fragment of it arrived (checked against the configured
    /// slice count).
    slice_ok: Vec<bool>,
}

impl Fragments {
    fn of(w: &World) -> Fragments {
        let seen = w.frags.iter().map(|f| f.slice + 1).max().unwrap_or(0) as usize;
        let mut t = Fragments {
            delays: Vec::new(),
            produced: 0,
            sent: 0,
            suppressed: 0,
            arrived: 0,
            slice_ok: vec![true; seen],
        };
        for f in &w.frags {
            if f.suppressed {
                t.suppressed += 1;
                continue;
            }
            t.produced += 1;
            if f.sent != NEVER {
                t.sent += 1;
            }
            if f.arrived != NEVER {
                t.arrived += 1;
                t.delays.push(f.arrived - f.sent);
            } else {
                t.slice_ok[f.slice as usize] = false;
            }
        }
        t
    }
}

/// The transmission scheme's name: direct, delayed with its k, or pull with its tokens.
fn scheme(c: &crate::config::SimConfig) -> String {
    match (c.k, c.pull) {
        (Some(k), _) => format!("delayed k={k}"),
        (None, Some(n)) => format!("pull {n} (flp tokens {})", c.flp_tokens.unwrap_or(2)),
        (None, None) => "direct".into(),
    }
}

impl SimSummary {
    pub fn of(w: &World) -> SimSummary {
        let Fragments {
            mut delays,
            produced,
            sent,
            suppressed,
            arrived,
            slice_ok,
        } = Fragments::of(w);
        let seen = slice_ok.len();
        delays.sort_unstable();
        let (tf_latency, goodput_mbps) = building(w, &slice_ok);
        let avg = if delays.is_empty() {
            0.0
        } else {
            delays.iter().map(|&d| secs(d)).sum::<f64>() / delays.len() as f64
        };
        let pct = |q: f64| fanin_report::percentile(&delays, q).map_or(0.0, secs);
        let (segs, retx, timeouts) = w.tcp_segments();
        let complete = slice_ok.iter().filter(|&&ok| ok).count() as u64;
        let incomplete = slice_ok.iter().filter(|&&ok| !ok).count() as u64;
        let issued = w.slices();
        let c = &w.cfg;
        SimSummary {
            lcms: c.lcms(),
            pcs: w.pcs() as u32,
            transport: match c.transport {
                Transport::Tcp => "tcp".into(),
                Transport::Udp => "udp".into(),
            },
            scheme: scheme(c),
            bio: format!("{:?}", c.bio).to_lowercase(),
            slices: issued,
            fragments: produced,
            fragments_sent: sent,
            fragments_suppressed: suppressed,
            fragments_arrived: arrived,
            fragments_lost: produced - arrived,
            loss_pct: if produced == 0 {
                0.0
            } else {
                100.0 * (produced - arrived) as f64 / produced as f64
            },
            delay_avg_s: avg,
            delay_p99_s: pct(0.99),
            delay_max_s: delays.last().map(|&d| secs(d)).unwrap_or(0.0),
            segments_sent: segs,
            segments_retransmitted: retx,
            retrans_pct: if segs == 0 {
                0.0
            } else {
                100.0 * retx as f64 / segs as f64
            },
            tcp_timeouts: timeouts,
            packets_dropped: w.net.total_drops(),
            packets_corrupted: w.net.corrupted,
            tfs_issued: issued,
            tf_latency_p50_s: tf_latency.0,
            tf_latency_p99_s: tf_latency.1,
            tf_latency_max_s: tf_latency.2,
            goodput_mbps,
            tfs_complete: complete,
            tfs_incomplete: incomplete,
            // Every configured slice produced fragments, and each is complete or not.
            invariant_ok: seen as u64 == issued && issued == complete + incomplete,
            events: w.events(),
        }
    }

    /// One line, for logs and for comparing runs.
    pub fn line(&self) -> String {
        format!(
            "{} LCMs -> {} PCs {} {} bio={}: slices {} fragments {} arrived {} lost {} ({:.2} %) delay avg {:.4} s p99 {:.4} s max {:.4} s retrans {:.2} % TFs complete {} incomplete {} events {}",
            self.lcms,
            self.pcs,
            self.transport,
            self.scheme,
            self.bio,
            self.slices,
            self.fragments_sent,
            self.fragments_arrived,
            self.fragments_lost,
            self.loss_pct,
            self.delay_avg_s,
            self.delay_p99_s,
            self.delay_max_s,
            self.retrans_pct,
            self.tfs_complete,
            self.tfs_incomplete,
            self.events
        )
    }
}
