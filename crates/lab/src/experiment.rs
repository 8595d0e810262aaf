//! Experiment files: a base `[run]`, optional explicit `[[config]]` rows and a `[matrix]`
//! crossed over them, repeated `repetitions` times. Expands to a list of checked runs.

use std::path::Path;

use anyhow::{bail, Context};
use fanin_node::RunConfig;
use fanin_report::doc::from_toml;
use toml::{Table, Value};

/// The experiment `fanin run` uses when given no file.
pub const DEFAULT: &str = include_str!("../../../experiments/default.toml");

/// One configuration of an experiment (repeated `repetitions` times).
#[derive(Debug, Clone)]
pub struct Config {
    pub label: String,
    pub run: RunConfig,
    /// Published loss % for this configuration, when the experiment reproduces a table.
    pub published_loss_pct: Option<f64>,
    /// Published loss % of the long (3 minute) runs, TDR Table 19.
    pub published_long_loss_pct: Option<f64>,
    /// Published throughput in MB/s (TDR §5.1).
    pub published_mb_s: Option<f64>,
}

/// The published figures a configuration is compared with.
#[derive(Debug, Clone, Copy, Default)]
struct Published {
    loss_pct: Option<f64>,
    long_loss_pct: Option<f64>,
    mb_s: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct Experiment {
    pub name: String,
    pub description: String,
    pub repetitions: u32,
    pub configs: Vec<Config>,
    /// Where the nodes run, when the experiment names a testbed.
    pub testbed: Option<Placement>,
    /// Faults injected into every run (`[[fault]]`).
    pub faults: Vec<crate::faults::Fault>,
    /// Where EPNs send built TFs (`[[sink]]`, `[epn]`).
    pub epn: crate::node_plan::NodePlan,
}

/// Which network carries control traffic (ICN<->FLP, EPN->ICN) on a testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ControlNet {
    /// The data network, shared with STFs (TDR §4.1, network baseline).
    Data,
    /// The separate auxiliary network (TDR §4.2.2).
    Aux,
}

/// `[testbed]`: the testbed an experiment runs on and the host of every node
/// (hosts are numbered from 1, as the TDR's 192.168.1.x addresses).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// Name of the testbed (`fanin testbed up --preset NAME` or `--name NAME`).
    pub name: String,
    pub control: ControlNet,
    pub icn: u32,
    /// Host of FLP i.
    pub flps: Vec<u32>,
    /// Host of EPN i.
    pub epns: Vec<u32>,
}

impl Placement {
    /// Checks the placement covers every configuration's FLPs and EPNs.
    pub fn check(&self, configs: &[Config]) -> anyhow::Result<()> {
        let flps = configs.iter().map(|c| c.run.flps).max().unwrap_or(0) as usize;
        let epns = configs.iter().map(|c| c.run.epns).max().unwrap_or(0) as usize;
        if self.flps.len() < flps {
            bail!(
                "testbed.flps places {} FLP(s) but a configuration has {flps}",
                self.flps.len()
            );
        }
        if self.epns.len() < epns {
            bail!(
                "testbed.epns places {} EPN(s) but a configuration has {epns}",
                self.epns.len()
            );
        }
        for (what, h) in std::iter::once(("icn", &self.icn))
            .chain(self.flps.iter().map(|h| ("flps", h)))
            .chain(self.epns.iter().map(|h| ("epns", h)))
        {
            if *h == 0 || *h > crate::testbed::spec::MAX_HOSTS {
                bail!("testbed.{what}: host {h} is not a host number (1..)");
            }
        }
        Ok(())
    }
}

const META_KEYS: &[&str] = &[
    "label",
    "published_loss_pct",
    "published_long_loss_pct",
    "published_mb_s",
];

fn merge(base: &Table, over: &Table) -> Table {
    let mut t = base.clone();
    for (k, v) in over {
        if !META_KEYS.contains(&k.as_str()) {
            t.insert(k.clone(), v.clone());
        }
    }
    t
}

fn number(v: Option<&Value>, field: &str) -> anyhow::Result<Option<f64>> {
    match v {
        None => Ok(None),
        Some(Value::Float(f)) => Ok(Some(*f)),
        Some(Value::Integer(i)) => Ok(Some(*i as f64)),
        Some(other) => bail!("`{field}` must be a number, not {other}"),
    }
}

