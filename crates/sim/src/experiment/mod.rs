//! Simulation experiment files behind one loader: the top-level `model` key says which
//! simulator runs the file (`packet`, `flow`, `fabric`, `build`); results go to one place.
//!
//! Files written before the key existed are recognised by their one model table
//! (`[sim]`, `[alice]`, `[fabric]`, `[build]`); a file with none, or with several and no
//! `model`, gets an error naming the choices.

pub mod fabric;
pub mod flow;
pub mod nodes;
pub mod packet;

use std::path::Path;

use anyhow::{bail, Context};
use toml::{Table, Value};

/// Which simulator an experiment file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Packet-level network (TCP, UDP): `[sim]` + `[[run]]`.
    Packet,
    /// Flow-level event building at ALICE scale: `[alice]` + `[[run]]`.
    Flow,
    /// Flows on a fat tree (ECMP, Hedera): `[fabric]` + `[[scenario]]`.
    Fabric,
    /// Event building over a fat tree: `[build]` + `[[run]]`.
    Build,
    /// The real node cores in simulated time: `[run]` + `[net]` + `[[fault]]`.
    Nodes,
}

impl Model {
    pub const ALL: [Model; 5] = [
        Model::Packet,
        Model::Flow,
        Model::Fabric,
        Model::Build,
        Model::Nodes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Model::Packet => "packet",
            Model::Flow => "flow",
            Model::Fabric => "fabric",
            Model::Build => "build",
            Model::Nodes => "nodes",
        }
    }

    /// The table holding the model's base configuration.
    pub fn table(self) -> &'static str {
        match self {
            Model::Packet => "sim",
            Model::Flow => "alice",
            Model::Fabric => "fabric",
            Model::Build => "build",
            Model::Nodes => "run",
        }
    }

    fn parse(s: &str) -> Option<Model> {
        Model::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// The experiment's `name`, or `default`.
fn name_of(doc: &Table, default: &str) -> String {
    doc.get("name")
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_string()
}

/// The model's base table `[key]` (empty when absent).
fn base_table(doc: &Table, key: &str, origin: &str) -> anyhow::Result<Table> {
    match doc.get(key) {
        None => Ok(Table::new()),
        Some(Value::Table(t)) => Ok(t.clone()),
        Some(_) => bail!("experiment {origin}: `{key}` must be a table"),
    }
}

/// The policies every row runs with: `policies = [...]`, or every policy.
fn policies(doc: &Table, origin: &str) -> anyhow::Result<Vec<fanin_sched::PolicyKind>> {
    let Some(v) = doc.get("policies") else {
        return Ok(fanin_sched::PolicyKind::ALL.to_vec());
    };
    let names = v
        .as_array()
        .with_context(|| format!("experiment {origin}: policies must be an array of names"))?;
    let kinds: Vec<fanin_sched::PolicyKind> = names
        .iter()
        .map(|v| {
            v.as_str()
                .with_context(|| format!("experiment {origin}: policies: names as strings"))?
                .parse()
                .map_err(|e| anyhow::anyhow!("experiment {origin}: policies: {e}"))
        })
        .collect::<anyhow::Result<_>>()?;
    // Each policy's results have a directory of their own: one named twice would
    // overwrite the other.
    if let Some(twice) = kinds
        .iter()
        .find(|k| kinds.iter().filter(|o| o == k).count() > 1)
    {
        bail!("experiment {origin}: policies: {twice} is named twice");
    }
    Ok(kinds)
}

/// A file whose `[[run]]` rows each run with every policy (`flow`, `build`): its name,
/// origin (for messages), policies and rows merged over `[key]`.
struct PolicyRows {
    name: String,
    origin: String,
    policies: Vec<fanin_sched::PolicyKind>,
    rows: Vec<fanin_report::doc::Row>,
}

fn policy_rows(path: &Path, key: &str) -> anyhow::Result<PolicyRows> {
    let allowed = ["model", "name", "description", "policies", key, "run"];
    let (doc, origin) = fanin_report::doc::read_doc(path, &allowed)?;
    let base = base_table(&doc, key, &origin)?;
    let policies = policies(&doc, &origin)?;
    let rows = fanin_report::doc::rows_over(&doc, "run", &base, &[], &origin)?;
    // Each run's directory is `LABEL-POLICY`: no two may meet (`x-weighted` with
    // round-robin, `x` with weighted-round-robin).
    let mut dirs = std::collections::BTreeMap::new();
    for r in &rows {
        for p in &policies {
            let dir = policy_dir(&r.label, *p);
            if let Some(other) = dirs.insert(dir.clone(), (&r.label, p)) {
                bail!(
                    "experiment {origin}: run {} with {} and run {} with {p} share the results directory {dir}",
                    other.0, other.1, r.label
                );
            }
        }
    }
    Ok(PolicyRows {
        name: name_of(&doc, key),
        policies,
        rows,
        origin,
    })
}

/// The first columns of every policy sweep's table: the row, the policy, the counts.
pub(super) const COUNT_COLUMNS: [&str; 6] = [
    "run",
    "policy",
    "issued",
    "completed",
    "incompl.",
    "dropped",
];

/// A table's header row: the count columns, then `rest`.
pub(super) fn head_with(rest: &[&str]) -> Vec<String> {
    COUNT_COLUMNS
        .iter()
        .chain(rest)
        .map(|c| c.to_string())
        .collect()
}

/// The directory name of row `label` run with policy `p` (flow and build files).
pub(super) fn policy_dir(label: &str, p: fanin_sched::PolicyKind) -> String {
    format!("{}-{}", fanin_report::sanitize(label), p.name())
}

/// Keeps the rows whose label is in `only` (all when empty); none left is an error.
pub fn keep_only<T>(
    rows: &mut Vec<T>,
    only: &[String],
    label: impl Fn(&T) -> &str,
) -> anyhow::Result<()> {
    if only.is_empty() {
        return Ok(());
    }
    rows.retain(|r| only.iter().any(|o| o == label(r)));
    anyhow::ensure!(!rows.is_empty(), "--only {only:?}: no row has those labels");
    Ok(())
}

/// Loads a fabric, build or nodes file of `model` and its `--only` rows, checking what it
/// can without running anything: the number of table rows. Of the flags only `--seed`
/// changes these models' runs (the fabric's seeds); packet and flow files are checked
/// as they run, with the flags applied (`fanin --check sim`), so they are refused here.
pub fn check_file(
    path: &Path,
    model: Model,
    (only, seed): (&[String], Option<u64>),
) -> anyhow::Result<usize> {
    let rows = match model {
        Model::Packet | Model::Flow => {
            anyhow::bail!("{} files are checked with their run's flags", model.name())
        }
        Model::Fabric => {
            let mut e = fabric::load(path)?;
            keep_only(&mut e.scenarios, only, |s| &s.label)?;
            fabric::check_seeds(&e, seed)?;
            e.scenarios.len()
        }
        Model::Build => {
            let mut r = policy_rows(path, "build")?;
            keep_only(&mut r.rows, only, |r| &r.label)?;
            fabric::build_configs(&r.rows, &r.origin)?.len() * r.policies.len()
        }
        Model::Nodes => {
            nodes::load(path)?;
            1
        }
    };
    Ok(rows)
}

/// Which model the file at `path` is for: its `model` key, or its one model table.
pub fn model_of(path: &Path) -> anyhow::Result<Model> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading experiment {}", path.display()))?;
    let doc: Table = fanin_report::doc::from_toml(&text)
        .with_context(|| format!("experiment {}", path.display()))?;
    model_of_doc(&doc).with_context(|| format!("experiment {}", path.display()))
}

