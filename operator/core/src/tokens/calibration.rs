//! Per-agent calibration of approximate token counts against provider-reported usage.

use serde::{Deserialize, Serialize};

/// Lowest ratio a calibration may learn: a provider never counts less than half the base estimate.
pub const MIN_CALIBRATION_RATIO: f64 = 0.5;
/// Highest ratio a calibration may learn: a provider never counts more than twice the base estimate.
pub const MAX_CALIBRATION_RATIO: f64 = 2.0;
/// Ratio before any observation. Anthropic tokenizers produce more tokens than o200k_base for
/// English and code, so the prior over-estimates slightly: erring high keeps budgets safe.
pub const DEFAULT_APPROXIMATE_RATIO: f64 = 1.2;
/// Weight of the newest observation in the exponentially weighted moving average.
pub const EWMA_WEIGHT: f64 = 0.2;

/// Learned `actual / estimated` ratio: the first observation replaces the prior, later ones are
/// blended with an exponentially weighted moving average ([`EWMA_WEIGHT`]). The ratio always stays
/// within [`MIN_CALIBRATION_RATIO`]..=[`MAX_CALIBRATION_RATIO`], also after deserialization.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "CalibrationRecord")]
pub struct Calibration {
    ratio: f64,
    samples: u64,
}

/// Untrusted persisted form, sanitised into a [`Calibration`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CalibrationRecord {
    ratio: f64,
    #[serde(default)]
    samples: u64,
}

impl From<CalibrationRecord> for Calibration {
    fn from(record: CalibrationRecord) -> Self {
        let ratio =
            if record.ratio.is_finite() { clamp_ratio(record.ratio) } else { DEFAULT_APPROXIMATE_RATIO };
        Self { ratio, samples: record.samples }
    }
}

impl Default for Calibration {
    fn default() -> Self {
        Self { ratio: DEFAULT_APPROXIMATE_RATIO, samples: 0 }
    }
}

impl Calibration {
    /// The current `actual / estimated` ratio.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// How many observations have been learned.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Learns from one provider response. Observations with a zero on either side carry no
    /// information and are ignored.
    pub fn observe(&mut self, estimated: u32, actual: u32) {
        if estimated == 0 || actual == 0 {
            return;
        }
        let observed = clamp_ratio(f64::from(actual) / f64::from(estimated));
        self.ratio = if self.samples == 0 {
            observed
        } else {
            clamp_ratio(self.ratio + EWMA_WEIGHT * (observed - self.ratio))
        };
        self.samples = self.samples.saturating_add(1);
    }

    /// `base × ratio`, rounded up so an estimate never undercounts by rounding.
    pub fn apply(&self, base: u32) -> u32 {
        // `as` saturates for f64 → u32, which is the intended behaviour for huge inputs.
        (f64::from(base) * self.ratio).ceil() as u32
    }
}

fn clamp_ratio(ratio: f64) -> f64 {
    ratio.clamp(MIN_CALIBRATION_RATIO, MAX_CALIBRATION_RATIO)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn first_observation_replaces_prior() {
        let mut calibration = Calibration::default();
        calibration.observe(1000, 1100);
        assert!((calibration.ratio() - 1.1).abs() < 1e-9);
        assert_eq!(calibration.samples(), 1);
    }

    #[test]
    fn later_observations_are_blended() {
        let mut calibration = Calibration::default();
        calibration.observe(1000, 1000);
        calibration.observe(1000, 2000);
        assert!((calibration.ratio() - 1.2).abs() < 1e-9);
    }

    #[test]
    fn ratio_is_clamped() {
        let mut calibration = Calibration::default();
        calibration.observe(10, 1000);
        assert_eq!(calibration.ratio(), MAX_CALIBRATION_RATIO);
        for _ in 0..100 {
            calibration.observe(1000, 1);
        }
        assert!(calibration.ratio() >= MIN_CALIBRATION_RATIO);
        assert!(calibration.ratio() - MIN_CALIBRATION_RATIO < 1e-6);
    }

    #[test]
    fn zero_observations_are_ignored() {
        let mut calibration = Calibration::default();
        calibration.observe(0, 100);
        calibration.observe(100, 0);
        assert_eq!(calibration, Calibration::default());
    }

    #[test]
    fn apply_rounds_up() {
        let mut calibration = Calibration::default();
        calibration.observe(3, 4);
        assert_eq!(calibration.apply(3), 4);
        assert_eq!(calibration.apply(0), 0);
        assert_eq!(Calibration::default().apply(10), 12);
    }

    #[test]
    fn persists_and_sanitises() {
        let mut calibration = Calibration::default();
        calibration.observe(100, 130);
        let json = serde_json::to_string(&calibration).unwrap();
        assert_eq!(json, r#"{"ratio":1.3,"samples":1}"#);
        let restored: Calibration = serde_json::from_str(&json).unwrap();
        assert_eq!(restored, calibration);
        let hostile: Calibration = serde_json::from_str(r#"{"ratio":50.0,"samples":3}"#).unwrap();
        assert_eq!(hostile.ratio(), MAX_CALIBRATION_RATIO);
    }
}