/// Top-level keys of a runtime experiment file.
const TOP_KEYS: [&str; 11] = [
    "name",
    "description",
    "repetitions",
    "run",
    "config",
    "matrix",
    "testbed",
    "fault",
    "sink",
    "epn",
    "source",
];

/// One configuration before it is typed: its label (if given), its table, the
/// published values it is compared with.
type RawConfig = (Option<String>, Table, Published);

pub fn parse(text: &str, origin: &str) -> anyhow::Result<Experiment> {
    let exp = parse_with(text, origin, (&[], &|_| Ok(())))?;
    if let Some(t) = &exp.testbed {
        t.check(&exp.configs)
            .with_context(|| format!("experiment {origin}"))?;
    }
    Ok(exp)
}

/// The command line's say over an experiment: the configurations it keeps (`--only`
/// labels; none: all) and its settings changed after the file (the overrides).
pub type Tweak<'a> = (
    &'a [String],
    &'a dyn Fn(&mut RunConfig) -> anyhow::Result<()>,
);

/// `parse`, keeping the `--only` rows and applying the overrides to them before the
/// experiment's `[[fault]]`, `[[source]]` and `[[sink]]` are checked against them: a
/// `--epns 1` must meet a fault on EPN 3 at the check, not at run time. The `[testbed]`
/// placement is the caller's to check, when the testbed is used (`--local` runs
/// without it).
pub fn parse_with(text: &str, origin: &str, (only, tweak): Tweak) -> anyhow::Result<Experiment> {
    let doc: Table = from_toml(text).with_context(|| format!("experiment {origin}"))?;
    check_keys(&doc).with_context(|| format!("experiment {origin}"))?;
    let (name, description, repetitions) =
        header(&doc, origin).with_context(|| format!("experiment {origin}"))?;
    let rows = raw_configs(&doc).with_context(|| format!("experiment {origin}"))?;
    let rows = cross_matrix(&doc, rows).with_context(|| format!("experiment {origin}"))?;
    let mut configs = typed(rows).with_context(|| format!("experiment {origin}"))?;
    if !only.is_empty() {
        configs.retain(|c| only.contains(&c.label));
        anyhow::ensure!(
            !configs.is_empty(),
            "--only {only:?}: no configuration has those labels"
        );
    }
    let testbed = match doc.get("testbed") {
        None => None,
        Some(v) => {
            let p: Placement = v
                .clone()
                .try_into()
                .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.message().trim()))
                .with_context(|| format!("experiment {origin}: [testbed]"))?;
            Some(p)
        }
    };
    for c in &mut configs {
        tweak(&mut c.run)?;
        c.run
            .check()
            .with_context(|| format!("configuration {}", c.label))?;
    }
    let faults = faults(&doc, &configs).with_context(|| format!("experiment {origin}"))?;
    let max_epns = configs.iter().map(|c| c.run.epns).min().unwrap_or(0);
    let max_flps = configs.iter().map(|c| c.run.flps).min().unwrap_or(0);
    let epn = crate::node_plan::NodePlan::parse(&doc, (max_flps, max_epns))
        .with_context(|| format!("experiment {origin}"))?;
    Ok(Experiment {
        name,
        description,
        repetitions,
        configs,
        testbed,
        faults,
        epn,
    })
}

fn check_keys(doc: &Table) -> anyhow::Result<()> {
    let sim = ["model", "sim", "alice", "fabric", "build"];
    if let Some(k) = sim.iter().find(|k| doc.contains_key(**k)) {
        bail!("this is a simulation experiment (`{k}`): use `fanin sim`, not `fanin run`");
    }
    if let Some(k) = doc.keys().find(|k| !TOP_KEYS.contains(&k.as_str())) {
        bail!("unknown top-level key `{k}` ({})", TOP_KEYS.join(", "));
    }
    Ok(())
}

/// The name (default: the file's stem), description and repetitions.
fn header(doc: &Table, origin: &str) -> anyhow::Result<(String, String, u32)> {
    let name = match doc.get("name") {
        Some(Value::String(s)) => s.clone(),
        None => Path::new(origin)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "experiment".into()),
        Some(v) => bail!("`name` must be a string, not {v}"),
    };
    let description = match doc.get("description") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => bail!("`description` must be a string, not {v}"),
    };
    let repetitions = match doc.get("repetitions") {
        None => 1,
        Some(Value::Integer(n)) if (1..=10_000).contains(n) => *n as u32,
        Some(v) => bail!("`repetitions` must be 1..=10000, not {v}"),
    };
    Ok((name, description, repetitions))
}

