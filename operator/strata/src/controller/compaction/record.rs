//! Reading the compaction record that `strata compact` writes as its pod's termination message.

use k8s_openapi::api::core::v1::Pod;
use strata_api::compaction_job::CompactionRecord;

use super::job::COMPACT_CONTAINER;

/// The record in a termination message, if it is one.
pub fn parse_record(message: &str) -> Option<CompactionRecord> {
    serde_json::from_str(message.trim()).ok()
}

/// The termination message of the compact container in the newest terminated pod of the Job.
pub fn termination_message(pods: &[Pod]) -> Option<String> {
    let mut terminated: Vec<(Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>, String)> = pods
        .iter()
        .flat_map(|pod| pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()))
        .filter(|status| status.name == COMPACT_CONTAINER)
        .filter_map(|status| {
            let state = status.state.as_ref()?.terminated.as_ref()?;
            Some((state.finished_at.as_ref(), state.message.clone()?))
        })
        .collect();
    terminated.sort_by(|a, b| a.0.cmp(&b.0));
    terminated.pop().map(|(_, message)| message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_other_messages_do_not() {
        let message = r#"{"compactionId":"cmp:1","sourceGeneration":3,"resultGeneration":4,"tokensBefore":170000,"tokensAfter":21000,"preservedFields":["decisions"],"qualityCheck":"Passed"}"#;
        let record = parse_record(&format!("{message}\n")).unwrap_or_default();
        assert_eq!(record.compaction_id, "cmp:1");
        assert_eq!(record.tokens_after, 21000);
        assert!(parse_record("panic: out of memory").is_none());
    }
}
