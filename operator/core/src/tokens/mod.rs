//! Token counting with real BPE encodings (o200k_base, cl100k_base) and a calibrated approximation.
//!
//! * [`TokenizerKind::O200kBase`] and [`TokenizerKind::Cl100kBase`] count exactly what the OpenAI
//!   encodings produce for ordinary text. Text that looks like a special token (for example
//!   `<|endoftext|>`) is counted as ordinary text, because that is how user-supplied text reaches a
//!   provider; counting never panics.
//! * [`TokenizerKind::Approximate`] serves providers without a public tokenizer (Anthropic). Its base
//!   estimate is the o200k_base count (a modern 200k-vocabulary BPE, much closer to current provider
//!   tokenizers than a characters-per-token rule), multiplied by a per-agent [`Calibration`] ratio
//!   learned from provider-reported `input_tokens`.
//!
//! The BPE ranks ship inside the `tiktoken` crate, which builds each encoding once, lazily, on first
//! use, and keeps it for the life of the process (about 11 MiB for o200k_base). A process that
//! counts rarely, like the controller, builds a private copy instead
//! ([`TokenCounter::with_private_tables`]) and frees it with the last counter. Its counts agree
//! exactly with `tiktoken-rs` (OpenAI's reference port) on every text of the corpora, and it is
//! several times faster and needs half the memory (BENCHMARKS.md, "Choosing the BPE
//! implementation"). An encoding the build does not carry is reported as
//! [`TokenizerError::Load`].

mod calibration;
mod digit_shapes;

pub use digit_shapes::DigitShapeCounts;

pub use calibration::{
    Calibration, DEFAULT_APPROXIMATE_RATIO, EWMA_WEIGHT, MAX_CALIBRATION_RATIO, MIN_CALIBRATION_RATIO,
};

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tiktoken::CoreBpe;

/// Tokens a chat message costs beyond its role and content: the message start/end markers and the
/// role/content separator of the chat format (the value OpenAI documents for its chat models).
pub const MESSAGE_OVERHEAD_TOKENS: u32 = 3;

/// Which tokenizer counts tokens for an agent's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TokenizerKind {
    /// OpenAI `o200k_base` (GPT-4o, GPT-4.1, GPT-5, o-series).
    O200kBase,
    /// OpenAI `cl100k_base` (GPT-4, GPT-3.5).
    Cl100kBase,
    /// No public tokenizer: o200k_base count times a learned calibration ratio.
    Approximate,
}

impl TokenizerKind {
    /// Stable name of the tokenizer, used in cache identities and manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::O200kBase => "O200kBase",
            Self::Cl100kBase => "Cl100kBase",
            Self::Approximate => "Approximate",
        }
    }
}

impl std::fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Failure to make a tokenizer available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerError {
    /// The embedded BPE ranks of an encoding could not be parsed.
    #[error("failed to load the {encoding} BPE ranks: {reason}")]
    Load {
        /// Encoding name, e.g. `o200k_base`.
        encoding: &'static str,
        /// The loader's error message.
        reason: String,
    },
}

/// The BPE encodings Strata loads.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    O200kBase,
    Cl100kBase,
}

impl Encoding {
    fn name(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
        }
    }

    /// The encoding a tokenizer kind counts with.
    fn of(kind: TokenizerKind) -> Self {
        match kind {
            TokenizerKind::O200kBase | TokenizerKind::Approximate => Self::O200kBase,
            TokenizerKind::Cl100kBase => Self::Cl100kBase,
        }
    }

    /// The process-wide copy of the encoding, built on first use only.
    fn shared(self) -> Result<&'static CoreBpe, TokenizerError> {
        tiktoken::get_encoding(self.name()).ok_or_else(|| TokenizerError::Load {
            encoding: self.name(),
            reason: "this build does not carry the encoding's ranks".to_owned(),
        })
    }

    /// A copy of the encoding of its own, freed when the last holder drops it.
    fn private(self) -> CoreBpe {
        match self {
            Self::O200kBase => tiktoken::encoding::o200k_base(),
            Self::Cl100kBase => tiktoken::encoding::cl100k_base(),
        }
    }
}

/// Where a counter's BPE tables live.
#[derive(Clone)]
enum Tables {
    /// The process-wide copy, kept until the process exits.
    Shared(&'static CoreBpe),
    /// A private copy, freed with the last counter that holds it.
    Private(Arc<CoreBpe>),
}

impl Tables {
    fn bpe(&self) -> &CoreBpe {
        match self {
            Self::Shared(bpe) => bpe,
            Self::Private(bpe) => bpe,
        }
    }
}

/// Counts tokens for one agent's model.
#[derive(Clone)]
pub struct TokenCounter {
    kind: TokenizerKind,
    tables: Tables,
    calibration: Calibration,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("kind", &self.kind)
            .field("calibration", &self.calibration)
            .finish_non_exhaustive()
    }
}

impl TokenCounter {
    /// A counter for `kind`, with a fresh calibration for [`TokenizerKind::Approximate`].
    pub fn new(kind: TokenizerKind) -> Result<Self, TokenizerError> {
        Self::with_calibration(kind, Calibration::default())
    }