/// The `[[config]]` rows merged over `[run]`, or just `[run]`.
fn raw_configs(doc: &Table) -> anyhow::Result<Vec<RawConfig>> {
    let base = match doc.get("run") {
        None => Table::new(),
        Some(Value::Table(t)) => t.clone(),
        Some(_) => bail!("`run` must be a table"),
    };
    let list = match doc.get("config") {
        None => return Ok(vec![(None, base, Published::default())]),
        Some(Value::Array(list)) => list,
        Some(_) => bail!("`config` must be an array of tables ([[config]])"),
    };
    let mut rows = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let Value::Table(t) = v else {
            bail!("config #{} must be a table", i + 1);
        };
        let label = t.get("label").map(|l| match l {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        let what = format!("config #{}", i + 1);
        let publ = Published {
            loss_pct: number(t.get("published_loss_pct"), "published_loss_pct")
                .with_context(|| what.clone())?,
            long_loss_pct: number(t.get("published_long_loss_pct"), "published_long_loss_pct")
                .with_context(|| what.clone())?,
            mb_s: number(t.get("published_mb_s"), "published_mb_s").with_context(|| what)?,
        };
        rows.push((label, merge(&base, t), publ));
    }
    Ok(rows)
}

/// Every row crossed with every value of every `[matrix]` key.
fn cross_matrix(doc: &Table, mut rows: Vec<RawConfig>) -> anyhow::Result<Vec<RawConfig>> {
    let Some(m) = doc.get("matrix") else {
        return Ok(rows);
    };
    let Value::Table(m) = m else {
        bail!("`matrix` must be a table of arrays");
    };
    for (k, v) in m {
        let Value::Array(values) = v else {
            bail!("matrix.{k} must be an array");
        };
        if values.is_empty() {
            bail!("matrix.{k} is empty");
        }
        let mut next = Vec::new();
        for (label, t, publ) in &rows {
            for val in values {
                let mut t = t.clone();
                t.insert(k.clone(), val.clone());
                let val_s = match val {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let l = match label {
                    Some(l) => format!("{l} {k}={val_s}"),
                    None => format!("{k}={val_s}"),
                };
                next.push((Some(l), t, *publ));
            }
        }
        rows = next;
    }
    Ok(rows)
}

/// Each row as a `RunConfig` (checked once the command line had its say, in
/// `parse_with`); labels must be unique (they name directories).
fn typed(rows: Vec<RawConfig>) -> anyhow::Result<Vec<Config>> {
    let mut configs: Vec<Config> = Vec::new();
    for (i, (label, t, publ)) in rows.into_iter().enumerate() {
        let label = label.unwrap_or_else(|| format!("{}", i + 1));
        if configs.iter().any(|c| c.label == label) {
            bail!("two configurations are labelled {label:?}");
        }
        let run: RunConfig = Value::Table(t)
            .try_into()
            .with_context(|| format!("configuration {label}"))?;
        configs.push(Config {
            label,
            run,
            published_loss_pct: publ.loss_pct,
            published_long_loss_pct: publ.long_loss_pct,
            published_mb_s: publ.mb_s,
        });
    }
    Ok(configs)
}

/// The `[[fault]]` entries, each checked against every configuration.
fn faults(doc: &Table, configs: &[Config]) -> anyhow::Result<Vec<crate::faults::Fault>> {
    let faults: Vec<crate::faults::Fault> = match doc.get("fault") {
        None => Vec::new(),
        Some(v) => v
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.message().trim()))
            .context("[[fault]]")?,
    };
    for f in &faults {
        for c in configs {
            f.check(c.run.flps, c.run.epns, &c.run.registry)
                .with_context(|| format!("configuration {}", c.label))?;
        }
    }
    Ok(faults)
}

pub fn load(path: &Path) -> anyhow::Result<Experiment> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading experiment {}", path.display()))?;
    parse(&text, &path.display().to_string())
}

/// `load`, with `tweak` applied as `parse_with` does.
pub fn load_with(path: &Path, tweak: Tweak) -> anyhow::Result<Experiment> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading experiment {}", path.display()))?;
    parse_with(&text, &path.display().to_string(), tweak)
}

