//! What a testbed is: hosts, addresses, link shaping, presets, and the exact `ip`/`tc`
//! commands that build it. Pure (no I/O), so the command list is unit-tested without root.

use anyhow::{bail, Context};
use fanin_sched::parse_bytes;
use serde::{Deserialize, Serialize};

/// Most hosts a testbed may have (one /24 per network, .1 to .250).
pub const MAX_HOSTS: u32 = 250;
/// Bytes an Ethernet frame costs on the wire beyond what the kernel counts (preamble and
/// SFD 8, FCS 4, inter-frame gap 12): with it, 100 Mbit/s carries 94.1 Mbit/s of TCP
/// payload, as on the TDR's switch.
pub const ETH_OVERHEAD: &str = "24";
/// Host-side transmit queue (packets): a NIC's default `txqueuelen`.
pub const HOST_QUEUE_PACKETS: u32 = 1000;

/// Output-queue limit of a switch port.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueLimit {
    Packets(u32),
    Bytes(u64),
}

impl QueueLimit {
    /// `100p` (packets) or a byte size (`128KiB`, `65536`).
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let t = s.trim();
        if let Some(n) = t.strip_suffix('p') {
            let n: u32 = n
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("queue {s:?}: expected N packets like `100p`"))?;
            if n == 0 || n > 100_000 {
                bail!("queue {s:?}: packets must be 1..=100000");
            }
            return Ok(QueueLimit::Packets(n));
        }
        let b = parse_bytes(t).map_err(|e| anyhow::anyhow!("queue {s:?}: {e}"))?;
        if !(1500..=1 << 30).contains(&b) {
            bail!("queue {s:?}: bytes must be 1500 B..=1 GiB");
        }
        Ok(QueueLimit::Bytes(b))
    }

    fn tc_leaf(self) -> Vec<String> {
        match self {
            QueueLimit::Packets(n) => vec!["pfifo".into(), "limit".into(), n.to_string()],
            QueueLimit::Bytes(b) => vec!["bfifo".into(), "limit".into(), b.to_string()],
        }
    }
}

impl std::fmt::Display for QueueLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueLimit::Packets(n) => write!(f, "{n}p"),
            QueueLimit::Bytes(b) => write!(f, "{b}B"),
        }
    }
}

/// Shaping of every host link of one network (both directions).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Shaping {
    /// Line rate in bit/s.
    pub rate_bps: u64,
    /// One-way delay added on the host's transmit side, in microseconds.
    pub delay_us: u64,
    /// Random loss on the host's transmit side, percent (a random classifier; see below).
    pub loss_pct: f64,
    /// Output queue of the switch port towards each host (the switch buffer).
    pub queue: QueueLimit,
}

/// Parses a rate: `100mbit`, `1gbit`, `500kbit`, or plain bit/s.
pub fn parse_rate(s: &str) -> anyhow::Result<u64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = t.strip_suffix("gbit") {
        (n, 1e9)
    } else if let Some(n) = t.strip_suffix("mbit") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix("kbit") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("bit") {
        (n, 1.0)
    } else {
        (t.as_str(), 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("rate {s:?}: expected e.g. 100mbit, 1gbit"))?;
    let bps = v * mul;
    if !(bps.is_finite() && (8_000.0..=100e9).contains(&bps)) {
        bail!("rate {s:?}: must be between 8kbit and 100gbit");
    }
    Ok(bps as u64)
}

/// Parses a delay: `100us`, `0.5ms`, `2ms`, or `0`.
pub fn parse_delay_us(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let (num, mul) = if let Some(n) = t.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e6)
    } else if t == "0" {
        ("0", 1.0)
    } else {
        bail!("delay {s:?}: give a unit, e.g. 100us or 2ms");
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("delay {s:?}: not a number"))?;
    if !(v.is_finite() && v >= 0.0 && v * mul <= 10e6) {
        bail!("delay {s:?}: must be between 0 and 10 s");
    }
    Ok((v * mul).round() as u64)
}

/// A whole testbed: `hosts` network namespaces joined by a bridge (the switch), and
/// optionally a second, separate bridge as the auxiliary (control) network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// Prefix of every namespace this testbed owns (`<name>-sw`, `<name>-h1` ...).
    pub name: String,
    /// Preset it was made from, if any.
    pub preset: Option<String>,
    pub hosts: u32,
    pub data: Shaping,
    /// The auxiliary network, if any (TDR §4.2.2: ICN<->FLP and EPN->ICN traffic).
    pub aux: Option<Shaping>,
}

/// Presets: `pi-cluster` (TDR §2: eight Raspberry Pis behind a 100 Mbit switch, each with
/// a second interface for control traffic).
pub const PRESETS: &[&str] = &["pi-cluster"];

