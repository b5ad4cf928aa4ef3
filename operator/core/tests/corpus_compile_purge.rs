//! The compiler and purge on real trajectories (../shared/corpus/swe-gemini3), counted with the real
//! o200k tokenizer: incremental compilation equals a rebuild at every step, and a purge of the largest
//! tool output shrinks the context by about its size while the output reopens byte-exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use strata_core::artifacts::ArtifactStore;
use strata_core::budget::BudgetPolicy;
use strata_core::compiler::{BreakpointPlacement, ContextCompiler, SyncOutcome};
use strata_core::economics::CachePricing;
use strata_core::entry::Entry;
use strata_core::journal::{Journal, JournalOptions, StdStorage, SyncPolicy};
use strata_core::prefix::{StablePrefix, StablePrefixSources, ToolRegistry};
use strata_core::purge::{PurgeRequest, purge};
use strata_core::tokens::{TokenCounter, TokenizerKind};
use support::{corpus_files, load_drafts};

#[test]
fn incremental_compile_and_purge_on_real_trajectories() {
    let Some(files) = corpus_files("incremental_compile_and_purge_on_real_trajectories") else { return };
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let count = |text: &str| u64::from(counter.count(text));
    let storage = Arc::new(StdStorage);
    // Every tenth trajectory keeps the debug-mode run short while covering different tasks.
    for path in files.into_iter().step_by(10) {
        let drafts = load_drafts(&path, &count);
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let mut options = JournalOptions::new("corpus-test", 1);
        options.sync_policy = SyncPolicy::Batched { max_pending: 4096 };
        let (mut journal, _) = Journal::open(storage.clone(), &data, options).unwrap();
        let store = ArtifactStore::new(storage.clone(), data.join("artifacts"));

        let sources = StablePrefixSources::default();
        let prefix = StablePrefix::build(&sources, &mut ToolRegistry::new(), &counter).unwrap();
        let mut compiler = ContextCompiler::new(prefix.clone(), BreakpointPlacement::Auto);
        for draft in drafts {
            journal.append(draft).unwrap();
            let outcome = compiler.sync(journal.generation(), journal.entries(), &counter);
            assert!(matches!(outcome, SyncOutcome::Appended(1) | SyncOutcome::Rebuilt(1)), "{outcome:?}");
        }
        journal.sync().unwrap();
        let mut scratch = ContextCompiler::new(prefix.clone(), BreakpointPlacement::Auto);
        scratch.sync(journal.generation(), journal.entries(), &counter);
        assert_eq!(compiler.context_tokens(), scratch.context_tokens(), "{}", path.display());
        let packet = compiler.compile(journal.entries(), 1_000_000, BudgetPolicy::default()).unwrap();
        assert_eq!(packet.entries.len(), journal.entries().len());
        for (index, entry) in journal.entries().iter().enumerate() {
            assert_eq!(packet.text(index), strata_core::compiler::journaled_text(entry));
            assert!(packet.text(index).starts_with(&format!("[{}]", entry.id)));
        }

        // Purge the largest tool output.
        let largest: Entry = journal
            .entries()
            .iter()
            .filter(|e| !e.content.tool_results.is_empty())
            .max_by_key(|e| e.tokens)
            .cloned()
            .unwrap();
        let before = compiler.context_tokens();
        let request =
            PurgeRequest { ids: vec![largest.id], summary: "Large listing; nothing relevant.".into() };
        let outcome =
            purge(&mut journal, &store, "corpus", &request, &counter, 2, 10, CachePricing::ANTHROPIC)
                .unwrap();
        assert!(matches!(
            compiler.sync(journal.generation(), journal.entries(), &counter),
            SyncOutcome::Rebuilt(_)
        ));
        let after = compiler.context_tokens();
        assert!(
            before - after + 80 >= largest.tokens,
            "{}: purging {} tokens only saved {}",
            path.display(),
            largest.tokens,
            before - after
        );
        let archived: Vec<Entry> =
            serde_json::from_slice(&store.get("corpus", &outcome.archive).unwrap()).unwrap();
        assert_eq!(archived, vec![largest]);
    }
}
