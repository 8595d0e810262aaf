//! Host metrics (the TDR's Table 8): CPU use, memory, swap, network bytes per interface,
//! CPU clock and temperature where the machine exposes them, this process's CPU time.
//!
//! Read from /proc and /sys when a scrape asks, never in the background: a node that is
//! not scraped pays nothing. The parsers are pure and tested on sample text.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One reading of the host.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HostSample {
    /// Busy and total jiffies of all CPUs since boot (/proc/stat).
    pub cpu_busy: u64,
    pub cpu_total: u64,
    /// Bytes (/proc/meminfo).
    pub mem_total: u64,
    pub mem_available: u64,
    pub swap_total: u64,
    pub swap_free: u64,
    /// Interface -> (received, transmitted) bytes since boot (/proc/net/dev).
    pub net: BTreeMap<String, (u64, u64)>,
    /// CPU -> clock in Hz (cpufreq, else /proc/cpuinfo).
    pub cpu_hz: BTreeMap<String, f64>,
    /// Thermal zone -> °C.
    pub temp_c: BTreeMap<String, f64>,
    /// This process: user + system seconds.
    pub process_cpu_s: f64,
}

/// Reads everything the machine exposes; what it does not expose stays empty.
pub fn sample() -> HostSample {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mut s = HostSample::default();
    (s.cpu_busy, s.cpu_total) = cpu_jiffies(&read("/proc/stat"));
    let mem = meminfo(&read("/proc/meminfo"));
    let kib = |k: &str| mem.get(k).copied().unwrap_or(0).saturating_mul(1024);
    (s.mem_total, s.mem_available) = (kib("MemTotal"), kib("MemAvailable"));
    (s.swap_total, s.swap_free) = (kib("SwapTotal"), kib("SwapFree"));
    s.net = net_dev(&read("/proc/net/dev"));
    s.cpu_hz = cpufreq().unwrap_or_else(|| cpuinfo_hz(&read("/proc/cpuinfo")));
    s.temp_c = thermal();
    s.process_cpu_s = process_cpu_us() as f64 / 1e6;
    s
}

/// CPU time (user + system) of this process and the children it waited for (an EPN's
/// exec sinks), in µs: `fanin bench sink` compares hand-offs by it.
pub fn process_cpu_us() -> u64 {
    let usage = |who| {
        // SAFETY: getrusage writes into the zeroed struct we own.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(who, &mut r) } != 0 {
            return 0;
        }
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        us(r.ru_utime) + us(r.ru_stime)
    };
    usage(libc::RUSAGE_SELF) + usage(libc::RUSAGE_CHILDREN)
}

/// (busy, total) jiffies from the `cpu ` line of /proc/stat (idle and iowait are not busy).
pub fn cpu_jiffies(stat: &str) -> (u64, u64) {
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user..steal; guest is inside user. Saturating: a corrupt line never panics.
    let total = v.iter().take(8).fold(0u64, |a, x| a.saturating_add(*x));
    let idle = v
        .get(3)
        .unwrap_or(&0)
        .saturating_add(*v.get(4).unwrap_or(&0));
    (total.saturating_sub(idle), total)
}

/// `Key: N kB` lines of /proc/meminfo, in kB.
pub fn meminfo(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_string(), v.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// Interface -> (received, transmitted) bytes from /proc/net/dev.
pub fn net_dev(text: &str) -> BTreeMap<String, (u64, u64)> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            Some((name.trim().to_string(), (*v.first()?, *v.get(8)?)))
        })
        .collect()
}

/// `cpu MHz : 2445.406` lines of /proc/cpuinfo, numbered by `processor`.
pub fn cpuinfo_hz(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let mut cpu = String::new();
    for l in text.lines() {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        match k.trim() {
            "processor" => cpu = v.trim().to_string(),
            "cpu MHz" => {
                if let Ok(mhz) = v.trim().parse::<f64>() {
                    out.insert(cpu.clone(), mhz * 1e6);
                }
            }
            _ => {}
        }
    }
    out
}

/// scaling_cur_freq (kHz) of every CPU, when cpufreq exists.
fn cpufreq() -> Option<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("cpu")
            .filter(|n| n.parse::<u32>().is_ok())
        else {
            continue;
        };
        let f = e.path().join("cpufreq/scaling_cur_freq");
        if let Some(khz) = std::fs::read_to_string(f)
            .ok()
            .and_then(|t| t.trim().parse::<f64>().ok())
        {
            out.insert(n.to_string(), khz * 1e3);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Every thermal zone's temperature (millidegrees in sysfs).
fn thermal() -> BTreeMap<String, f64> {
    let Ok(dir) = std::fs::read_dir("/sys/class/thermal") else {
        return BTreeMap::new();
    };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("thermal_zone"))
        .filter_map(|e| {
            let t = std::fs::read_to_string(e.path().join("temp")).ok()?;
            let c = t.trim().parse::<f64>().ok()? / 1000.0;
            Some((e.file_name().to_string_lossy().into_owned(), c))
        })
        .collect()
}

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// The host's gauges on a node's Prometheus endpoint, refreshed at each scrape.
#[derive(Default)]
pub struct HostMetrics {
    cpu_seconds: Family<Labels, FloatGauge>,
    memory: Family<Labels, FloatGauge>,
    swap: Family<Labels, FloatGauge>,
    network: Family<Labels, FloatGauge>,
    clock: Family<Labels, FloatGauge>,
    temperature: Family<Labels, FloatGauge>,
    process_cpu: FloatGauge,
}

