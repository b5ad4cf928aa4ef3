//! Spilling oversized tool outputs to the artifact store, leaving a preview and a marker line.
//!
//! An output with more than [`SpillPolicy::max_result_chars`] characters is stored whole in the
//! tenant's artifact store. The window keeps a preview — at most `preview_lines` lines and at most
//! `preview_chars` characters, cut at a line end when possible — followed by one marker line:
//!
//! ```text
//! [strata: output spilled: 48,213 chars, 1,204 lines; showing first 60 lines. data_ref=art:sha256:<hex> — call strata_read_output with this data_ref to read more (head, slice or search)]
//! ```
//!
//! The marker always starts on its own line, begins with [`SPILL_MARKER_PREFIX`] and ends the
//! window text. Counts are characters and lines of the original output (a final unterminated line
//! counts). The result depends only on the output and the policy, so the same output always yields
//! the same window text and the prompt cache stays valid.

use serde::{Deserialize, Serialize};

use super::error::ToolOutputError;
use super::text::{grouped, line_count, prefix_within};
use crate::artifacts::{ArtifactRef, ArtifactStore};

/// How the marker line of a spilled output begins.
pub const SPILL_MARKER_PREFIX: &str = "[strata: output spilled: ";

/// When and how tool outputs are spilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SpillPolicy {
    /// Outputs with more characters than this are spilled.
    pub max_result_chars: usize,
    /// Maximum characters of the preview kept in the window.
    pub preview_chars: usize,
    /// Maximum lines of the preview kept in the window.
    pub preview_lines: usize,
}

impl Default for SpillPolicy {
    fn default() -> Self {
        Self { max_result_chars: 2000, preview_chars: 250, preview_lines: 60 }
    }
}

/// What [`spill`] did with an output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillOutcome {
    /// The text that goes into the window: the output itself, or a preview plus marker line.
    pub window_text: String,
    /// Where the full output is stored, when it was spilled.
    pub data_ref: Option<ArtifactRef>,
    /// Characters in the original output.
    pub original_chars: usize,
    /// Lines in the original output.
    pub original_lines: usize,
}

impl SpillOutcome {
    /// Whether the output was moved to the artifact store.
    pub fn spilled(&self) -> bool {
        self.data_ref.is_some()
    }
}

/// Spills `output` to `store` for `tenant` when it is longer than the policy allows.
pub fn spill(
    output: &str,
    policy: &SpillPolicy,
    store: &ArtifactStore,
    tenant: &str,
) -> Result<SpillOutcome, ToolOutputError> {
    let original_chars = output.chars().count();
    let original_lines = line_count(output);
    if original_chars <= policy.max_result_chars {
        return Ok(SpillOutcome {
            window_text: output.to_owned(),
            data_ref: None,
            original_chars,
            original_lines,
        });
    }
    let data_ref = store.put(tenant, output.as_bytes()).map_err(|source| ToolOutputError::Store {
        tenant: tenant.to_owned(),
        chars: original_chars,
        source,
    })?;
    let window_text = render_spilled(output, policy, &data_ref);
    Ok(SpillOutcome { window_text, data_ref: Some(data_ref), original_chars, original_lines })
}

/// The window text of a spilled `output` stored as `data_ref`: preview plus marker line.
pub fn render_spilled(output: &str, policy: &SpillPolicy, data_ref: &ArtifactRef) -> String {
    let preview = prefix_within(output, policy.preview_lines, policy.preview_chars);
    let shown_lines = line_count(preview);
    let shown = if preview.is_empty() || preview.ends_with('\n') {
        format!("showing first {} lines", grouped(shown_lines))
    } else {
        format!("showing first {} chars", grouped(preview.chars().count()))
    };
    let mut text = String::with_capacity(preview.len() + 256);
    text.push_str(preview);
    if !preview.is_empty() && !preview.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "{SPILL_MARKER_PREFIX}{} chars, {} lines; {shown}. data_ref={data_ref} — call strata_read_output \
         with this data_ref to read more (head, slice or search)]",
        grouped(output.chars().count()),
        grouped(line_count(output)),
    ));
    text
}
