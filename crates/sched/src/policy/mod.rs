//! The `Policy` trait every load-balancing policy implements, and the policy catalogue.
//! A policy sees membership changes (plus weights and load reports) and TF requests, and
//! answers each with a `Decision`: assign to an EPN, wait, or drop with a named reason.
//!
//! Decisions: `Decision::Assign(epn)`; `Decision::Drop(DropReason::NoEpn)` when no EPN is a
//! member at all (every policy, the old `None`); and, for policies that can refuse a TF
//! although EPNs exist (`least-loaded`), `Decision::Wait` (ask again later with the same
//! request) or `Decision::Drop(reason)` with `reason` saying why none qualified.
//! `Decision::epn()` gives the old `Option<EpnId>` view.

mod blacklist;
mod least_loaded;
mod reinit;
mod round_robin;
mod static_modulo;
mod weighted_round_robin;
mod whitelist;

pub use blacklist::Blacklist;
pub use least_loaded::{LeastLoaded, LeastLoadedConfig, WhenNoneReady};
pub use reinit::Reinit;
pub use round_robin::RoundRobin;
pub use static_modulo::StaticModulo;
pub use weighted_round_robin::{check_weights, WeightedRoundRobin};
pub use whitelist::Whitelist;

use crate::{EpnId, TfId};

/// One TF to place: its id and its total size in bytes (all its STFs).
///
/// The size travels with each request, rather than being configured once, because the
/// STF size models vary per TF and the ICN knows every TF's exact size in advance
/// (`StfSize::tf_bytes`), as DataDistribution's scheduler does from its STF reports.
/// Only `least-loaded` uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TfRequest {
    pub tf: TfId,
    pub bytes: u64,
}

impl TfRequest {
    pub fn new(tf: TfId, bytes: u64) -> TfRequest {
        TfRequest { tf, bytes }
    }
}

/// A policy's answer to one `TfRequest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send the TF to this EPN.
    Assign(EpnId),
    /// EPNs exist but none can take the TF now, and the policy says: hold it and ask
    /// again (after a load report or a membership change). Never returned when there
    /// are no EPNs at all (that is `Drop(NoEpn)`).
    Wait,
    /// Do not build the TF; count it under `reason`.
    Drop(DropReason),
}

impl Decision {
    /// The chosen EPN, if the decision is `Assign`.
    pub fn epn(self) -> Option<EpnId> {
        match self {
            Decision::Assign(e) => Some(e),
            Decision::Wait | Decision::Drop(_) => None,
        }
    }
}

/// Why a policy dropped a TF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// No EPN is a member (none registered, or all gone).
    NoEpn,
    /// EPNs exist, but none has free buffer >= headroom x TF size (and a free slot).
    NoEpnBuffer,
    /// EPNs exist, but every one has the maximum number of TFs in building.
    EpnsBusy,
}

