//! Run parameters given on the command line that override an experiment file's `[run]`
//! (`fanin run`, `fanin icn`): one flag per key, generated from `RunConfig` itself.

use anyhow::Context;
use clap::{Arg, ArgMatches, Command};
use fanin_node::RunConfig;
use fanin_sched::PolicyKind;
use serde_json::Value;

/// The `[run]` keys given on the command line, in order, as (key, text).
/// Nested keys are dotted (`least_loaded.max_building`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RunOverrides {
    set: Vec<(String, String)>,
}

/// Shorter spellings kept from earlier releases and used in the docs.
const ALIASES: &[(&str, &str)] = &[("rate_hz", "rate"), ("duration_s", "duration")];
/// Keys of which a run takes one: setting one clears the other.
const RUN_LENGTH: [&str; 2] = ["tfs", "duration_s"];

/// Every `[run]` key with its default value, nested tables flattened with dots.
pub fn run_keys() -> Vec<(String, Value)> {
    let defaults = serde_json::to_value(RunConfig::default()).expect("RunConfig serialises");
    let mut keys = Vec::new();
    flatten("", &defaults, &mut keys);
    keys
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        _ => out.push((prefix.to_string(), v.clone())),
    }
}

/// `least_loaded.max_building` -> `least-loaded-max-building`.
pub fn flag_name(key: &str) -> String {
    key.replace(['.', '_'], "-")
}

/// The user's documentation of the `[run]` keys: the file format in experiments/README.md,
/// whose comments are also the flags' help (a test checks every key is there).
const FILE_FORMAT: &str = include_str!("../../../experiments/README.md");

/// Each `[run]` key documented in experiments/README.md, with its comment (continued on
/// the comment-only lines below it).
pub fn documented_run_keys() -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = Vec::new();
    let block = FILE_FORMAT.split("[run]").nth(1).unwrap_or_default();
    for line in block.lines().skip(1).take_while(|l| !l.trim().is_empty()) {
        let (code, comment) = line.split_once('#').unwrap_or((line, ""));
        let code = code.trim();
        let comment = comment.trim();
        match (code.split_once('='), keys.last_mut()) {
            (Some((key, _)), _) => keys.push((key.trim().to_string(), comment.to_string())),
            // `# key = value  # comment`: a key shown without a default.
            (None, _) if comment.contains(" = ") => {
                let (key, rest) = comment.split_once(" = ").expect("checked");
                let note = rest.split_once('#').map(|(_, n)| n.trim()).unwrap_or("");
                keys.push((key.trim().to_string(), note.to_string()));
            }
            (None, Some((_, prev))) => {
                prev.push(' ');
                prev.push_str(comment);
            }
            (None, None) => {}
        }
    }
    keys
}

fn help(key: &str, default: &Value, docs: &[(String, String)]) -> String {
    let default = match default {
        Value::Null => "none".to_string(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let doc = docs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, d)| d.as_str())
        .unwrap_or_default();
    let mut h = format!("{doc} [default {default}]");
    if key == "policy" {
        let names: Vec<_> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
        h = format!("one of: {} [default {default}]", names.join(", "));
    }
    h.trim_start().to_string()
}

