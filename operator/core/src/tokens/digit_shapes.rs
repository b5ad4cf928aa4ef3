//! Token counts of texts that differ only in their ASCII digits, each shape counted once.
//!
//! Both encodings cut digits off every neighbouring piece, in runs of at most three (`\p{N}{1,3}` in
//! their pre-tokenising patterns), and every run of one to three ASCII digits is one token (tested
//! below). So an ASCII text has as many tokens as its shape: the text with each digit made `0`.
//! (Other texts are counted as they are: a run may join an ASCII digit to another script's.) The
//! Tier-3 telemetry line changes its numbers on every request and its shape rarely, so its count
//! is a lookup instead of a BPE pass.

use std::collections::HashMap;

use super::{TokenCounter, TokenizerKind};

/// Shapes kept at most; the memo starts over when it is full.
const SHAPES_KEPT: usize = 64;

/// Base counts by shape, for one encoding.
#[derive(Debug, Default)]
pub struct DigitShapeCounts {
    kind: Option<TokenizerKind>,
    counts: HashMap<Vec<u8>, u32>,
    shape: Vec<u8>,
}

impl DigitShapeCounts {
    /// `counter.count(text)`, counting an ASCII text of a shape already seen without encoding it.
    pub fn count(&mut self, counter: &TokenCounter, text: &str) -> u32 {
        if !text.is_ascii() {
            return counter.count(text);
        }
        if self.kind != Some(counter.kind) {
            self.kind = Some(counter.kind);
            self.counts.clear();
        }
        self.shape.clear();
        self.shape.extend(text.bytes().map(|byte| if byte.is_ascii_digit() { b'0' } else { byte }));
        let base = match self.counts.get(self.shape.as_slice()) {
            Some(&base) => base,
            None => {
                let base = counter.base_count(text);
                if self.counts.len() >= SHAPES_KEPT {
                    self.counts.clear();
                }
                self.counts.insert(self.shape.clone(), base);
                base
            }
        };
        counter.calibrate(base)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const KINDS: [TokenizerKind; 2] = [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase];

    #[test]
    fn every_run_of_one_to_three_digits_is_one_token() {
        for kind in KINDS {
            let counter = TokenCounter::new(kind).unwrap();
            for width in 1..=3usize {
                for value in 0..10u32.pow(u32::try_from(width).unwrap()) {
                    let digits = format!("{value:0width$}");
                    assert_eq!(counter.base_count(&digits), 1, "{kind:?} {digits:?}");
                }
            }
        }
    }

    #[test]
    fn a_text_counts_as_its_shape_and_a_seen_shape_is_not_encoded_again() {
        let texts = [
            "Status: Context: 1,234 / 1,000,000 (0%) | Level: Normal",
            "Status: Context: 987,654 / 1,000,000 (98%) | Level: Critical",
            "a12b 3456789 x9y, 00 and 1.5e10; v2024-12-05T10:59:00Z",
            "digits after letters abc123 and before them 456def, ٣٤ (not ASCII) 78",
        ];
        for kind in KINDS {
            let counter = TokenCounter::new(kind).unwrap();
            let mut memo = DigitShapeCounts::default();
            for text in texts {
                let shape: String = text.chars().map(|c| if c.is_ascii_digit() { '0' } else { c }).collect();
                assert_eq!(counter.count(text), counter.count(&shape), "{kind:?} {text:?}");
                assert_eq!(memo.count(&counter, text), counter.count(text), "{kind:?} {text:?}");
            }
            let kept = memo.counts.len();
            assert_eq!(kept, texts.len() - 1, "a text that is not ASCII is not kept");
            let same_shape = "Status: Context: 5,678 / 2,000,000 (1%) | Level: Normal";
            assert_eq!(memo.count(&counter, same_shape), counter.count(same_shape));
            assert_eq!(memo.counts.len(), kept, "a seen shape is looked up");
        }
    }

    #[test]
    fn the_memo_starts_over_for_another_encoding_and_when_full() {
        let o200k = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        let cl100k = TokenCounter::new(TokenizerKind::Cl100kBase).unwrap();
        let mut memo = DigitShapeCounts::default();
        let text = "Status: 12 tokens";
        memo.count(&o200k, text);
        assert_eq!(memo.count(&cl100k, text), cl100k.count(text));
        assert_eq!(memo.counts.len(), 1);
        for width in 1..=SHAPES_KEPT + 1 {
            memo.count(&o200k, &"7".repeat(width));
        }
        assert!(memo.counts.len() <= SHAPES_KEPT);
    }
}
