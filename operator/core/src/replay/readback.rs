//! Read-back accounting: finds where a later turn uses content that a policy removed from the
//! model's view, so replay can charge the read the agent would have needed to get it back.
//!
//! Method. Every removal (an elided tail, a spilled body, an expired or masked output, compacted
//! history) is kept with its *anchors*: the distinctive material in it.
//! - identifiers of at least [`MIN_IDENTIFIER_CHARS`] characters that look like code (an underscore,
//!   a digit, or a lower-to-upper case change), such as `separability_matrix` or `fetchUser2`;
//! - paths with a `/` and at least [`MIN_PATH_CHARS`] characters, such as `src/auth/session.py`;
//! - numbers of at least [`MIN_NUMBER_CHARS`] characters (digits, `.`, `:`), such as `0.7391` or `13:31:54`;
//! - quoted lines: any line of at least [`MIN_QUOTED_LINE_CHARS`] characters, compared trimmed.
//!
//! A later model output (its text and its tool-call arguments) *uses* a removal when it contains one
//! of the removal's anchors that the prompt of that call does not contain: the model could only have
//! written it by having the removed content. Each removal is charged at most once: after its
//! read-back the content is back in context, where it stays for the rest of the session, so replay
//! also charges the read-back's answer and slice as cached input on every later call. A removal without a way back (no `data_ref`, as with
//! observation masking) is counted as an unrecoverable use instead.
//!
//! Known blind spots: paraphrased use (the model restates removed content in its own words) and use
//! that leaves no distinctive trace (the model merely acts on a conclusion) are not detected, so the
//! charge is a lower bound. Anchors that also occur in the kept prompt are never evidence, so a
//! removal whose distinctive material is all repeated elsewhere is never charged.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;

/// Shortest identifier that counts as distinctive.
pub const MIN_IDENTIFIER_CHARS: usize = 8;
/// Shortest path that counts as distinctive.
pub const MIN_PATH_CHARS: usize = 6;
/// Shortest number that counts as distinctive.
pub const MIN_NUMBER_CHARS: usize = 4;
/// Shortest line that counts as a quotation.
pub const MIN_QUOTED_LINE_CHARS: usize = 24;
/// Tokens of the short answer a read-back call produces (the model's `strata_read_output` call).
pub const READ_BACK_OUTPUT_TOKENS: u64 = 40;
/// Most tokens of removed content one read-back brings back (a `slice` or `search`, not the whole
/// output).
pub const READ_BACK_SLICE_TOKENS: u64 = 1_000;

/// What kind of distinctive material an anchor is, strongest evidence first (the order in which a
/// use's evidence is chosen).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AnchorKind {
    /// A whole line quoted verbatim.
    QuotedLine,
    /// A file path.
    Path,
    /// A code-like identifier.
    Identifier,
    /// A number.
    Number,
}

/// One piece of distinctive material.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Anchor {
    /// Its kind.
    pub kind: AnchorKind,
    /// Its exact text.
    pub text: String,
}

fn identifier_pattern() -> &'static Regex {
    static PATTERN: OnceLock<Regex> = OnceLock::new();
    PATTERN
        .get_or_init(|| Regex::new(r"[A-Za-z_][A-Za-z0-9_]+").expect("constant identifier pattern compiles"))
}

fn path_pattern() -> &'static Regex {
    static PATTERN: OnceLock<Regex> = OnceLock::new();
    PATTERN.get_or_init(|| {
        Regex::new(r"[A-Za-z0-9_.~-]*(?:/[A-Za-z0-9_.-]+)+").expect("constant path pattern compiles")
    })
}

fn number_pattern() -> &'static Regex {
    static PATTERN: OnceLock<Regex> = OnceLock::new();
    PATTERN.get_or_init(|| Regex::new(r"[0-9][0-9.:]*[0-9]").expect("constant number pattern compiles"))
}

/// Whether an identifier looks like code rather than a word of prose.
fn code_like(identifier: &str) -> bool {
    let bytes = identifier.as_bytes();
    identifier.contains('_')
        || bytes.iter().any(u8::is_ascii_digit)
        || bytes.windows(2).any(|pair| pair[0].is_ascii_lowercase() && pair[1].is_ascii_uppercase())
}

