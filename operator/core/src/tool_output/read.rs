//! The model tool `strata_read_output`: head, slice or search of a spilled or elided output.
//!
//! Arguments (JSON object): `data_ref` (required, `art:sha256:<hex>`), `mode` (required: `head`,
//! `slice` or `search`) and per mode:
//! * `head`: `lines` (default 60), `chars` (default 4000);
//! * `slice`: `offset` (characters from the start, default 0), `length` (characters, default the
//!   answer limit);
//! * `search`: `pattern` (required regular expression, matched per line), `max_matches`
//!   (default 50).
//!
//! Answers are bounded to `max_chars` characters of content (the spill policy's
//! `max_result_chars`). Every answer ends with one footer line, `[strata: …]`, saying what was
//! shown and whether more remains. For head and slice the footer is preceded by `\n` and
//! everything before that `\n` is the stored text verbatim, so the last `\n[strata: ` splits an
//! answer exactly; search answers are `line N: text` lines followed by the footer.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::{ReadArgsError, ToolOutputError};
use super::text::{char_boundary, grouped, line_count};
use crate::artifacts::{ArtifactRef, ArtifactStore};

/// The tool name the model calls.
pub const READ_OUTPUT_TOOL_NAME: &str = "strata_read_output";

const DEFAULT_HEAD_LINES: usize = 60;
const DEFAULT_HEAD_CHARS: usize = 4000;
const DEFAULT_MAX_MATCHES: usize = 50;

/// One `strata_read_output` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum ReadRequest {
    /// The first lines of the output.
    Head {
        /// The stored output.
        data_ref: ArtifactRef,
        /// Maximum lines.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lines: Option<usize>,
        /// Maximum characters.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chars: Option<usize>,
    },
    /// A character range of the output.
    Slice {
        /// The stored output.
        data_ref: ArtifactRef,
        /// First character, 0-based.
        #[serde(default)]
        offset: usize,
        /// Number of characters.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        length: Option<usize>,
    },
    /// Lines matching a regular expression.
    Search {
        /// The stored output.
        data_ref: ArtifactRef,
        /// The regular expression.
        pattern: String,
        /// Maximum matching lines.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_matches: Option<usize>,
    },
}

impl ReadRequest {
    /// Parses the JSON arguments of a `strata_read_output` tool call, naming any bad field.
    pub fn from_arguments_json(arguments: &str) -> Result<Self, ReadArgsError> {
        let value: Value =
            serde_json::from_str(arguments).map_err(|e| ReadArgsError::NotJson { reason: e.to_string() })?;
        let Value::Object(fields) = value else {
            return Err(ReadArgsError::NotObject);
        };
        let mode = required_string(&fields, "mode")?;
        let allowed: &[&str] = match mode.as_str() {
            "head" => &["lines", "chars"],
            "slice" => &["offset", "length"],
            "search" => &["pattern", "max_matches"],
            _ => {
                return Err(ReadArgsError::Invalid {
                    field: "mode".into(),
                    problem: format!("must be \"head\", \"slice\" or \"search\", got {mode:?}"),
                });
            }
        };
        if let Some(extra) = fields
            .keys()
            .find(|k| !matches!(k.as_str(), "mode" | "data_ref") && !allowed.contains(&k.as_str()))
        {
            return Err(ReadArgsError::Unexpected { field: extra.clone(), mode });
        }
        let data_ref_text = required_string(&fields, "data_ref")?;
        let data_ref = data_ref_text.parse::<ArtifactRef>().map_err(|_| ReadArgsError::Invalid {
            field: "data_ref".into(),
            problem: format!("must look like art:sha256:<64 hex digits>, got {data_ref_text:?}"),
        })?;
        Ok(match mode.as_str() {
            "head" => ReadRequest::Head {
                data_ref,
                lines: optional_count(&fields, "lines")?,
                chars: optional_count(&fields, "chars")?,
            },
            "slice" => ReadRequest::Slice {
                data_ref,
                offset: optional_count(&fields, "offset")?.unwrap_or(0),
                length: optional_count(&fields, "length")?,
            },
            _ => ReadRequest::Search {
                data_ref,
                pattern: required_string(&fields, "pattern")?,
                max_matches: optional_count(&fields, "max_matches")?,
            },
        })
    }

    /// The artifact the request reads.
    pub fn data_ref(&self) -> &ArtifactRef {
        match self {
            ReadRequest::Head { data_ref, .. }
            | ReadRequest::Slice { data_ref, .. }
            | ReadRequest::Search { data_ref, .. } => data_ref,
        }
    }

    fn mode(&self) -> &'static str {
        match self {
            ReadRequest::Head { .. } => "head",
            ReadRequest::Slice { .. } => "slice",
            ReadRequest::Search { .. } => "search",
        }
    }
}

