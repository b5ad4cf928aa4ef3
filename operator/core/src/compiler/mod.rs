//! The context compiler: Tier 1 (stable prefix), Tier 2 (journal entries with visible IDs) and
//! Tier 3 (telemetry) into the model-visible packet, incrementally.
//!
//! The compiler keeps the rendered Tier 2 between requests. A request whose journal only grew
//! renders just the new entries, so the work per request grows with the new entries, not with the
//! history. A generation switch (compaction, purge, rollback) rebuilds once. Planned rewrites of
//! existing entries (elision, expiry, deduplication) arrive as batches of [`Treatment`]s; the
//! compiler applies them and counts only the changed entries again.

mod provenance;
mod render;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

pub use provenance::{TrustClass, entry_provenance, section_provenance};
pub use render::{id_tag, journaled_text, push_id_tag, render_entry, write_journaled_text};

use crate::budget::{BudgetError, BudgetPolicy, ContextBudget, ContextStatus};
use crate::entry::{Entry, EntryId, EntryKind, RetentionClass, Role, ToolCall};
use crate::prefix::{SectionClass, StablePrefix};
use crate::tokens::{DigitShapeCounts, TokenCounter};

/// Anthropic accepts at most this many cache breakpoints per request.
pub const MAX_BREAKPOINTS: usize = 4;

/// Why an item is in the packet, or left out (shown by the Context Inspector).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InclusionReason {
    /// Tier 1: part of the stable prefix.
    StablePrefix,
    /// Tier 2: journal entry sent verbatim.
    Journal,
    /// Tier 2: a tool result cut to its head plus an artifact reference.
    Elided,
    /// Tier 2: identical to an earlier result, sent as a reference to it.
    Duplicate,
    /// Tier 2: left out because its retention TTL expired.
    Expired,
    /// Tier 3: volatile telemetry, rebuilt every request.
    Telemetry,
}

/// A planned change to how one entry is rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Treatment {
    /// Send `text` instead of the entry's content (elision, dedup). Tool calls and IDs stay.
    Replace {
        /// The replacement text, without the ID tag.
        text: String,
        /// Elided or Duplicate.
        reason: InclusionReason,
    },
    /// Leave the entry out of the window (expiry). It stays in the journal.
    Omit,
}

/// One Tier-2 entry as the model sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderedEntry {
    /// The entry's ID.
    pub id: EntryId,
    /// Provider role.
    pub role: Role,
    /// The text a treatment gave the entry, with the visible ID tag (`[tool_res_9] def login(user):
    /// … [elided]`; the tag alone for an expired entry). `None` while the entry is sent as journaled: its text is then written from
    /// the journal entry when it is rendered ([`Packet::text`]), so the compiler does not hold a
    /// second copy of the history's text.
    pub replaced_text: Option<String>,
    /// Tokens of the rendered entry.
    pub tokens: u64,
    /// Why it is here.
    pub reason: InclusionReason,
    /// Whether it is in the window (false once expired).
    pub included: bool,
    /// Retention class of the journaled entry.
    pub retention: RetentionClass,
}

/// Where a cache breakpoint goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "after")]
pub enum Breakpoint {
    /// After the last Tier-1 section.
    Tier1,
    /// After a Tier-2 entry.
    Entry {
        /// The entry.
        id: EntryId,
    },
}

/// One inclusion decision, for the Context Inspector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InclusionDecision {
    /// Section id (`tier1.system`, …) or entry ID.
    pub id: String,
    /// Tier 1, 2 or 3.
    pub tier: u8,
    /// Whether it is sent.
    pub included: bool,
    /// Why.
    pub reason: InclusionReason,
    /// Tokens it costs.
    pub tokens: u64,
    /// sha256 of its source (empty for telemetry).
    pub source_hash: String,
    /// Where it comes from (`stable_prefix.system`, `client.user`, `model`, `tool`,
    /// `strata.summary`, `strata.telemetry`, …).
    pub source: &'static str,
    /// How far it is trusted.
    pub trust_class: TrustClass,
    /// The privacy scope it belongs to (the agent's).
    pub privacy_scope: String,
}

