//! Effective-policy resolution: merge order, provenance, locks, bounds and ordering, plus properties.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use proptest::prelude::*;
use strata_api::cluster_policy::FieldBound;
use strata_api::effective::{ClampReason, EffectivePolicy, PolicyError, PolicyInputs, Resolution, resolve};
use strata_api::fields::{NumericField, PolicyField};
use strata_api::policy::{
    BudgetSpec, CompactionSpec, KeepLimitsSpec, PolicySpec, RedactionSpec, RetentionClass, RetentionMatch,
    RetentionRule, RetentionSpec, ToolResultsSpec, VolumeSpec,
};
use strata_api::{ClusterContextPolicy, ClusterContextPolicySpec, ContextPolicy, ContextPolicySpec};

fn cluster(name: &str, priority: u32, spec: ClusterContextPolicySpec) -> ClusterContextPolicy {
    let mut policy =
        ClusterContextPolicy::new(name, ClusterContextPolicySpec { priority: Some(priority), ..spec });
    policy.metadata = ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() };
    policy
}

fn tenant(spec: PolicySpec) -> ContextPolicy {
    ContextPolicy::new("default", ContextPolicySpec { policy: spec })
}

fn budget(warning: Option<u8>, high: Option<u8>, critical: Option<u8>) -> PolicySpec {
    PolicySpec {
        budget: Some(BudgetSpec {
            warning_percent: warning,
            high_risk_percent: high,
            critical_percent: critical,
            ..BudgetSpec::default()
        }),
        ..PolicySpec::default()
    }
}

fn resolve_with(
    labels: &BTreeMap<String, String>,
    clusters: &[ClusterContextPolicy],
    tenant: Option<&ContextPolicy>,
    overrides: Option<&PolicySpec>,
) -> Resolution {
    resolve(&PolicyInputs {
        namespace_labels: labels,
        cluster_policies: clusters,
        context_policy: tenant,
        agent_overrides: overrides.map(|o| ("builder", o)),
        context_window: Some(200_000),
    })
    .unwrap()
}

fn fleet_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("strata.dev/fleet".to_string(), "always-on".to_string())])
}

#[test]
fn defaults_are_the_seed_values() {
    let resolution = resolve_with(&BTreeMap::new(), &[], None, None);
    let policy = &resolution.policy;
    assert_eq!(
        (policy.budget.warning_percent, policy.budget.high_risk_percent, policy.budget.critical_percent),
        (80, 90, 95)
    );
    assert_eq!(policy.tool_results.max_result_chars, 2000);
    assert_eq!(policy.tool_results.preview_chars, 250);
    assert_eq!(policy.tool_results.preview_lines, 60);
    assert_eq!(policy.tool_results.elide_after_rounds, 4);
    assert_eq!(policy.tool_results.elide_over_chars, 2000);
    assert_eq!(policy.tool_results.elide_keep_chars, 800);
    assert_eq!(policy.compaction.trigger_percent, 85);
    assert!(resolution.clamps.is_empty());
    assert_eq!(resolution.provenance["budget.criticalPercent"].to_string(), "Default/builtin");
}

#[test]
fn layers_merge_in_order_with_provenance() {
    let fleet = cluster(
        "fleet",
        10,
        ClusterContextPolicySpec { policy: budget(Some(70), None, None), ..Default::default() },
    );
    let ns = tenant(PolicySpec {
        tool_results: Some(ToolResultsSpec { max_result_chars: Some(12_000), ..Default::default() }),
        ..budget(Some(75), None, None)
    });
    let overrides = budget(None, Some(88), None);
    let r = resolve_with(&BTreeMap::new(), &[fleet], Some(&ns), Some(&overrides));
    assert_eq!(r.policy.budget.warning_percent, 75);
    assert_eq!(r.policy.budget.high_risk_percent, 88);
    assert_eq!(r.policy.tool_results.max_result_chars, 12_000);
    assert_eq!(r.provenance["budget.warningPercent"].to_string(), "ContextPolicy/default");
    assert_eq!(r.provenance["budget.highRiskPercent"].to_string(), "Agent/builder");
    assert_eq!(r.provenance["budget.criticalPercent"].to_string(), "Default/builtin");
    let sources: Vec<String> = r.sources.iter().map(ToString::to_string).collect();
    assert_eq!(
        sources,
        ["Default/builtin", "ClusterContextPolicy/fleet", "ContextPolicy/default", "Agent/builder"]
    );
}