    /// A counter for `kind` that resumes a persisted calibration (only used by `Approximate`).
    pub fn with_calibration(kind: TokenizerKind, calibration: Calibration) -> Result<Self, TokenizerError> {
        let tables = Tables::Shared(Encoding::of(kind).shared()?);
        Ok(Self { kind, tables, calibration })
    }

    /// A counter for `kind` with BPE tables of its own, built now (about 11 MiB for o200k_base)
    /// and freed when this counter and its clones are dropped. Counts are identical to
    /// [`Self::new`]'s. For a process that counts rarely and should not keep the tables resident.
    pub fn with_private_tables(kind: TokenizerKind) -> Self {
        let tables = Tables::Private(Arc::new(Encoding::of(kind).private()));
        Self { kind, tables, calibration: Calibration::default() }
    }

    /// The tokenizer this counter implements.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// The calibration state (meaningful for `Approximate`; persist it with the agent).
    pub fn calibration(&self) -> &Calibration {
        &self.calibration
    }

    /// The uncalibrated BPE count of `text` (special-token text counted as ordinary text).
    pub fn base_count(&self, text: &str) -> u32 {
        saturate(self.tables.bpe().count(text))
    }

    /// The token count of `text` for this tokenizer: exact for BPE kinds, calibrated for
    /// `Approximate`.
    pub fn count(&self, text: &str) -> u32 {
        self.calibrate(self.base_count(text))
    }

    /// Tokens of one chat message: role + content + [`MESSAGE_OVERHEAD_TOKENS`].
    pub fn count_message(&self, role: &str, content: &str) -> u32 {
        let base = self
            .base_count(role)
            .saturating_add(self.base_count(content))
            .saturating_add(MESSAGE_OVERHEAD_TOKENS);
        self.calibrate(base)
    }

    /// Learns from a provider-reported usage: `estimated` is the [`Self::base_count`] of what was
    /// sent and `actual` the provider's `input_tokens`. Exact BPE kinds ignore the observation.
    pub fn observe_usage(&mut self, estimated: u32, actual: u32) {
        if self.kind == TokenizerKind::Approximate {
            self.calibration.observe(estimated, actual);
        }
    }

    fn calibrate(&self, base: u32) -> u32 {
        match self.kind {
            TokenizerKind::Approximate => self.calibration.apply(base),
            TokenizerKind::O200kBase | TokenizerKind::Cl100kBase => base,
        }
    }
}

fn saturate(count: usize) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn o200k_counts_known_text() {
        let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        assert_eq!(counter.count("hello world"), 2);
        assert_eq!(counter.count(""), 0);
    }

    #[test]
    fn cl100k_counts_known_text() {
        let counter = TokenCounter::new(TokenizerKind::Cl100kBase).unwrap();
        assert_eq!(counter.count("hello world"), 2);
        assert_eq!(counter.count("This is a test"), 4);
    }

    #[test]
    fn special_token_text_counts_as_ordinary_text() {
        for kind in [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase] {
            let counter = TokenCounter::new(kind).unwrap();
            let count = counter.count("<|endoftext|>");
            assert!(count > 1, "{kind}: special text must be split, got {count}");
        }
    }

    #[test]
    fn message_adds_overhead() {
        let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        let expected = counter.count("user") + counter.count("hello world") + 3;
        assert_eq!(counter.count_message("user", "hello world"), expected);
    }

    #[test]
    fn private_tables_count_what_the_shared_ones_count() {
        let text = "fn main() { println!(\"héllo, 世界\"); }\n\t<|endoftext|> 12345 ".repeat(40);
        for kind in [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase, TokenizerKind::Approximate] {
            let shared = TokenCounter::new(kind).unwrap();
            let private = TokenCounter::with_private_tables(kind);
            assert_eq!(private.kind(), kind);
            assert_eq!(private.count(&text), shared.count(&text), "{kind}");
            assert_eq!(private.count_message("tool", &text), shared.count_message("tool", &text), "{kind}");
        }
    }

    #[test]
    fn approximate_applies_calibration() {
        let mut counter = TokenCounter::new(TokenizerKind::Approximate).unwrap();
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        let base = counter.base_count(&text);
        assert_eq!(counter.count(&text), counter.calibration().apply(base), "approximate = base × ratio");
        counter.observe_usage(base, base * 2);
        assert!(counter.count(&text) > base);
    }

    #[test]
    fn exact_kinds_ignore_usage_observations() {
        let mut counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        counter.observe_usage(100, 180);
        assert_eq!(counter.count("hello world"), 2);
    }

    #[test]
    fn kind_serializes_with_variant_names() {
        let json = serde_json::to_string(&TokenizerKind::O200kBase).unwrap();
        assert_eq!(json, "\"O200kBase\"");
        let kind: TokenizerKind = serde_json::from_str("\"Approximate\"").unwrap();
        assert_eq!(kind, TokenizerKind::Approximate);
    }
}
