//! Property tests of the context budget.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use strata_core::budget::{
    Admission, BudgetLevel, BudgetPolicy, ContextBudget, OperationId, OperationRequest,
};

fn policy() -> impl Strategy<Value = BudgetPolicy> {
    (1u8..98, 1u8..50, 1u8..50, 0u64..20_000, 0u64..5_000, 0u64..5_000).prop_map(
        |(warning, high_gap, critical_gap, reserved, overhead, margin)| {
            let high_risk = warning.saturating_add(high_gap).min(99);
            let critical = high_risk.saturating_add(critical_gap).min(100);
            BudgetPolicy {
                warning_percent: warning,
                high_risk_percent: high_risk,
                critical_percent: critical,
                reserved_completion_tokens: reserved,
                protocol_overhead_tokens: overhead,
                safety_margin_tokens: margin,
            }
        },
    )
}

fn valid_budget() -> impl Strategy<Value = (ContextBudget, u64)> {
    (policy(), 30_001u64..2_000_000, 0u64..2_200_000).prop_filter_map(
        "policy must be valid",
        |(policy, limit, current)| {
            ContextBudget::new(limit, current.min(limit * 11 / 10), policy).ok().map(|budget| (budget, limit))
        },
    )
}

proptest! {
    #[test]
    fn validation_accepts_exactly_ordered_thresholds(
        warning in 0u8..=110, high_risk in 0u8..=110, critical in 0u8..=110,
    ) {
        let policy = BudgetPolicy {
            warning_percent: warning,
            high_risk_percent: high_risk,
            critical_percent: critical,
            ..BudgetPolicy::default()
        };
        let ordered = 0 < warning && warning < high_risk && high_risk < critical && critical <= 100;
        prop_assert_eq!(policy.validate(128_000).is_ok(), ordered);
    }

    #[test]
    fn level_is_monotone_in_current_tokens((budget, limit) in valid_budget(), delta in 0u64..500_000) {
        let more = budget.with_current(budget.current().saturating_add(delta));
        prop_assert!(more.level() >= budget.level());
        prop_assert!(more.available() <= budget.available());
        prop_assert!(budget.with_current(0).level() == BudgetLevel::Normal);
        prop_assert!(budget.with_current(limit).level() == BudgetLevel::Critical);
    }

    #[test]
    fn levels_start_exactly_at_thresholds((budget, limit) in valid_budget()) {
        let policy = *budget.policy();
        for (percent, level) in [
            (policy.warning_percent, BudgetLevel::Warning),
            (policy.high_risk_percent, BudgetLevel::HighRisk),
            (policy.critical_percent, BudgetLevel::Critical),
        ] {
            let at = (u64::from(percent) * limit).div_ceil(100);
            prop_assert_eq!(budget.with_current(at).level(), level);
            prop_assert!(budget.with_current(at - 1).level() < level);
        }
    }

    #[test]
    fn admit_never_allows_more_than_available(
        (budget, _limit) in valid_budget(),
        estimated in 0u64..300_000,
        high_volume in any::<bool>(),
        sequence in any::<u64>(),
    ) {
        let request = OperationRequest {
            operation_id: OperationId::from_sequence(sequence),
            estimated_tokens: estimated,
            high_volume,
        };
        match budget.admit(&request) {
            Admission::Allowed => {
                prop_assert!(i128::from(estimated) <= i128::from(budget.available()));
                prop_assert!(i128::from(estimated) <= i128::from(budget.effective_available()));
                prop_assert!(!(high_volume && budget.level() == BudgetLevel::Critical));
            }
            Admission::Blocked(notice) => {
                prop_assert_eq!(&notice.pending_operation_id, &request.operation_id);
                prop_assert_eq!(notice.current_context_tokens, budget.current());
                prop_assert!(notice.estimated_result_tokens >= estimated);
                let json = serde_json::to_value(&notice).unwrap();
                let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
                prop_assert_eq!(keys.len(), 6);
                prop_assert_eq!(&json["status"], "context_budget_exceeded");
                prop_assert_eq!(&json["required_action"], "purge_or_compact");
            }
        }
    }
}