/// The distinctive material of `text`, deduplicated and in a stable order.
pub fn anchors(text: &str) -> Vec<Anchor> {
    let mut found = BTreeSet::new();
    for matched in identifier_pattern().find_iter(text) {
        let identifier = matched.as_str();
        if identifier.len() >= MIN_IDENTIFIER_CHARS && code_like(identifier) {
            found.insert(Anchor { kind: AnchorKind::Identifier, text: identifier.to_owned() });
        }
    }
    for matched in path_pattern().find_iter(text) {
        let path = matched.as_str().trim_end_matches('.');
        if path.len() >= MIN_PATH_CHARS
            && path.trim_matches('/').contains(|c: char| c.is_ascii_alphanumeric())
        {
            found.insert(Anchor { kind: AnchorKind::Path, text: path.to_owned() });
        }
    }
    for matched in number_pattern().find_iter(text) {
        let number = matched.as_str();
        let digits = number.bytes().filter(u8::is_ascii_digit).count();
        if number.len() >= MIN_NUMBER_CHARS && digits >= 3 {
            found.insert(Anchor { kind: AnchorKind::Number, text: number.to_owned() });
        }
    }
    for line in text.lines() {
        let line = line.trim();
        if line.chars().count() >= MIN_QUOTED_LINE_CHARS {
            found.insert(Anchor { kind: AnchorKind::QuotedLine, text: line.to_owned() });
        }
    }
    found.into_iter().collect()
}

/// Content a policy took out of the model's view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// What was removed: an entry ID, a `data_ref`, or a policy's own label.
    pub id: String,
    /// The model call before which it left the prompt.
    pub removed_before_call: usize,
    /// The removed text.
    pub text: String,
    /// Its tokens.
    pub tokens: u64,
    /// Whether the agent could read it back (`strata_read_output` with a `data_ref`).
    pub recoverable: bool,
}

impl Removal {
    /// A removal of `text` before call `removed_before_call`; its tokens are estimated at four
    /// characters each (the read-back slice is capped far below where the estimate matters).
    pub fn new(id: String, removed_before_call: usize, text: String, recoverable: bool) -> Self {
        let tokens = (text.chars().count() as u64).div_ceil(4);
        Removal { id, removed_before_call, text, tokens, recoverable }
    }
}

/// A detected use of removed content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadBackUse {
    /// The removal used.
    pub removal_id: String,
    /// The call whose output used it.
    pub call: usize,
    /// The anchor found in the output and absent from that call's prompt.
    pub evidence: Anchor,
    /// Tokens the read-back brings back (the removal's tokens, at most [`READ_BACK_SLICE_TOKENS`]).
    pub slice_tokens: u64,
    /// Whether it could be read back.
    pub recoverable: bool,
}

struct Tracked {
    removal: Removal,
    anchors: Vec<Anchor>,
    charged: bool,
}

/// Follows one session's removals and the model outputs after them.
#[derive(Default)]
pub struct ReadBackTracker {
    tracked: Vec<Tracked>,
}

impl ReadBackTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a removal. Removals without any anchor can never be shown to be used and are dropped.
    pub fn removed(&mut self, removal: Removal) {
        let anchors = anchors(&removal.text);
        if !anchors.is_empty() {
            self.tracked.push(Tracked { removal, anchors, charged: false });
        }
    }

    /// Removals still being followed.
    pub fn pending(&self) -> usize {
        self.tracked.iter().filter(|tracked| !tracked.charged).count()
    }

    /// Checks the output of model call `call` (its text and tool-call arguments, joined) against
    /// every removal made before it. `in_prompt` says whether that call's prompt contains a text: an
    /// anchor it contains is not evidence. It is asked only about anchors the output contains, so a
    /// caller can build the prompt text lazily. Each removal is reported at most once.
    pub fn observe_output(
        &mut self,
        call: usize,
        output: &str,
        in_prompt: &mut dyn FnMut(&str) -> bool,
    ) -> Vec<ReadBackUse> {
        let mut uses = Vec::new();
        if output.is_empty() {
            return uses;
        }
        for tracked in self.tracked.iter_mut().filter(|t| !t.charged && t.removal.removed_before_call <= call)
        {
            let evidence = tracked
                .anchors
                .iter()
                .find(|anchor| output.contains(anchor.text.as_str()) && !in_prompt(anchor.text.as_str()));
            if let Some(evidence) = evidence {
                tracked.charged = true;
                uses.push(ReadBackUse {
                    removal_id: tracked.removal.id.clone(),
                    call,
                    evidence: evidence.clone(),
                    slice_tokens: tracked.removal.tokens.min(READ_BACK_SLICE_TOKENS),
                    recoverable: tracked.removal.recoverable,
                });
            }
        }
        uses
    }

    /// Forgets a removal that came back into the prompt by other means (a rollback, a re-read).
    pub fn restored(&mut self, id: &str) {
        self.tracked.retain(|tracked| tracked.removal.id != id);
    }
}

