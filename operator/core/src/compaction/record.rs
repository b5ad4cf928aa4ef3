//! The compaction record (§17.15.3, §17.22.3): its JSON shape (the API's `CompactionRecord`, plus
//! the span and asset lists), its stable ID, RFC 3339 time, and the ≤ 4096-byte termination form.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::plan::CompactionMode;

/// The Kubernetes termination-message limit.
pub const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// Outcome of the preservation check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum QualityCheck {
    /// Every required item is represented.
    #[default]
    Passed,
    /// Something is missing; the old generation stays CURRENT.
    Failed,
}

/// One compaction, purge or rollback, as kept beside the journal, reported in the termination
/// message and shown in a CompactionJob's `status.record` (seed 001 §17.15.3 and §17.22.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactionRecord {
    /// `cmp:` + a stable hash of the inputs.
    pub compaction_id: String,
    /// Mode that ran (always set by Strata; optional so that records written without it, by older
    /// versions, still read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<CompactionMode>,
    /// Why it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Generation that was compacted.
    pub source_generation: u64,
    /// Generation that became CURRENT (equal to the source when nothing changed).
    pub result_generation: u64,
    /// Tokens of the compacted span before.
    pub tokens_before: u64,
    /// Tokens of the new baseline that replaced it.
    pub tokens_after: u64,
    /// CompactedState fields that hold something.
    #[serde(default)]
    pub preserved_fields: Vec<String>,
    /// What the preservation check found missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_items: Vec<String>,
    /// Passed or Failed.
    pub quality_check: QualityCheck,
    /// The summary entry, e.g. `summary_212`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_asset_id: Option<String>,
    /// Privacy scope of the compacted state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy_scope: Option<String>,
    /// Summariser model, `strata-extractive/1`, or the operation for purge and rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_or_service_version: Option<String>,
    /// RFC 3339 creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// First and last entry ID of the span read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_span_ids: Vec<String>,
    /// Entries kept verbatim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assets_retained: Vec<String>,
    /// Entries removed from the window (reopenable from `rawArchive`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assets_removed: Vec<String>,
    /// How many entries were kept (the list may be shortened in the termination message).
    #[serde(default)]
    pub assets_retained_count: u64,
    /// How many entries were removed.
    #[serde(default)]
    pub assets_removed_count: u64,
    /// Artifact holding the removed entries as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_archive: Option<String>,
    /// Set when lists were shortened to fit the termination message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// `cmp:` followed by the first 32 hex digits of SHA-256 over the given parts (length-prefixed).
pub fn compaction_id(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hex::encode(hasher.finalize());
    format!("cmp:{}", &digest[..32])
}

/// Unix milliseconds as RFC 3339 UTC with second precision, e.g. `2026-05-01T12:00:00Z`.
pub fn rfc3339(unix_ms: u64) -> String {
    let seconds = unix_ms / 1000;
    let days = seconds / 86_400;
    let of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        (of_day % 3600) / 60,
        of_day % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

impl CompactionRecord {
    /// Pretty JSON for stdout.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Compact JSON of at most `limit` bytes: lists are shortened (newest kept) and long strings
    /// clipped until it fits, and `truncated` is set; the result is always valid JSON.
    pub fn to_termination_message(&self, limit: usize) -> String {
        let encode = |record: &CompactionRecord| serde_json::to_string(record).unwrap_or_default();
        let mut record = self.clone();
        let mut json = encode(&record);
        if json.len() <= limit {
            return json;
        }
        record.truncated = true;
        for item in &mut record.missing_items {
            *item = clip_chars(item, 200);
        }
        if let Some(reason) = &mut record.reason {
            *reason = clip_chars(reason, 200);
        }
        json = encode(&record);
        while json.len() > limit {
            let lists = [
                &mut record.assets_removed,
                &mut record.assets_retained,
                &mut record.missing_items,
                &mut record.preserved_fields,
                &mut record.source_span_ids,
            ];
            let Some(longest) =
                lists.into_iter().filter(|list| !list.is_empty()).max_by_key(|list| list.len())
            else {
                break;
            };
            let keep = longest.len() / 2;
            longest.drain(..longest.len() - keep);
            json = encode(&record);
        }
        if json.len() > limit {
            record.reason = None;
            record.missing_items =
                vec![format!("{} items missing; see the full record", self.missing_items.len())];
            json = encode(&record);
        }
        json
    }
}

fn clip_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_767_225_599_999), "2025-12-31T23:59:59Z");
    }

    #[test]
    fn termination_message_fits_and_stays_valid_json() {
        let record = CompactionRecord {
            compaction_id: compaction_id(&["a", "b"]),
            mode: Some(CompactionMode::Budget),
            reason: Some("r".repeat(2000)),
            source_generation: 4,
            result_generation: 5,
            tokens_before: 18_420,
            tokens_after: 3650,
            preserved_fields: vec!["decisions".into()],
            missing_items: (0..100).map(|n| format!("missing item {n} {}", "é".repeat(300))).collect(),
            quality_check: QualityCheck::Failed,
            summary_asset_id: None,
            privacy_scope: Some("tenant".into()),
            model_or_service_version: Some("strata-extractive/1".into()),
            created_at: Some(rfc3339(0)),
            source_span_ids: vec!["msg_1".into(), "msg_9000".into()],
            assets_retained: (0..500).map(|n| format!("msg_{n}")).collect(),
            assets_removed: (0..5000).map(|n| format!("tool_res_{n}")).collect(),
            assets_retained_count: 500,
            assets_removed_count: 5000,
            raw_archive: None,
            truncated: false,
        };
        let message = record.to_termination_message(TERMINATION_MESSAGE_LIMIT);
        assert!(message.len() <= TERMINATION_MESSAGE_LIMIT, "{}", message.len());
        let back: CompactionRecord = serde_json::from_str(&message).unwrap();
        assert!(back.truncated);
        assert_eq!(back.assets_removed_count, 5000);
        assert_eq!(back.compaction_id, record.compaction_id);
        assert!(compaction_id(&["a", "b"]) != compaction_id(&["ab"]));
    }
}
