//! Flow-level vs packet-level on the same event-building cases (docs/simulator.md,
//! "Flow-level vs packet-level: where they agree"): agreement and documented breakage.

// Each case runs a packet-level configuration and its flow-level twin
// (`fanin_sim::compare`) and compares per-TF latency: from the slice's transmission to
// its last fragment's arrival (packet), from issue to the last STF's end (flow). Run
// with `-- --nocapture` to print the numbers of the table in docs/simulator.md.

use fanin_sim::compare::{compare, flow_twin, Comparison};
use fanin_sim::SimConfig;

/// Payload plus header over payload: what TCP puts on the wire per payload byte
/// (1460-byte segments, 40-byte headers); the flow model carries payload only.
const HEADER_FACTOR: f64 = 1500.0 / 1460.0;

/// `senders` LCMs, each behind its own MLCM with a 10x faster uplink (never a
/// bottleneck: the twin is exact), to `receivers` PCs, all at 1 Gbit/s, 5 us per hop,
/// 1000-packet drop-tail queues, TCP with a 200 ms minimum RTO, 64 KiB fragments.
fn base(senders: u32, receivers: u32) -> SimConfig {
    SimConfig {
        strings: 1,
        sectors_per_string: senders,
        lcms_per_sector: 1,
        pcs: Some(receivers),
        lcm_mbps: 1000.0,
        mlcm_mbps: 10_000.0,
        pc_mbps: 1000.0,
        lcm_delay_us: 5.0,
        shore_delay_us: 5.0,
        pc_delay_us: 5.0,
        queue_packets: 1000,
        fragment_bytes: 65_536,
        slice_ms: 2.0,
        duration_s: 2.0,
        relax_s: 2.0,
        ..SimConfig::default()
    }
}

fn run(label: &str, cfg: &SimConfig) -> Comparison {
    let r = compare(cfg).unwrap();
    println!("{label}: {}", r.line());
    r
}

/// Seconds for `bytes` at `mbps` (the flow model's transfer time).
fn ideal(bytes: f64, mbps: f64) -> f64 {
    bytes * 8.0 / (mbps * 1e6)
}

fn within(what: &str, packet: f64, flow: f64, lo: f64, hi: f64) {
    let r = packet / flow;
    assert!(
        (lo..=hi).contains(&r),
        "{what}: packet {packet:.6} s / flow {flow:.6} s = {r:.4}, outside [{lo}, {hi}]"
    );
}

/// Where both models describe the same network: every TF completes, nothing is
/// dropped, and each statistic of the packet model is the flow model's within
/// [1.00, 1.06]: 2.7 % of headers plus the path latency the flow model has not.
fn assert_agree(what: &str, r: &Comparison) {
    assert_eq!(r.packet.incomplete, 0, "{what}: {}", r.line());
    assert_eq!(r.flow.incomplete, 0, "{what}: {}", r.line());
    assert_eq!(r.packet.complete, r.flow.complete, "{what}: {}", r.line());
    assert_eq!((r.packets_dropped, r.tcp_timeouts), (0, 0), "{what}");
    for (name, p, f) in [
        ("mean", r.packet.mean_s, r.flow.mean_s),
        ("p50", r.packet.p50_s, r.flow.p50_s),
        ("p99", r.packet.p99_s, r.flow.p99_s),
        ("max", r.packet.max_s, r.flow.max_s),
    ] {
        within(&format!("{what} {name}"), p, f, 1.0, 1.06);
    }
}

#[test]
fn many_to_many_with_ample_buffers_agrees_within_6_percent() {
    // 16 senders x 64 KiB to 8 receivers every 2 ms: a 1 MiB TF takes 8.39 ms on its
    // receiver's 1 Gbit/s link, 4-5 TFs in flight share the senders' links, each
    // receiver busy 52 % of the time. 1000-packet queues hold a whole TF: no loss.
    let r = run("16x8 fixed", &base(16, 8));
    assert_agree("16x8 fixed", &r);
    // The flow model is exact: 16 x 64 KiB at 1 Gbit/s, every TF.
    let t = ideal(16.0 * 65_536.0, 1000.0);
    assert!((r.flow.max_s - t).abs() < 1e-6 && (r.flow.p50_s - t).abs() < 1e-6);
    // The packet model adds its headers and the path latency (three store-and-forward
    // hops of 5 us plus a packet's serialisation), nothing else.
    let rest = r.packet.mean_s - r.flow.mean_s * HEADER_FACTOR;
    assert!(
        (0.0..100e-6).contains(&rest),
        "residual {rest:.6} s: {}",
        r.line()
    );

    // Sizes that differ between senders (one flow per STF in the flow model).
    let cfg = SimConfig {
        fragment_size: Some("uniform(32768,98304)".into()),
        ..base(16, 8)
    };
    assert!(!flow_twin(&cfg).unwrap().aggregate);
    let r = run("16x8 uniform", &cfg);
    assert_agree("16x8 uniform", &r);
    // The spread of TF sizes is the same in both: p99 / p50 agrees to 1 %.
    let spread = |l: &fanin_sim::compare::Latency| l.p99_s / l.p50_s;
    within(
        "16x8 uniform p99/p50",
        spread(&r.packet),
        spread(&r.flow),
        0.99,
        1.01,
    );
}

