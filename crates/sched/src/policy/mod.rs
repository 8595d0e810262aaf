//! The `Policy` trait every load-balancing policy implements, and the policy catalogue.
//! A policy sees membership changes and TF ids, and answers with one EPN per TF.

mod round_robin;
mod static_modulo;

pub use round_robin::RoundRobin;
pub use static_modulo::StaticModulo;

use crate::{EpnId, TfId};

/// A load-balancing policy. Implementations are deterministic: the same sequence of
/// calls gives the same answers, in the runtime and in the simulator alike.
pub trait Policy: Send {
    /// Short name used in configuration and results.
    fn name(&self) -> &'static str;
    /// An EPN became available (registered, or came back).
    fn add_epn(&mut self, epn: EpnId);
    /// An EPN is gone; it must not be chosen again until re-added.
    fn remove_epn(&mut self, epn: EpnId);
    /// The EPNs currently eligible, in the policy's own order.
    fn epns(&self) -> &[EpnId];
    /// Picks the EPN that builds `tf`, or `None` when no EPN is available.
    fn assign(&mut self, tf: TfId) -> Option<EpnId>;
}

/// The policies a configuration can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Round robin over registered EPNs in join order (the TDR's `determineChannel`).
    RoundRobin,
    /// ANTARES static assignment: TF s goes to EPN s mod N (EPNs sorted by id).
    StaticModulo,
}

impl PolicyKind {
    pub const ALL: &'static [PolicyKind] = &[PolicyKind::RoundRobin, PolicyKind::StaticModulo];

    pub fn build(self) -> Box<dyn Policy> {
        match self {
            PolicyKind::RoundRobin => Box::new(RoundRobin::default()),
            PolicyKind::StaticModulo => Box::new(StaticModulo::default()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::StaticModulo => "static-modulo",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PolicyKind::ALL
            .iter()
            .copied()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
                format!("unknown policy {s:?} (known: {})", names.join(", "))
            })
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().unwrap(), *p);
            assert_eq!(p.build().name(), p.name());
        }
        let e = "fastest".parse::<PolicyKind>().unwrap_err();
        assert!(e.contains("round-robin"), "{e}");
    }

    #[test]
    fn every_policy_uses_only_members_and_none_when_empty() {
        for p in PolicyKind::ALL {
            let mut pol = p.build();
            assert_eq!(pol.assign(0), None, "{p}");
            for e in [5, 2, 9] {
                pol.add_epn(e);
            }
            pol.remove_epn(2);
            for tf in 0..100 {
                let e = pol.assign(tf).unwrap();
                assert!(e == 5 || e == 9, "{p} chose {e}");
            }
            pol.remove_epn(5);
            pol.remove_epn(9);
            assert_eq!(pol.assign(100), None, "{p}");
        }
    }
}