fn model_of_doc(doc: &Table) -> anyhow::Result<Model> {
    let names = || Model::ALL.map(Model::name).join(", ");
    if let Some(v) = doc.get("model") {
        let s = v.as_str().context("`model` must be a string")?;
        let Some(m) = Model::parse(s) else {
            bail!("model {s:?} is none of {}", names());
        };
        if !doc.contains_key(m.table()) {
            bail!("model {s:?} needs a [{}] table", m.table());
        }
        return Ok(m);
    }
    let present: Vec<Model> = Model::ALL
        .into_iter()
        .filter(|&m| m != Model::Nodes && doc.contains_key(m.table()))
        .collect();
    match present[..] {
        [m] => Ok(m),
        [] if doc.contains_key("run") && doc.get("run").is_some_and(Value::is_table) => {
            bail!("this is a runtime experiment ([run]): use `fanin run`, not `fanin sim`")
        }
        [] => bail!(
            "no `model` key and no model table; set model = one of {}",
            names()
        ),
        _ => bail!("several model tables: set model = one of {}", names()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(s: &str) -> Table {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn the_model_key_decides() {
        let d = doc("model = \"flow\"\n[alice]\n[sim]\n");
        assert_eq!(model_of_doc(&d).unwrap(), Model::Flow);
    }

    #[test]
    fn old_files_are_known_by_their_table() {
        assert_eq!(model_of_doc(&doc("[fabric]\n")).unwrap(), Model::Fabric);
        assert_eq!(model_of_doc(&doc("[build]\n")).unwrap(), Model::Build);
        assert_eq!(model_of_doc(&doc("[sim]\n")).unwrap(), Model::Packet);
    }

    #[test]
    fn unknown_or_missing_models_are_named() {
        let e = model_of_doc(&doc("model = \"quantum\"\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("none of packet, flow, fabric, build, nodes"),
            "{e}"
        );
        let e = model_of_doc(&doc("model = \"flow\"\n[sim]\n")).unwrap_err();
        assert!(e.to_string().contains("needs a [alice] table"), "{e}");
        let e = model_of_doc(&doc("[run]\nflps = 2\n")).unwrap_err();
        assert!(e.to_string().contains("use `fanin run`"), "{e}");
    }
}
