//! Validations of the network model (docs/simulator.md): TCP fills a link, incast
//! collapses with a 200 ms minimum RTO and recovers with 200 us, UDP loses exactly
//! the excess over capacity, and the same seed gives the same result.

use fanin_sim::workload::Bio;
use fanin_sim::{simulate, SimConfig, SimSummary, Transport};

/// One sender, one receiver: LCM -> MLCM -> switch -> PC.
fn one_flow() -> SimConfig {
    SimConfig {
        strings: 1,
        sectors_per_string: 1,
        lcms_per_sector: 1,
        pcs: Some(1),
        lcm_mbps: 100.0,
        mlcm_mbps: 1000.0,
        pc_mbps: 1000.0,
        ..SimConfig::default()
    }
}

#[test]
fn one_tcp_flow_reaches_the_link_rate() {
    // A single 20 MB fragment over a 100 Mbit/s first hop with a 100-packet queue.
    let cfg = SimConfig {
        slice_ms: 10.0,
        duration_s: 0.01,
        relax_s: 10.0,
        fragment_bytes: 20_000_000,
        ..one_flow()
    };
    let w = simulate(cfg).unwrap();
    let s = SimSummary::of(&w);
    assert_eq!(s.fragments_arrived, 1, "{}", s.line());
    let wire = 20_000_000.0 * 1500.0 / 1460.0 * 8.0; // bits on the wire incl. headers
    let rate = wire / s.delay_max_s / 1e6;
    assert!(
        rate > 90.0 && rate <= 100.0,
        "one TCP flow achieved {rate:.1} Mbit/s of 100 ({})",
        s.line()
    );
}

/// `n` synchronised senders, 32 KiB each, into one 1 Gbit/s port with a 32 KiB buffer
/// (Vasudevan et al., SIGCOMM 2009). Returns the summary.
fn incast(n: u32, min_rto_ms: f64) -> SimSummary {
    let cfg = SimConfig {
        strings: 1,
        sectors_per_string: 1,
        lcms_per_sector: n,
        pcs: Some(1),
        lcm_mbps: 1000.0,
        mlcm_mbps: 10_000.0,
        pc_mbps: 1000.0,
        lcm_delay_us: 10.0,
        shore_delay_us: 10.0,
        pc_delay_us: 10.0,
        queue_bytes: Some(32 * 1024),
        fragment_bytes: 32 * 1024,
        min_rto_ms,
        // Not a divisor of the RTO series (1, 2, 4 s ...): a retransmission must not
        // land on the next synchronised burst every time (see docs/simulator.md).
        slice_ms: 473.0,
        duration_s: 20.0,
        relax_s: 5.0,
        ..SimConfig::default()
    };
    SimSummary::of(&simulate(cfg).unwrap())
}

#[test]
fn incast_collapses_with_a_200ms_min_rto_and_recovers_with_200us() {
    let slow = incast(32, 200.0);
    let fast = incast(32, 0.2);
    // Every block gets through in the end either way.
    assert_eq!(slow.fragments_lost, 0, "{}", slow.line());
    assert_eq!(fast.fragments_lost, 0, "{}", fast.line());
    // Collapse: time-outs stall the average block for longer than the minimum RTO.
    assert!(slow.tcp_timeouts > 0, "{}", slow.line());
    assert!(slow.delay_avg_s > 0.2, "{}", slow.line());
    // A 200 us minimum RTO makes the same losses cheap: an order of magnitude better.
    assert!(fast.delay_avg_s < 0.05, "{}", fast.line());
    assert!(
        fast.delay_avg_s * 10.0 < slow.delay_avg_s,
        "fast {} vs slow {}",
        fast.line(),
        slow.line()
    );
    // Every retransmitted segment is charged to exactly one fragment.
    for s in [&slow, &fast] {
        assert!(s.segments_retransmitted > 0);
    }
    // Two senders fit the buffer nearly always: no collapse.
    let few = incast(2, 200.0);
    assert!(few.delay_avg_s < 0.05, "{}", few.line());
}

#[test]
fn udp_loss_is_the_offered_load_over_capacity() {
    // One 1460-byte fragment (one 1500-byte packet) every 0.1 ms: 120 Mbit/s offered
    // into a 50 Mbit/s last hop.
    let cfg = SimConfig {
        transport: Transport::Udp,
        lcm_mbps: 1000.0,
        pc_mbps: 50.0,
        fragment_bytes: 1460,
        slice_ms: 0.1,
        duration_s: 2.0,
        relax_s: 1.0,
        ..one_flow()
    };
    let s = SimSummary::of(&simulate(cfg).unwrap());
    let expected = 100.0 * (1.0 - 50.0 / 120.0);
    assert!(
        (s.loss_pct - expected).abs() < 1.0,
        "loss {:.2} % vs expected {expected:.2} % ({})",
        s.loss_pct,
        s.line()
    );
    assert_eq!(s.tfs_complete + s.tfs_incomplete, s.tfs_issued);
}

#[test]
fn the_same_seed_gives_the_same_run_byte_for_byte() {
    let cfg = SimConfig {
        preset: Some("antares-2-string".into()),
        k: Some(8),
        bio: Bio::Cutoff,
        duration_s: 3.0,
        relax_s: 1.0,
        seed: 42,
        ..SimConfig::default()
    };
    let a = simulate(cfg.clone()).unwrap();
    let b = simulate(cfg.clone()).unwrap();
    let (sa, sb) = (SimSummary::of(&a), SimSummary::of(&b));
    assert_eq!(
        serde_json::to_string(&sa).unwrap(),
        serde_json::to_string(&sb).unwrap()
    );
    let times = |w: &fanin_sim::World| -> Vec<(u64, u64)> {
        w.frags.iter().map(|f| (f.sent, f.arrived)).collect()
    };
    assert_eq!(times(&a), times(&b));
    // Another seed changes the bioluminescence bursts.
    let c = simulate(SimConfig { seed: 43, ..cfg }).unwrap();
    let sizes = |w: &fanin_sim::World| -> Vec<u32> { w.frags.iter().map(|f| f.bytes).collect() };
    assert_ne!(sizes(&a), sizes(&c));
}

#[test]
fn retransmissions_are_charged_to_fragments_and_sizes_can_follow_a_model() {
    let cfg = SimConfig {
        preset: Some("antares-2-string".into()),
        fragment_size: Some("uniform(10000,50000)".into()),
        duration_s: 2.0,
        relax_s: 2.0,
        ..SimConfig::default()
    };
    let w = simulate(cfg.clone()).unwrap();
    let s = SimSummary::of(&w);
    let per_fragment: u64 = w.frags.iter().map(|f| f.retx as u64).sum();
    assert!(s.segments_retransmitted > 0, "{}", s.line());
    assert_eq!(per_fragment, s.segments_retransmitted);
    // Sizes follow the model, exactly as the runtime would draw them.
    let model: fanin_sched::StfSize = "uniform(10000,50000)".parse().unwrap();
    for f in &w.frags {
        assert!((10_000..=50_000).contains(&f.bytes));
        assert_eq!(f.bytes as u64, model.sample(cfg.seed, f.sender, f.slice));
    }
}
