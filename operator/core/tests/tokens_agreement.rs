//! The token counter agrees exactly with `tiktoken-rs` (the reference port of OpenAI's tiktoken):
//! on generated text of every shape the pre-tokenizer distinguishes.
#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;

use proptest::prelude::*;
use strata_core::tokens::{TokenCounter, TokenizerKind};

/// The reference encoding, parsed once per test binary.
fn reference(kind: TokenizerKind) -> &'static tiktoken_rs::CoreBPE {
    static O200K: OnceLock<tiktoken_rs::CoreBPE> = OnceLock::new();
    static CL100K: OnceLock<tiktoken_rs::CoreBPE> = OnceLock::new();
    match kind {
        TokenizerKind::Cl100kBase => CL100K.get_or_init(|| tiktoken_rs::cl100k_base().unwrap()),
        TokenizerKind::O200kBase | TokenizerKind::Approximate => {
            O200K.get_or_init(|| tiktoken_rs::o200k_base().unwrap())
        }
    }
}

/// Text mixing the classes the o200k and cl100k pre-tokenizers split on: letters of several
/// scripts and cases, digits, punctuation, runs of spaces and newlines, contractions and emoji.
fn mixed_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z]{1,12}",
        "[0-9]{1,7}",
        "[ ]{1,5}",
        "[\n\t ]{1,4}",
        "[.,;:!?(){}<>/\\\\\"'`_=+*&^%$#@~-]{1,4}",
        Just("'s".to_owned()),
        Just("'LL".to_owned()),
        "[а-яА-Я]{1,8}",
        "[一-龥]{1,6}",
        "[ぁ-ゟ]{1,6}",
        Just("🚀🙂".to_owned()),
        Just("<|endoftext|>".to_owned()),
        "[ÀÉÎõüß]{1,4}",
    ];
    prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn o200k_counts_equal_tiktoken_rs(text in mixed_text()) {
        let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        let expected = reference(TokenizerKind::O200kBase).encode_ordinary(&text).len();
        prop_assert_eq!(counter.base_count(&text) as usize, expected, "text {:?}", text);
    }

    #[test]
    fn cl100k_counts_equal_tiktoken_rs(text in mixed_text()) {
        let counter = TokenCounter::new(TokenizerKind::Cl100kBase).unwrap();
        let expected = reference(TokenizerKind::Cl100kBase).encode_ordinary(&text).len();
        prop_assert_eq!(counter.base_count(&text) as usize, expected, "text {:?}", text);
    }
}
