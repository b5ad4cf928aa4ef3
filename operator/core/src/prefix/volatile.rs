//! Detection of volatile material (timestamps, identifiers, counters) that must never enter the
//! stable prefix.
//!
//! Rules are deliberately narrow so normal prose, code and schemas pass:
//! * **Timestamp** — a date *with* a time: ISO-8601/RFC 3339 (`2024-05-01T10:15:00Z`,
//!   `2024-05-01 10:15`), ISO basic (`20240501T101500Z`), RFC 2822/HTTP dates
//!   (`Wed, 01 May 2024 10:15:00`), numeric or month-name dates followed by a clock time, and
//!   "current time is 10:15". A plain date (`2024-05-01`), a year (`2024`) or a clock time alone
//!   is allowed: release dates and cut-offs are stable facts.
//! * **CurrentDate** — a date announced as current: `today is 2024-05-01`, `current date: May 1, 2024`.
//! * **Uuid** — any 8-4-4-4-12 hex UUID.
//! * **RequestId** — provider/request identifiers with at least two digits in the random part
//!   (`req_011CSHoEeqs5C35K`, `msg_01XFDUDYJgAACzvnptvVoYEL`, `call_a1b2c3d4`, `chatcmpl-9x8y7z6w`,
//!   `toolu_…`, `resp_…`, `trace_…`, `span_…`), and labelled ids with a value containing at least two
//!   digits (`x-request-id: 4f9a1c0d`, `trace_id=…`, `correlation-id: …`). A header *name* alone
//!   (documentation such as "returns the x-request-id header") is allowed.
//! * **TraceId** — W3C `traceparent` values and bare 32-character hex strings mixing digits and
//!   letters. 40- and 64-character hex strings (git commits, SHA-256 digests, e.g. in pinned URLs)
//!   are allowed: they pin content and are stable by construction.
//! * **EpochTimestamp** — a 10-digit (seconds) or 13-digit (milliseconds) Unix time between 2001 and
//!   2100 right after a time-like label (`timestamp`, `created_at`, `expires`, `iat`, `now`, …).
//!   Bare long numbers are allowed.
//! * **UsageCounter** — `call #123`, `turn no. 5`, `turn 57` at the start of a line or after
//!   "current"/"this is", labelled counters (`"turn": 57`, `tokens_used=1200`, `queue_depth: 3`),
//!   `tokens used: 12,000`, `current usage: 40%`, and Tier-3 telemetry (`Context: 112,000 / 128,000`).
//!   Ordinary enumerations (`step 1`, `round 2`, `call 3 functions`) are allowed.

use std::sync::OnceLock;

use regex::{Captures, Regex};
use serde::Serialize;

/// Category of a volatile finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum VolatileKind {
    /// A date with a time of day.
    Timestamp,
    /// A date presented as "today" / "current".
    CurrentDate,
    /// A UUID.
    Uuid,
    /// A request, message, call or correlation identifier.
    RequestId,
    /// A distributed-tracing identifier.
    TraceId,
    /// A Unix epoch timestamp in a time-like field.
    EpochTimestamp,
    /// A usage counter or live telemetry value.
    UsageCounter,
}

impl std::fmt::Display for VolatileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Timestamp => "timestamp",
            Self::CurrentDate => "current date",
            Self::Uuid => "UUID",
            Self::RequestId => "request identifier",
            Self::TraceId => "trace identifier",
            Self::EpochTimestamp => "epoch timestamp",
            Self::UsageCounter => "usage counter",
        })
    }
}

/// One piece of volatile material.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolatileFinding {
    /// What was found.
    pub kind: VolatileKind,
    /// The offending text (at most [`MAX_SNIPPET_CHARS`] characters).
    pub snippet: String,
    /// Byte offset of the match in the canonical section text.
    pub offset: usize,
    /// Byte length of the whole match.
    #[serde(skip)]
    pub len: usize,
}

/// A client's system text with its volatile lines moved out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolatileSplit {
    /// The lines without volatile material, in order: the stable remainder for the prefix.
    pub stable: String,
    /// The lines carrying volatile material, in order, for below the cache boundary.
    pub moved: String,
    /// What was found in the moved lines.
    pub kinds: Vec<VolatileKind>,
}

