//! Property tests of token counting and calibration.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use strata_core::tokens::{
    Calibration, MAX_CALIBRATION_RATIO, MIN_CALIBRATION_RATIO, TokenCounter, TokenizerKind,
};

fn text_with_special_tokens() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            any::<String>(),
            Just("<|endoftext|>".to_owned()),
            Just("<|im_start|>".to_owned()),
            Just("<|endofprompt|>".to_owned()),
            Just("<|fim_prefix|>".to_owned()),
        ],
        0..6,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn counts_are_bounded_by_bytes_and_never_panic(text in text_with_special_tokens()) {
        for kind in [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase] {
            let count = TokenCounter::new(kind).unwrap().count(&text);
            prop_assert!(count as usize <= text.len());
            prop_assert_eq!(count == 0, text.is_empty());
        }
    }

    #[test]
    fn approximate_is_calibrated_base(
        text in any::<String>(),
        observations in prop::collection::vec((1u32..100_000, 1u32..100_000), 0..10),
    ) {
        let mut counter = TokenCounter::new(TokenizerKind::Approximate).unwrap();
        for (estimated, actual) in observations {
            counter.observe_usage(estimated, actual);
        }
        let ratio = counter.calibration().ratio();
        prop_assert!((MIN_CALIBRATION_RATIO..=MAX_CALIBRATION_RATIO).contains(&ratio));
        let base = counter.base_count(&text);
        let expected = (f64::from(base) * ratio).ceil() as u32;
        prop_assert_eq!(counter.count(&text), expected);
    }

    #[test]
    fn calibration_converges_to_a_constant_ratio(actual_per_hundred in 50u32..=200) {
        let mut calibration = Calibration::default();
        for _ in 0..60 {
            calibration.observe(100, actual_per_hundred);
        }
        let target = f64::from(actual_per_hundred) / 100.0;
        prop_assert!((calibration.ratio() - target).abs() < 1e-3);
        let restored: Calibration =
            serde_json::from_str(&serde_json::to_string(&calibration).unwrap()).unwrap();
        prop_assert_eq!(restored, calibration);
    }
}