/// The compiled, model-visible packet. It borrows the compiler's state: building it is O(1) in the history.
#[derive(Debug)]
pub struct Packet<'a> {
    /// Tier 1.
    pub prefix: &'a StablePrefix,
    /// Tier 2, in journal order (check [`RenderedEntry::included`]).
    pub entries: &'a [RenderedEntry],
    /// The journal's entries Tier 2 was rendered from, position for position (an entry not at its
    /// position is looked for by ID, in time linear in the history).
    pub journal: &'a [Entry],
    /// Tier 3: the telemetry line, after the cache boundary.
    pub telemetry: String,
    /// Cache breakpoints, at most [`MAX_BREAKPOINTS`].
    pub breakpoints: Vec<Breakpoint>,
    /// Context status counted over all three tiers.
    pub status: ContextStatus,
    /// The included Tier-2 tokens by the budget section they count against.
    pub tier2: Tier2Tokens,
}

/// The journal entry `id` in `journal`, looked for at `index` first: Tier 2 is rendered from the
/// journal position for position ([`ContextCompiler::sync`]); the search by ID covers a journal
/// slice that is not.
fn journaled_at(journal: &[Entry], index: usize, id: EntryId) -> Option<&Entry> {
    journal.get(index).filter(|entry| entry.id == id).or_else(|| journal.iter().find(|entry| entry.id == id))
}

impl<'a> Packet<'a> {
    /// The journal entry Tier-2 entry `index` was rendered from.
    pub fn journaled(&self, index: usize) -> Option<&'a Entry> {
        journaled_at(self.journal, index, self.entries.get(index)?.id)
    }

    /// The text of Tier-2 entry `index` as the model sees it, with its visible ID tag: a
    /// treatment's text, or else the journal entry's own, written now.
    pub fn text(&self, index: usize) -> Cow<'a, str> {
        let Some(rendered) = self.entries.get(index) else { return Cow::Borrowed("") };
        if let Some(text) = &rendered.replaced_text {
            return Cow::Borrowed(text);
        }
        let mut text = String::new();
        self.write_text(index, &mut text);
        Cow::Owned(text)
    }

    /// Appends [`Self::text`] of Tier-2 entry `index` to `out`.
    pub fn write_text(&self, index: usize, out: &mut String) {
        let Some(rendered) = self.entries.get(index) else { return };
        match (&rendered.replaced_text, self.journaled(index)) {
            (Some(text), _) => out.push_str(text),
            (None, Some(entry)) => write_journaled_text(entry, out),
            (None, None) => push_id_tag(rendered.id, out),
        }
    }

    /// The content hash of the journal entry Tier-2 entry `index` was rendered from (empty when
    /// it is not in the journal slice).
    pub fn source_hash(&self, index: usize) -> &'a str {
        self.journaled(index).map_or("", |entry| entry.content_hash.as_str())
    }

    /// The tool calls Tier-2 entry `index` sends: an included assistant entry's, as journaled.
    pub fn tool_calls(&self, index: usize) -> &'a [ToolCall] {
        let sends_calls = self
            .entries
            .get(index)
            .is_some_and(|rendered| rendered.included && rendered.role == Role::Assistant);
        match self.journaled(index) {
            Some(entry) if sends_calls => &entry.content.tool_calls,
            _ => &[],
        }
    }
}

/// `tier1.<id>`: how the inspector and each call's summary name Tier-1 section `id`. Written in one
/// allocation without the formatting machinery, since every request names its sections.
pub fn tier1_section_id(id: &str) -> String {
    ["tier1.", id].concat()
}

/// Included Tier-2 tokens by the budget section they count against, kept up to date as entries are
/// rendered and treated, so no request has to add them up over the whole history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tier2Tokens {
    /// Summaries (the memory section).
    pub memory: u64,
    /// Tool results.
    pub tool_results: u64,
    /// Everything else: messages and tool calls.
    pub history: u64,
}

impl Tier2Tokens {
    fn section(&mut self, kind: EntryKind) -> &mut u64 {
        match kind {
            EntryKind::Summary => &mut self.memory,
            EntryKind::ToolResult => &mut self.tool_results,
            _ => &mut self.history,
        }
    }

    fn add(&mut self, entry: &RenderedEntry) {
        if entry.included {
            *self.section(entry.id.kind()) += entry.tokens;
        }
    }

    fn remove(&mut self, entry: &RenderedEntry) {
        if entry.included {
            *self.section(entry.id.kind()) -= entry.tokens;
        }
    }

    /// All included Tier-2 tokens.
    pub fn total(&self) -> u64 {
        self.memory + self.tool_results + self.history
    }
}