/// Jiffies per second of /proc/stat (USER_HZ; 100 on every Linux port that matters).
const USER_HZ: f64 = 100.0;

impl HostMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "host_cpu_seconds",
            "Host CPU seconds since boot (mode busy or all)",
            self.cpu_seconds.clone(),
        );
        r.register(
            "host_memory_bytes",
            "Host memory (kind total or available)",
            self.memory.clone(),
        );
        r.register(
            "host_swap_bytes",
            "Host swap (kind total or free)",
            self.swap.clone(),
        );
        r.register(
            "host_network_bytes",
            "Bytes since boot per interface and direction",
            self.network.clone(),
        );
        r.register(
            "host_cpu_clock_hz",
            "CPU clock per CPU, where exposed",
            self.clock.clone(),
        );
        r.register(
            "host_temperature_celsius",
            "Thermal zones, where exposed",
            self.temperature.clone(),
        );
        r.register(
            "process_cpu_seconds",
            "CPU seconds of this process and its waited-for children",
            self.process_cpu.clone(),
        );
    }

    /// Reads the host now and sets every gauge.
    pub fn refresh(&self) {
        let s = sample();
        // Interfaces, CPUs and zones come and go: only what exists now is shown.
        for f in [&self.network, &self.clock, &self.temperature] {
            f.clear();
        }
        let set = |f: &Family<Labels, FloatGauge>, l: &[(&str, &str)], v: f64| {
            let l = l
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            f.get_or_create(&l).set(v);
        };
        set(
            &self.cpu_seconds,
            &[("mode", "busy")],
            s.cpu_busy as f64 / USER_HZ,
        );
        set(
            &self.cpu_seconds,
            &[("mode", "all")],
            s.cpu_total as f64 / USER_HZ,
        );
        set(&self.memory, &[("kind", "total")], s.mem_total as f64);
        set(
            &self.memory,
            &[("kind", "available")],
            s.mem_available as f64,
        );
        set(&self.swap, &[("kind", "total")], s.swap_total as f64);
        set(&self.swap, &[("kind", "free")], s.swap_free as f64);
        for (i, (rx, tx)) in s.net.iter().take(MAX_SERIES) {
            set(
                &self.network,
                &[("interface", i), ("direction", "received")],
                *rx as f64,
            );
            set(
                &self.network,
                &[("interface", i), ("direction", "transmitted")],
                *tx as f64,
            );
        }
        for (cpu, hz) in s.cpu_hz.iter().take(MAX_SERIES) {
            set(&self.clock, &[("cpu", cpu)], *hz);
        }
        for (zone, c) in s.temp_c.iter().take(MAX_SERIES) {
            set(&self.temperature, &[("zone", zone)], *c);
        }
        self.process_cpu.set(s.process_cpu_s);
    }
}

/// Series per family at most (interfaces, CPUs, zones): a host with thousands of
/// namespaced interfaces does not grow a node's metrics without bound.
const MAX_SERIES: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_gives_busy_and_total_jiffies() {
        let stat = "cpu  100 5 50 800 20 0 10 0 0 0\ncpu0 50 2 25 400 10 0 5 0 0 0\n";
        assert_eq!(cpu_jiffies(stat), (165, 985));
        assert_eq!(cpu_jiffies("garbage"), (0, 0));
    }

    #[test]
    fn meminfo_and_net_dev_parse_their_fields() {
        let m = meminfo(
            "MemTotal:       24000000 kB\nMemAvailable:   12000000 kB\nHugePages_Total:       0\n",
        );
        assert_eq!(m["MemTotal"], 24_000_000);
        assert_eq!(m["HugePages_Total"], 0);
        let dev = "Inter-|   Receive\n face |bytes\n    lo: 2049 5 0 0 0 0 0 0 4096 5 0 0 0 0 0 0\n  eth0: 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n";
        let n = net_dev(dev);
        assert_eq!(n["lo"], (2049, 4096));
        assert_eq!(n["eth0"], (10, 20));
    }

    #[test]
    fn cpuinfo_clock_is_per_processor() {
        let t = "processor\t: 0\ncpu MHz\t\t: 2445.406\n\nprocessor\t: 1\ncpu MHz\t\t: 1200\n";
        let hz = cpuinfo_hz(t);
        assert_eq!(hz["0"], 2_445_406_000.0);
        assert_eq!(hz["1"], 1.2e9);
    }

    #[test]
    fn this_machine_reports_cpu_memory_and_loopback() {
        let s = sample();
        assert!(s.cpu_total > 0 && s.mem_total > 0 && s.mem_available <= s.mem_total);
        assert!(s.net.contains_key("lo"), "{:?}", s.net);
    }
}
