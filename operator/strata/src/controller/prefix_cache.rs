//! Memoised stable prefixes: token counting is the costliest step of a no-op reconcile, so the
//! manifest of each distinct (sources, tokenizer) pair is computed once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use strata_core::prefix::{
    PrefixError, StablePrefix, StablePrefixManifest, StablePrefixSources, ToolRegistry,
};
use strata_core::tokens::{TokenCounter, TokenizerKind};

use crate::controller::error::{Error, Result};
use crate::controller::hashing::json_sha256;

/// Entries kept before the cache is cleared (distinct prefixes are few: fleets share prompts).
const MAX_ENTRIES: usize = 4096;

/// A bounded memo of stable-prefix manifests.
#[derive(Clone, Default)]
pub struct PrefixCache {
    entries: Arc<Mutex<HashMap<String, Arc<StablePrefixManifest>>>>,
}

/// Why a stable prefix could not be built.
#[derive(Debug)]
pub enum PrefixFailure {
    /// The sources are unusable (volatile material, duplicate tools, ...): the user must fix them.
    Invalid(PrefixError),
    /// The tokenizer or hashing failed: an operator problem.
    Internal(Error),
}

impl PrefixCache {
    /// The manifest of `sources` counted with `tokenizer`, built on first use.
    pub fn manifest(
        &self,
        sources: &StablePrefixSources,
        tokenizer: TokenizerKind,
    ) -> std::result::Result<Arc<StablePrefixManifest>, PrefixFailure> {
        let key = memo_key(sources, tokenizer).map_err(PrefixFailure::Internal)?;
        if let Some(found) = self.lock().get(&key) {
            return Ok(found.clone());
        }
        let counter = TokenCounter::new(tokenizer)
            .map_err(|error| PrefixFailure::Internal(Error::CacheIdentity(error.to_string())))?;
        let prefix = StablePrefix::build(sources, &mut ToolRegistry::new(), &counter)
            .map_err(PrefixFailure::Invalid)?;
        let manifest = Arc::new(prefix.manifest().clone());
        let mut entries = self.lock();
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key, manifest.clone());
        Ok(manifest)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<StablePrefixManifest>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn memo_key(sources: &StablePrefixSources, tokenizer: TokenizerKind) -> Result<String> {
    Ok(format!("{}:{}", tokenizer.as_str(), json_sha256(sources, "stable-prefix sources")?))
}
