//! Prefix-cache pricing, the way providers bill it, against the cache a provider would hold.
//!
//! A prompt is a list of blocks (the system prompt, each message) with their token counts. The
//! simulated cache stores prefixes by a cumulative hash of their blocks, so a prompt hits the cache
//! only when everything before the hit point is byte-identical to an earlier prompt.
//!
//! - **anthropic**: prefixes are written at cache breakpoints only (at most 4 per request), reads
//!   are looked up at each breakpoint and up to 20 blocks before it; writes cost 1.25×, reads 0.1×;
//!   prefixes under 1024 tokens are not cached; entries live 5 minutes, refreshed on every hit.
//! - **openai**: every prompt of at least 1024 tokens is cached automatically; a hit is the longest
//!   cached prefix, counted in 128-token increments above 1024; reads 0.1×, no write premium.
//!
//! Costs are in *units* of one fresh input token; completion tokens are the same under every
//! context policy and are left out.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde::Serialize;

/// Which provider's cache rules apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// Anthropic explicit breakpoints.
    Anthropic,
    /// OpenAI automatic prefix caching.
    OpenAi,
}

impl Provider {
    /// What one output token costs, in fresh-input-token units: the ratio of the providers' list
    /// prices for their current mid-tier models (Anthropic 5×, OpenAI 4×).
    pub fn output_price_ratio(self) -> f64 {
        match self {
            Provider::Anthropic => 5.0,
            Provider::OpenAi => 4.0,
        }
    }
}

/// Minimum cacheable prefix.
pub const MIN_CACHEABLE_TOKENS: u64 = 1024;
/// OpenAI's cache granularity above the minimum.
pub const OPENAI_INCREMENT: u64 = 128;
/// How far before a breakpoint Anthropic looks for an earlier cached prefix.
pub const ANTHROPIC_LOOKBACK_BLOCKS: usize = 20;
/// Cache entry lifetime without hits.
pub const CACHE_TTL_MS: u64 = 5 * 60 * 1000;

/// One block of a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Hash of the block's exact text.
    pub hash: u64,
    /// Its tokens.
    pub tokens: u64,
    /// Whether a cache breakpoint follows it (Anthropic).
    pub breakpoint: bool,
}

/// Hash of a block's text.
pub fn block_hash(text: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// The bill of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallCost {
    /// Prompt tokens.
    pub total: u64,
    /// Billed at the fresh price.
    pub fresh: u64,
    /// Written to the cache.
    pub cache_write: u64,
    /// Read from the cache.
    pub cache_read: u64,
    /// Cost in fresh-token units.
    pub units: f64,
}

impl std::ops::Add for CallCost {
    type Output = CallCost;

    fn add(self, other: CallCost) -> CallCost {
        CallCost {
            total: self.total + other.total,
            fresh: self.fresh + other.fresh,
            cache_write: self.cache_write + other.cache_write,
            cache_read: self.cache_read + other.cache_read,
            units: self.units + other.units,
        }
    }
}

/// The cache a provider holds for one session.
pub struct ProviderCache {
    provider: Provider,
    expires: HashMap<u64, u64>,
}

impl ProviderCache {
    /// An empty cache.
    pub fn new(provider: Provider) -> Self {
        ProviderCache { provider, expires: HashMap::new() }
    }

    fn live(&self, hash: u64, now_ms: u64) -> bool {
        self.expires.get(&hash).is_some_and(|&until| until >= now_ms)
    }