/// What a lower context limit would have cost this packet (the Context Inspector's simulation, §17.16).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LowerBudgetOutcome {
    /// The simulated limit, in tokens.
    pub limit: u64,
    /// Percent of the real limit it is.
    pub percent_of_limit: u8,
    /// Tokens that would have to leave the window for the packet to fit.
    pub tokens_over: u64,
    /// Entries that would leave, in the order Strata would remove them.
    pub removed: Vec<LowerBudgetRemoval>,
    /// Whether the packet fits after those removals (Critical entries and Tier 1 never leave).
    pub fits: bool,
}

/// One entry a lower budget would remove, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LowerBudgetRemoval {
    /// The entry.
    pub id: EntryId,
    /// Its tokens.
    pub tokens: u64,
    /// `expire` (Ephemeral), `elide` (Reference) or `compact` (Working, oldest first).
    pub action: &'static str,
}

/// Whether the compiler places cache breakpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakpointPlacement {
    /// At the end of Tier 1, after the latest summary, and at the end of Tier 2.
    Auto,
    /// None.
    Off,
}

/// What [`ContextCompiler::sync`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Only new entries were rendered.
    Appended(usize),
    /// The generation changed or the history was rewritten: everything was rendered again.
    Rebuilt(usize),
}

/// An error compiling.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The budget policy does not fit the context window.
    #[error("context budget: {0}")]
    Budget(#[from] BudgetError),
    /// A treatment names an entry that is not in the window.
    #[error("treatment for {0} which is not in the current generation")]
    UnknownEntry(EntryId),
}

/// Incremental compiler state for one agent.
pub struct ContextCompiler {
    prefix: StablePrefix,
    prefix_tokens: u64,
    generation: u64,
    rendered: Vec<RenderedEntry>,
    tier2: Tier2Tokens,
    last_summary: Option<usize>,
    treatments: BTreeMap<EntryId, Treatment>,
    placement: BreakpointPlacement,
    volatile_context: String,
    volatile_tokens: u64,
    /// The ID tags' counts by shape (`[msg_104]` counts as `[msg_000]`).
    tag_counts: DigitShapeCounts,
}

impl ContextCompiler {
    /// A compiler for `prefix`, with no entries yet.
    pub fn new(prefix: StablePrefix, placement: BreakpointPlacement) -> Self {
        let prefix_tokens = u64::from(prefix.manifest().total_tokens);
        ContextCompiler {
            prefix,
            prefix_tokens,
            generation: 0,
            rendered: Vec::new(),
            tier2: Tier2Tokens::default(),
            last_summary: None,
            treatments: BTreeMap::new(),
            placement,
            volatile_context: String::new(),
            volatile_tokens: 0,
            tag_counts: DigitShapeCounts::default(),
        }
    }

    /// Sets the volatile lines of the client's system prompt (dates, times, identifiers), sent
    /// after the cache boundary with the Tier-3 telemetry so the stable prefix stays cached.
    pub fn set_volatile_context(&mut self, text: &str, counter: &TokenCounter) {
        if text != self.volatile_context {
            self.volatile_context = text.to_owned();
            self.volatile_tokens = if text.is_empty() { 0 } else { u64::from(counter.count(text)) };
        }
    }

    /// The volatile lines of the client's system prompt, as set.
    pub fn volatile_context(&self) -> &str {
        &self.volatile_context
    }

    /// Tokens of the volatile lines.
    pub fn volatile_tokens(&self) -> u64 {
        self.volatile_tokens
    }

    /// Replace the stable prefix (a tool or system-prompt change). Tier 2 is kept.
    pub fn set_prefix(&mut self, prefix: StablePrefix) {
        self.prefix_tokens = u64::from(prefix.manifest().total_tokens);
        self.prefix = prefix;
    }

    /// The stable prefix.
    pub fn prefix(&self) -> &StablePrefix {
        &self.prefix
    }

    /// Whether the list of rendered entries is close to reallocating (see [`crate::room_ahead`]).
    pub fn room_low(&self) -> bool {
        crate::room_ahead::is_low(&self.rendered)
    }

    /// Grows the list of rendered entries ahead of need when its room is low; returns whether it grew.
    pub fn make_room(&mut self) -> bool {
        crate::room_ahead::make(&mut self.rendered)
    }

    /// Tokens of Tier 1 plus the included Tier-2 entries.
    pub fn context_tokens(&self) -> u64 {
        self.prefix_tokens + self.tier2.total() + self.volatile_tokens
    }