/// What read-backs cost one policy over a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadBackSummary {
    /// Uses of removed content detected.
    pub uses_detected: u64,
    /// Read-backs charged (recoverable uses).
    pub read_backs: u64,
    /// Their cost, in fresh-token units.
    pub cost_units: f64,
    /// Uses of content with no way back.
    pub unrecoverable: u64,
}

impl ReadBackSummary {
    /// Adds another summary.
    pub fn add(&mut self, other: &ReadBackSummary) {
        self.uses_detected += other.uses_detected;
        self.read_backs += other.read_backs;
        self.cost_units += other.cost_units;
        self.unrecoverable += other.unrecoverable;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe(tracker: &mut ReadBackTracker, call: usize, output: &str, prompt: &str) -> Vec<ReadBackUse> {
        tracker.observe_output(call, output, &mut |anchor| prompt.contains(anchor))
    }

    fn removal(id: &str, call: usize, text: &str) -> Removal {
        Removal {
            id: id.into(),
            removed_before_call: call,
            text: text.into(),
            tokens: 500,
            recoverable: true,
        }
    }

    #[test]
    fn finds_code_like_identifiers_paths_numbers_and_lines() {
        let found = anchors(
            "Traceback in src/auth/session.py line 1042: refresh_token_expired raised\n\
             the quick brown fox\n    assert total == 0.7391, 'checksum mismatch in ledger'\n",
        );
        let texts: Vec<(AnchorKind, &str)> = found.iter().map(|a| (a.kind, a.text.as_str())).collect();
        assert!(texts.contains(&(AnchorKind::Path, "src/auth/session.py")), "{texts:?}");
        assert!(texts.contains(&(AnchorKind::Identifier, "refresh_token_expired")), "{texts:?}");
        assert!(texts.contains(&(AnchorKind::Number, "1042")), "{texts:?}");
        assert!(texts.contains(&(AnchorKind::Number, "0.7391")), "{texts:?}");
        assert!(
            texts
                .contains(&(AnchorKind::QuotedLine, "assert total == 0.7391, 'checksum mismatch in ledger'")),
            "{texts:?}"
        );
        assert!(
            !texts.iter().any(|(_, text)| *text == "Traceback" || *text == "quick"),
            "prose is not an anchor"
        );
    }

    #[test]
    fn a_quoted_line_of_an_elided_output_is_charged_once() {
        let mut tracker = ReadBackTracker::new();
        tracker.removed(removal(
            "msg_7",
            3,
            "header\n    raise ValueError('bad separability input')\nfooter",
        ));
        assert!(
            observe(&mut tracker, 2, "raise ValueError('bad separability input')", "").is_empty(),
            "not yet removed"
        );
        let uses = observe(
            &mut tracker,
            4,
            "The failing line is `raise ValueError('bad separability input')`.",
            "prompt",
        );
        assert_eq!(uses.len(), 1);
        assert_eq!(uses[0].removal_id, "msg_7");
        assert_eq!(uses[0].evidence.kind, AnchorKind::QuotedLine);
        assert!(
            observe(&mut tracker, 5, "raise ValueError('bad separability input') again", "prompt").is_empty()
        );
        assert_eq!(tracker.pending(), 0);
    }

    #[test]
    fn material_still_in_the_prompt_is_not_evidence() {
        let mut tracker = ReadBackTracker::new();
        tracker.removed(removal("msg_9", 1, "see operator/core/src/compiler/mod.rs"));
        let prompt = "[msg_2] earlier I opened operator/core/src/compiler/mod.rs";
        assert!(observe(&mut tracker, 2, "edit operator/core/src/compiler/mod.rs", prompt).is_empty());
        let uses = observe(&mut tracker, 3, "edit operator/core/src/compiler/mod.rs", "other prompt");
        assert_eq!(uses.len(), 1, "once the prompt no longer has it, the use counts");
    }

    #[test]
    fn unrecoverable_removals_are_reported_as_such() {
        let mut tracker = ReadBackTracker::new();
        let mut masked = removal("obs_4", 2, "exit code 137 from worker_pool_7");
        masked.recoverable = false;
        tracker.removed(masked);
        let uses = observe(&mut tracker, 3, "worker_pool_7 was killed", "");
        assert_eq!(uses.len(), 1);
        assert!(!uses[0].recoverable);
    }

    #[test]
    fn prose_only_removals_are_not_followed() {
        let mut tracker = ReadBackTracker::new();
        tracker.removed(removal("msg_1", 1, "ok fine thanks"));
        assert_eq!(tracker.pending(), 0);
    }
}
