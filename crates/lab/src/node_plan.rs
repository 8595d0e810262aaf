//! `[[source]]`, `[[sink]]` and `[epn]` of a runtime experiment: where each FLP's STFs
//! come from, where each EPN's built TFs go and how; checked when the file is read,
//! turned into `fanin flp` and `fanin epn` flags.
//!
//! Nodes run in their run's directory, so relative paths land beside its results.
//! `{flp}` in a source's spec is the FLP's id (one ring per FLP: `shm:ro-{flp}`).

use anyhow::{bail, Context};
use fanin_node::epn::sink::{OnFailure, SinkSpec};
use fanin_node::flp::source::SourceSpec;
use serde::Deserialize;

/// One `[[sink]]`: a spec for `fanin epn --sink`, on every EPN or those listed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkEntry {
    pub spec: String,
    pub epns: Option<Vec<u32>>,
}

/// One `[[source]]`: a spec for `fanin flp --source`, on every FLP or those listed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceEntry {
    pub spec: String,
    pub flps: Option<Vec<u32>>,
}

impl SourceEntry {
    fn for_flp(&self, id: u32) -> Option<String> {
        let mine = self.flps.as_ref().is_none_or(|f| f.contains(&id));
        mine.then(|| self.spec.replace("{flp}", &id.to_string()))
    }
}

/// `[epn]`: how TFs leave every EPN that has sinks.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpnSetup {
    /// "accepted" (default) or "built".
    pub complete_on: Option<String>,
    /// Deliver in TF-id order, giving up the oldest after this many newer TFs.
    pub in_order: Option<usize>,
    /// "restart" (default) or "leave".
    pub on_sink_failure: Option<String>,
    /// Exec sinks lend payload pages (vmsplice); only for commands that read(2).
    #[serde(default)]
    pub exec_zero_copy: bool,
    /// After a run stops, how long the sinks may go without returning a TF (seconds).
    pub sink_stop_timeout_s: Option<f64>,
}

#[derive(Debug, Clone, Default)]
pub struct NodePlan {
    pub sources: Vec<SourceEntry>,
    pub sinks: Vec<SinkEntry>,
    pub setup: EpnSetup,
}

impl NodePlan {
    /// From the experiment's `[[source]]`, `[[sink]]` and `[epn]`, checked against its
    /// smallest run.
    pub fn parse(doc: &toml::Table, (max_flps, max_epns): (u32, u32)) -> anyhow::Result<NodePlan> {
        let sources = parse_sources(doc.get("source"), max_flps)?;
        let (sink, epn) = (doc.get("sink"), doc.get("epn"));
        let sinks: Vec<SinkEntry> = match sink {
            None => Vec::new(),
            Some(v) => typed(v).context("[[sink]]")?,
        };
        for s in &sinks {
            let spec = s.spec.parse::<SinkSpec>().map_err(anyhow::Error::msg);
            let epns = s.epns.as_ref().map_or(max_epns as usize, Vec::len);
            if let SinkSpec::Tap(t) = spec.context("[[sink]]")? {
                if t.addr.port() != 0 && epns > 1 {
                    bail!(
                        "[[sink]] `{}`: one port for {epns} EPNs; give `epns = [N]` per tap",
                        s.spec
                    );
                }
            }
            if let Some(bad) = s.epns.iter().flatten().find(|e| **e >= max_epns) {
                bail!(
                    "[[sink]] `{}`: EPN {bad} is not in a run of {max_epns} EPNs",
                    s.spec
                );
            }
        }
        let setup: EpnSetup = match epn {
            None => EpnSetup::default(),
            Some(v) => typed(v).context("[epn]")?,
        };
        if let Some(c) = &setup.complete_on {
            if c != "accepted" && c != "built" {
                bail!("[epn] complete_on: `{c}` is not accepted or built");
            }
        }
        if setup.in_order == Some(0) {
            bail!("[epn] in_order: must be at least 1");
        }
        if let Some(f) = &setup.on_sink_failure {
            f.parse::<OnFailure>()
                .map_err(|e| anyhow::anyhow!("[epn] on_sink_failure: {e}"))?;
        }
        if let Some(t) = setup.sink_stop_timeout_s {
            let d = std::time::Duration::try_from_secs_f64(t).unwrap_or_default();
            if d.is_zero() || d > std::time::Duration::from_secs(86_400) {
                bail!("[epn] sink_stop_timeout_s: {t} is not within (0, 86400] seconds");
            }
        }
        Ok(NodePlan {
            sources,
            sinks,
            setup,
        })
    }

    /// How long the launcher waits for an EPN to exit after its run: longer than its
    /// sinks' stop watchdog (sinks still making progress then may be cut off).
    pub fn epn_exit_wait(&self) -> std::time::Duration {
        let stop = self.setup.sink_stop_timeout_s;
        let sinks = match self.sinks.is_empty() {
            true => 0.0, // no sink to wait for
            false => stop.unwrap_or(fanin_node::epn::SINK_STOP_TIMEOUT_S) + 5.0,
        };
        std::time::Duration::from_secs_f64(sinks.max(15.0))
    }