    /// Price one prompt sent at `now_ms`, and update the cache.
    pub fn price(&mut self, blocks: &[Block], now_ms: u64) -> CallCost {
        let mut cumulative_hash = Vec::with_capacity(blocks.len());
        let mut cumulative_tokens = Vec::with_capacity(blocks.len());
        let (mut hash, mut tokens) = (0xcbf2_9ce4_8422_2325_u64, 0u64);
        for block in blocks {
            hash = (hash ^ block.hash).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17) ^ block.tokens;
            tokens += block.tokens;
            cumulative_hash.push(hash);
            cumulative_tokens.push(tokens);
        }
        let total = tokens;
        match self.provider {
            Provider::Anthropic => {
                self.price_anthropic(blocks, &cumulative_hash, &cumulative_tokens, total, now_ms)
            }
            Provider::OpenAi => self.price_openai(&cumulative_hash, &cumulative_tokens, total, now_ms),
        }
    }

    fn price_anthropic(
        &mut self,
        blocks: &[Block],
        hashes: &[u64],
        tokens: &[u64],
        total: u64,
        now: u64,
    ) -> CallCost {
        let breakpoints: Vec<usize> =
            blocks.iter().enumerate().filter(|(_, b)| b.breakpoint).map(|(i, _)| i).collect();
        let mut read_at: Option<usize> = None;
        for &point in &breakpoints {
            let earliest = point.saturating_sub(ANTHROPIC_LOOKBACK_BLOCKS);
            if let Some(hit) = (earliest..=point)
                .rev()
                .find(|&j| tokens[j] >= MIN_CACHEABLE_TOKENS && self.live(hashes[j], now))
                && read_at.is_none_or(|r| hit > r)
            {
                read_at = Some(hit);
            }
        }
        let read = read_at.map_or(0, |j| tokens[j]);
        if let Some(j) = read_at {
            self.expires.insert(hashes[j], now + CACHE_TTL_MS);
        }
        let mut written_to = read;
        for &point in &breakpoints {
            if tokens[point] >= MIN_CACHEABLE_TOKENS && tokens[point] > read {
                self.expires.insert(hashes[point], now + CACHE_TTL_MS);
                written_to = written_to.max(tokens[point]);
            }
        }
        let write = written_to - read;
        let fresh = total - read - write;
        CallCost {
            total,
            fresh,
            cache_write: write,
            cache_read: read,
            units: fresh as f64 + 1.25 * write as f64 + 0.1 * read as f64,
        }
    }

    fn price_openai(&mut self, hashes: &[u64], tokens: &[u64], total: u64, now: u64) -> CallCost {
        let hit =
            (0..hashes.len()).rev().find(|&j| tokens[j] >= MIN_CACHEABLE_TOKENS && self.live(hashes[j], now));
        let read = hit.map_or(0, |j| {
            MIN_CACHEABLE_TOKENS + (tokens[j] - MIN_CACHEABLE_TOKENS) / OPENAI_INCREMENT * OPENAI_INCREMENT
        });
        if total >= MIN_CACHEABLE_TOKENS {
            for (j, &hash) in hashes.iter().enumerate() {
                if tokens[j] >= MIN_CACHEABLE_TOKENS {
                    self.expires.insert(hash, now + CACHE_TTL_MS);
                }
            }
        }
        let fresh = total - read;
        CallCost { total, fresh, cache_write: 0, cache_read: read, units: fresh as f64 + 0.1 * read as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(sizes: &[(u64, &str, bool)]) -> Vec<Block> {
        sizes
            .iter()
            .map(|&(tokens, text, breakpoint)| Block { hash: block_hash(text), tokens, breakpoint })
            .collect()
    }

    #[test]
    fn anthropic_reads_the_previous_prompt_and_writes_the_new_tail() {
        let mut cache = ProviderCache::new(Provider::Anthropic);
        let first = blocks(&[(2000, "system", true), (500, "m1", true)]);
        let cost = cache.price(&first, 0);
        assert_eq!((cost.fresh, cost.cache_write, cost.cache_read), (0, 2500, 0));
        let second = blocks(&[(2000, "system", true), (500, "m1", false), (300, "m2", true)]);
        let cost = cache.price(&second, 1000);
        assert_eq!((cost.fresh, cost.cache_write, cost.cache_read), (0, 300, 2500));
        assert!((cost.units - (1.25 * 300.0 + 0.1 * 2500.0)).abs() < 1e-9);
    }

    #[test]
    fn anthropic_changed_history_reads_only_the_unchanged_prefix() {
        let mut cache = ProviderCache::new(Provider::Anthropic);
        cache.price(&blocks(&[(2000, "system", true), (500, "m1", false), (300, "m2", true)]), 0);
        // m1 was elided: only the system prompt (a breakpoint of its own) is still cached.
        let cost =
            cache.price(&blocks(&[(2000, "system", true), (100, "m1-elided", false), (300, "m2", true)]), 10);
        assert_eq!((cost.cache_read, cost.cache_write), (2000, 400));
    }

    #[test]
    fn anthropic_small_prefixes_and_expired_entries_are_not_cached() {
        let mut cache = ProviderCache::new(Provider::Anthropic);
        let small = blocks(&[(500, "system", true)]);
        assert_eq!(cache.price(&small, 0).cache_write, 0);
        let big = blocks(&[(5000, "system", true)]);
        cache.price(&big, 0);
        assert_eq!(cache.price(&big, CACHE_TTL_MS).cache_read, 5000);
        assert_eq!(cache.price(&big, 3 * CACHE_TTL_MS).cache_read, 0, "expired");
    }

    #[test]
    fn openai_rounds_hits_to_128_token_increments() {
        let mut cache = ProviderCache::new(Provider::OpenAi);
        let first = blocks(&[(1500, "system", false), (300, "m1", false)]);
        assert_eq!(cache.price(&first, 0).cache_read, 0);
        let second = blocks(&[(1500, "system", false), (300, "m1", false), (50, "m2", false)]);
        let cost = cache.price(&second, 1);
        assert_eq!(cost.cache_read, 1024 + (1800 - 1024) / 128 * 128);
        assert_eq!(cost.fresh, 1850 - cost.cache_read);
    }
}