#[test]
fn higher_priority_cluster_policy_wins_and_selectors_filter() {
    let low = cluster(
        "a-low",
        1,
        ClusterContextPolicySpec { policy: budget(Some(60), None, None), ..Default::default() },
    );
    let high = cluster(
        "z-high",
        50,
        ClusterContextPolicySpec { policy: budget(Some(65), None, None), ..Default::default() },
    );
    let elsewhere = cluster(
        "other-fleet",
        99,
        ClusterContextPolicySpec {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("team".into(), "payments".into())])),
                match_expressions: None,
            }),
            policy: budget(Some(50), None, None),
            ..Default::default()
        },
    );
    let r = resolve_with(&fleet_labels(), &[high.clone(), elsewhere, low.clone()], None, None);
    assert_eq!(r.policy.budget.warning_percent, 65);
    assert_eq!(r.provenance["budget.warningPercent"].to_string(), "ClusterContextPolicy/z-high");
}

#[test]
fn locks_fix_platform_values_and_record_clamps() {
    let fleet = cluster(
        "fleet",
        10,
        ClusterContextPolicySpec {
            policy: PolicySpec {
                redaction: Some(RedactionSpec { enabled: Some(true), extra_patterns: None }),
                ..PolicySpec::default()
            },
            locks: Some(vec![PolicyField::RedactionEnabled]),
            ..Default::default()
        },
    );
    let ns = tenant(PolicySpec {
        redaction: Some(RedactionSpec { enabled: Some(false), extra_patterns: None }),
        ..PolicySpec::default()
    });
    let r = resolve_with(&BTreeMap::new(), &[fleet], Some(&ns), None);
    assert!(r.policy.redaction.enabled);
    assert_eq!(r.clamps.len(), 1);
    let clamp = &r.clamps[0];
    assert_eq!(clamp.field, "redaction.enabled");
    assert_eq!((clamp.requested.as_str(), clamp.applied.as_str()), ("false", "true"));
    assert_eq!(clamp.reason, ClampReason::Locked);
    assert_eq!(clamp.by, "ClusterContextPolicy/fleet");
    assert_eq!(r.provenance["redaction.enabled"].to_string(), "ClusterContextPolicy/fleet");
}

#[test]
fn bounds_let_tenants_tighten_but_not_loosen() {
    let fleet = cluster(
        "fleet",
        10,
        ClusterContextPolicySpec {
            bounds: Some(vec![FieldBound {
                field: NumericField::MaxResultChars,
                min: None,
                max: Some(16_000.0),
            }]),
            ..Default::default()
        },
    );
    let loosen = tenant(PolicySpec {
        tool_results: Some(ToolResultsSpec { max_result_chars: Some(50_000), ..Default::default() }),
        ..PolicySpec::default()
    });
    let r = resolve_with(&BTreeMap::new(), std::slice::from_ref(&fleet), Some(&loosen), None);
    assert_eq!(r.policy.tool_results.max_result_chars, 16_000);
    assert_eq!(r.clamps[0].reason, ClampReason::Bound);
    assert_eq!(r.clamps[0].requested, "50000");

    let tighten = tenant(PolicySpec {
        tool_results: Some(ToolResultsSpec { max_result_chars: Some(6_000), ..Default::default() }),
        ..PolicySpec::default()
    });
    let r = resolve_with(&BTreeMap::new(), &[fleet], Some(&tighten), None);
    assert_eq!(r.policy.tool_results.max_result_chars, 6_000);
    assert!(r.clamps.is_empty());
}

#[test]
fn merged_thresholds_are_repaired_by_lowering() {
    // The platform lowers critical to 90; the tenant's highRisk 92 was valid on its own.
    let fleet = cluster(
        "fleet",
        10,
        ClusterContextPolicySpec { policy: budget(None, None, Some(90)), ..Default::default() },
    );
    let ns = tenant(budget(None, Some(92), None));
    let r = resolve_with(&BTreeMap::new(), &[fleet], Some(&ns), None);
    let b = &r.policy.budget;
    assert_eq!((b.warning_percent, b.high_risk_percent, b.critical_percent), (80, 89, 90));
    assert_eq!(r.clamps[0].reason, ClampReason::Ordering);
    assert_eq!(r.clamps[0].field, "budget.highRiskPercent");
}