pub fn preset(name: &str) -> anyhow::Result<Spec> {
    match name {
        "pi-cluster" => {
            let link = Shaping {
                rate_bps: 100_000_000,
                delay_us: 0,
                loss_pct: 0.0,
                // An unmanaged 100 Mbit office switch: about 128 KiB of buffer per port.
                queue: QueueLimit::Bytes(128 * 1024),
            };
            Ok(Spec {
                name: "pi-cluster".into(),
                preset: Some("pi-cluster".into()),
                hosts: 8,
                data: link,
                aux: Some(link),
            })
        }
        other => bail!(
            "unknown testbed preset {other:?} (known: {})",
            PRESETS.join(", ")
        ),
    }
}

/// Checks a testbed name: it prefixes namespace names, so keep it short and plain.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty()
        || name.len() > 24
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        || name.starts_with('-')
    {
        bail!("testbed name {name:?}: use 1-24 characters a-z, 0-9 and '-'");
    }
    Ok(())
}

impl Spec {
    pub fn check(&self) -> anyhow::Result<()> {
        check_name(&self.name)?;
        if self.hosts == 0 || self.hosts > MAX_HOSTS {
            bail!("hosts = {}: must be 1..={MAX_HOSTS}", self.hosts);
        }
        for (net, s) in [("data", Some(&self.data)), ("aux", self.aux.as_ref())] {
            let Some(s) = s else { continue };
            if !(0.0..=100.0).contains(&s.loss_pct) {
                bail!("{net} loss = {} %: must be 0..=100", s.loss_pct);
            }
        }
        Ok(())
    }

    pub fn switch_ns(&self) -> String {
        format!("{}-sw", self.name)
    }

    /// Namespace of host `h` (1-based).
    pub fn host_ns(&self, h: u32) -> String {
        format!("{}-h{h}", self.name)
    }

    /// Data-network address of host `h` (the TDR's 192.168.1.h).
    pub fn data_ip(&self, h: u32) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(192, 168, 1, h as u8)
    }

    /// Auxiliary-network address of host `h`, if the testbed has one.
    pub fn aux_ip(&self, h: u32) -> Option<std::net::Ipv4Addr> {
        self.aux
            .map(|_| std::net::Ipv4Addr::new(192, 168, 2, h as u8))
    }

    /// Is `ns` one of this testbed's namespaces?
    pub fn owns(name: &str, ns: &str) -> bool {
        let Some(rest) = ns.strip_prefix(name).and_then(|r| r.strip_prefix('-')) else {
            return false;
        };
        rest == "sw"
            || rest
                .strip_prefix('h')
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    }

    /// Host `h`'s links: the data network's, then the auxiliary one's, if any.
    pub fn links(&self, h: u32) -> Vec<Link> {
        let data = Link {
            dev: "eth0",
            bridge: "br0",
            port: format!("h{h}"),
            ip: self.data_ip(h),
            shaping: self.data,
        };
        let aux = self.aux.zip(self.aux_ip(h)).map(|(shaping, ip)| Link {
            dev: "eth1",
            bridge: "br1",
            port: format!("ah{h}"),
            ip,
            shaping,
        });
        std::iter::once(data).chain(aux).collect()
    }

    /// The commands that build the testbed, in order. Each is argv for `Command`.
    pub fn up_commands(&self, ethtool: bool) -> Vec<Vec<String>> {
        let sw = self.switch_ns();
        let mut c = vec![
            argv(&["ip", "netns", "add", &sw]),
            argv(&["ip", "-n", &sw, "link", "set", "lo", "up"]),
        ];
        for l in self.links(1) {
            c.push(argv(&[
                "ip", "-n", &sw, "link", "add", l.bridge, "type", "bridge",
            ]));
            c.push(argv(&["ip", "-n", &sw, "link", "set", l.bridge, "up"]));
        }
        for h in 1..=self.hosts {
            let ns = self.host_ns(h);
            c.push(argv(&["ip", "netns", "add", &ns]));
            c.push(argv(&["ip", "-n", &ns, "link", "set", "lo", "up"]));
            for l in self.links(h) {
                c.extend(self.link_commands(&ns, &l, ethtool));
            }
        }
        c
    }

    /// One host link (in namespace `ns`): the veth pair to its switch port, its address,
    /// and its shaping on both ends.
    fn link_commands(&self, ns: &str, l: &Link, ethtool: bool) -> Vec<Vec<String>> {
        let (sw, dev, port) = (self.switch_ns(), l.dev, l.port.as_str());
        let ip = format!("{}/24", l.ip);
        let mut c = vec![
            argv(&[
                "ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", port, "netns",
                &sw,
            ]),
            argv(&["ip", "-n", &sw, "link", "set", port, "master", l.bridge]),
            argv(&["ip", "-n", ns, "addr", "add", &ip, "dev", dev]),
        ];
        if ethtool {
            // One packet per skb, so queue limits and shaping see real packets.
            for (n, d) in [(ns, dev), (sw.as_str(), port)] {
                c.push(argv(&[
                    "ip", "netns", "exec", n, "ethtool", "-K", d, "tso", "off", "gso", "off",
                    "gro", "off",
                ]));
            }
        }
        let shaping = l.shaping;
        let rate = shaping.rate_bps.to_string() + "bit";
        // Host transmit side: the NIC's line rate and transmit queue; delay through
        // netem (needs CONFIG_NET_SCH_NETEM); loss through a random classifier.
        let leaf = if shaping.delay_us > 0 {
            let delay = format!("{}us", shaping.delay_us);
            argv(&[
                "netem",
                "delay",
                &delay,
                "limit",
                &HOST_QUEUE_PACKETS.to_string(),
            ])
        } else {
            QueueLimit::Packets(HOST_QUEUE_PACKETS).tc_leaf()
        };
        c.extend(shape(ns, dev, &rate, leaf));
        if shaping.loss_pct > 0.0 {
            c.extend(random_loss(ns, dev, &rate, shaping.loss_pct));
        }
        // Switch port towards the host: line rate and the switch's buffer.
        c.extend(shape(&sw, port, &rate, shaping.queue.tc_leaf()));
        c.push(argv(&["ip", "-n", ns, "link", "set", dev, "up"]));
        c.push(argv(&["ip", "-n", &sw, "link", "set", port, "up"]));
        c
    }
}