    /// The journal generation Tier 2 was last synced with.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Bring Tier 2 up to date with the journal's current `entries` of `generation`.
    pub fn sync(&mut self, generation: u64, entries: &[Entry], counter: &TokenCounter) -> SyncOutcome {
        let extends = generation == self.generation
            && entries.len() >= self.rendered.len()
            && self
                .rendered
                .last()
                .is_none_or(|last| entries.get(self.rendered.len() - 1).is_some_and(|e| e.id == last.id));
        if !extends {
            self.generation = generation;
            self.rendered.clear();
            self.tier2 = Tier2Tokens::default();
            self.last_summary = None;
            // Headroom, so the appends that follow a rebuild do not reallocate the whole history.
            let headroom = entries.len() / 2 + 64;
            self.rendered.reserve(entries.len() + headroom);
            let live: std::collections::HashSet<EntryId> = entries.iter().map(|e| e.id).collect();
            self.treatments.retain(|id, _| live.contains(id));
            for entry in entries {
                self.push(entry, counter);
            }
            return SyncOutcome::Rebuilt(entries.len());
        }
        let new = &entries[self.rendered.len()..];
        for entry in new {
            self.push(entry, counter);
        }
        SyncOutcome::Appended(new.len())
    }

    fn push(&mut self, entry: &Entry, counter: &TokenCounter) {
        let treatment = self.treatments.get(&entry.id);
        let rendered = render_entry(entry, treatment, counter, &mut self.tag_counts);
        self.tier2.add(&rendered);
        if entry.id.kind() == EntryKind::Summary {
            self.last_summary = Some(self.rendered.len());
        }
        self.rendered.push(rendered);
    }

    /// Apply a batch of treatments; only the named entries are rendered and counted again.
    pub fn apply_treatments(
        &mut self,
        batch: BTreeMap<EntryId, Treatment>,
        entries: &[Entry],
        counter: &TokenCounter,
    ) -> Result<(), CompileError> {
        // Batches are rare (they rewrite the cached prompt), so the index is built per batch instead
        // of being maintained on every append; an empty batch (the common case) costs nothing.
        if batch.is_empty() {
            return Ok(());
        }
        let position: HashMap<EntryId, usize> =
            self.rendered.iter().enumerate().map(|(index, rendered)| (rendered.id, index)).collect();
        for (id, treatment) in batch {
            let index = *position.get(&id).ok_or(CompileError::UnknownEntry(id))?;
            let entry = entries.get(index).filter(|e| e.id == id).ok_or(CompileError::UnknownEntry(id))?;
            self.tier2.remove(&self.rendered[index]);
            let rendered = render_entry(entry, Some(&treatment), counter, &mut self.tag_counts);
            self.tier2.add(&rendered);
            self.rendered[index] = rendered;
            self.treatments.insert(id, treatment);
        }
        Ok(())
    }