impl clap::Args for RunOverrides {
    fn augment_args(mut cmd: Command) -> Command {
        let docs = documented_run_keys(); // read once: every fanin process builds these
        for (key, default) in run_keys() {
            let mut arg = Arg::new(key.clone())
                .long(flag_name(&key))
                .value_name("VALUE")
                .allow_negative_numbers(true)
                .help(help(&key, &default, &docs))
                .help_heading("Run parameters (override the file's [run])");
            if let Some((_, alias)) = ALIASES.iter().find(|(k, _)| *k == key) {
                arg = arg.visible_alias(*alias);
            }
            if key == RUN_LENGTH[0] {
                arg = arg.conflicts_with(RUN_LENGTH[1]);
            }
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for RunOverrides {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut o = RunOverrides::default();
        o.update_from_arg_matches(m)?;
        Ok(o)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for (key, _) in run_keys() {
            if let Some(v) = m.get_one::<String>(&key) {
                self.set.push((key, v.clone()));
            }
        }
        Ok(())
    }
}

impl RunOverrides {
    /// Overrides from (key, text) pairs, as the command line would give them.
    pub fn new(set: &[(&str, &str)]) -> RunOverrides {
        RunOverrides {
            set: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Does the command line override anything?
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Sets every given key in `c`; a value of the wrong kind names its flag.
    pub fn apply(&self, c: &mut RunConfig) -> anyhow::Result<()> {
        // JSON has no NaN or infinity: such a value in the file is named here, before the
        // round trip below turns it into a null that the next flag would be blamed for.
        if !self.set.is_empty() {
            let as_toml = toml::Value::try_from(&*c).context("the run configuration")?;
            if let Some((key, v)) = non_finite(&as_toml, String::new()) {
                anyhow::bail!("{key}: {v} is not a finite number");
            }
        }
        let mut doc = serde_json::to_value(&*c).expect("RunConfig serialises");
        for (key, text) in &self.set {
            let flag = flag_name(key);
            let slot = slot(&mut doc, key).with_context(|| format!("--{flag}: no such key"))?;
            *slot = value(slot, text).with_context(|| format!("--{flag}"))?;
            if RUN_LENGTH.contains(&key.as_str()) {
                let other = RUN_LENGTH.iter().find(|k| *k != key).expect("two keys");
                doc[*other] = Value::Null;
            }
            *c = serde_json::from_value(doc.clone())
                .map_err(|e| anyhow::anyhow!("--{flag} {text}: {e}"))?;
        }
        Ok(())
    }
}

/// The first float that is NaN or infinite in `v`, with its dotted key.
fn non_finite(v: &toml::Value, key: String) -> Option<(String, f64)> {
    match v {
        toml::Value::Float(f) if !f.is_finite() => Some((key, *f)),
        toml::Value::Table(t) => t.iter().find_map(|(k, v)| {
            let key = if key.is_empty() {
                k.clone()
            } else {
                format!("{key}.{k}")
            };
            non_finite(v, key)
        }),
        toml::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| non_finite(v, format!("{key}[{i}]"))),
        _ => None,
    }
}

fn slot<'a>(doc: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    key.split('.').try_fold(doc, |v, k| v.get_mut(k))
}

/// The text of a flag as the value its key holds: a string key takes the text as it
/// is; others read it as TOML (`3`, `true`, `[1, 2]`; a list may omit its brackets).
fn value(current: &Value, text: &str) -> anyhow::Result<Value> {
    if current.is_string() {
        return Ok(Value::String(text.to_string()));
    }
    let text = if current.is_array() && !text.trim_start().starts_with('[') {
        format!("[{text}]")
    } else {
        text.to_string()
    };
    match toml::from_str::<toml::Table>(&format!("v = {text}")) {
        Ok(mut t) => Ok(serde_json::to_value(t.remove("v"))?),
        // Not TOML: a string (the key's own parser says whether it fits).
        Err(_) => Ok(Value::String(text)),
    }
}

/// A run id from the wall clock (ms since the UNIX epoch).
pub fn clock_run_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Args;
    use fanin_node::config::Registry;

    #[test]
    fn every_run_key_is_documented_and_every_documented_key_exists() {
        let documented: Vec<String> = documented_run_keys().into_iter().map(|(k, _)| k).collect();
        let keys: Vec<String> = run_keys().into_iter().map(|(k, _)| k).collect();
        for k in &keys {
            assert!(
                documented.contains(k),
                "experiments/README.md lacks [run] key {k}"
            );
        }
        for (k, doc) in documented_run_keys() {
            assert!(
                !doc.is_empty(),
                "experiments/README.md: [run] key {k} has no comment"
            );
        }
        for k in &documented {
            assert!(
                keys.contains(k),
                "experiments/README.md documents unknown key {k}"
            );
        }
    }

    #[test]
    fn every_run_key_has_a_flag_named_after_it() {
        let cmd = RunOverrides::augment_args(Command::new("t"));
        let keys = run_keys();
        assert!(keys.len() >= 25, "{keys:?}");
        for (key, _) in &keys {
            let arg = cmd.get_arguments().find(|a| a.get_id() == key.as_str());
            let arg = arg.unwrap_or_else(|| panic!("no flag for {key}"));
            assert_eq!(arg.get_long(), Some(flag_name(key).as_str()));
        }
        assert!(keys.iter().any(|(k, _)| k == "least_loaded.max_building"));
    }

    #[test]
    fn flags_set_their_keys() {
        let mut c = RunConfig::default();
        RunOverrides::new(&[
            ("flps", "4"),
            ("rate_hz", "100"),
            ("lease_ms", "400"),
            ("reassign", "false"),
            ("flp_buffer", "64MiB"),
            ("registry", "zookeeper"),
            ("stf_size", "232000"),
            ("epn_weights", "1,2,3"),
            ("least_loaded.max_building", "7"),
            ("tfs", "500"),
        ])
        .apply(&mut c)
        .unwrap();
        assert_eq!((c.flps, c.rate_hz, c.lease_ms), (4, 100.0, 400));
        assert!(!c.reassign);
        assert_eq!(c.flp_buffer.0, 64 << 20);
        assert_eq!(c.registry, Registry::ZooKeeper);
        assert_eq!(c.stf_size, "232000");
        assert_eq!(c.epn_weights, vec![1, 2, 3]);
        assert_eq!(c.least_loaded.max_building, 7);
        assert_eq!((c.tfs, c.duration_s), (Some(500), None), "one run length");
    }

    /// A NaN from the file is named as the file's, not blamed on the flag given after it.
    #[test]
    fn a_non_finite_value_in_the_file_is_named_not_the_flag() {
        let mut c = RunConfig {
            rate_hz: f64::NAN,
            ..RunConfig::default()
        };
        let e = RunOverrides::new(&[("flps", "3")])
            .apply(&mut c)
            .unwrap_err();
        assert_eq!(e.to_string(), "rate_hz: NaN is not a finite number");
    }

    #[test]
    fn a_bad_value_names_its_flag() {
        let mut c = RunConfig::default();
        for (key, text, flag) in [
            ("flps", "many", "--flps"),
            ("reassign", "maybe", "--reassign"),
            ("flp_buffer", "lots", "--flp-buffer"),
            ("registry", "http://x", "--registry"),
            ("policy", "fastest", "--policy"),
        ] {
            let e = RunOverrides::new(&[(key, text)]).apply(&mut c).unwrap_err();
            let e = format!("{e:#}");
            assert!(e.starts_with(flag), "{e}");
        }
        assert_eq!(c, RunConfig::default(), "a refused flag changes nothing");
    }
}