#[test]
fn retention_rules_merge_by_name() {
    let rule = |name: &str, class: RetentionClass, ttl: Option<u32>| RetentionRule {
        name: name.into(),
        class,
        matcher: RetentionMatch { content_regex: Some("^x".into()), ..Default::default() },
        ttl_seconds: ttl,
    };
    let fleet = cluster(
        "fleet",
        1,
        ClusterContextPolicySpec {
            policy: PolicySpec {
                retention: Some(RetentionSpec {
                    rules: Some(vec![rule("status-checks", RetentionClass::Ephemeral, Some(600))]),
                }),
                ..PolicySpec::default()
            },
            ..Default::default()
        },
    );
    let ns = tenant(PolicySpec {
        retention: Some(RetentionSpec {
            rules: Some(vec![
                rule("heartbeats", RetentionClass::Ephemeral, Some(60)),
                rule("decisions", RetentionClass::Critical, None),
            ]),
        }),
        ..PolicySpec::default()
    });
    let r = resolve_with(&BTreeMap::new(), &[fleet], Some(&ns), None);
    let names: Vec<&str> = r.policy.retention.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["heartbeats", "status-checks", "decisions"]);
    assert_eq!(r.policy.retention.rules[0].ttl_seconds, Some(60));
    assert_eq!(r.provenance["retention.rules[heartbeats]"].to_string(), "ContextPolicy/default");
    assert_eq!(r.provenance["retention.rules[status-checks]"].to_string(), "ClusterContextPolicy/fleet");
}

#[test]
fn reservations_that_fill_the_window_are_refused() {
    let overrides = PolicySpec {
        budget: Some(BudgetSpec { reserved_completion_tokens: Some(15_000), ..Default::default() }),
        ..PolicySpec::default()
    };
    let err = resolve(&PolicyInputs {
        namespace_labels: &BTreeMap::new(),
        cluster_policies: &[],
        context_policy: None,
        agent_overrides: Some(("tiny", &overrides)),
        context_window: Some(16_384),
    })
    .unwrap_err();
    assert_eq!(err, PolicyError::ReservationsExceedWindow { reserved: 15_000 + 512 + 2048, window: 16_384 });
    assert!(err.to_string().contains("lower them"));
}

#[test]
fn invalid_selectors_are_skipped_with_a_warning() {
    let broken = cluster(
        "broken",
        5,
        ClusterContextPolicySpec {
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "env".into(),
                        operator: "Like".into(),
                        values: None,
                    },
                ]),
                match_labels: None,
            }),
            policy: budget(Some(50), None, None),
            ..Default::default()
        },
    );
    let r = resolve_with(&BTreeMap::new(), &[broken], None, None);
    assert_eq!(r.policy.budget.warning_percent, 80);
    assert!(r.warnings[0].contains("ClusterContextPolicy/broken is skipped"));
}

#[test]
fn hash_changes_with_the_policy() {
    let a = resolve_with(&BTreeMap::new(), &[], None, None);
    let b = resolve_with(&BTreeMap::new(), &[], Some(&tenant(budget(Some(70), None, None))), None);
    assert_ne!(a.hash, b.hash);
    assert_eq!(a.hash, resolve_with(&BTreeMap::new(), &[], None, None).hash);
    assert_eq!(a.policy, EffectivePolicy::default());
}

// ---- properties ----

fn arb_percent(min: u8, max: u8) -> impl Strategy<Value = Option<u8>> {
    prop::option::of(min..=max)
}

fn arb_layer() -> impl Strategy<Value = PolicySpec> {
    (
        arb_percent(1, 98),
        arb_percent(2, 99),
        arb_percent(3, 100),
        prop::option::of(256u32..40_000),
        prop::option::of(0u32..40_000),
        prop::option::of(1u8..=100),
    )
        .prop_map(|(w, h, c, max_chars, preview, trigger)| PolicySpec {
            tool_results: Some(ToolResultsSpec {
                max_result_chars: max_chars,
                preview_chars: preview,
                ..Default::default()
            }),
            compaction: Some(CompactionSpec { trigger_percent: trigger, ..Default::default() }),
            ..budget(w, h, c)
        })
}

