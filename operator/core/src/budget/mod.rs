//! Context budget (seed 000): available operation tokens, pressure levels and admission.
//!
//! `available = limit − current − reserved_completion − protocol_overhead − safety_margin`,
//! computed in signed arithmetic: a negative value is a deficit (the context already overruns its
//! reservations). The blocked-operation notice reports `max(available, 0)`.
//!
//! Levels use the percent of the limit in use (`current × 100 / limit`, compared exactly, so
//! 79.99 % is still Normal at an 80 % threshold; the displayed percent is rounded down):
//! * **Normal** below `warningPercent`;
//! * **Warning** from `warningPercent`;
//! * **HighRisk** from `highRiskPercent`: estimates are multiplied by
//!   [`HIGH_RISK_ESTIMATE_NUMERATOR`]/[`HIGH_RISK_ESTIMATE_DENOMINATOR`] (×1.5, rounded up) and the
//!   safety margin by [`HIGH_RISK_SAFETY_MARGIN_FACTOR`] (×2);
//! * **Critical** from `criticalPercent`: as HighRisk, and high-volume operations are blocked.
//!
//! At every level an operation whose (effective) estimate exceeds the (effective) available
//! budget is blocked.

mod admission;
mod policy;
pub mod stages;
mod status;

pub use admission::{
    Admission, BlockReason, BudgetExceeded, ExceededStatus, OperationId, OperationRequest, RequiredAction,
};
pub use policy::{BudgetError, BudgetPolicy};
pub use stages::{MaxTokensClamp, Stage, StageBudgets, StageUsage, clamp_max_tokens};
pub use status::{BudgetLevel, ContextStatus, with_thousands_separators};

/// Numerator of the conservative estimate multiplier at HighRisk and Critical.
pub const HIGH_RISK_ESTIMATE_NUMERATOR: u64 = 3;
/// Denominator of the conservative estimate multiplier at HighRisk and Critical.
pub const HIGH_RISK_ESTIMATE_DENOMINATOR: u64 = 2;
/// Safety-margin multiplier at HighRisk and Critical.
pub const HIGH_RISK_SAFETY_MARGIN_FACTOR: u64 = 2;

/// The budget of one agent's context at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextBudget {
    limit: u64,
    current: u64,
    policy: BudgetPolicy,
}

impl ContextBudget {
    /// A budget for a context of `limit` tokens holding `current` tokens.
    pub fn new(limit: u64, current: u64, policy: BudgetPolicy) -> Result<Self, BudgetError> {
        policy.validate(limit)?;
        Ok(Self { limit, current, policy })
    }

    /// The same budget with a new token count (rebuilt every cycle).
    pub fn with_current(self, current: u64) -> Self {
        Self { current, ..self }
    }

    /// Context limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Tokens in context.
    pub fn current(&self) -> u64 {
        self.current
    }

    /// The policy in force.
    pub fn policy(&self) -> &BudgetPolicy {
        &self.policy
    }

    /// Percent of the limit in use, rounded down.
    pub fn percent_used(&self) -> u64 {
        let percent = u128::from(self.current) * 100 / u128::from(self.limit);
        u64::try_from(percent).unwrap_or(u64::MAX)
    }

    /// Pressure level at the policy's thresholds.
    pub fn level(&self) -> BudgetLevel {
        let reaches =
            |threshold: u8| u128::from(self.current) * 100 >= u128::from(threshold) * u128::from(self.limit);
        if reaches(self.policy.critical_percent) {
            BudgetLevel::Critical
        } else if reaches(self.policy.high_risk_percent) {
            BudgetLevel::HighRisk
        } else if reaches(self.policy.warning_percent) {
            BudgetLevel::Warning
        } else {
            BudgetLevel::Normal
        }
    }

    /// Seed-000 available operation tokens with the policy's safety margin.
    pub fn available(&self) -> i64 {
        self.available_with_margin_factor(1)
    }

    /// Available tokens at the current level (safety margin increased at HighRisk and above).
    pub fn effective_available(&self) -> i64 {
        self.available_with_margin_factor(self.margin_factor())
    }

    /// Snapshot for Tier 3 and the status endpoint.
    pub fn status(&self) -> ContextStatus {
        ContextStatus {
            tokens: self.current,
            limit: self.limit,
            available: self.effective_available(),
            percent: self.percent_used(),
            level: self.level(),
        }
    }

    /// Decides whether `operation` may add its result to the context.
    pub fn admit(&self, operation: &OperationRequest) -> Admission {
        let level = self.level();
        let estimate = self.effective_estimate(operation.estimated_tokens, level);
        let available = self.effective_available();
        let fits = i128::from(estimate) <= i128::from(available);
        let reason = if level == BudgetLevel::Critical && operation.high_volume {
            Some(BlockReason::CriticalHighVolume)
        } else if !fits {
            Some(BlockReason::InsufficientBudget)
        } else {
            None
        };
        match reason {
            None => Admission::Allowed,
            Some(reason) => Admission::Blocked(BudgetExceeded {
                status: ExceededStatus::ContextBudgetExceeded,
                pending_operation_id: operation.operation_id.clone(),
                current_context_tokens: self.current,
                estimated_result_tokens: estimate,
                available_operation_tokens: u64::try_from(available).unwrap_or(0),
                required_action: RequiredAction::PurgeOrCompact,
                reason,
            }),
        }
    }

    /// The estimate used for admission: ×1.5 (rounded up) at HighRisk and Critical.
    pub fn effective_estimate(&self, estimated_tokens: u64, level: BudgetLevel) -> u64 {
        if level >= BudgetLevel::HighRisk {
            estimated_tokens
                .saturating_mul(HIGH_RISK_ESTIMATE_NUMERATOR)
                .div_ceil(HIGH_RISK_ESTIMATE_DENOMINATOR)
        } else {
            estimated_tokens
        }
    }

    fn margin_factor(&self) -> u64 {
        if self.level() >= BudgetLevel::HighRisk { HIGH_RISK_SAFETY_MARGIN_FACTOR } else { 1 }
    }

    fn available_with_margin_factor(&self, margin_factor: u64) -> i64 {
        let available = i128::from(self.limit)
            - i128::from(self.current)
            - i128::from(self.policy.reservations(margin_factor));
        i64::try_from(available).unwrap_or(if available < 0 { i64::MIN } else { i64::MAX })
    }
}

#[cfg(test)]
mod tests;
