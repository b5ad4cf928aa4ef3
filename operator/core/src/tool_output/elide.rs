//! Cache-aware, batched elision of old large tool results.
//!
//! **Eligibility.** A round is one assistant entry. The age of an entry is the number of assistant
//! entries after it in the sequence ([`rounds_after`]). A tool result is eligible when its age is
//! at least `elide_after_rounds` (so the results of the newest `elide_after_rounds` rounds stay
//! whole) and at least one of its outputs is longer than `elide_over_chars` characters. Eliding
//! cuts each such output to its first `elide_keep_chars` characters plus a ref line
//! ([`render_elided`]); shorter outputs of the same entry stay as they are.
//!
//! **Why batches.** The provider caches the prompt prefix. Changing an entry changes every byte
//! after it, so the whole tail from the first changed entry must be written to the cache again
//! (write price instead of read price). A naive policy elides each result the round it becomes
//! eligible; the first changed position then moves forward by one round every round and the cache
//! is rewritten from there every round — a recurring cost that can exceed what elision saves.
//! [`plan_elision`] instead returns a batch only when the accumulated saving of *all* eligible,
//! not-yet-elided results pays for one rewrite of everything after the earliest of them (judged by
//! [`RemovalEconomics`]); otherwise it returns `None` and the candidates keep accumulating.
//!
//! "Pays" is strengthened by [`ElisionPolicy::payback_ratio`]: the expected saving must be at least
//! that multiple of the rewrite cost. Every batch rewrites at least the young tail (the newest
//! `elide_after_rounds` rounds), so a batch fired the moment it barely pays is soon followed by
//! another; waiting for a clear margin gathers more results per rewrite. In the 40-round simulation
//! in `tests/tool_output_elide.rs` (Anthropic prices) ratio 1.0 rewrites 12 times and saves ~2% over
//! never eliding, 3.0 rewrites 3 times and saves ~17%, and eliding every round costs ~55% more than
//! never eliding.
//!
//! **Storage.** The planner is pure. [`elide_entry`] stores every output it cuts in the artifact
//! store before rendering (`put` is idempotent and content-addressed, so an output already stored,
//! e.g. at spill time, is not written twice). The ref in the elided text is the SHA-256 of the
//! output as it stood in the entry; for a spilled output that is its preview, whose marker line
//! names the full output.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::error::ToolOutputError;
use super::text::{char_boundary, grouped};
use crate::artifacts::{ArtifactRef, ArtifactStore};
use crate::economics::{CachePricing, RemovalEconomics};
use crate::entry::{Content, Entry, EntryId, Role};

/// How the marker line of an elided output begins.
pub const ELISION_MARKER_PREFIX: &str = "[strata: output elided: ";

/// When tool results are elided and how much is kept.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ElisionPolicy {
    /// Results at least this many rounds old are eligible.
    pub elide_after_rounds: usize,
    /// Only outputs longer than this many characters are elided.
    pub elide_over_chars: usize,
    /// Characters kept from the start of an elided output.
    pub elide_keep_chars: usize,
    /// A batch fires only when its expected saving is at least this multiple of its rewrite cost
    /// (1.0: as soon as it merely pays). See the module docs for why the default waits longer.
    pub payback_ratio: f64,
}

impl Default for ElisionPolicy {
    fn default() -> Self {
        Self { elide_after_rounds: 4, elide_over_chars: 2000, elide_keep_chars: 800, payback_ratio: 3.0 }
    }
}

/// A set of results to elide together, with the economics that justify it.
#[derive(Debug, Clone, PartialEq)]
pub struct ElisionBatch {
    /// The entries to elide, in sequence order.
    pub ids: Vec<EntryId>,
    /// Estimated tokens removed from every later call.
    pub saved_tokens: u64,
    /// Index (in the planned sequence) of the first entry the batch changes.
    pub first_changed_index: usize,
    /// The trade: saving against the cache rewrite.
    pub economics: RemovalEconomics,
}

/// For each entry, the number of assistant entries after it.
pub fn rounds_after(entries: &[Entry]) -> Vec<usize> {
    let mut ages = vec![0; entries.len()];
    let mut assistants = 0;
    for (index, entry) in entries.iter().enumerate().rev() {
        ages[index] = assistants;
        if entry.role == Role::Assistant {
            assistants += 1;
        }
    }
    ages
}

/// Whether `entry` has an output the policy would cut (ignoring age).
pub fn has_elidable_output(entry: &Entry, policy: &ElisionPolicy) -> bool {
    entry.content.tool_results.iter().any(|result| is_elidable(&result.output, policy))
}

/// Whether `output` has more than `elide_over_chars` characters. Planning asks this of every old
/// output on every request, so the byte length settles it without counting where it can: a
/// character takes one to four bytes.
fn is_elidable(output: &str, policy: &ElisionPolicy) -> bool {
    let limit = policy.elide_over_chars;
    if output.len() <= limit {
        return false;
    }
    if output.len() / 4 > limit {
        return true;
    }
    output.chars().nth(limit).is_some()
}