impl DropReason {
    pub const ALL: &'static [DropReason] = &[
        DropReason::NoEpn,
        DropReason::NoEpnBuffer,
        DropReason::EpnsBusy,
    ];

    /// Name in metrics and result files (snake_case, like the ledger's reasons).
    pub fn name(self) -> &'static str {
        match self {
            DropReason::NoEpn => "no_epn",
            DropReason::NoEpnBuffer => "no_epn_buffer",
            DropReason::EpnsBusy => "epns_busy",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an EPN reports about itself (used by `least-loaded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EpnLoad {
    /// Free bytes in its build buffer.
    pub free_bytes: u64,
    /// TFs it is building now.
    pub building: u32,
}

/// A load-balancing policy. Implementations are deterministic: the same sequence of
/// calls gives the same answers, in the runtime and in the simulator alike.
///
/// Membership calls are idempotent: adding a member or removing a non-member changes
/// nothing. `set_weight` and `report_load` are hints that policies which do not use
/// them ignore (the default methods).
pub trait Policy: Send {
    /// Short name used in configuration and results.
    fn name(&self) -> &'static str;
    /// An EPN became available (registered, or came back).
    fn add_epn(&mut self, epn: EpnId);
    /// An EPN is gone; it must not be chosen again until re-added.
    fn remove_epn(&mut self, epn: EpnId);
    /// The EPNs currently eligible, in the policy's own order.
    fn epns(&self) -> &[EpnId];
    /// Decides where `req.tf` is built. Every policy answers `Drop(DropReason::NoEpn)`
    /// when it has no member, and otherwise `Assign` of a member, except `least-loaded`,
    /// which answers `Wait` or `Drop(NoEpnBuffer | EpnsBusy)` when no member qualifies.
    fn assign(&mut self, req: TfRequest) -> Decision;
    /// Capacity weight of an EPN (member or not yet); EPNs never given one weigh 1.
    /// Used by `weighted-round-robin`; ignored by the others.
    fn set_weight(&mut self, _epn: EpnId, _weight: u32) {}
    /// The latest load an EPN reported. Used by `least-loaded`; ignored by the others.
    fn report_load(&mut self, _epn: EpnId, _load: EpnLoad) {}
    /// How many times the policy rebuilt its whole table (`reinit`: once per membership
    /// change); 0 for policies that never do. The runtime times the calls that raise it.
    fn resets(&self) -> u64 {
        0
    }
}

/// The policies a configuration can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Round robin over registered EPNs in join order (the TDR's `determineChannel`).
    #[default]
    RoundRobin,
    /// ANTARES static assignment: TF s goes to EPN s mod N (EPNs sorted by id).
    StaticModulo,
    /// O2Balancer2's ZooKeeper version: round robin over every EPN ever seen, skipping
    /// offline ones; a returning EPN takes its old place.
    Whitelist,
    /// Original O2Balancer: TF id mod |online|, mapped onto the online EPNs in channel
    /// (join) order; offline EPNs are blacklisted, not removed from the channel list.
    Blacklist,
    /// Original O2Balancer's re-initialization: every membership change rebuilds the
    /// table from scratch (counted by `resets()`); TF id mod N over the EPNs by id.
    Reinit,
    /// Smooth weighted round robin (as in nginx) over per-EPN capacity weights.
    WeightedRoundRobin,
    /// DataDistribution's scheduler: round robin over the EPNs with free buffer >= 1.2 x
    /// TF size and fewer than a maximum of TFs in building; otherwise wait or drop.
    LeastLoaded,
}

impl PolicyKind {
    pub const ALL: &'static [PolicyKind] = &[
        PolicyKind::RoundRobin,
        PolicyKind::StaticModulo,
        PolicyKind::Whitelist,
        PolicyKind::Blacklist,
        PolicyKind::Reinit,
        PolicyKind::WeightedRoundRobin,
        PolicyKind::LeastLoaded,
    ];

    /// The policy with its default parameters (`least-loaded`: `LeastLoadedConfig::default()`).
    pub fn build(self) -> Box<dyn Policy> {
        match self {
            PolicyKind::RoundRobin => Box::new(RoundRobin::default()),
            PolicyKind::StaticModulo => Box::new(StaticModulo::default()),
            PolicyKind::Whitelist => Box::new(Whitelist::default()),
            PolicyKind::Blacklist => Box::new(Blacklist::default()),
            PolicyKind::Reinit => Box::new(Reinit::default()),
            PolicyKind::WeightedRoundRobin => Box::new(WeightedRoundRobin::default()),
            PolicyKind::LeastLoaded => Box::new(LeastLoaded::default()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::StaticModulo => "static-modulo",
            PolicyKind::Whitelist => "whitelist",
            PolicyKind::Blacklist => "blacklist",
            PolicyKind::Reinit => "reinit",
            PolicyKind::WeightedRoundRobin => "weighted-round-robin",
            PolicyKind::LeastLoaded => "least-loaded",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = crate::ParseError;
    fn from_str(s: &str) -> Result<Self, crate::ParseError> {
        PolicyKind::ALL
            .iter()
            .copied()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
                format!("unknown policy {s:?} (known: {})", names.join(", ")).into()
            })
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Test helper shared by the policies' tests: `n` decisions for TFs `first..`, each
/// `bytes` big; panics on anything but `Assign`.
#[cfg(test)]
pub(crate) fn take_from(p: &mut dyn Policy, first: TfId, n: usize, bytes: u64) -> Vec<EpnId> {
    (first..first + n as u64)
        .map(|tf| match p.assign(TfRequest::new(tf, bytes)) {
            Decision::Assign(e) => e,
            d => panic!("{}: TF {tf}: {d:?}", p.name()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(tf: TfId) -> TfRequest {
        TfRequest::new(tf, 1 << 20)
    }

    #[test]
    fn names_parse_back() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().unwrap(), *p);
            assert_eq!(p.build().name(), p.name());
            // serde uses the same kebab-case names as FromStr.
            assert_eq!(from_serde(p.name()), *p);
        }
        let e = "fastest".parse::<PolicyKind>().unwrap_err();
        assert!(e.0.contains("round-robin"), "{e}");
        assert!(e.0.contains("least-loaded"), "{e}");
    }

    /// Deserialises a policy name through serde (a plain string deserializer, so the
    /// crate needs no format dependency).
    fn from_serde(name: &str) -> PolicyKind {
        use serde::de::IntoDeserializer;
        let d: serde::de::value::StrDeserializer<serde::de::value::Error> =
            name.into_deserializer();
        serde::Deserialize::deserialize(d).unwrap()
    }

    #[test]
    fn decision_epn_view() {
        assert_eq!(Decision::Assign(4).epn(), Some(4));
        assert_eq!(Decision::Wait.epn(), None);
        assert_eq!(Decision::Drop(DropReason::NoEpn).epn(), None);
        let names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["no_epn", "no_epn_buffer", "epns_busy"]);
    }

    #[test]
    fn every_policy_uses_only_members_and_no_epn_when_empty() {
        for p in PolicyKind::ALL {
            let mut pol = p.build();
            assert_eq!(pol.assign(req(0)), Decision::Drop(DropReason::NoEpn), "{p}");
            for e in [5, 2, 9] {
                pol.add_epn(e);
            }
            pol.remove_epn(2);
            let mut members = pol.epns().to_vec();
            members.sort_unstable();
            assert_eq!(members, [5, 9], "{p}");
            for tf in 0..100 {
                let e = pol.assign(req(tf)).epn().unwrap();
                assert!(e == 5 || e == 9, "{p} chose {e}");
            }
            pol.remove_epn(5);
            pol.remove_epn(9);
            assert!(pol.epns().is_empty(), "{p}");
            assert_eq!(
                pol.assign(req(100)),
                Decision::Drop(DropReason::NoEpn),
                "{p}"
            );
        }
    }

    #[test]
    fn every_policy_ignores_hints_it_does_not_use_and_stays_round() {
        // With equal weights and generous load reports, every policy spreads 6 TFs over
        // 3 EPNs evenly.
        for p in PolicyKind::ALL {
            let mut pol = p.build();
            for e in [1, 2, 3] {
                pol.add_epn(e);
                pol.set_weight(e, 2);
                pol.report_load(
                    e,
                    EpnLoad {
                        free_bytes: 1 << 40,
                        building: 0,
                    },
                );
            }
            let mut got = take_from(pol.as_mut(), 0, 6, 1 << 20);
            got.sort_unstable();
            assert_eq!(got, [1, 1, 2, 2, 3, 3], "{p}");
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(EpnId),
        Remove(EpnId),
        Assign(u64),
        Weight(EpnId, u32),
        Load(EpnId, u64, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..6).prop_map(Op::Add),
            (0u32..6).prop_map(Op::Remove),
            (0u64..4 << 20).prop_map(Op::Assign),
            (0u32..6, 0u32..5).prop_map(|(e, w)| Op::Weight(e, w)),
            (0u32..6, 0u64..16 << 20, 0u32..8).prop_map(|(e, f, b)| Op::Load(e, f, b)),
        ]
    }

    proptest! {
        /// Any sequence of calls: every policy tracks exactly the membership, chooses
        /// only members, answers NoEpn exactly when empty, refuses only when it may
        /// (least-loaded), and gives the same answers when replayed (determinism).
        #[test]
        fn any_call_sequence_keeps_the_contract(ops in proptest::collection::vec(op(), 0..200)) {
            for kind in PolicyKind::ALL {
                let run = || {
                    let mut pol = kind.build();
                    let mut members = std::collections::BTreeSet::new();
                    let mut out = Vec::new();
                    for (i, o) in ops.iter().enumerate() {
                        match *o {
                            Op::Add(e) => { pol.add_epn(e); members.insert(e); }
                            Op::Remove(e) => { pol.remove_epn(e); members.remove(&e); }
                            Op::Weight(e, w) => pol.set_weight(e, w),
                            Op::Load(e, f, b) => pol.report_load(e, EpnLoad { free_bytes: f, building: b }),
                            Op::Assign(bytes) => {
                                let d = pol.assign(TfRequest::new(i as u64, bytes));
                                match d {
                                    Decision::Assign(e) => assert!(members.contains(&e), "{kind}: {e} not a member"),
                                    Decision::Drop(DropReason::NoEpn) => assert!(members.is_empty(), "{kind}: NoEpn with members"),
                                    Decision::Wait | Decision::Drop(_) => {
                                        assert_eq!(*kind, PolicyKind::LeastLoaded, "{kind} refused: {d:?}");
                                        assert!(!members.is_empty());
                                    }
                                }
                                out.push(d);
                            }
                        }
                        let mut got = pol.epns().to_vec();
                        got.sort_unstable();
                        assert_eq!(got, members.iter().copied().collect::<Vec<_>>(), "{kind}");
                    }
                    (out, pol.resets())
                };
                let a = run();
                prop_assert_eq!(a, run(), "{} is not deterministic", kind);
            }
        }
    }
}
