//! Experiment files as TOML documents: reading one with its allowed top-level keys,
//! expanding `[[row]]` arrays over a base table, and TOML errors as one line.

use std::path::Path;

use anyhow::{bail, Context};
use toml::{Table, Value};

/// Reads an experiment file whose top-level keys must be among `allowed`; returns the
/// document and its origin (the path, for messages). Errors are one line.
pub fn read_doc(path: &Path, allowed: &[&str]) -> anyhow::Result<(Table, String)> {
    let src = std::fs::read_to_string(path)
        .with_context(|| format!("reading experiment {}", path.display()))?;
    let origin = path.display().to_string();
    let doc: Table = from_toml(&src).with_context(|| format!("experiment {origin}"))?;
    for k in doc.keys() {
        if !allowed.contains(&k.as_str()) {
            bail!(
                "experiment {origin}: unknown top-level key `{k}` ({})",
                allowed.join(", ")
            );
        }
    }
    Ok((doc, origin))
}

/// Does the file parse as TOML with this top-level table (which kind of experiment)?
pub fn has_table(path: &Path, key: &str) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| toml::from_str::<Table>(&s).ok())
        .is_some_and(|t| t.contains_key(key))
}

/// One row of a simulation experiment's `[[key]]` array: its label (`label`, or its
/// 1-based position), the row as written, and the row merged over the base table
/// without the `meta` keys (labels, published values).
pub struct Row {
    pub label: String,
    pub raw: Table,
    pub merged: Table,
}

/// The rows of `[[key]]` in `doc`, each merged over `base`; no array: one row, the base.
/// Two rows whose labels name the same directory are refused (one would overwrite the
/// other's results).
pub fn rows_over(
    doc: &Table,
    key: &str,
    base: &Table,
    meta: &[&str],
    origin: &str,
) -> anyhow::Result<Vec<Row>> {
    let raw: Vec<Table> = match doc.get(key) {
        None => vec![Table::new()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::Table(t) => Ok(t.clone()),
                _ => bail!("experiment {origin}: each [[{key}]] must be a table"),
            })
            .collect::<anyhow::Result<_>>()?,
        Some(_) => bail!("experiment {origin}: `{key}` must be an array of tables ([[{key}]])"),
    };
    let rows: Vec<Row> = raw
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            let label = match row.get("label") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => format!("{}", i + 1),
            };
            let mut merged = base.clone();
            for (k, v) in &row {
                if k != "label" && !meta.contains(&k.as_str()) {
                    merged.insert(k.clone(), v.clone());
                }
            }
            Row {
                label,
                raw: row,
                merged,
            }
        })
        .collect();
    let mut dirs = std::collections::BTreeMap::new();
    for r in &rows {
        if let Some(first) = dirs.insert(crate::sanitize(&r.label), &r.label) {
            bail!(
                "experiment {origin}: [[{key}]] labels `{first}` and `{}` name the same results directory",
                r.label
            );
        }
    }
    Ok(rows)
}

/// A TOML error as one line: `line L, column C: message`.
pub fn toml_error(e: toml::de::Error, text: &str) -> anyhow::Error {
    let msg = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
            anyhow::anyhow!("TOML error at line {line}, column {col}: {msg}")
        }
        None => anyhow::anyhow!("TOML error: {msg}"),
    }
}

pub fn from_toml<T: serde::de::DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    toml::from_str(text).map_err(|e| toml_error(e, text))
}