/// Plans the next elision batch, or `None` when eliding now would not pay for the cache rewrite.
///
/// `tokens_of` counts the tokens of a text; `entries[i].tokens` is used for the rewrite size.
/// `remaining_calls_estimate` is the number of model calls expected before the prompt changes
/// anyway (next compaction or session end).
pub fn plan_elision(
    entries: &[Entry],
    already_elided: &HashSet<EntryId>,
    policy: &ElisionPolicy,
    tokens_of: impl Fn(&str) -> u64,
    remaining_calls_estimate: u64,
    pricing: CachePricing,
) -> Option<ElisionBatch> {
    let candidates = ElisionCandidates { entries, candidates: rounds_after(entries).into_iter().enumerate() };
    plan_elision_among(candidates, already_elided, policy, tokens_of, remaining_calls_estimate, pricing)
}

/// The entries [`plan_elision_among`] looks at.
#[derive(Debug, Clone)]
pub struct ElisionCandidates<'a, C> {
    /// The whole history (the economics of a batch depend on everything after its first entry).
    pub entries: &'a [Entry],
    /// Ascending `(position, age)` of the entries that may have an elidable output; the age is the
    /// number of Assistant entries after it (the rounds since).
    pub candidates: C,
}

/// [`plan_elision`] over the given candidates only, so that an engine which keeps a
/// [`crate::history_index::EntryIndex`] of elidable outputs does not walk its whole history on
/// every answer.
pub fn plan_elision_among<C>(
    candidates: ElisionCandidates<'_, C>,
    already_elided: &HashSet<EntryId>,
    policy: &ElisionPolicy,
    tokens_of: impl Fn(&str) -> u64,
    remaining_calls_estimate: u64,
    pricing: CachePricing,
) -> Option<ElisionBatch>
where
    C: IntoIterator<Item = (usize, usize)>,
    C::IntoIter: DoubleEndedIterator,
{
    // Planning runs on every request, so it must not re-tokenize or hash outputs: the entry's stored
    // token count is split across its outputs by characters, and the marker line is counted once,
    // when there is something to elide. Candidates are walked newest first, and only those with an
    // elidable output are looked at further.
    let entries = candidates.entries;
    let mut marker_tokens = None;
    let mut ids = Vec::new();
    let mut first_changed_index = None;
    let mut saved_tokens = 0u64;
    for (index, age) in candidates.candidates.into_iter().rev() {
        let Some(entry) = entries.get(index) else { continue };
        if age < policy.elide_after_rounds
            || !has_elidable_output(entry, policy)
            || already_elided.contains(&entry.id)
        {
            continue;
        }
        let marker = *marker_tokens.get_or_insert_with(|| {
            tokens_of(&render_elided("", policy.elide_keep_chars, &ArtifactRef::for_bytes(b"")))
        });
        saved_tokens += estimated_saving(entry, policy, marker);
        first_changed_index = Some(index);
        ids.push(entry.id);
    }
    ids.reverse();
    let first_changed_index = first_changed_index?;
    let economics = RemovalEconomics::for_batch(
        entries,
        first_changed_index,
        saved_tokens,
        remaining_calls_estimate,
        pricing,
    );
    economics.pays_by(policy.payback_ratio).then_some(ElisionBatch {
        ids,
        saved_tokens,
        first_changed_index,
        economics,
    })
}

/// Tokens eliding `entry` would save: each elidable output's share of the entry's tokens (by
/// characters), less the share of the kept head and the marker line.
fn estimated_saving(entry: &Entry, policy: &ElisionPolicy, marker_tokens: u64) -> u64 {
    let lengths: Vec<usize> = entry.content.tool_results.iter().map(|r| r.output.chars().count()).collect();
    let total_chars = (entry.content.text.chars().count() + lengths.iter().sum::<usize>()).max(1) as u64;
    let mut saved = 0u64;
    for (result, &chars) in entry.content.tool_results.iter().zip(&lengths) {
        if !is_elidable(&result.output, policy) {
            continue;
        }
        let share = entry.tokens * chars as u64 / total_chars;
        let kept = share * (policy.elide_keep_chars.min(chars) as u64) / (chars.max(1) as u64);
        saved += share.saturating_sub(kept + marker_tokens);
    }
    saved
}

/// The window text of an elided output: its first `keep_chars` characters and a ref line.
pub fn render_elided(text: &str, keep_chars: usize, data_ref: &ArtifactRef) -> String {
    let kept = &text[..char_boundary(text, keep_chars)];
    let mut out = String::with_capacity(kept.len() + 200);
    out.push_str(kept);
    if !kept.is_empty() && !kept.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "{ELISION_MARKER_PREFIX}kept first {} of {} chars. data_ref={data_ref} — call strata_read_output \
         with this data_ref to read the rest (head, slice or search)]",
        grouped(kept.chars().count()),
        grouped(text.chars().count()),
    ));
    out
}

/// The content of `entry` with every output longer than `elide_over_chars` stored in `store` and
/// replaced by its elided form. Returns the new content and the refs of the stored outputs.
pub fn elide_entry(
    entry: &Entry,
    policy: &ElisionPolicy,
    store: &ArtifactStore,
    tenant: &str,
) -> Result<(Content, Vec<ArtifactRef>), ToolOutputError> {
    let mut content = entry.content.clone();
    let mut refs = Vec::new();
    for result in &mut content.tool_results {
        if !is_elidable(&result.output, policy) {
            continue;
        }
        let data_ref = store.put(tenant, result.output.as_bytes()).map_err(|source| {
            ToolOutputError::Store { tenant: tenant.to_owned(), chars: result.output.chars().count(), source }
        })?;
        result.output = render_elided(&result.output, policy.elide_keep_chars, &data_ref);
        refs.push(data_ref);
    }
    Ok((content, refs))
}
