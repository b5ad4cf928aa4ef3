//! Artifact lifecycle: how long derived files on the volume are kept ([`VolumeRetention`]), what
//! the journal still references ([`referenced_artifacts`]) and which expired files a sweep
//! deletes ([`plan_sweep`]). Pure: the engine's sweep (`session::sweep`) does the IO.
//!
//! **Kinds.** Three kinds of derived files grow on an always-on agent's volume: *artifacts* (the
//! content-addressed store: spilled outputs, elided, expired and deduplicated copies, compaction
//! and purge archives of removed entries), superseded journal *generations* (rollback targets) and
//! *compaction records*. Each kind has an age and a byte limit ([`KeepLimits`]).
//!
//! **Decisions.** A file past `maxAgeSeconds` is deleted; then, while the kind's bytes on the
//! volume (including what must stay) exceed `maxBytes`, the oldest remaining file is deleted.
//! A protected file is never deleted, whatever the limits: the live generation, and every artifact
//! referenced by the live generation, by a generation the policy keeps for rollback, or by a
//! pending compaction proposal. When protected files alone exceed `maxBytes`, the plan says by how
//! much instead of deleting them.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::artifacts::ArtifactRef;
use crate::entry::Entry;

const MIB: u64 = 1024 * 1024;
const DAY_SECONDS: u64 = 86_400;

/// How long one kind of derived file is kept: by age and by the kind's bytes on the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeepLimits {
    /// A file that is no longer needed is deleted this many seconds after it stopped being needed
    /// (artifacts: since nothing kept references it; generations: since they were superseded;
    /// compaction records: since they were written).
    pub max_age_seconds: u64,
    /// Bytes this kind may take on the volume; past it the oldest unprotected files go first.
    pub max_bytes: u64,
}

/// How long the derived files on an agent's volume are kept, and how often the sweeper runs.
/// The defaults fit a 1Gi volume: 512 MiB of artifacts, 256 MiB of old generations and 16 MiB of
/// compaction records leave 240 MiB for the live journal and the gateway's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRetention {
    /// The artifact store: spilled outputs, elided/expired/deduplicated copies, archives.
    pub artifacts: KeepLimits,
    /// Superseded journal generations (rollback targets); at most `compaction.retainGenerations`
    /// of them are kept in any case. A live generation that alone exceeds `maxBytes` is compacted
    /// by the sweep.
    pub generations: KeepLimits,
    /// Compaction records (`compactions/*.json`).
    pub compaction_records: KeepLimits,
    /// Seconds between sweeps.
    pub sweep_interval_seconds: u32,
}

impl Default for VolumeRetention {
    fn default() -> Self {
        Self {
            artifacts: KeepLimits { max_age_seconds: 7 * DAY_SECONDS, max_bytes: 512 * MIB },
            generations: KeepLimits { max_age_seconds: 7 * DAY_SECONDS, max_bytes: 256 * MIB },
            compaction_records: KeepLimits { max_age_seconds: 30 * DAY_SECONDS, max_bytes: 16 * MIB },
            sweep_interval_seconds: 300,
        }
    }
}

/// What kind of derived file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepKind {
    /// An artifact-store file.
    Artifact,
    /// A superseded journal generation.
    Generation,
    /// A compaction record.
    CompactionRecord,
}

impl SweepKind {
    /// Every kind, in sweep order.
    pub const ALL: [SweepKind; 3] = [SweepKind::Generation, SweepKind::Artifact, SweepKind::CompactionRecord];

    /// Label value for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            SweepKind::Artifact => "artifact",
            SweepKind::Generation => "generation",
            SweepKind::CompactionRecord => "compaction_record",
        }
    }

    /// The limits of this kind.
    pub fn limits(self, retention: &VolumeRetention) -> KeepLimits {
        match self {
            SweepKind::Artifact => retention.artifacts,
            SweepKind::Generation => retention.generations,
            SweepKind::CompactionRecord => retention.compaction_records,
        }
    }
}

/// One file (or generation) a sweep considers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepCandidate {
    /// What identifies it to the caller (a path, a generation number).
    pub key: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// When its age starts (unix ms); see [`KeepLimits::max_age_seconds`].
    pub since_ms: u64,
    /// Still needed: never deleted.
    pub protected: bool,
}