#[test]
fn antares_two_strings_agree_only_with_buffers_that_hold_a_tf() {
    // The thesis's 2-string model, direct transmission: 60 LCMs at 50 Mbit/s x 30 kB to
    // 20 PCs at 500 Mbit/s every 10 ms; a 1.8 MB TF takes 28.8 ms on its PC's link.
    let antares = |queue_packets: u32| SimConfig {
        preset: Some("antares-2-string".into()),
        queue_packets,
        duration_s: 2.0,
        relax_s: 5.0,
        ..SimConfig::default()
    };
    // 2000-packet queues (3 MB) hold a TF: agreement, the 50 Mbit/s first hop and the
    // 300 us shore link adding 0.7 ms of latency to 28.8 ms.
    let big = run("antares-2-string q=2000", &antares(2000));
    assert_agree("antares-2-string q=2000", &big);
    assert!((big.flow.mean_s - 0.0288).abs() < 1e-6);
    // The thesis's 100-packet queues: 60 senders' windows overflow the PC port, TCP
    // times out again and again (200 ms minimum RTO, exponential back-off) and TFs take
    // seconds. The flow model, which has no queues, still says 28.8 ms for every TF.
    let small = run("antares-2-string q=100", &antares(100));
    assert_eq!(small.flow.incomplete, 0);
    assert!((small.flow.max_s - 0.0288).abs() < 1e-6);
    assert!(small.tcp_timeouts > 1000, "{}", small.line());
    assert!(small.packet.p50_s > 0.5, "{}", small.line());
    assert!(small.mean_ratio() > 20.0, "{}", small.line());
}

/// 32 senders x 32 KiB to one receiver, 1 Gbit/s, 10 us per hop, a TF every 473 ms
/// (not a divisor of the RTO series: see "Phase lock" in docs/simulator.md), 20 s.
fn incast(queue_bytes: u64, min_rto_ms: f64) -> SimConfig {
    SimConfig {
        queue_bytes: Some(queue_bytes),
        fragment_bytes: 32 * 1024,
        min_rto_ms,
        lcm_delay_us: 10.0,
        shore_delay_us: 10.0,
        pc_delay_us: 10.0,
        slice_ms: 473.0,
        duration_s: 20.0,
        relax_s: 5.0,
        ..base(32, 1)
    }
}

#[test]
fn incast_with_a_small_buffer_is_what_the_flow_model_cannot_see() {
    let t = ideal(32.0 * 32_768.0, 1000.0); // 8.39 ms: the flow model's every TF
                                            // 32 KiB switch buffer, 200 ms minimum RTO: collapse, TFs 50-200 times the ideal.
    let slow = run("incast 32 KiB, min RTO 200 ms", &incast(32 * 1024, 200.0));
    assert!((slow.flow.mean_s - t).abs() < 1e-6 && (slow.flow.max_s - t).abs() < 1e-6);
    assert!(slow.tcp_timeouts > 0 && slow.packets_dropped > 0);
    assert_eq!(slow.packet.incomplete, 0, "{}", slow.line());
    assert!(
        (50.0..200.0).contains(&slow.mean_ratio()),
        "{}",
        slow.line()
    );
    assert!(slow.packet.p50_s > 0.2, "{}", slow.line());
    // The same losses with a 200 us minimum RTO: the median TF is within 25 % of the
    // flow model, but the first TF of each connection waits for the 1 s initial RTO.
    let fast = run("incast 32 KiB, min RTO 200 us", &incast(32 * 1024, 0.2));
    assert!(fast.packets_dropped > 0);
    within("incast fast p50", fast.packet.p50_s, t, 1.0, 1.25);
    assert!(fast.packet.max_s > 1.0, "{}", fast.line());
    assert!(fast.mean_ratio() > 2.0, "{}", fast.line());
    // A 1 MiB buffer holds the whole TF: no loss, and the models agree again.
    let big = run("incast 1 MiB, min RTO 200 ms", &incast(1 << 20, 200.0));
    assert_agree("incast 1 MiB", &big);
}

