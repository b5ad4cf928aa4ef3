//! Tier-3 context status: the JSON of `GET /strata/v1/status` and the telemetry line.

use serde::{Deserialize, Serialize};

/// Context pressure level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BudgetLevel {
    /// Below the warning threshold.
    Normal,
    /// Context pressure is increasing: avoid unnecessary growth, consider purge.
    Warning,
    /// Conservative estimates and an increased safety margin apply.
    HighRisk,
    /// High-volume operations are blocked until purge or compaction.
    Critical,
}

impl std::fmt::Display for BudgetLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
            Self::HighRisk => "HighRisk",
            Self::Critical => "Critical",
        })
    }
}

/// Snapshot of the context budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextStatus {
    /// Tokens currently in context.
    pub tokens: u64,
    /// Context limit.
    pub limit: u64,
    /// Seed-000 available operation tokens at the current level (negative = deficit).
    pub available: i64,
    /// Percent of the limit in use, rounded down (may exceed 100).
    pub percent: u64,
    /// Pressure level.
    pub level: BudgetLevel,
}

impl ContextStatus {
    /// `Status: Context: 112,000 / 128,000 (87%) | Level: Warning`.
    pub fn telemetry_line(&self) -> String {
        format!(
            "Status: Context: {} / {} ({}%) | Level: {}",
            with_thousands_separators(self.tokens),
            with_thousands_separators(self.limit),
            self.percent,
            self.level
        )
    }
}

/// `112000` → `112,000`.
pub fn with_thousands_separators(value: u64) -> String {
    let digits = value.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(with_thousands_separators(0), "0");
        assert_eq!(with_thousands_separators(999), "999");
        assert_eq!(with_thousands_separators(1_000), "1,000");
        assert_eq!(with_thousands_separators(128_000), "128,000");
        assert_eq!(with_thousands_separators(1_234_567), "1,234,567");
    }
}