/// For `fanin icn --config`: an experiment file (first configuration) or a bare run table.
pub fn load_run_config(path: &Path) -> anyhow::Result<RunConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    parse_run_config(&text, &path.display().to_string())
}

/// A run configuration from text: an experiment file (its first configuration) or a
/// config.toml; `origin` names it in errors.
pub fn parse_run_config(text: &str, origin: &str) -> anyhow::Result<RunConfig> {
    let doc: Table = from_toml(text).with_context(|| format!("config {origin}"))?;
    if doc.contains_key("run") || doc.contains_key("config") || doc.contains_key("matrix") {
        let e = parse(text, origin)?;
        return Ok(e.configs[0].run.clone());
    }
    from_toml(text).with_context(|| format!("config {origin}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_experiment_parses() {
        let e = parse(DEFAULT, "default").unwrap();
        assert_eq!(e.configs.len(), 1);
        assert_eq!(e.repetitions, 1);
    }

    #[test]
    fn configs_cross_the_matrix() {
        let e = parse(
            r#"
            repetitions = 3
            [run]
            epns = 4
            duration_s = 1
            [[config]]
            label = "a"
            flps = 1
            published_loss_pct = 0.5
            [[config]]
            label = "b"
            flps = 2
            [matrix]
            stf_size = ["1KiB", "2KiB"]
            rate_hz = [50, 200]
            "#,
            "t.toml",
        )
        .unwrap();
        assert_eq!(e.configs.len(), 8);
        assert_eq!(e.repetitions, 3);
        assert_eq!(e.configs[0].label, "a rate_hz=50 stf_size=1KiB");
        assert_eq!(e.configs[0].published_loss_pct, Some(0.5));
        assert!(e.configs.iter().all(|c| c.run.epns == 4));
        assert_eq!(e.configs[7].run.flps, 2);
        assert_eq!(e.configs[7].run.rate_hz, 200.0);
    }

    #[test]
    fn testbed_placement_parses_and_is_checked() {
        let base = "[run]\nflps = 2\nepns = 3\n[testbed]\nname = \"pi-cluster\"\ncontrol = \"aux\"\nicn = 1\n";
        let e = parse(&format!("{base}flps = [2, 3]\nepns = [3, 4, 5]\n"), "t").unwrap();
        let p = e.testbed.unwrap();
        assert_eq!(p.control, ControlNet::Aux);
        assert_eq!(p.epns, vec![3, 4, 5]);
        let e = parse(&format!("{base}flps = [2]\nepns = [3, 4, 5]\n"), "t").unwrap_err();
        assert!(
            format!("{e:#}").contains("testbed.flps places 1 FLP(s)"),
            "{e:#}"
        );
        let e = parse(&format!("{base}flps = [2, 0]\nepns = [3, 4, 5]\n"), "t").unwrap_err();
        assert!(format!("{e:#}").contains("host 0"), "{e:#}");
        let e = parse(
            &format!("{base}flps = [2, 3]\nepns = [3, 4, 5]\nswitch = 1\n"),
            "t",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("switch"), "{e:#}");
    }

    #[test]
    fn bad_headers_and_repeated_labels_are_refused() {
        let e = parse("description = 5\n[run]\ntfs = 10\n", "t").unwrap_err();
        assert!(
            format!("{e:#}").contains("`description` must be a string"),
            "{e:#}"
        );
        let twice = "[run]\ntfs = 10\n[[config]]\nlabel = \"a\"\n[[config]]\nlabel = \"a\"\n";
        let e = parse(twice, "t").unwrap_err();
        assert!(format!("{e:#}").contains("labelled \"a\""), "{e:#}");
    }

    #[test]
    fn errors_name_the_configuration_and_field() {
        let e = parse("[[config]]\nlabel = \"x\"\nrate_hz = -5\n", "t.toml").unwrap_err();
        let s = format!("{e:#}");
        assert!(
            s.contains("configuration x") && s.contains("rate_hz"),
            "{s}"
        );
        let e = parse("[run]\nflsp = 2\n", "t.toml").unwrap_err();
        assert!(format!("{e:#}").contains("flsp"), "{e:#}");
        let e = parse("repetition = 2\n", "t.toml").unwrap_err();
        assert!(format!("{e:#}").contains("repetition"), "{e:#}");
    }
}