/// Splits `text` into its stable lines and the lines that carry volatile material (every line a
/// finding touches, so a match across a line break moves both lines).
pub fn split_volatile_lines(text: &str) -> Result<VolatileSplit, DetectorError> {
    let findings = find_volatile(text)?;
    if findings.is_empty() {
        return Ok(VolatileSplit { stable: text.to_owned(), ..VolatileSplit::default() });
    }
    let mut stable = Vec::new();
    let mut moved = Vec::new();
    let mut start = 0;
    for line in text.split('\n') {
        let end = start + line.len();
        let touched = findings.iter().any(|f| f.offset <= end && f.offset + f.len.max(1) > start);
        if touched {
            moved.push(line)
        } else {
            stable.push(line)
        }
        start = end + 1;
    }
    let mut kinds: Vec<VolatileKind> = findings.iter().map(|finding| finding.kind).collect();
    kinds.dedup();
    Ok(VolatileSplit { stable: stable.join("\n"), moved: moved.join("\n"), kinds })
}

/// Longest snippet reported in a finding.
pub const MAX_SNIPPET_CHARS: usize = 64;

/// The detector's patterns failed to compile (a defect in this module, reported rather than
/// panicking).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("volatile-material detector pattern for {kind} failed to compile: {reason}")]
pub struct DetectorError {
    /// Rule whose pattern failed.
    pub kind: VolatileKind,
    /// The regex compiler's message.
    pub reason: String,
}

type Validator = fn(&Captures<'_>) -> bool;

struct RuleSpec {
    kind: VolatileKind,
    pattern: String,
    validator: Option<Validator>,
}

struct Rule {
    kind: VolatileKind,
    regex: Regex,
    validator: Option<Validator>,
}

const MONTH: &str = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?";

fn rule_specs() -> Vec<RuleSpec> {
    let iso_date_time = r"\b\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])[T ](?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?";
    let iso_basic = r"\b\d{8}T\d{6}(?:Z|[+-]\d{4})?\b";
    let rfc2822 = format!(
        r"(?i)\b(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*,?\s+\d{{1,2}}\s+{MONTH}\s+\d{{4}}\s+\d{{1,2}}:\d{{2}}"
    );
    let numeric_date_time = r"\b\d{1,4}[/.]\d{1,2}[/.]\d{2,4},?\s+(?:at\s+)?\d{1,2}:\d{2}\b";
    let month_date_time =
        format!(r"(?i)\b{MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}},?\s+(?:at\s+)?\d{{1,2}}:\d{{2}}");
    let current_time = r"(?i)\b(?:current time|time now|the time)\s*(?:is|:|=)\s*\d{1,2}:\d{2}";
    let current_date = format!(
        r"(?i)\b(?:today(?:'s date)?|current date|date today|now)\s*(?:is|:|=)\s*(?:\d{{4}}-\d{{2}}-\d{{2}}|\d{{1,2}}/\d{{1,2}}/\d{{2,4}}|{MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}|\d{{1,2}}\s+{MONTH}\s+\d{{4}})"
    );
    vec![
        spec(VolatileKind::Timestamp, iso_date_time, None),
        spec(VolatileKind::Timestamp, iso_basic, None),
        spec(VolatileKind::Timestamp, rfc2822, None),
        spec(VolatileKind::Timestamp, numeric_date_time, None),
        spec(VolatileKind::Timestamp, month_date_time, None),
        spec(VolatileKind::Timestamp, current_time, None),
        spec(VolatileKind::CurrentDate, current_date, None),
        spec(
            VolatileKind::Uuid,
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
            None,
        ),
        spec(
            VolatileKind::RequestId,
            r"\b(?:req|request|trace|span|corr|correlation|chatcmpl|msg|call|toolu|resp|run)[_-](?P<value>[A-Za-z0-9]{8,})\b",
            Some(value_has_two_digits),
        ),
        spec(
            VolatileKind::RequestId,
            r#"(?i)\b(?:x-request-id|x-correlation-id|x-amzn-trace-id|x-trace-id|x-b3-traceid|request[-_ ]?id|trace[-_ ]?id|correlation[-_ ]?id|span[-_ ]?id|task[-_ ]?id)["']?\s*[:=]\s*["']?(?P<value>[A-Za-z0-9][A-Za-z0-9._:-]{5,})"#,
            Some(value_has_two_digits),
        ),
        spec(VolatileKind::TraceId, r"\b[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\b", None),
        spec(VolatileKind::TraceId, r"\b(?P<value>[0-9a-fA-F]{32})\b", Some(value_mixes_digits_and_letters)),
        spec(
            VolatileKind::EpochTimestamp,
            r#"(?i)\b(?:timestamp|time|ts|epoch|created(?:_at)?|updated(?:_at)?|modified(?:_at)?|expires?(?:_at)?|issued(?:_at)?|iat|exp|nbf|now|date|last[_ ]?seen)["']?\s*(?:[:=]|is)\s*["']?(?P<value>\d{10}|\d{13})\b"#,
            Some(value_is_plausible_epoch),
        ),
        spec(
            VolatileKind::UsageCounter,
            r"(?i)\b(?:turn|call|request|attempt|iteration|cycle|retry|run|message|msg|invocation)\s*(?:#|no\.|number|num\.?)\s*\d+",
            None,
        ),
        spec(
            VolatileKind::UsageCounter,
            r"(?im)(?:^[ \t]*|\bcurrent\s+|\bthis is\s+)(?:turn|call|iteration|cycle|attempt|invocation)\s*[:=]?\s*\d+\b",
            None,
        ),
        spec(
            VolatileKind::UsageCounter,
            r#"(?i)["']?\b(?:turn|turn_number|call_count|request_count|iteration|tokens_used|token_count|queue_depth|current_usage|usage_count)["']?\s*[:=]\s*\d+"#,
            None,
        ),
        spec(
            VolatileKind::UsageCounter,
            r"(?i)\b(?:tokens?\s+used(?:\s+so\s+far)?|current\s+(?:token\s+usage|usage|queue\s+depth|load|call\s+count|request\s+count))\s*(?:is|:|=)\s*\d",
            None,
        ),
        spec(VolatileKind::UsageCounter, r"(?i)\bcontext:\s*\d[\d,]*\s*/\s*\d[\d,]*", None),
    ]
}

fn spec(kind: VolatileKind, pattern: impl Into<String>, validator: Option<Validator>) -> RuleSpec {
    RuleSpec { kind, pattern: pattern.into(), validator }
}

fn captured_value<'t>(captures: &Captures<'t>) -> &'t str {
    captures.name("value").map_or("", |value| value.as_str())
}

