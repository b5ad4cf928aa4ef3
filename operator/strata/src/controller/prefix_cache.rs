//! Memoised stable prefixes: token counting is the costliest step of a no-op reconcile, so the
//! manifest of each distinct (sources, tokenizer) pair is computed once, on the counting thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use strata_core::prefix::{
    PrefixError, StablePrefix, StablePrefixManifest, StablePrefixSources, ToolRegistry,
};
use strata_core::tokens::TokenizerKind;

use crate::controller::counting_thread::CountingThread;
use crate::controller::error::{Error, Result};
use crate::controller::hashing::json_sha256;

/// Entries kept before the cache is cleared (distinct prefixes are few: fleets share prompts).
const MAX_ENTRIES: usize = 4096;

/// The memo's map, from [`memo_key`] to manifest.
type Entries = Arc<Mutex<HashMap<String, Arc<StablePrefixManifest>>>>;

/// A bounded memo of stable-prefix manifests.
#[derive(Clone, Default)]
pub struct PrefixCache {
    entries: Entries,
    counting: CountingThread,
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
    /// The manifest of `sources` counted with `tokenizer`, built on first use. A miss waits for
    /// the counting thread, which looks again before it counts: reconciles that miss on the same
    /// new prefix together count it once.
    pub fn manifest(
        &self,
        sources: &StablePrefixSources,
        tokenizer: TokenizerKind,
    ) -> std::result::Result<Arc<StablePrefixManifest>, PrefixFailure> {
        let key = memo_key(sources, tokenizer).map_err(PrefixFailure::Internal)?;
        if let Some(found) = lock(&self.entries).get(&key) {
            return Ok(found.clone());
        }
        let entries = self.entries.clone();
        let sources = sources.clone();
        let counted = self.counting.run(tokenizer, move |counter| {
            if let Some(found) = lock(&entries).get(&key) {
                return Ok(found.clone());
            }
            let prefix = StablePrefix::build(&sources, &mut ToolRegistry::new(), counter)?;
            let manifest = Arc::new(prefix.manifest().clone());
            let mut entries = lock(&entries);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
            entries.insert(key, manifest.clone());
            Ok(manifest)
        });
        match counted {
            Ok(built) => built.map_err(PrefixFailure::Invalid),
            Err(error) => Err(PrefixFailure::Internal(Error::CacheIdentity(error.to_string()))),
        }
    }
}

fn lock(entries: &Entries) -> std::sync::MutexGuard<'_, HashMap<String, Arc<StablePrefixManifest>>> {
    entries.lock().unwrap_or_else(PoisonError::into_inner)
}

fn memo_key(sources: &StablePrefixSources, tokenizer: TokenizerKind) -> Result<String> {
    Ok(format!("{}:{}", tokenizer.as_str(), json_sha256(sources, "stable-prefix sources")?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use strata_core::tokens::TokenCounter;

    use super::*;

    fn sources(system_prompt: &str) -> StablePrefixSources {
        StablePrefixSources {
            system_prompt: system_prompt.to_owned(),
            tools: vec![serde_json::json!({"name": "read_file", "description": "Read one file"})],
            constants: BTreeMap::from([("repo".to_owned(), "strata".to_owned())]),
        }
    }

    #[test]
    fn a_manifest_is_counted_once_as_the_shared_tables_count_it_then_served_from_the_memo() {
        let cache = PrefixCache::default();
        let sources = sources("You are a careful agent. Keep decisions; cite paths like /srv/app.");
        let shared = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        let expected = StablePrefix::build(&sources, &mut ToolRegistry::new(), &shared).unwrap();

        let first = cache.manifest(&sources, TokenizerKind::O200kBase).unwrap();
        assert_eq!(*first, *expected.manifest());
        let again = cache.manifest(&sources, TokenizerKind::O200kBase).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the second call is served from the memo");

        let other_tokenizer = cache.manifest(&sources, TokenizerKind::Cl100kBase).unwrap();
        assert_eq!(other_tokenizer.tokenizer, TokenizerKind::Cl100kBase);
        assert!(!Arc::ptr_eq(&first, &other_tokenizer));
    }

    #[test]
    fn unusable_sources_are_the_users_problem_not_the_operators() {
        let cache = PrefixCache::default();
        let mut duplicated = sources("A careful agent.");
        duplicated.tools.push(duplicated.tools[0].clone());
        let refused = cache.manifest(&duplicated, TokenizerKind::O200kBase);
        assert!(matches!(refused, Err(PrefixFailure::Invalid(_))), "{:?}", refused.err());
    }
}