    /// Compile the packet for one request. O(1) in the history: Tier 2 is borrowed as rendered,
    /// with `journal`, the entries it was last synced with ([`Self::sync`]), for their text.
    pub fn compile<'a>(
        &'a self,
        journal: &'a [Entry],
        limit: u64,
        policy: BudgetPolicy,
    ) -> Result<Packet<'a>, CompileError> {
        let status = self.status(limit, policy)?;
        Ok(Packet {
            prefix: &self.prefix,
            entries: &self.rendered,
            journal,
            telemetry: if self.volatile_context.is_empty() {
                status.telemetry_line()
            } else {
                format!("{}\n\n{}", self.volatile_context, status.telemetry_line())
            },
            breakpoints: self.breakpoints(),
            status,
            tier2: self.tier2,
        })
    }

    /// The context status a [`Self::compile`] now would report, without compiling the packet.
    pub fn status(&self, limit: u64, policy: BudgetPolicy) -> Result<ContextStatus, CompileError> {
        let telemetry_estimate = render::TELEMETRY_TOKENS;
        Ok(ContextBudget::new(limit, self.context_tokens() + telemetry_estimate, policy)?.status())
    }

    fn breakpoints(&self) -> Vec<Breakpoint> {
        if self.placement == BreakpointPlacement::Off {
            return Vec::new();
        }
        let mut points = Vec::with_capacity(3);
        if !self.prefix.sections().is_empty() {
            points.push(Breakpoint::Tier1);
        }
        let last_included = self.rendered.iter().rposition(|r| r.included);
        if let Some(summary) = self.last_summary
            && self.rendered[summary].included
            && Some(summary) != last_included
        {
            points.push(Breakpoint::Entry { id: self.rendered[summary].id });
        }
        if let Some(last) = last_included {
            points.push(Breakpoint::Entry { id: self.rendered[last].id });
        }
        points.truncate(MAX_BREAKPOINTS);
        points
    }

    /// Every inclusion decision, Tier 1 to Tier 3 (for the inspector; O(history)), with `journal`,
    /// the entries Tier 2 was last synced with, for their content hashes.
    pub fn decisions(&self, journal: &[Entry], privacy_scope: &str) -> Vec<InclusionDecision> {
        let mut decisions = Vec::with_capacity(self.rendered.len() + 4);
        let manifest = self.prefix.manifest();
        for section in &manifest.sections {
            let (source, trust_class) = section_provenance(section.class);
            decisions.push(InclusionDecision {
                id: tier1_section_id(&section.id),
                tier: 1,
                included: true,
                reason: InclusionReason::StablePrefix,
                tokens: u64::from(section.tokens),
                source_hash: section.source_hash.clone(),
                source,
                trust_class,
                privacy_scope: privacy_scope.to_owned(),
            });
        }
        for (index, entry) in self.rendered.iter().enumerate() {
            let (source, trust_class) = entry_provenance(entry.id.kind(), entry.role);
            let journaled = journaled_at(journal, index, entry.id);
            decisions.push(InclusionDecision {
                id: entry.id.to_string(),
                tier: 2,
                included: entry.included,
                reason: entry.reason,
                tokens: entry.tokens,
                source_hash: journaled.map(|journaled| journaled.content_hash.clone()).unwrap_or_default(),
                source,
                trust_class,
                privacy_scope: privacy_scope.to_owned(),
            });
        }
        let (source, trust_class) = provenance::TELEMETRY_PROVENANCE;
        decisions.push(InclusionDecision {
            id: "tier3.telemetry".into(),
            tier: 3,
            included: true,
            reason: InclusionReason::Telemetry,
            tokens: render::TELEMETRY_TOKENS,
            source_hash: String::new(),
            source,
            trust_class,
            privacy_scope: privacy_scope.to_owned(),
        });
        decisions
    }

    /// For each fraction (percent of `limit`), which entries a lower limit would have removed from the
    /// current packet: Ephemeral entries expire first, then Reference entries, then Working entries
    /// are compacted oldest first; Critical entries and Tier 1 never leave (the simulation of §17.16).
    pub fn simulate_lower_budgets(
        &self,
        limit: u64,
        policy: BudgetPolicy,
        percents: &[u8],
    ) -> Vec<LowerBudgetOutcome> {
        let reserved =
            policy.reserved_completion_tokens + policy.protocol_overhead_tokens + policy.safety_margin_tokens;
        let used = self.context_tokens() + render::TELEMETRY_TOKENS;
        let included: Vec<&RenderedEntry> = self.rendered.iter().filter(|r| r.included).collect();
        let order = [
            (RetentionClass::Ephemeral, "expire"),
            (RetentionClass::Reference, "elide"),
            (RetentionClass::Working, "compact"),
        ];
        percents
            .iter()
            .map(|&percent| {
                let lower = limit * u64::from(percent) / 100;
                let room = lower.saturating_sub(reserved);
                let tokens_over = used.saturating_sub(room);
                let mut freed = 0u64;
                let mut removed = Vec::new();
                'classes: for (class, action) in order {
                    for entry in included.iter().filter(|r| r.retention == class) {
                        if freed >= tokens_over {
                            break 'classes;
                        }
                        freed += entry.tokens;
                        removed.push(LowerBudgetRemoval { id: entry.id, tokens: entry.tokens, action });
                    }
                }
                LowerBudgetOutcome {
                    limit: lower,
                    percent_of_limit: percent,
                    tokens_over,
                    removed,
                    fits: freed >= tokens_over,
                }
            })
            .collect()
    }

    /// The class of every Tier-1 section, in order (for provider adapters).
    pub fn prefix_classes(&self) -> Vec<SectionClass> {
        self.prefix.sections().iter().map(|s| s.class).collect()
    }
}

#[cfg(test)]
mod tests;