fn value_has_two_digits(captures: &Captures<'_>) -> bool {
    captured_value(captures).chars().filter(char::is_ascii_digit).count() >= 2
}

fn value_mixes_digits_and_letters(captures: &Captures<'_>) -> bool {
    let value = captured_value(captures);
    value.chars().any(|c| c.is_ascii_digit()) && value.chars().any(|c| c.is_ascii_alphabetic())
}

/// Seconds since the epoch for 2001-09-09 and 2100-01-01: the plausible range of a live timestamp.
const EPOCH_SECONDS_RANGE: std::ops::RangeInclusive<u64> = 1_000_000_000..=4_102_444_800;

fn value_is_plausible_epoch(captures: &Captures<'_>) -> bool {
    let value = captured_value(captures);
    let Ok(number) = value.parse::<u64>() else {
        return false;
    };
    let seconds = if value.len() == 13 { number / 1000 } else { number };
    EPOCH_SECONDS_RANGE.contains(&seconds)
}

fn rules() -> Result<&'static [Rule], DetectorError> {
    static RULES: OnceLock<Result<Vec<Rule>, DetectorError>> = OnceLock::new();
    RULES
        .get_or_init(|| {
            rule_specs()
                .into_iter()
                .map(|spec| {
                    Regex::new(&spec.pattern)
                        .map(|regex| Rule { kind: spec.kind, regex, validator: spec.validator })
                        .map_err(|error| DetectorError { kind: spec.kind, reason: error.to_string() })
                })
                .collect()
        })
        .as_ref()
        .map(Vec::as_slice)
        .map_err(Clone::clone)
}