/// One of a host's links: its device, the switch's bridge and port it plugs into, its
/// address and its shaping.
pub struct Link {
    pub dev: &'static str,
    pub bridge: &'static str,
    pub port: String,
    pub ip: std::net::Ipv4Addr,
    pub shaping: Shaping,
}

/// A command's argv from its words.
pub fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The random loss classifier's filter priority: after those of network faults
/// (`netfault.rs`), which the kernel must try first.
pub const LOSS_PRIO: u32 = 1000;

/// An htb class at the line rate, counting Ethernet's framing overhead.
fn htb_class(ns: &str, dev: &str, classid: &str, rate: &str) -> Vec<String> {
    htb_class_cmd("add", ns, dev, classid, rate)
}

/// `tc class VERB` (add, change, replace) of an htb class at `rate`, with overhead.
pub fn htb_class_cmd(verb: &str, ns: &str, dev: &str, classid: &str, rate: &str) -> Vec<String> {
    argv(&[
        "tc",
        "-n",
        ns,
        "class",
        verb,
        "dev",
        dev,
        "parent",
        "1:",
        "classid",
        classid,
        "htb",
        "rate",
        rate,
        "ceil",
        rate,
        "quantum",
        "1514",
        "overhead",
        ETH_OVERHEAD,
    ])
}

/// `htb` at `rate` on `dev`'s root with `leaf` as its only queue.
fn shape(ns: &str, dev: &str, rate: &str, leaf: Vec<String>) -> Vec<Vec<String>> {
    let mut leaf_cmd = argv(&[
        "tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:",
    ]);
    leaf_cmd.extend(leaf);
    vec![
        argv(&[
            "tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default",
            "1",
        ]),
        htb_class(ns, dev, "1:1", rate),
        leaf_cmd,
    ]
}

/// Random loss without netem: a classic-BPF classifier (`ld rand`) sends a fraction
/// `loss_pct` of packets to class 1:2, whose queue holds nothing, so the kernel drops them
/// and counts them as drops of qdisc 20:.
fn random_loss(ns: &str, dev: &str, rate: &str, loss_pct: f64) -> Vec<Vec<String>> {
    // A >= threshold => class 1:2 (dropped); P = 1 - threshold / 2^32.
    let threshold = ((1.0 - loss_pct / 100.0) * 4_294_967_296.0).clamp(0.0, 4_294_967_295.0) as u64;
    // ld rand (SKF_AD_OFF + SKF_AD_RANDOM = 0xfffff038); jge #t, 0, 1; ret 1:2; ret 1:1.
    let code = format!("4,32 0 0 4294963256,53 0 1 {threshold},6 0 0 65538,6 0 0 65537");
    vec![
        htb_class(ns, dev, "1:2", rate),
        argv(&[
            "tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:2", "handle", "20:", "pfifo",
            "limit", "0",
        ]),
        argv(&[
            "tc",
            "-n",
            ns,
            "filter",
            "add",
            "dev",
            dev,
            "parent",
            "1:",
            "protocol",
            "all",
            "prio",
            &LOSS_PRIO.to_string(),
            "bpf",
            "bytecode",
            &code,
        ]),
    ]
}

