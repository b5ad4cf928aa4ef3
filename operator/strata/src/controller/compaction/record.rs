//! Reading what `strata compact` left in its pod's status: the compaction record (its termination
//! message on success) or, on failure, its exit code and the error it wrote there, turned into a
//! reason and a message a person can act on.

use k8s_openapi::api::core::v1::Pod;
use strata_api::compaction_job::CompactionRecord;

use super::job::COMPACT_CONTAINER;
use crate::compact::exit::{EXIT_DATA, EXIT_IO, EXIT_RETRY, EXIT_UNAVAILABLE, EXIT_USAGE};

/// Longest failure message copied into a condition or an Event.
pub const MESSAGE_LIMIT: usize = 1000;

/// How the compact container of a Job's newest terminated pod ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Termination {
    /// The container's exit code.
    pub exit_code: i32,
    /// The kubelet's reason, e.g. `Error` or `OOMKilled`.
    pub reason: Option<String>,
    /// The termination message (the record, the error `strata compact` wrote, or the log tail).
    pub message: Option<String>,
}

impl Termination {
    /// A CamelCase reason for the CompactionJob from the exit code of `strata compact`.
    pub fn failure_reason(&self) -> &'static str {
        match u8::try_from(self.exit_code) {
            Ok(EXIT_USAGE) => "InvalidRequest",
            Ok(EXIT_DATA) => "JournalDamaged",
            Ok(EXIT_UNAVAILABLE) => "SummarizerUnavailable",
            Ok(EXIT_IO) => "StorageError",
            Ok(EXIT_RETRY) => "RetryLater",
            _ if self.reason.as_deref() == Some("OOMKilled") => "OOMKilled",
            _ => "JobFailed",
        }
    }

    /// What went wrong, in one message: the exit code, the kubelet's reason and the error text.
    pub fn failure_message(&self) -> String {
        let reason = self.reason.as_deref().filter(|r| !r.is_empty() && *r != "Error");
        let mut text = format!("strata compact exited with code {}", self.exit_code);
        if let Some(reason) = reason {
            text.push_str(&format!(" ({reason})"));
        }
        if let Some(message) = self.message.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
            text.push_str(": ");
            text.push_str(message.strip_prefix("strata compact: ").unwrap_or(message));
        }
        truncate(&text, MESSAGE_LIMIT)
    }
}

/// `text` cut to at most `limit` characters, marked with an ellipsis when cut.
pub fn truncate(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(limit.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The record in a termination message, if it is one.
pub fn parse_record(message: &str) -> Option<CompactionRecord> {
    serde_json::from_str(message.trim()).ok()
}

/// How the compact container ended in the newest terminated pod of the Job.
pub fn last_termination(pods: &[Pod]) -> Option<Termination> {
    let mut terminated: Vec<(Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>, Termination)> =
        pods.iter()
            .flat_map(|pod| pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()))
            .filter(|status| status.name == COMPACT_CONTAINER)
            .filter_map(|status| {
                let state = status.state.as_ref()?.terminated.as_ref()?;
                let termination = Termination {
                    exit_code: state.exit_code,
                    reason: state.reason.clone(),
                    message: state.message.clone(),
                };
                Some((state.finished_at.as_ref(), termination))
            })
            .collect();
    terminated.sort_by(|a, b| a.0.cmp(&b.0));
    terminated.pop().map(|(_, termination)| termination)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_other_messages_do_not() {
        let message = r#"{"compactionId":"cmp:1","mode":"Budget","sourceGeneration":3,"resultGeneration":4,"tokensBefore":170000,"tokensAfter":21000,"preservedFields":["decisions"],"qualityCheck":"Passed"}"#;
        let Some(record) = parse_record(&format!("{message}\n")) else { panic!("{message} is a record") };
        assert_eq!(record.compaction_id, "cmp:1");
        assert_eq!(record.tokens_after, 21000);
        assert!(parse_record("panic: out of memory").is_none());
    }

    #[test]
    fn a_failure_names_its_exit_code_and_the_error_strata_compact_wrote() {
        let unavailable = Termination {
            exit_code: 69,
            reason: Some("Error".into()),
            message: Some("strata compact: summariser claude-haiku-4-5 failed: HTTP 404 model not found; nothing changed\n".into()),
        };
        assert_eq!(unavailable.failure_reason(), "SummarizerUnavailable");
        assert_eq!(
            unavailable.failure_message(),
            "strata compact exited with code 69: summariser claude-haiku-4-5 failed: HTTP 404 model not found; nothing changed"
        );
        let killed = Termination { exit_code: 137, reason: Some("OOMKilled".into()), message: None };
        assert_eq!(killed.failure_reason(), "OOMKilled");
        assert_eq!(killed.failure_message(), "strata compact exited with code 137 (OOMKilled)");
        let long = Termination { exit_code: 1, reason: None, message: Some("x".repeat(5000)) };
        assert_eq!(long.failure_reason(), "JobFailed");
        assert_eq!(long.failure_message().chars().count(), MESSAGE_LIMIT);
    }
}