fn arb_bounds() -> impl Strategy<Value = Vec<FieldBound>> {
    let field = prop::sample::select(vec![
        NumericField::WarningPercent,
        NumericField::HighRiskPercent,
        NumericField::CriticalPercent,
        NumericField::MaxResultChars,
        NumericField::CompactionTriggerPercent,
    ]);
    prop::collection::vec(
        (field, prop::option::of(0u32..60), prop::option::of(60u32..40_000)).prop_map(|(field, min, max)| {
            FieldBound { field, min: min.map(f64::from), max: max.map(f64::from).or(Some(100_000.0)) }
        }),
        0..4,
    )
}

fn arb_clusters() -> impl Strategy<Value = Vec<ClusterContextPolicy>> {
    prop::collection::vec((0u32..5, arb_layer(), arb_bounds(), any::<bool>()), 0..4).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (priority, policy, bounds, lock))| {
                cluster(
                    &format!("c{i}"),
                    priority,
                    ClusterContextPolicySpec {
                        policy,
                        bounds: Some(bounds),
                        locks: lock.then(|| vec![PolicyField::CompactionTriggerPercent]),
                        ..Default::default()
                    },
                )
            })
            .collect()
    })
}

fn in_bounds(r: &Resolution, clusters: &[ClusterContextPolicy], field: NumericField, value: f64) -> bool {
    clusters
        .iter()
        .flat_map(|c| c.spec.bounds.iter().flatten())
        .filter(|b| b.field == field)
        .all(|b| b.min.is_none_or(|m| value >= m) && b.max.is_none_or(|m| value <= m))
        || !r.warnings.is_empty()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn thresholds_stay_ordered(clusters in arb_clusters(), ns in arb_layer(), overrides in arb_layer()) {
        let r = resolve_with(&BTreeMap::new(), &clusters, Some(&tenant(ns)), Some(&overrides));
        let b = &r.policy.budget;
        prop_assert!(b.warning_percent < b.high_risk_percent, "{b:?}");
        prop_assert!(b.high_risk_percent < b.critical_percent, "{b:?}");
        prop_assert!(b.critical_percent <= 100);
        prop_assert!(r.policy.tool_results.preview_chars <= r.policy.tool_results.max_result_chars);
    }

    #[test]
    fn bounds_hold(clusters in arb_clusters(), ns in arb_layer(), overrides in arb_layer()) {
        let r = resolve_with(&BTreeMap::new(), &clusters, Some(&tenant(ns)), Some(&overrides));
        let p = &r.policy;
        prop_assert!(in_bounds(&r, &clusters, NumericField::CriticalPercent, f64::from(p.budget.critical_percent)));
        prop_assert!(in_bounds(&r, &clusters, NumericField::HighRiskPercent, f64::from(p.budget.high_risk_percent)));
        prop_assert!(in_bounds(&r, &clusters, NumericField::WarningPercent, f64::from(p.budget.warning_percent)));
        prop_assert!(in_bounds(&r, &clusters, NumericField::MaxResultChars, f64::from(p.tool_results.max_result_chars)));
        prop_assert!(in_bounds(&r, &clusters, NumericField::CompactionTriggerPercent, f64::from(p.compaction.trigger_percent)));
    }

    #[test]
    fn locked_fields_ignore_tenants(clusters in arb_clusters(), ns in arb_layer(), overrides in arb_layer()) {
        let with = resolve_with(&BTreeMap::new(), &clusters, Some(&tenant(ns)), Some(&overrides));
        let without = resolve_with(&BTreeMap::new(), &clusters, None, None);
        let locked = clusters.iter().any(|c| c.spec.locks.iter().flatten().any(|f| *f == PolicyField::CompactionTriggerPercent));
        if locked {
            prop_assert_eq!(with.policy.compaction.trigger_percent, without.policy.compaction.trigger_percent);
        }
    }

    #[test]
    fn result_does_not_depend_on_input_order(clusters in arb_clusters(), ns in arb_layer(), seed in any::<u64>()) {
        let ns = tenant(ns);
        let forward = resolve_with(&BTreeMap::new(), &clusters, Some(&ns), None);
        let mut shuffled = clusters.clone();
        // A deterministic permutation from the seed.
        let len = shuffled.len();
        if len > 1 {
            for i in 0..len {
                let j = (seed.rotate_left(i as u32) as usize) % len;
                shuffled.swap(i, j);
            }
        }
        shuffled.reverse();
        let permuted = resolve_with(&BTreeMap::new(), &shuffled, Some(&ns), None);
        prop_assert_eq!(forward, permuted);
    }
}

