//! Cache economics: whether removing tokens from the cached prefix pays for the cache rewrite it causes.
//!
//! Providers bill a prompt in three parts: tokens read from the prefix cache, tokens written to it,
//! and fresh tokens. Removing `saved` tokens at some position in the prompt changes every byte after
//! that position, so the `rewritten` tokens that follow must be written to the cache again once
//! (instead of being read). In exchange every later call is `saved` tokens shorter.
//!
//! All prices are multiples of the fresh input price (Anthropic: read 0.1×, write 1.25×).
//! One-off cost of the change:   rewritten × (write − read)
//! Saving over the later calls:  saved × read × remaining_calls  (the removed tokens would have been cache reads)
//! plus, on the call that makes the change, the removed tokens are not written: saved × write.
//! A change pays when the saving exceeds the cost.

use serde::{Deserialize, Serialize};

/// Fewest calls a removal is assumed to serve.
pub const MIN_EXPECTED_CALLS: u64 = 10;
/// Most calls a removal is credited with. A later batch rewrites the prompt again, so savings
/// past this horizon are not this removal's to claim (measured with `strata replay`: crediting the
/// whole remaining session rewrote the cache so often that cost rose on long sessions).
pub const PAYBACK_HORIZON_CALLS: u64 = 40;

/// The calls a removal made now is expected to serve, from the calls the session has made so far
/// (a session that has run n calls is likely to run about as many more), within the payback horizon.
pub fn expected_remaining_calls(calls_so_far: u64) -> u64 {
    calls_so_far.clamp(MIN_EXPECTED_CALLS, PAYBACK_HORIZON_CALLS)
}

/// Cache prices as multiples of the fresh input-token price.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachePricing {
    /// Price of a token read from the cache.
    pub read: f64,
    /// Price of a token written to the cache.
    pub write: f64,
}

impl CachePricing {
    /// Anthropic prompt caching: reads at 0.1×, 5-minute writes at 1.25×.
    pub const ANTHROPIC: CachePricing = CachePricing { read: 0.1, write: 1.25 };
    /// OpenAI automatic prefix caching: reads at 0.1×, writes at no premium.
    pub const OPENAI: CachePricing = CachePricing { read: 0.1, write: 1.0 };
}

/// The trade a removal offers, in fresh-token units.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemovalEconomics {
    /// Tokens removed from every later call.
    pub saved_tokens_per_call: u64,
    /// Tokens after the first changed position that must be written to the cache again.
    pub rewritten_tokens: u64,
    /// One-off cost of the rewrite.
    pub rewrite_cost: f64,
    /// What the removal saves over the expected remaining calls.
    pub expected_saving: f64,
    /// Calls after which the saving has paid for the rewrite (`None` if it never does).
    pub break_even_calls: Option<u64>,
}

impl RemovalEconomics {
    /// Evaluate removing `saved` tokens when `rewritten` tokens follow the first change, with
    /// `remaining_calls` calls expected before the next compaction or the end of the session.
    pub fn evaluate(saved: u64, rewritten: u64, remaining_calls: u64, pricing: CachePricing) -> Self {
        let rewrite_cost = rewritten as f64 * (pricing.write - pricing.read).max(0.0);
        let immediate = saved as f64 * pricing.write;
        let per_call = saved as f64 * pricing.read;
        let expected_saving = immediate + per_call * remaining_calls as f64;
        let break_even_calls = if immediate >= rewrite_cost {
            Some(0)
        } else if per_call > 0.0 {
            Some(((rewrite_cost - immediate) / per_call).ceil() as u64)
        } else {
            None
        };
        RemovalEconomics {
            saved_tokens_per_call: saved,
            rewritten_tokens: rewritten,
            rewrite_cost,
            expected_saving,
            break_even_calls,
        }
    }

    /// Whether the removal pays for itself within the expected remaining calls.
    pub fn pays(&self) -> bool {
        self.expected_saving > self.rewrite_cost
    }

    /// Whether it pays, and saves at least `ratio` times what the rewrite costs.
    pub fn pays_by(&self, ratio: f64) -> bool {
        self.pays() && self.expected_saving >= ratio * self.rewrite_cost
    }

    /// A batch that removes `saved` tokens from `entries`, the earliest change at `first_changed`:
    /// everything from there on that stays is rewritten.
    pub fn for_batch(
        entries: &[crate::entry::Entry],
        first_changed: usize,
        saved: u64,
        remaining_calls: u64,
        pricing: CachePricing,
    ) -> Self {
        let tail: u64 =
            entries.get(first_changed..).unwrap_or_default().iter().map(|entry| entry.tokens).sum();
        Self::evaluate(saved, tail.saturating_sub(saved), remaining_calls, pricing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_calls_are_bounded_by_the_horizon() {
        assert_eq!(expected_remaining_calls(0), MIN_EXPECTED_CALLS);
        assert_eq!(expected_remaining_calls(25), 25);
        assert_eq!(expected_remaining_calls(5_000), PAYBACK_HORIZON_CALLS);
    }

    #[test]
    fn removing_at_the_tail_always_pays() {
        let e = RemovalEconomics::evaluate(1_000, 0, 0, CachePricing::ANTHROPIC);
        assert!(e.pays());
        assert_eq!(e.break_even_calls, Some(0));
    }

    #[test]
    fn small_removal_deep_in_a_long_prompt_does_not_pay_soon() {
        // 500 tokens saved, 100k tokens rewritten: cost 115k units, saving 625 + 50/call.
        let e = RemovalEconomics::evaluate(500, 100_000, 10, CachePricing::ANTHROPIC);
        assert!(!e.pays());
        assert_eq!(e.break_even_calls, Some(2288));
        assert!(RemovalEconomics::evaluate(500, 100_000, 2_300, CachePricing::ANTHROPIC).pays());
    }

    #[test]
    fn large_removal_pays_within_a_few_calls() {
        let e = RemovalEconomics::evaluate(30_000, 40_000, 5, CachePricing::ANTHROPIC);
        assert!(e.pays(), "{e:?}");
    }
}
