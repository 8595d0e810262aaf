//! The transport benchmark's output: one line per case, the CSV, the plots (the seed's
//! Figs. 1, 3 and 4 per network), and fanin against the best peer at each block size.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use fanin_report::plot::{Chart, Line, Marker, Series};

use super::peer::Transport;
use super::{NetKind, Row, Tuning};

pub const CSV: &str = "transport.csv";

/// One figure of a row.
type Value = fn(&Row) -> f64;

/// Block sizes from which fanin must lead (issue: >= 64 KiB).
pub const LEAD_FROM: u64 = 64 << 10;

fn net_name(n: NetKind) -> &'static str {
    match n {
        NetKind::Loopback => "loopback",
        NetKind::Testbed => "testbed",
    }
}

fn tuning_name(t: Tuning) -> &'static str {
    match t {
        Tuning::Untuned => "untuned",
        Tuning::Tuned => "tuned",
    }
}

fn size(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b if b % 1_000_000 == 0 => format!("{} MB", b / 1_000_000),
        b => format!("{b} B"),
    }
}

pub fn line(r: &Row) -> String {
    format!(
        "{:<9} {:<8} {:<9} {:>10} {:>9.2} {:>13.3} {:>13.3}  {}",
        net_name(r.net),
        tuning_name(r.tuning),
        r.transport.name(),
        size(r.block),
        r.gbit_s,
        r.send_cpu_s_per_gb,
        r.recv_cpu_s_per_gb,
        r.note
    )
}

pub fn csv(rows: &[Row]) -> String {
    let mut s =
        "net,tuning,transport,block_bytes,gbit_s,send_cpu_s_per_gb,recv_cpu_s_per_gb,note\n"
            .to_string();
    let num = |v: f64| {
        if v.is_finite() {
            format!("{v:.4}")
        } else {
            String::new()
        }
    };
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{}",
            net_name(r.net),
            tuning_name(r.tuning),
            r.transport.name(),
            r.block,
            num(r.gbit_s),
            num(r.send_cpu_s_per_gb),
            num(r.recv_cpu_s_per_gb),
            r.note.replace(',', ";")
        );
    }
    s
}

/// The CSV and, per network measured, throughput.svg, cpu-send.svg and cpu-recv.svg.
pub fn write(dir: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let put = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    put(CSV, csv(rows))?;
    for net in [NetKind::Loopback, NetKind::Testbed] {
        if !rows.iter().any(|r| r.net == net) {
            continue;
        }
        let figs: [(&str, &str, Value); 3] = [
            ("throughput", "throughput (Gbit/s)", |r| r.gbit_s),
            ("cpu-send", "sending side CPU (s per GB)", |r| {
                r.send_cpu_s_per_gb
            }),
            ("cpu-recv", "receiving side CPU (s per GB)", |r| {
                r.recv_cpu_s_per_gb
            }),
        ];
        for (file, y, value) in figs {
            let chart = chart(rows, net, y, value);
            put(&format!("{}-{file}.svg", net_name(net)), chart.svg())?;
        }
    }
    Ok(())
}

fn chart(rows: &[Row], net: NetKind, y: &str, value: Value) -> Chart {
    let mut series = Vec::new();
    for (c, t) in Transport::ALL.into_iter().enumerate() {
        for tuning in [Tuning::Untuned, Tuning::Tuned] {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.net == net && r.transport == t && r.tuning == tuning)
                .map(|r| ((r.block as f64).log2(), value(r)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let line = if tuning == Tuning::Tuned {
                Line::Dashed
            } else {
                Line::Solid
            };
            let legend = format!("{} {}", t.name(), tuning_name(tuning));
            series.push(Series::new(c, line, Marker::Filled, pts).legend(legend));
        }
    }
    Chart {
        title: format!("fanin bench transport, {}", net_name(net)),
        x_desc: "block size, log2 bytes (12 = 4 KiB, 20 = 1 MiB, 26 = 64 MiB)".into(),
        y_desc: y.into(),
        size: (900, 480),
        series,
    }
}

/// fanin against the best peer at each case from `LEAD_FROM`: throughput over the
/// best peer's, and CPU per GB over the lowest peer's, on each side; first against
/// every peer, then against the message-queue libraries alone (the seed's choice).
pub fn leads(rows: &[Row]) -> String {
    let mut s = String::new();
    let all: &[Transport] = &[
        Transport::Zeromq,
        Transport::Nng,
        Transport::Iperf3,
        Transport::Tcp,
    ];
    let libs: &[Transport] = &[Transport::Zeromq, Transport::Nng];
    for (what, peers) in [("every peer", all), ("ZeroMQ and nng", libs)] {
        let _ = writeln!(
            s,
            "\nfanin against the best of {what} (throughput: >= 1 leads; CPU: <= 1 leads)"
        );
        let verdict = match compare(rows, peers, &mut s) {
            Some(true) => "yes",
            Some(false) => "no",
            None => "not measured",
        };
        let from = size(LEAD_FROM);
        let _ = writeln!(s, "fanin leads {what} everywhere from {from}: {verdict}");
    }
    s
}

/// One line per fanin case against the best of `peers`: whether fanin leads in all
/// (None: no case had one of them to compare with).
fn compare(rows: &[Row], peers: &[Transport], s: &mut String) -> Option<bool> {
    let mut all = true;
    let mut any = false;
    for f in rows
        .iter()
        .filter(|r| r.transport == Transport::Fanin && r.block >= LEAD_FROM)
    {
        let same: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                peers.contains(&r.transport)
                    && (r.net, r.tuning, r.block) == (f.net, f.tuning, f.block)
                    && r.gbit_s.is_finite()
            })
            .collect();
        if same.is_empty() {
            continue;
        }
        let best = |v: fn(&Row) -> f64, max: bool| {
            let it = same.iter().map(|r| v(r)).filter(|x| x.is_finite());
            if max {
                it.fold(f64::NAN, f64::max)
            } else {
                it.fold(f64::NAN, f64::min)
            }
        };
        let thr = f.gbit_s / best(|r| r.gbit_s, true);
        let snd = f.send_cpu_s_per_gb / best(|r| r.send_cpu_s_per_gb, false);
        let rcv = f.recv_cpu_s_per_gb / best(|r| r.recv_cpu_s_per_gb, false);
        let lead = thr >= 1.0 && snd <= 1.0 && rcv <= 1.0;
        all &= lead;
        any = true;
        let _ = writeln!(
            s,
            "{:<9} {:<8} {:>10}  throughput {thr:.2}  send CPU {snd:.2}  recv CPU {rcv:.2}  {}",
            net_name(f.net),
            tuning_name(f.tuning),
            size(f.block),
            if lead { "leads" } else { "behind" }
        );
    }
    if !any {
        let from = size(LEAD_FROM);
        let _ = writeln!(
            s,
            "(no fanin case from {from} has one of these peers beside it)"
        );
    }
    any.then_some(all)
}
