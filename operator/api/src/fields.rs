//! Names of the individual policy fields, used by platform locks, bounds, provenance and clamps.

use serde::{Deserialize, Serialize};

/// Declares a field enum whose serialized names are the fields' camelCase paths.
macro_rules! field_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $path:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
        pub enum $name {
            $(
                #[doc = concat!("`", $path, "`")]
                #[serde(rename = $path)]
                $variant,
            )+
        }

        impl $name {
            /// Every field, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The field's dotted camelCase path inside a policy spec.
            pub fn path(self) -> &'static str {
                match self { $($name::$variant => $path),+ }
            }

            /// Look a field up by its path.
            pub fn from_path(path: &str) -> Option<Self> {
                match path { $($path => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.path())
            }
        }
    };
}

field_enum!(
    /// Any policy field a platform team can lock.
    PolicyField {
        WarningPercent => "budget.warningPercent",
        HighRiskPercent => "budget.highRiskPercent",
        CriticalPercent => "budget.criticalPercent",
        ReservedCompletionTokens => "budget.reservedCompletionTokens",
        ProtocolOverheadTokens => "budget.protocolOverheadTokens",
        SafetyMarginTokens => "budget.safetyMarginTokens",
        StageSystemTokens => "budget.stages.systemTokens",
        StageToolsTokens => "budget.stages.toolsTokens",
        StageMemoryTokens => "budget.stages.memoryTokens",
        StageToolResultsTokens => "budget.stages.toolResultsTokens",
        StageHistoryTokens => "budget.stages.historyTokens",
        MaxResultChars => "toolResults.maxResultChars",
        PreviewChars => "toolResults.previewChars",
        PreviewLines => "toolResults.previewLines",
        ElideAfterRounds => "toolResults.elideAfterRounds",
        ElideOverChars => "toolResults.elideOverChars",
        ElideKeepChars => "toolResults.elideKeepChars",
        RetentionRules => "retention.rules",
        CompactionAutomatic => "compaction.automatic",
        CompactionTriggerPercent => "compaction.triggerPercent",
        KeepRecentEntries => "compaction.keepRecentEntries",
        RetainGenerations => "compaction.retainGenerations",
        SummarizerModel => "compaction.summarizer.model",
        MaxSummaryTokens => "compaction.summarizer.maxSummaryTokens",
        SummarizerProvider => "compaction.summarizer.provider",
        SummarizerEndpoint => "compaction.summarizer.endpoint",
        SummarizerCredentials => "compaction.summarizer.credentialsSecretRef",
        RequiredFields => "compaction.requiredFields",
        ResponseCacheTtlSeconds => "cache.responseCacheTtlSeconds",
        Breakpoints => "cache.breakpoints",
        PurgeMinSavingsRatio => "cache.purgeMinSavingsRatio",
        RedactionEnabled => "redaction.enabled",
        RedactionExtraPatterns => "redaction.extraPatterns",
        ReportingIntervalSeconds => "reporting.intervalSeconds",
        VolumeArtifactsMaxAgeSeconds => "volume.artifacts.maxAgeSeconds",
        VolumeArtifactsMaxBytes => "volume.artifacts.maxBytes",
        VolumeGenerationsMaxAgeSeconds => "volume.generations.maxAgeSeconds",
        VolumeGenerationsMaxBytes => "volume.generations.maxBytes",
        VolumeRecordsMaxAgeSeconds => "volume.compactionRecords.maxAgeSeconds",
        VolumeRecordsMaxBytes => "volume.compactionRecords.maxBytes",
        VolumeSweepIntervalSeconds => "volume.sweepIntervalSeconds",
        FullSchemaTools => "capabilities.fullSchemaTools",
        BatchTools => "capabilities.batchTools",
        DelegationTools => "delegation.tools",
        DelegationReturnTokens => "delegation.returnTokens",
    }
);

field_enum!(
    /// A numeric policy field a platform team can bound.
    NumericField {
        WarningPercent => "budget.warningPercent",
        HighRiskPercent => "budget.highRiskPercent",
        CriticalPercent => "budget.criticalPercent",
        ReservedCompletionTokens => "budget.reservedCompletionTokens",
        ProtocolOverheadTokens => "budget.protocolOverheadTokens",
        SafetyMarginTokens => "budget.safetyMarginTokens",
        StageSystemTokens => "budget.stages.systemTokens",
        StageToolsTokens => "budget.stages.toolsTokens",
        StageMemoryTokens => "budget.stages.memoryTokens",
        StageToolResultsTokens => "budget.stages.toolResultsTokens",
        StageHistoryTokens => "budget.stages.historyTokens",
        MaxResultChars => "toolResults.maxResultChars",
        PreviewChars => "toolResults.previewChars",
        PreviewLines => "toolResults.previewLines",
        ElideAfterRounds => "toolResults.elideAfterRounds",
        ElideOverChars => "toolResults.elideOverChars",
        ElideKeepChars => "toolResults.elideKeepChars",
        CompactionTriggerPercent => "compaction.triggerPercent",
        KeepRecentEntries => "compaction.keepRecentEntries",
        RetainGenerations => "compaction.retainGenerations",
        MaxSummaryTokens => "compaction.summarizer.maxSummaryTokens",
        ResponseCacheTtlSeconds => "cache.responseCacheTtlSeconds",
        PurgeMinSavingsRatio => "cache.purgeMinSavingsRatio",
        ReportingIntervalSeconds => "reporting.intervalSeconds",
        VolumeArtifactsMaxAgeSeconds => "volume.artifacts.maxAgeSeconds",
        VolumeArtifactsMaxBytes => "volume.artifacts.maxBytes",
        VolumeGenerationsMaxAgeSeconds => "volume.generations.maxAgeSeconds",
        VolumeGenerationsMaxBytes => "volume.generations.maxBytes",
        VolumeRecordsMaxAgeSeconds => "volume.compactionRecords.maxAgeSeconds",
        VolumeRecordsMaxBytes => "volume.compactionRecords.maxBytes",
        VolumeSweepIntervalSeconds => "volume.sweepIntervalSeconds",
        FullSchemaTools => "capabilities.fullSchemaTools",
        BatchTools => "capabilities.batchTools",
        DelegationReturnTokens => "delegation.returnTokens",
    }
);

impl NumericField {
    /// The same field as a [`PolicyField`].
    pub fn as_policy_field(self) -> PolicyField {
        // Every numeric path is also a policy path; the test below proves it for all variants.
        PolicyField::from_path(self.path()).unwrap_or(PolicyField::WarningPercent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_field_is_a_policy_field() {
        for field in NumericField::ALL {
            assert_eq!(PolicyField::from_path(field.path()).map(PolicyField::path), Some(field.path()));
        }
    }

    #[test]
    fn serialized_names_are_paths() {
        let json = serde_json::to_string(&PolicyField::MaxSummaryTokens).unwrap_or_default();
        assert_eq!(json, "\"compaction.summarizer.maxSummaryTokens\"");
    }
}
