//! Shared test support: loading the real mini-swe-agent trajectories of ../shared/corpus as journal entries.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};

use strata_core::entry::{Content, Entry, EntryDraft, EntryKind, RetentionClass, Role, ToolResult};

/// Token estimate used where a test needs speed more than the real tokenizer (debug builds).
pub fn tokens_of(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

pub mod shared;

/// Every trajectory file of ../shared/corpus/swe-gemini3, sorted; `None` (after printing why) when
/// the corpus is absent, see [`shared::shared_path`].
pub fn corpus_files(test: &str) -> Option<Vec<PathBuf>> {
    let dir = shared::shared_path(test, "corpus/swe-gemini3")?;
    let listing = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus directory {} cannot be read: {e}", dir.display()));
    let mut files: Vec<PathBuf> =
        listing.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    files.sort();
    assert!(!files.is_empty(), "no *.json trajectories in {}", dir.display());
    Some(files)
}

/// One trajectory as entries numbered from 0, counted with [`tokens_of`].
pub fn load(path: &Path) -> Vec<Entry> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let messages =
        json["messages"].as_array().unwrap_or_else(|| panic!("{}: no messages array", path.display()));
    messages
        .iter()
        .enumerate()
        .map(|(n, message)| {
            let text = message["content"].as_str().unwrap_or_default().to_owned();
            let (kind, role, content) = match message["role"].as_str() {
                Some("assistant") => (EntryKind::ToolCall, Role::Assistant, Content::text(text)),
                Some("system") => (EntryKind::Message, Role::System, Content::text(text)),
                _ if text.starts_with("<returncode>") => (
                    EntryKind::ToolResult,
                    Role::Tool,
                    Content {
                        text: String::new(),
                        tool_calls: vec![],
                        tool_results: vec![ToolResult {
                            call_id: format!("c{n}"),
                            name: Some("bash".into()),
                            output: text,
                        }],
                    },
                ),
                _ => (EntryKind::Message, Role::User, Content::text(text)),
            };
            let tokens = tokens_of(&content.text)
                + content.tool_results.iter().map(|r| tokens_of(&r.output)).sum::<u64>()
                + 4;
            EntryDraft {
                kind,
                role,
                content,
                retention: RetentionClass::Working,
                created_at_ms: n as u64,
                tokens,
                artifact_refs: vec![],
            }
            .into_entry(n as u64)
        })
        .collect()
}

/// One trajectory as drafts, counted with `count`; `<returncode>` user messages become tool results.
pub fn load_drafts(path: &Path, count: &dyn Fn(&str) -> u64) -> Vec<EntryDraft> {
    load(path)
        .into_iter()
        .map(|entry| {
            let tokens = count(&entry.content.text)
                + entry.content.tool_results.iter().map(|r| count(&r.output)).sum::<u64>();
            EntryDraft {
                kind: entry.id.kind(),
                role: entry.role,
                content: entry.content,
                retention: entry.retention,
                created_at_ms: entry.created_at_ms,
                tokens,
                artifact_refs: Vec::new(),
            }
        })
        .collect()
}
