//! Extractive compaction of every real trajectory in ../shared/corpus/swe-gemini3: the decisions,
//! the files a patch changes and the final-patch commands of the agent survive in the new baseline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use strata_core::artifacts::ArtifactStore;
use strata_core::compaction::{
    CompactionMode, CompactionRequest, CompactionSettings, Conclusion, ExtractiveSummarizer,
    PreparedCompaction, signals,
};
use strata_core::entry::{Entry, Role};
use strata_core::journal::{BaselineEntry, Snapshot, StdStorage, Watermark};
use strata_core::tokens::{TokenCounter, TokenizerKind};
use support::{corpus_files, load};

const MARKERS: [&str; 2] = ["COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT"];

fn snapshot(entries: Vec<Entry>) -> Snapshot {
    Snapshot {
        generation: 1,
        watermark: Watermark { entries: entries.len() as u64, last_id: entries.last().map(|e| e.id) },
        entries,
    }
}

/// Decision lines as a reader would spot them: the agent announcing what it will do.
fn decision_lines(entry: &Entry) -> Vec<&str> {
    if entry.role != Role::Assistant {
        return Vec::new();
    }
    entry
        .content
        .text
        .lines()
        .map(signals::strip_bullet)
        .filter(|line| line.starts_with("I'll ") || line.starts_with("I will ") || line.starts_with("We'll "))
        .collect()
}

fn patch_files(entries: &[Entry]) -> Vec<String> {
    let mut files = Vec::new();
    for entry in entries {
        let texts = std::iter::once(entry.content.text.as_str())
            .chain(entry.content.tool_results.iter().map(|r| r.output.as_str()));
        for text in texts {
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("diff --git a/") {
                    files.push(rest.split(" b/").next().unwrap().to_owned());
                }
            }
        }
    }
    files
}

/// A summary bound large enough for every extracted item of the longest trajectory.
const ROOMY_SUMMARY_TOKENS: u64 = 65_536;

/// Under the default bound the state fits and still holds the newest decisions.
fn assert_bounded(name: &str, state: &strata_core::compaction::CompactedState, max_tokens: u64) {
    let json = serde_json::to_string(state).unwrap();
    assert!(json.len() as u64 <= max_tokens * 4, "{name}: state of {} bytes exceeds the bound", json.len());
    assert!(!state.decisions.is_empty(), "{name}: the newest decisions are kept");
}

#[test]
fn decisions_files_and_final_patch_markers_survive_extractive_compaction() {
    let Some(files) = corpus_files("decisions_files_and_final_patch_markers_survive_extractive_compaction")
    else {
        return;
    };
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(Arc::new(StdStorage), dir.path().join("artifacts"));
    let mut checked_markers = 0;
    let mut checked_decisions = 0;
    let mut checked_files = 0;
    for path in files {
        let entries = load(&path);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let request = CompactionRequest {
            mode: CompactionMode::Budget,
            reason: None,
            resume_instruction: None,
            settings: CompactionSettings {
                keep_recent_entries: 2,
                max_summary_tokens: ROOMY_SUMMARY_TOKENS,
                ..CompactionSettings::default()
            },
            now_ms: 0,
        };
        let prepared = PreparedCompaction::new(snapshot(entries.clone()), request);
        let default_bound = ExtractiveSummarizer::default();
        let bounded = default_bound.summarize_now(prepared.summary_input());
        assert_bounded(&name, &bounded, default_bound.max_summary_tokens);
        let summarizer = ExtractiveSummarizer { max_summary_tokens: ROOMY_SUMMARY_TOKENS };
        let state = summarizer.summarize_now(prepared.summary_input());
        let kept = prepared.retained().to_vec();
        let state_json = serde_json::to_string(&state).unwrap();
        let mentioned = state.mentioned_entry_ids();
        let Conclusion::Ready(ready) =
            prepared.conclude(state.clone(), "extractive", &store, "t", &counter).unwrap()
        else {
            panic!("{name}: the preservation check failed")
        };
        assert!(ready.record().tokens_after < ready.record().tokens_before, "{name}: no reduction");
        assert!(matches!(ready.baseline().last(), Some(BaselineEntry::New(_))));

        let decisions = state.decisions.iter().map(|d| d.text.as_str()).collect::<Vec<_>>().join("\n");
        for entry in entries.iter().filter(|e| !kept.contains(&e.id)) {
            for line in decision_lines(entry) {
                assert!(
                    signals::represented_in(line, &decisions),
                    "{name}: decision {line:?} of {} lost",
                    entry.id
                );
                checked_decisions += 1;
            }
        }
        for file in patch_files(&entries) {
            assert!(
                state.affected_files.contains(&file),
                "{name}: patched file {file} lost: {:?}",
                state.affected_files
            );
            checked_files += 1;
        }
        for entry in entries.iter().filter(|e| e.role == Role::Assistant) {
            let text = &entry.content.text;
            let marker = MARKERS.iter().find(|m| text.contains(*m)).copied().or_else(|| {
                (entry.role == Role::Assistant
                    && signals::fenced_commands(text).iter().any(|c| c.starts_with("git diff")))
                .then_some("git diff")
            });
            let Some(marker) = marker else { continue };
            checked_markers += 1;
            let survives = kept.contains(&entry.id)
                || (mentioned.contains(&entry.id.to_string()) && state_json.contains(marker));
            assert!(survives, "{name}: final-patch marker {marker:?} of {} lost", entry.id);
        }
    }
    assert!(checked_markers >= 50, "only {checked_markers} markers in the corpus");
    assert!(checked_decisions > 100, "only {checked_decisions} decisions in the corpus");
    assert!(checked_files >= 50, "only {checked_files} patched files in the corpus");
}