/// All volatile material in `text`, ordered by position; overlapping matches are reported once.
pub fn find_volatile(text: &str) -> Result<Vec<VolatileFinding>, DetectorError> {
    let mut matches: Vec<(usize, usize, VolatileKind)> = Vec::new();
    for rule in rules()? {
        for captures in rule.regex.captures_iter(text) {
            let Some(whole) = captures.get(0) else {
                continue;
            };
            if rule.validator.is_none_or(|validate| validate(&captures)) {
                matches.push((whole.start(), whole.end(), rule.kind));
            }
        }
    }
    matches.sort_by_key(|&(start, end, _)| (start, std::cmp::Reverse(end)));
    let mut findings = Vec::new();
    let mut covered_until = 0;
    for (start, end, kind) in matches {
        if start < covered_until {
            continue;
        }
        covered_until = end;
        findings.push(VolatileFinding {
            kind,
            snippet: text[start..end].chars().take(MAX_SNIPPET_CHARS).collect(),
            offset: start,
            len: end - start,
        });
    }
    Ok(findings)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn split_moves_only_the_lines_with_volatile_material() {
        let text =
            "You are a helpful assistant.\nToday's date is 2026-03-21.\nCurrent time: 13:31\nAnswer briefly.";
        let split = split_volatile_lines(text).unwrap();
        assert_eq!(split.stable, "You are a helpful assistant.\nAnswer briefly.");
        assert_eq!(split.moved, "Today's date is 2026-03-21.\nCurrent time: 13:31");
        assert_eq!(split.kinds, vec![VolatileKind::CurrentDate, VolatileKind::Timestamp]);
        let plain = split_volatile_lines("Release 2024-05-01 shipped.").unwrap();
        assert_eq!(plain.stable, "Release 2024-05-01 shipped.");
        assert!(plain.moved.is_empty() && plain.kinds.is_empty());
    }

    #[test]
    fn split_moves_both_lines_of_a_match_across_a_line_break() {
        let split = split_volatile_lines("intro\ntoday is\n2026-03-21\nend").unwrap();
        assert_eq!(split.stable, "intro\nend");
        assert_eq!(split.moved, "today is\n2026-03-21");
    }

    fn kinds(text: &str) -> Vec<VolatileKind> {
        find_volatile(text).unwrap().into_iter().map(|finding| finding.kind).collect()
    }

    #[test]
    fn all_patterns_compile() {
        assert!(rules().is_ok());
    }

    #[test]
    fn detects_volatile_material() {
        let cases = [
            ("Generated at 2024-05-01T10:15:00Z.", VolatileKind::Timestamp),
            ("generated 2024-05-01 10:15:07+02:00", VolatileKind::Timestamp),
            ("stamp 20240501T101500Z", VolatileKind::Timestamp),
            ("Date: Wed, 01 May 2024 10:15:00 GMT", VolatileKind::Timestamp),
            ("at 05/01/2024 10:15", VolatileKind::Timestamp),
            ("on May 1, 2024 at 10:15", VolatileKind::Timestamp),
            ("The current time is 10:15.", VolatileKind::Timestamp),
            ("Today is 2024-05-01.", VolatileKind::CurrentDate),
            ("current date: May 1st, 2024", VolatileKind::CurrentDate),
            ("id 123e4567-e89b-12d3-a456-426614174000", VolatileKind::Uuid),
            ("request req_011CSHoEeqs5C35K2UUqR7Fy failed", VolatileKind::RequestId),
            ("msg_01XFDUDYJgAACzvnptvVoYEL", VolatileKind::RequestId),
            ("tool call call_a1b2c3d4e5", VolatileKind::RequestId),
            ("x-request-id: 4f9a1c0d-77", VolatileKind::RequestId),
            ("trace-id: ab12cd34ef", VolatileKind::RequestId),
            ("traceparent 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", VolatileKind::TraceId),
            ("trace 4bf92f3577b34da6a3ce929d0e0e4736", VolatileKind::TraceId),
            (r#"{"created_at":1714558500}"#, VolatileKind::EpochTimestamp),
            ("timestamp = 1714558500123", VolatileKind::EpochTimestamp),
            ("This is call #123.", VolatileKind::UsageCounter),
            ("turn 57", VolatileKind::UsageCounter),
            ("We are on turn no. 4", VolatileKind::UsageCounter),
            (r#"{"turn":57}"#, VolatileKind::UsageCounter),
            ("tokens used: 12,000", VolatileKind::UsageCounter),
            ("Status: Context: 112,000 / 128,000 (87%)", VolatileKind::UsageCounter),
        ];
        for (text, kind) in cases {
            assert_eq!(kinds(text), [kind], "text: {text}");
        }
    }

    #[test]
    fn allows_stable_prose_and_code() {
        let stable = [
            "Copyright 2024 Strata authors.",
            "Requires version 1.2.3 or newer; released 2024-05-01.",
            "Step 1: read the file. Step 2: run the tests. Round 2 repeats step 1.",
            "You may call 3 functions in parallel; each turn should be short.",
            "See https://github.com/o/r/blob/4b825dc642cb6eb9a060e54bf8d69288fbee4904/README.md",
            "digest sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "Return the x-request-id header to the caller.",
            r#"{"properties":{"request_id":{"type":"string"},"timeout":{"default":30}}}"#,
            "The meeting runs 10:00-11:00 daily.",
            "Use the request_response pattern and trace_function helpers.",
            "Limit: 1234567890 bytes.",
            "fn turn_left(&mut self) { self.heading -= 90; }",
            "Maximum retries: 3. Max queue depth is 10.",
        ];
        for text in stable {
            assert_eq!(kinds(text), [], "false positive on: {text}");
        }
    }

    #[test]
    fn reports_offset_and_truncated_snippet() {
        let findings = find_volatile("abc 2024-05-01T10:15:00Z").unwrap();
        assert_eq!(findings[0].offset, 4);
        assert_eq!(findings[0].snippet, "2024-05-01T10:15:00Z");
    }
}
