//! Tier-3 context status: the JSON of `GET /strata/v1/status` and the telemetry line.

use std::fmt::Write as _;

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
        let mut line = String::with_capacity(80);
        line.push_str("Status: Context: ");
        push_with_thousands_separators(&mut line, self.tokens);
        line.push_str(" / ");
        push_with_thousands_separators(&mut line, self.limit);
        // Writing into a `String` cannot fail.
        let _ = write!(line, " ({}%) | Level: {}", self.percent, self.level);
        line
    }
}

/// `112000` → `112,000`.
pub fn with_thousands_separators(value: u64) -> String {
    let mut grouped = String::with_capacity(26);
    push_with_thousands_separators(&mut grouped, value);
    grouped
}

/// Appends `value` to `out` with its thousands separated by commas.
fn push_with_thousands_separators(out: &mut String, value: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = value;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = &digits[start..];
    for (index, digit) in digits.iter().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(char::from(*digit));
    }
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
        assert_eq!(with_thousands_separators(u64::MAX), "18,446,744,073,709,551,615");
    }
}