fn required_string(fields: &Map<String, Value>, field: &'static str) -> Result<String, ReadArgsError> {
    match fields.get(field) {
        None | Some(Value::Null) => Err(ReadArgsError::Missing { field }),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => Err(ReadArgsError::Invalid {
            field: field.into(),
            problem: format!("must be a string, got {other}"),
        }),
    }
}

fn optional_count(fields: &Map<String, Value>, field: &'static str) -> Result<Option<usize>, ReadArgsError> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => {
            number.as_u64().and_then(|n| usize::try_from(n).ok()).map(Some).ok_or_else(|| {
                ReadArgsError::Invalid {
                    field: field.into(),
                    problem: format!("must be a non-negative integer, got {number}"),
                }
            })
        }
        Some(other) => Err(ReadArgsError::Invalid {
            field: field.into(),
            problem: format!("must be a non-negative integer, got {other}"),
        }),
    }
}

/// Executes `request` against `tenant`'s artifacts and renders the answer for the model, with at
/// most `max_chars` characters of content plus the footer line.
pub fn read_output(
    store: &ArtifactStore,
    tenant: &str,
    request: &ReadRequest,
    max_chars: usize,
) -> Result<String, ToolOutputError> {
    let read_error = |source| ToolOutputError::Read {
        tenant: tenant.to_owned(),
        data_ref: request.data_ref().clone(),
        mode: request.mode(),
        source,
    };
    match request {
        ReadRequest::Head { data_ref, lines, chars } => {
            let lines = lines.unwrap_or(DEFAULT_HEAD_LINES);
            let chars = chars.unwrap_or(DEFAULT_HEAD_CHARS).min(max_chars);
            let bytes = store.get(tenant, data_ref).map_err(read_error)?;
            let text = String::from_utf8_lossy(&bytes);
            let head = store.head(tenant, data_ref, lines, chars).map_err(read_error)?;
            let total_chars = text.chars().count();
            let shown_chars = head.chars().count();
            Ok(format!(
                "{head}\n[strata: head of {data_ref}: {} of {} chars, {} of {} lines{}]",
                grouped(shown_chars),
                grouped(total_chars),
                grouped(line_count(&head)),
                grouped(line_count(&text)),
                more_hint(total_chars - shown_chars, shown_chars),
            ))
        }
        ReadRequest::Slice { data_ref, offset, length } => {
            let length = length.unwrap_or(max_chars).min(max_chars);
            let bytes = store.get(tenant, data_ref).map_err(read_error)?;
            let text = String::from_utf8_lossy(&bytes);
            let start = char_boundary(&text, *offset);
            let rest = &text[start..];
            let body = &rest[..char_boundary(rest, length)];
            let total_chars = text.chars().count();
            let end = (*offset).min(total_chars) + body.chars().count();
            Ok(format!(
                "{body}\n[strata: slice of {data_ref}: chars {}..{} of {}{}]",
                grouped(*offset),
                grouped(end),
                grouped(total_chars),
                more_hint(total_chars - end, end),
            ))
        }
        ReadRequest::Search { data_ref, pattern, max_matches } => {
            let wanted = max_matches.unwrap_or(DEFAULT_MAX_MATCHES);
            let matches =
                store.search(tenant, data_ref, pattern, wanted.saturating_add(1)).map_err(read_error)?;
            let mut body = String::new();
            let mut shown = 0;
            let mut cut_by_size = false;
            for found in matches.iter().take(wanted) {
                let line = format!("line {}: {}\n", found.line_number, found.line);
                let used = body.chars().count();
                if used + line.chars().count() > max_chars {
                    let room = max_chars.saturating_sub(used);
                    if shown == 0 && room > 0 {
                        body.push_str(&line[..char_boundary(&line, room)]);
                        body.push('\n');
                    }
                    cut_by_size = true;
                    break;
                }
                body.push_str(&line);
                shown += 1;
            }
            let more = if cut_by_size {
                "; answer size limit reached, narrow the pattern or use slice".to_owned()
            } else if matches.len() > wanted {
                format!("; more matches exist, raise max_matches above {wanted}")
            } else {
                String::new()
            };
            Ok(format!(
                "{body}[strata: search of {data_ref} for {pattern:?}: {} matching lines shown{more}]",
                grouped(shown)
            ))
        }
    }
}

fn more_hint(remaining_chars: usize, next_offset: usize) -> String {
    if remaining_chars == 0 {
        "; end of output".to_owned()
    } else {
        format!("; {} more chars, continue with mode slice offset {next_offset}", grouped(remaining_chars))
    }
}