/// Parses `--rate/--delay/--loss/--queue` style values into a shaping.
pub fn shaping(rate: &str, delay: &str, loss_pct: f64, queue: &str) -> anyhow::Result<Shaping> {
    Ok(Shaping {
        rate_bps: parse_rate(rate)?,
        delay_us: parse_delay_us(delay)?,
        loss_pct,
        queue: QueueLimit::parse(queue).context("--queue")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_rejects_nonsense() {
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("1.5Mbit").unwrap(), 1_500_000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0mbit").is_err());
        assert_eq!(parse_delay_us("0").unwrap(), 0);
        assert_eq!(parse_delay_us("0.5ms").unwrap(), 500);
        assert_eq!(parse_delay_us("100us").unwrap(), 100);
        assert!(parse_delay_us("5").is_err());
        assert!(parse_delay_us("-1ms").is_err());
        assert_eq!(QueueLimit::parse("100p").unwrap(), QueueLimit::Packets(100));
        assert_eq!(
            QueueLimit::parse("128KiB").unwrap(),
            QueueLimit::Bytes(131072)
        );
        assert!(QueueLimit::parse("0p").is_err());
        assert!(QueueLimit::parse("10").is_err());
        assert!(check_name("pi-cluster").is_ok());
        assert!(check_name("Pi cluster").is_err());
        assert!(check_name("").is_err());
    }

    #[test]
    fn ownership_is_exact() {
        assert!(Spec::owns("pi", "pi-sw"));
        assert!(Spec::owns("pi", "pi-h12"));
        assert!(!Spec::owns("pi", "pi-cluster-h1"));
        assert!(!Spec::owns("pi", "pi-h"));
        assert!(!Spec::owns("pi", "pix-h1"));
        assert!(!Spec::owns("pi", "pi-hx"));
    }

    #[test]
    fn pi_cluster_commands_shape_both_directions_of_both_networks() {
        let s = preset("pi-cluster").unwrap();
        s.check().unwrap();
        let cmds = s.up_commands(false);
        let text: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
        // 1 switch + 8 hosts, two bridges, 16 veth pairs.
        assert_eq!(
            text.iter()
                .filter(|c| c.starts_with("ip netns add"))
                .count(),
            9
        );
        assert_eq!(text.iter().filter(|c| c.contains("type bridge")).count(), 2);
        assert_eq!(text.iter().filter(|c| c.contains("type veth")).count(), 16);
        // Every veth end has a 100 Mbit htb class: 32 of them.
        assert_eq!(
            text.iter()
                .filter(|c| c
                    .contains("htb rate 100000000bit ceil 100000000bit quantum 1514 overhead 24"))
                .count(),
            32
        );
        assert!(text.contains(&"ip -n pi-cluster-h4 addr add 192.168.1.4/24 dev eth0".into()));
        assert!(text.contains(&"ip -n pi-cluster-h4 addr add 192.168.2.4/24 dev eth1".into()));
        assert!(text.iter().any(|c| c
            == "tc -n pi-cluster-sw qdisc add dev h4 parent 1:1 handle 10: bfifo limit 131072"));
        // Creation happens before use, in order.
        let add = text
            .iter()
            .position(|c| c == "ip netns add pi-cluster-h4")
            .unwrap();
        let veth = text
            .iter()
            .position(|c| c.starts_with("ip -n pi-cluster-h4 link add eth0"))
            .unwrap();
        assert!(add < veth);
    }

    #[test]
    fn delay_and_loss_go_to_the_host_netem() {
        let mut s = preset("pi-cluster").unwrap();
        s.name = "t".into();
        s.hosts = 1;
        s.aux = None;
        s.data.delay_us = 250;
        s.data.loss_pct = 0.5;
        s.data.queue = QueueLimit::Packets(50);
        let text: Vec<String> = s.up_commands(true).iter().map(|c| c.join(" ")).collect();
        assert!(text.contains(
            &"tc -n t-h1 qdisc add dev eth0 parent 1:1 handle 10: netem delay 250us limit 1000"
                .into()
        ));
        // 0.5 % loss: threshold = 0.995 * 2^32.
        assert!(text.iter().any(|c| c.starts_with("tc -n t-h1 filter add dev eth0 parent 1:")
            && c.ends_with("bpf bytecode 4,32 0 0 4294963256,53 0 1 4273492459,6 0 0 65538,6 0 0 65537")), "{text:#?}");
        assert!(text
            .contains(&"tc -n t-h1 qdisc add dev eth0 parent 1:2 handle 20: pfifo limit 0".into()));
        assert!(text
            .contains(&"tc -n t-sw qdisc add dev h1 parent 1:1 handle 10: pfifo limit 50".into()));
        assert!(text.iter().any(|c| c.contains("ethtool -K eth0 tso off")));
        assert!(!text.iter().any(|c| c.contains("br1")));
    }
}