/// Why a file is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepReason {
    /// Older than `maxAgeSeconds`.
    Age,
    /// The kind exceeded `maxBytes`; it was the oldest unprotected file.
    Bytes,
}

/// What a sweep of one kind deletes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Indices into the candidates, with the reason, in deletion order.
    pub doomed: Vec<(usize, SweepReason)>,
    /// Bytes of this kind left after the deletions.
    pub bytes_after: u64,
    /// How far the protected files alone keep the kind over `maxBytes` (0 when within it).
    pub over_budget_bytes: u64,
}

/// Decides which candidates go: every unprotected one past the age limit, then the oldest
/// unprotected ones (ties by key) while the total exceeds the byte limit. Protected candidates
/// count towards the total but are never chosen.
pub fn plan_sweep(candidates: &[SweepCandidate], limits: &KeepLimits, now_ms: u64) -> SweepPlan {
    let max_age_ms = limits.max_age_seconds.saturating_mul(1000);
    let mut total: u64 = candidates.iter().map(|c| c.bytes).sum();
    let mut doomed = Vec::new();
    let mut survivors = Vec::new();
    for (index, candidate) in candidates.iter().enumerate() {
        if candidate.protected {
            continue;
        }
        if now_ms.saturating_sub(candidate.since_ms) >= max_age_ms {
            total -= candidate.bytes;
            doomed.push((index, SweepReason::Age));
        } else {
            survivors.push(index);
        }
    }
    survivors.sort_by(|&a, &b| {
        (candidates[a].since_ms, &candidates[a].key).cmp(&(candidates[b].since_ms, &candidates[b].key))
    });
    for index in survivors {
        if total <= limits.max_bytes {
            break;
        }
        total -= candidates[index].bytes;
        doomed.push((index, SweepReason::Bytes));
    }
    SweepPlan { doomed, bytes_after: total, over_budget_bytes: total.saturating_sub(limits.max_bytes) }
}

fn artifact_ref_pattern() -> &'static Regex {
    static PATTERN: OnceLock<Regex> = OnceLock::new();
    PATTERN
        .get_or_init(|| Regex::new(r"art:sha256:([0-9a-f]{64})").expect("constant artifact pattern compiles"))
}

/// Adds the digest of every `art:sha256:<hex>` reference written in `text`.
pub fn scan_refs(text: &str, into: &mut BTreeSet<String>) {
    for found in artifact_ref_pattern().captures_iter(text) {
        if let Some(digest) = found.get(1) {
            into.insert(digest.as_str().to_owned());
        }
    }
}

/// The digests of every artifact `entries` reference: their recorded `artifact_refs` (spilled
/// outputs, compaction and purge archives), the stored copy of each tool output (what elision,
/// expiry and deduplication put in the store and name in the window) and every `data_ref` written
/// in their text, tool-call arguments and outputs (spill markers, elision stubs, summaries).
pub fn referenced_artifacts<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    for entry in entries {
        refs.extend(entry.artifact_refs.iter().map(|r| r.digest_hex().to_owned()));
        scan_refs(&entry.content.text, &mut refs);
        for call in &entry.content.tool_calls {
            scan_refs(&call.arguments_json, &mut refs);
        }
        for result in &entry.content.tool_results {
            refs.insert(ArtifactRef::for_bytes(result.output.as_bytes()).digest_hex().to_owned());
            scan_refs(&result.output, &mut refs);
        }
    }
    refs
}