#[test]
fn near_capacity_the_packet_headers_decide_stability() {
    // 16 senders x 64 KiB to 4 receivers: each receiver gets a 1 MiB TF every 4 slices.
    let at = |slice_ms: f64| SimConfig {
        slice_ms,
        ..base(16, 4)
    };
    let t = ideal(16.0 * 65_536.0, 1000.0);
    // 2.2 ms slices: 95.3 % of a receiver link in payload, 97.9 % on the wire: both
    // models are stable and agree.
    let under = run("16x4 95 % payload", &at(2.2));
    assert_agree("16x4 95 %", &under);
    // 2.1 ms slices: 99.9 % in payload, 102.6 % on the wire. The flow model (payload
    // only) keeps every TF at 8.39 ms; the packet model is overloaded and its latency
    // grows for as long as TFs come (tenfold in 2 s).
    let near = run("16x4 99.9 % payload", &at(2.1));
    assert!((near.flow.max_s - t).abs() < 1e-6, "{}", near.line());
    assert!(near.packet.max_s > 10.0 * t, "{}", near.line());
    assert!(near.mean_ratio() > 4.0, "{}", near.line());
}

#[test]
fn overload_shares_in_the_flow_model_and_queues_in_order_in_tcp() {
    // 2.0 ms slices: 105 % of each receiver link in payload (108 % on the wire), for
    // 1 s, with queues too long to drop (100 000 packets). Both models fall behind,
    // but differently: the flow model shares a receiver's link among all TFs arriving
    // at it (processor sharing), so each TF ends late; the packet model's fragments of
    // one sender to one receiver share a TCP byte stream, so TFs finish in order.
    let cfg = SimConfig {
        slice_ms: 2.0,
        duration_s: 1.0,
        queue_packets: 100_000,
        ..base(16, 4)
    };
    let r = run("16x4 105 % payload", &cfg);
    let t = ideal(16.0 * 65_536.0, 1000.0);
    assert_eq!((r.packet.incomplete, r.flow.incomplete), (0, 0));
    assert_eq!(r.packets_dropped, 0);
    for l in [&r.packet, &r.flow] {
        assert!(l.max_s > 8.0 * t, "both fall behind: {}", r.line());
    }
    // More wire load, yet lower latency: in-order service beats processor sharing.
    assert!(
        (0.7..0.95).contains(&r.mean_ratio()),
        "packet/flow {}",
        r.line()
    );
    assert!(r.packet.max_s < r.flow.max_s, "{}", r.line());
}

#[test]
fn long_paths_and_slow_start_restart_cost_what_the_flow_model_omits() {
    // 300 us per hop (the ANTARES shore link's delay on all three hops), and 40 ms
    // slices: each connection idles 320 ms between fragments, longer than its 200 ms
    // RTO, so TCP restarts slow start from 2 segments for every fragment.
    let cfg = SimConfig {
        lcm_delay_us: 300.0,
        shore_delay_us: 300.0,
        pc_delay_us: 300.0,
        slice_ms: 40.0,
        duration_s: 4.0,
        ..base(16, 8)
    };
    let t = ideal(16.0 * 65_536.0, 1000.0);
    let ssr = run("16x8 300 us/hop, slow-start restart", &cfg);
    assert!((ssr.flow.mean_s - t).abs() < 1e-6);
    assert_eq!(ssr.packets_dropped, 0);
    within("slow-start restart p50", ssr.packet.p50_s, t, 1.3, 1.6);
    // Without the restart, windows stay open: only headers and the 0.9 ms one-way
    // latency remain (every connection's first fragment still starts slowly).
    let open = run(
        "16x8 300 us/hop, no restart",
        &SimConfig {
            slow_start_restart: false,
            ..cfg
        },
    );
    let expected = t * HEADER_FACTOR + 900e-6;
    within("no restart p50", open.packet.p50_s, expected, 1.0, 1.01);
    assert!(open.packet.p50_s < ssr.packet.p50_s);
    assert_eq!(open.packet.max_s, ssr.packet.max_s, "the first fragment");
}

#[test]
fn what_has_no_flow_level_twin_is_refused() {
    // A sector uplink slower than its LCMs together can be a bottleneck.
    let shared = SimConfig {
        lcms_per_sector: 4,
        mlcm_mbps: 2000.0,
        ..base(4, 2)
    };
    assert!(flow_twin(&shared).unwrap_err().0.contains("mlcm_mbps"));
    let delayed = SimConfig {
        k: Some(4),
        ..base(4, 2)
    };
    assert!(flow_twin(&delayed).is_err());
    // The ANTARES presets' MLCM links (1 Gbit/s for 5 x 50 Mbit/s) are not a bottleneck.
    let twin = flow_twin(&SimConfig {
        preset: Some("antares-10-string".into()),
        ..SimConfig::default()
    })
    .unwrap();
    assert_eq!((twin.flps, twin.epns), (Some(300), Some(100)));
}