    /// The `fanin flp` flags of FLP `id` (the first `[[source]]` that names it).
    pub fn flp_argv(&self, id: u32) -> Vec<String> {
        match self.sources.iter().find_map(|s| s.for_flp(id)) {
            Some(spec) => vec!["--source".into(), spec],
            None => Vec::new(),
        }
    }

    /// The `fanin epn` flags of EPN `id`.
    pub fn argv(&self, id: u32) -> Vec<String> {
        let mut a = Vec::new();
        for s in &self.sinks {
            if s.epns.as_ref().is_none_or(|e| e.contains(&id)) {
                a.extend(["--sink".to_string(), s.spec.clone()]);
            }
        }
        if a.is_empty() {
            return a;
        }
        let s = &self.setup;
        if let Some(c) = &s.complete_on {
            a.extend(["--complete-on".into(), c.clone()]);
        }
        if let Some(n) = s.in_order {
            a.extend(["--in-order".into(), n.to_string()]);
        }
        if let Some(f) = &s.on_sink_failure {
            a.extend(["--on-sink-failure".into(), f.clone()]);
        }
        if s.exec_zero_copy {
            a.push("--exec-zero-copy".into());
        }
        if let Some(t) = s.sink_stop_timeout_s {
            a.extend(["--sink-stop-timeout".into(), t.to_string()]);
        }
        a
    }
}

fn parse_sources(v: Option<&toml::Value>, max_flps: u32) -> anyhow::Result<Vec<SourceEntry>> {
    let sources: Vec<SourceEntry> = match v {
        None => return Ok(Vec::new()),
        Some(v) => typed(v).context("[[source]]")?,
    };
    for s in &sources {
        s.spec
            .replace("{flp}", "0")
            .parse::<SourceSpec>()
            .map_err(anyhow::Error::msg)
            .context("[[source]]")?;
        if let Some(bad) = s.flps.iter().flatten().find(|f| **f >= max_flps) {
            bail!(
                "[[source]] `{}`: FLP {bad} is not in a run of {max_flps} FLPs",
                s.spec
            );
        }
    }
    Ok(sources)
}

fn typed<T: serde::de::DeserializeOwned>(v: &toml::Value) -> anyhow::Result<T> {
    v.clone()
        .try_into()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.message().trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(text: &str) -> anyhow::Result<NodePlan> {
        let doc: toml::Table = text.parse().unwrap();
        NodePlan::parse(&doc, (2, 3))
    }

    #[test]
    fn sources_go_to_the_flps_they_name_with_their_id() {
        let p = plan(
            "[[source]]\nspec = \"shm:ro-{flp}\"\nflps = [1]\n[[source]]\nspec = \"exec:./ro\"\n",
        )
        .unwrap();
        assert_eq!(p.flp_argv(0), ["--source", "exec:./ro"]);
        assert_eq!(p.flp_argv(1), ["--source", "shm:ro-1"]);
        let e = plan("[[source]]\nspec = \"shm:a/b\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("NAME must be"), "{e:#}");
        let e = plan("[[source]]\nspec = \"synthetic\"\nflps = [2]\n").unwrap_err();
        assert!(
            format!("{e:#}").contains("FLP 2 is not in a run of 2"),
            "{e:#}"
        );
    }

    #[test]
    fn sinks_go_to_the_epns_they_name_with_the_epn_options() {
        let p = plan(
            "[[sink]]\nspec = \"file:tfs\"\n[[sink]]\nspec = \"exec:cat\"\nepns = [1]\n\
             [epn]\nin_order = 4\n",
        )
        .unwrap();
        assert_eq!(p.argv(0), ["--sink", "file:tfs", "--in-order", "4"]);
        assert_eq!(
            p.argv(1),
            [
                "--sink",
                "file:tfs",
                "--sink",
                "exec:cat",
                "--in-order",
                "4"
            ]
        );
        let q = plan("[[sink]]\nspec = \"file:tfs\"\n[epn]\nsink_stop_timeout_s = 2.5\n").unwrap();
        assert_eq!(
            q.argv(0),
            ["--sink", "file:tfs", "--sink-stop-timeout", "2.5"]
        );
    }

    #[test]
    fn bad_entries_name_their_field() {
        let e = plan("[[sink]]\nspec = \"mail:me\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("unknown kind"), "{e:#}");
        let e = plan("[[sink]]\nspec = \"exec:cat\"\nepns = [3]\n").unwrap_err();
        assert!(format!("{e:#}").contains("EPN 3"), "{e:#}");
        let e = plan("[epn]\ncomplete_on = \"soon\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("complete_on"), "{e:#}");
        let e = plan("[epn]\nsink_stop_timeout_s = 0\n").unwrap_err();
        assert!(
            format!("{e:#}").contains("sink_stop_timeout_s: 0 is not"),
            "{e:#}"
        );
        let e = plan("[[sink]]\nspec = \"tap:127.0.0.1:7100\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("one port for 3 EPNs"), "{e:#}");
        let e = plan("[[sink]]\nspek = \"x\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("spek"), "{e:#}");
    }
}