/// The digests of the archives `entries` point at: the recorded `artifact_refs` of compaction and
/// purge summaries, which hold the removed entries (and so name further artifacts inside them).
pub fn archive_refs<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> BTreeSet<String> {
    entries
        .into_iter()
        .filter(|entry| entry.id.kind() == crate::entry::EntryKind::Summary)
        .flat_map(|entry| entry.artifact_refs.iter().map(|r| r.digest_hex().to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::entry::{Content, EntryId, EntryKind, RetentionClass, Role, ToolResult};

    fn candidate(key: &str, bytes: u64, since_ms: u64, protected: bool) -> SweepCandidate {
        SweepCandidate { key: key.into(), bytes, since_ms, protected }
    }

    fn keys(candidates: &[SweepCandidate], plan: &SweepPlan) -> Vec<String> {
        plan.doomed.iter().map(|(i, _)| candidates[*i].key.clone()).collect()
    }

    const LIMITS: KeepLimits = KeepLimits { max_age_seconds: 100, max_bytes: 1000 };

    #[test]
    fn age_limit_deletes_only_old_unprotected_files() {
        let files = [
            candidate("old", 10, 0, false),
            candidate("old-but-referenced", 10, 0, true),
            candidate("young", 10, 150_000, false),
        ];
        let plan = plan_sweep(&files, &LIMITS, 200_000);
        assert_eq!(keys(&files, &plan), ["old"]);
        assert_eq!(plan.doomed[0].1, SweepReason::Age);
        assert_eq!(plan.bytes_after, 20);
        assert_eq!(plan.over_budget_bytes, 0);
    }

    #[test]
    fn byte_limit_deletes_oldest_first_until_within_it() {
        let files = [
            candidate("c", 400, 3_000, false),
            candidate("a", 400, 1_000, false),
            candidate("live", 300, 0, true),
            candidate("b", 400, 2_000, false),
        ];
        let plan = plan_sweep(&files, &LIMITS, 5_000);
        assert_eq!(keys(&files, &plan), ["a", "b"], "oldest first, the referenced one stays");
        assert!(plan.doomed.iter().all(|(_, reason)| *reason == SweepReason::Bytes));
        assert_eq!(plan.bytes_after, 700);
    }

    #[test]
    fn both_limits_apply_together() {
        let files = [
            candidate("ancient", 100, 0, false),
            candidate("old", 600, 150_000, false),
            candidate("new", 600, 190_000, false),
        ];
        let plan = plan_sweep(&files, &LIMITS, 200_000);
        assert_eq!(keys(&files, &plan), ["ancient", "old"]);
        assert_eq!(plan.doomed[0].1, SweepReason::Age);
        assert_eq!(plan.doomed[1].1, SweepReason::Bytes);
        assert_eq!(plan.bytes_after, 600);
    }

    #[test]
    fn protected_files_are_never_deleted_even_over_budget() {
        let files = [candidate("live-1", 800, 0, true), candidate("live-2", 800, 0, true)];
        let plan = plan_sweep(&files, &LIMITS, u64::MAX / 2);
        assert!(plan.doomed.is_empty());
        assert_eq!(plan.over_budget_bytes, 600);
    }

    fn entry(number: u64, content: Content, artifact_refs: Vec<ArtifactRef>) -> Entry {
        Entry {
            id: EntryId::new(EntryKind::ToolResult, number),
            role: Role::Tool,
            content_hash: String::new(),
            content,
            retention: RetentionClass::Working,
            created_at_ms: 0,
            tokens: 1,
            artifact_refs,
        }
    }

    #[test]
    fn references_come_from_refs_outputs_and_written_data_refs() {
        let spilled = ArtifactRef::for_bytes(b"the whole spilled output");
        let archive = ArtifactRef::for_bytes(b"archive of removed entries");
        let quoted = ArtifactRef::for_bytes(b"a summary names this");
        let output = "a tool output that elision or dedup stores as is";
        let entries = [
            entry(
                1,
                Content {
                    tool_results: vec![ToolResult {
                        call_id: "c1".into(),
                        name: None,
                        output: format!("preview\n[strata: output spilled: data_ref={spilled}]"),
                    }],
                    ..Content::default()
                },
                vec![spilled.clone()],
            ),
            entry(
                2,
                Content {
                    tool_results: vec![ToolResult {
                        call_id: "c2".into(),
                        name: None,
                        output: output.into(),
                    }],
                    ..Content::default()
                },
                Vec::new(),
            ),
            entry(
                3,
                Content { text: format!("summary; evidence {quoted}"), ..Content::default() },
                vec![archive.clone()],
            ),
        ];
        let refs = referenced_artifacts(&entries);
        for expected in [&spilled, &archive, &quoted, &ArtifactRef::for_bytes(output.as_bytes())] {
            assert!(refs.contains(expected.digest_hex()), "{expected} must be referenced");
        }
        assert!(!refs.contains(ArtifactRef::for_bytes(b"unrelated").digest_hex()));
    }
}
