//! Budget policy: pressure thresholds and the token reservations of the seed-000 formula.

use serde::{Deserialize, Serialize};

/// Invalid budget configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// The context limit is zero.
    #[error("context limit is 0; set it to the model's context window in tokens")]
    ZeroLimit,
    /// Thresholds are not strictly increasing within 1..=100.
    #[error(
        "thresholds must satisfy 0 < warningPercent < highRiskPercent < criticalPercent <= 100; \
         got warningPercent={warning}, highRiskPercent={high_risk}, criticalPercent={critical}"
    )]
    ThresholdsOutOfOrder {
        /// Configured warning threshold.
        warning: u8,
        /// Configured high-risk threshold.
        high_risk: u8,
        /// Configured critical threshold.
        critical: u8,
    },
    /// Reservations leave no room for context.
    #[error(
        "reservedCompletionTokens ({reserved}) + protocolOverheadTokens ({overhead}) + \
         safetyMarginTokens ({margin}) = {total} must be below the context limit {limit}; \
         lower the reservations or raise the limit"
    )]
    ReservationsExceedLimit {
        /// Reserved completion tokens.
        reserved: u64,
        /// Protocol overhead tokens.
        overhead: u64,
        /// Safety margin tokens.
        margin: u64,
        /// Their sum (saturating).
        total: u64,
        /// Context limit.
        limit: u64,
    },
    /// An operation id does not have the `op_<id>` shape.
    #[error(
        "operation id {id:?} is invalid: expected `op_` followed by 1 to 64 ASCII letters, digits, `_` or `-`"
    )]
    InvalidOperationId {
        /// The rejected id.
        id: String,
    },
}

/// Thresholds (percent of the limit in use) and reservations. Missing fields take defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BudgetPolicy {
    /// Level Warning from this percentage (default 80).
    pub warning_percent: u8,
    /// Level HighRisk from this percentage (default 90).
    pub high_risk_percent: u8,
    /// Level Critical from this percentage (default 95).
    pub critical_percent: u8,
    /// Tokens kept free for the model's answer (default 8,192; the same default as strata-api's effective policy).
    pub reserved_completion_tokens: u64,
    /// Tokens of provider framing not visible in the text (default 512).
    pub protocol_overhead_tokens: u64,
    /// Margin for estimation error (default 2,048); doubled at HighRisk and above.
    pub safety_margin_tokens: u64,
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        Self {
            warning_percent: 80,
            high_risk_percent: 90,
            critical_percent: 95,
            reserved_completion_tokens: 8_192,
            protocol_overhead_tokens: 512,
            safety_margin_tokens: 2_048,
        }
    }
}

impl BudgetPolicy {
    /// Checks threshold ordering and that reservations fit in `limit`.
    pub fn validate(&self, limit: u64) -> Result<(), BudgetError> {
        if limit == 0 {
            return Err(BudgetError::ZeroLimit);
        }
        let (warning, high_risk, critical) =
            (self.warning_percent, self.high_risk_percent, self.critical_percent);
        if !(0 < warning && warning < high_risk && high_risk < critical && critical <= 100) {
            return Err(BudgetError::ThresholdsOutOfOrder { warning, high_risk, critical });
        }
        let total = self.reservations(1);
        if total >= limit {
            return Err(BudgetError::ReservationsExceedLimit {
                reserved: self.reserved_completion_tokens,
                overhead: self.protocol_overhead_tokens,
                margin: self.safety_margin_tokens,
                total,
                limit,
            });
        }
        Ok(())
    }

    /// Reserved completion + protocol overhead + `margin_factor` × safety margin (saturating).
    pub fn reservations(&self, margin_factor: u64) -> u64 {
        self.reserved_completion_tokens
            .saturating_add(self.protocol_overhead_tokens)
            .saturating_add(self.safety_margin_tokens.saturating_mul(margin_factor))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_validate_and_deserialize_from_camel_case() {
        assert!(BudgetPolicy::default().validate(128_000).is_ok());
        let policy: BudgetPolicy =
            serde_json::from_str(r#"{"warningPercent":70,"safetyMarginTokens":10}"#).unwrap();
        assert_eq!(policy.warning_percent, 70);
        assert_eq!(policy.safety_margin_tokens, 10);
        assert_eq!(policy.critical_percent, 95);
        let json = serde_json::to_value(BudgetPolicy::default()).unwrap();
        assert_eq!(json["highRiskPercent"], 90);
        assert_eq!(json["reservedCompletionTokens"], 8192);
        assert_eq!(json["safetyMarginTokens"], 2048);
        assert_eq!(json["protocolOverheadTokens"], 512);
    }

    #[test]
    fn rejects_unordered_thresholds() {
        for (warning, high_risk, critical) in [(90, 80, 95), (0, 90, 95), (80, 90, 101), (80, 95, 95)] {
            let policy = BudgetPolicy {
                warning_percent: warning,
                high_risk_percent: high_risk,
                critical_percent: critical,
                ..BudgetPolicy::default()
            };
            let error = policy.validate(128_000).unwrap_err();
            assert!(error.to_string().contains("warningPercent < highRiskPercent"));
        }
    }

    #[test]
    fn rejects_reservations_that_fill_the_limit() {
        let error = BudgetPolicy::default().validate(10_752).unwrap_err();
        assert_eq!(
            error,
            BudgetError::ReservationsExceedLimit {
                reserved: 8_192,
                overhead: 512,
                margin: 2_048,
                total: 10_752,
                limit: 10_752
            }
        );
        assert!(BudgetPolicy::default().validate(10_753).is_ok());
        assert_eq!(BudgetPolicy::default().validate(0), Err(BudgetError::ZeroLimit));
    }
}