fn volume(artifacts: Option<KeepLimitsSpec>, sweep: Option<u32>) -> PolicySpec {
    PolicySpec {
        volume: Some(VolumeSpec { artifacts, sweep_interval_seconds: sweep, ..VolumeSpec::default() }),
        ..PolicySpec::default()
    }
}

#[test]
fn volume_retention_merges_field_by_field_with_defaults_for_a_1gi_volume() {
    let defaults = EffectivePolicy::default().volume;
    let total =
        defaults.artifacts.max_bytes + defaults.generations.max_bytes + defaults.compaction_records.max_bytes;
    assert!(total < 1024 * 1024 * 1024, "the defaults leave room for the live journal on a 1Gi volume");
    let ns = tenant(volume(Some(KeepLimitsSpec { max_age_seconds: Some(86_400), max_bytes: None }), None));
    let agent = volume(Some(KeepLimitsSpec { max_age_seconds: None, max_bytes: Some(64 << 20) }), Some(60));
    let r = resolve_with(&BTreeMap::new(), &[], Some(&ns), Some(&agent));
    let volume = r.policy.volume;
    assert_eq!(volume.artifacts.max_age_seconds, 86_400, "the namespace's age");
    assert_eq!(volume.artifacts.max_bytes, 64 << 20, "the agent's bytes");
    assert_eq!(volume.sweep_interval_seconds, 60);
    assert_eq!(volume.generations, defaults.generations, "untouched kinds keep the defaults");
    assert_eq!(r.provenance["volume.artifacts.maxAgeSeconds"].to_string(), "ContextPolicy/default");
    assert_eq!(r.provenance["volume.artifacts.maxBytes"].to_string(), "Agent/builder");
    assert_eq!(r.provenance["volume.generations.maxBytes"].to_string(), "Default/builtin");
}

#[test]
fn volume_retention_obeys_platform_locks_and_bounds() {
    let platform = cluster(
        "fleet",
        10,
        ClusterContextPolicySpec {
            policy: volume(Some(KeepLimitsSpec { max_age_seconds: Some(3_600), max_bytes: None }), None),
            locks: Some(vec![PolicyField::VolumeArtifactsMaxAgeSeconds]),
            bounds: Some(vec![FieldBound {
                field: NumericField::VolumeArtifactsMaxBytes,
                min: None,
                max: Some((256u64 << 20) as f64),
            }]),
            ..Default::default()
        },
    );
    let agent =
        volume(Some(KeepLimitsSpec { max_age_seconds: Some(30 * 86_400), max_bytes: Some(2 << 30) }), None);
    let r = resolve_with(&BTreeMap::new(), &[platform], None, Some(&agent));
    assert_eq!(r.policy.volume.artifacts.max_age_seconds, 3_600, "locked by the platform");
    assert_eq!(r.policy.volume.artifacts.max_bytes, 256 << 20, "clamped to the platform's maximum");
    let reasons: Vec<(&str, ClampReason)> = r.clamps.iter().map(|c| (c.field.as_str(), c.reason)).collect();
    assert_eq!(
        reasons,
        [
            ("volume.artifacts.maxAgeSeconds", ClampReason::Locked),
            ("volume.artifacts.maxBytes", ClampReason::Bound)
        ]
    );
}

#[test]
fn gateway_json_without_volume_fields_reads_the_defaults() {
    let mut json = serde_json::to_value(EffectivePolicy::default()).unwrap();
    json.as_object_mut().unwrap().remove("volume");
    let policy: EffectivePolicy = serde_json::from_value(json).unwrap();
    assert_eq!(policy.volume, EffectivePolicy::default().volume);
}
