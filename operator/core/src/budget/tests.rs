//! Unit tests of the context budget.
#![allow(clippy::unwrap_used)]

use super::*;

/// Small reservations (4,096 / 512 / 1,024) so the arithmetic in these tests stays readable.
fn budget(current: u64) -> ContextBudget {
    let policy = BudgetPolicy {
        reserved_completion_tokens: 4_096,
        protocol_overhead_tokens: 512,
        safety_margin_tokens: 1_024,
        ..BudgetPolicy::default()
    };
    ContextBudget::new(128_000, current, policy).unwrap()
}

fn request(estimated_tokens: u64, high_volume: bool) -> OperationRequest {
    OperationRequest { operation_id: OperationId::from_sequence(1842), estimated_tokens, high_volume }
}

#[test]
fn available_follows_seed_formula() {
    // 128,000 − 100,000 − 4,096 − 512 − 1,024
    assert_eq!(budget(100_000).available(), 22_368);
    assert_eq!(budget(127_000).available(), -4_632);
}

#[test]
fn levels_follow_default_thresholds() {
    assert_eq!(budget(102_399).level(), BudgetLevel::Normal);
    assert_eq!(budget(102_400).level(), BudgetLevel::Warning);
    assert_eq!(budget(115_200).level(), BudgetLevel::HighRisk);
    assert_eq!(budget(121_600).level(), BudgetLevel::Critical);
    assert_eq!(budget(200_000).level(), BudgetLevel::Critical);
}

#[test]
fn blocked_notice_matches_seed_json_exactly() {
    let policy = BudgetPolicy {
        reserved_completion_tokens: 10_000,
        protocol_overhead_tokens: 2_000,
        safety_margin_tokens: 2_000,
        ..BudgetPolicy::default()
    };
    // 128,000 − 108,000 − 14,000 = 6,000 available at Normal level (84% → Warning, margin ×1).
    let budget = ContextBudget::new(128_000, 108_000, policy).unwrap();
    assert_eq!(budget.level(), BudgetLevel::Warning);
    let Admission::Blocked(notice) = budget.admit(&request(10_000, false)) else {
        panic!("must be blocked");
    };
    assert_eq!(notice.reason, BlockReason::InsufficientBudget);
    assert_eq!(
        serde_json::to_string(&notice).unwrap(),
        r#"{"status":"context_budget_exceeded","pending_operation_id":"op_1842","current_context_tokens":108000,"estimated_result_tokens":10000,"available_operation_tokens":6000,"required_action":"purge_or_compact"}"#
    );
    let restored: BudgetExceeded = serde_json::from_str(&serde_json::to_string(&notice).unwrap()).unwrap();
    assert_eq!(restored.pending_operation_id, notice.pending_operation_id);
}

#[test]
fn fitting_operation_is_allowed_and_oversized_is_blocked() {
    let budget = budget(50_000);
    let available = u64::try_from(budget.available()).unwrap();
    assert!(budget.admit(&request(available, true)).is_allowed());
    assert!(!budget.admit(&request(available + 1, false)).is_allowed());
}

#[test]
fn high_risk_is_conservative() {
    let budget = budget(116_000);
    assert_eq!(budget.level(), BudgetLevel::HighRisk);
    // 128,000 − 116,000 − 4,096 − 512 − 2 × 1,024 = 5,344
    assert_eq!(budget.effective_available(), 5_344);
    assert_eq!(budget.effective_estimate(3_563, BudgetLevel::HighRisk), 5_345);
    assert!(budget.admit(&request(3_562, false)).is_allowed());
    let Admission::Blocked(notice) = budget.admit(&request(3_563, false)) else {
        panic!("conservative estimate must not fit");
    };
    assert_eq!(notice.estimated_result_tokens, 5_345);
    assert_eq!(notice.available_operation_tokens, 5_344);
}

#[test]
fn critical_blocks_high_volume_operations_only() {
    let policy = BudgetPolicy {
        reserved_completion_tokens: 100,
        protocol_overhead_tokens: 10,
        safety_margin_tokens: 10,
        ..BudgetPolicy::default()
    };
    let budget = ContextBudget::new(128_000, 122_000, policy).unwrap();
    assert_eq!(budget.level(), BudgetLevel::Critical);
    assert!(budget.admit(&request(100, false)).is_allowed());
    let Admission::Blocked(notice) = budget.admit(&request(100, true)) else {
        panic!("high-volume must be blocked at Critical");
    };
    assert_eq!(notice.reason, BlockReason::CriticalHighVolume);
}

#[test]
fn deficit_reports_zero_available() {
    let Admission::Blocked(notice) = budget(127_000).admit(&request(1, false)) else {
        panic!("deficit must block");
    };
    assert_eq!(notice.available_operation_tokens, 0);
}

#[test]
fn telemetry_line_and_status_json() {
    let status = budget(112_000).status();
    assert_eq!(status.telemetry_line(), "Status: Context: 112,000 / 128,000 (87%) | Level: Warning");
    let json = serde_json::to_value(status).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"tokens":112000,"limit":128000,"available":10368,"percent":87,"level":"Warning"})
    );
    assert_eq!(
        budget(127_999).status().telemetry_line(),
        "Status: Context: 127,999 / 128,000 (99%) | Level: Critical"
    );
}

#[test]
fn invalid_policy_is_rejected() {
    let policy = BudgetPolicy { warning_percent: 95, ..BudgetPolicy::default() };
    assert!(matches!(ContextBudget::new(128_000, 0, policy), Err(BudgetError::ThresholdsOutOfOrder { .. })));
}
