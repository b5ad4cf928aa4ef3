//! Replays one session under every policy: rebuild each call's prompt, price it, and measure.
//!
//! The strata policy runs the real engine on an in-memory volume:
//! - the journal;
//! - redaction, spill to the artifact store, dedup and retention classification on append;
//! - the incremental compiler with its breakpoints;
//! - cache-aware batched elision and expiry before each call;
//! - extractive compaction when the budget reaches the compaction trigger.
//!
//! The anchor policies rebuild their prompt from the messages as published (see [`super::policies`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use regex::Regex;
use serde::Serialize;

use crate::artifacts::{ArtifactRef, ArtifactStore};
use crate::budget::BudgetPolicy;
use crate::compaction::{CompactionMode, CompactionRequest, CompactionSettings, compact_extractive};
use crate::compiler::{Breakpoint, BreakpointPlacement, ContextCompiler, InclusionReason, Treatment};
use crate::dedup::{DedupIndex, render_duplicate};
use crate::economics::CachePricing;
use crate::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, Role, ToolResult};
use crate::journal::sim::SimStorage;
use crate::journal::{Journal, JournalOptions, SyncPolicy};
use crate::prefix::{StablePrefix, StablePrefixSources, ToolRegistry};
use crate::redaction::Redactor;
use crate::retention::{Classifier, ExpiryPolicy, RetentionMatch, RetentionRule, plan_expiry};
use crate::tokens::{MESSAGE_OVERHEAD_TOKENS, TokenCounter};
use crate::tool_output::{ElisionPolicy, SpillPolicy, elide_entry, plan_elision, spill};

use super::policies::{MessageIndex, PolicyKind, PolicySettings, Variant, anchor_variant, variant_text};
use super::pricing::{Block, CallCost, Provider, ProviderCache, block_hash};
use super::transcript::Transcript;

/// Seconds between calls when the input has no timestamps.
const DEFAULT_CALL_SPACING_MS: u64 = 30_000;

/// Strata's knobs in replay (the policy file's effective values).
#[derive(Clone, Debug)]
pub struct StrataSettings {
    /// Spill.
    pub spill: SpillPolicy,
    /// Elision.
    pub elision: ElisionPolicy,
    /// Retention rules.
    pub retention_rules: Vec<RetentionRule>,
    /// Expiry batching.
    pub expiry: ExpiryPolicy,
    /// Whether budget-triggered compaction runs.
    pub automatic_compaction: bool,
    /// Compaction trigger, percent of the window.
    pub compaction_trigger_percent: u8,
    /// Compaction settings.
    pub compaction: CompactionSettings,
    /// Redaction on.
    pub redaction: bool,
}

impl Default for StrataSettings {
    fn default() -> Self {
        StrataSettings {
            spill: SpillPolicy::default(),
            elision: ElisionPolicy::default(),
            retention_rules: vec![RetentionRule {
                name: "heartbeats".into(),
                class: crate::entry::RetentionClass::Ephemeral,
                matcher: RetentionMatch {
                    roles: None,
                    tool_names: None,
                    content_regex: Some(r"(?i)^\s*(heartbeat|HEARTBEAT_OK|status check|ping)\b".into()),
                },
                ttl_seconds: Some(3600),
            }],
            expiry: ExpiryPolicy::default(),
            automatic_compaction: true,
            compaction_trigger_percent: 85,
            compaction: CompactionSettings::default(),
            redaction: true,
        }
    }
}

/// Everything a replay needs besides the transcript.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Whose cache rules price the calls.
    pub provider: Provider,
    /// The model's context window.
    pub context_window: u64,
    /// Budget reservations and thresholds.
    pub budget: BudgetPolicy,
    /// Anchor-policy knobs.
    pub anchors: PolicySettings,
    /// Strata's knobs.
    pub strata: StrataSettings,
    /// Policies to run.
    pub policies: Vec<PolicyKind>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            provider: Provider::Anthropic,
            context_window: 200_000,
            budget: BudgetPolicy::default(),
            anchors: PolicySettings::default(),
            strata: StrataSettings::default(),
            policies: PolicyKind::ALL.to_vec(),
        }
    }
}

/// One priced call.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallRecord {
    /// Call number, from 0.
    pub call: usize,
    /// What it cost.
    pub cost: CallCost,
    /// Whether the prompt plus reservations exceeded the window.
    pub over_budget: bool,
    /// Whether a compaction ran before this call.
    pub compacted: bool,
}

/// What a policy kept readable.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preservation {
    /// Outputs moved off-window (spilled or elided).
    pub stored_outputs: u64,
    /// Of which read back byte-exact from the artifact store.
    pub readable_byte_exact: u64,
    /// Decision, constraint and TODO lines in the source.
    pub markers: u64,
    /// Of which still in the final context or reopenable from an artifact.
    pub markers_surviving: u64,
}

/// One policy over one session.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    /// The policy.
    pub policy: PolicyKind,
    /// Every call.
    pub calls: Vec<CallRecord>,
    /// Largest prompt.
    pub peak_context: u64,
    /// Calls whose prompt did not fit the budget.
    pub calls_over_budget: u64,
    /// Compactions run.
    pub compactions: u64,
    /// Outputs spilled.
    pub spills: u64,
    /// Outputs elided.
    pub elisions: u64,
    /// Entries expired.
    pub expirations: u64,
    /// Duplicate outputs replaced by references.
    pub deduplications: u64,
    /// Preservation (strata only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preservation: Option<Preservation>,
}

impl PolicyReport {
    fn new(policy: PolicyKind) -> Self {
        PolicyReport {
            policy,
            calls: Vec::new(),
            peak_context: 0,
            calls_over_budget: 0,
            compactions: 0,
            spills: 0,
            elisions: 0,
            expirations: 0,
            deduplications: 0,
            preservation: None,
        }
    }

    /// Sum of the calls' bills.
    pub fn totals(&self) -> CallCost {
        self.calls.iter().fold(CallCost::default(), |sum, c| sum + c.cost)
    }

    fn record(&mut self, cost: CallCost, reserved: u64, window: u64, compacted: bool) {
        let over_budget = cost.total + reserved > window;
        self.peak_context = self.peak_context.max(cost.total);
        self.calls_over_budget += u64::from(over_budget);
        self.calls.push(CallRecord { call: self.calls.len(), cost, over_budget, compacted });
    }
}

/// How the input's own usage compares with our token count (naive prompts).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCalibration {
    /// Calls with recorded usage.
    pub calls: u64,
    /// Prompt tokens the provider reported.
    pub recorded_prompt_tokens: u64,
    /// Prompt tokens we counted for the same calls.
    pub counted_prompt_tokens: u64,
    /// Cached tokens the provider reported.
    pub recorded_cached_tokens: u64,
}

/// One session under every policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionReport {
    /// The input.
    pub name: String,
    /// Model calls.
    pub calls: usize,
    /// Our count against the provider's.
    pub calibration: TokenCalibration,
    /// Per policy.
    pub policies: Vec<PolicyReport>,
}

/// A replay that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The engine refused something (journal, artifacts, compaction).
    #[error("{session}: the strata engine failed at call {call}: {message}")]
    Engine {
        /// Session name.
        session: String,
        /// Call number.
        call: usize,
        /// What failed.
        message: String,
    },
}

/// Replay `transcript` under `options.policies`.
pub fn replay_session(
    transcript: &Transcript,
    options: &ReplayOptions,
    counter: &TokenCounter,
) -> Result<SessionReport, ReplayError> {
    let mut tokens = TokenMemo::new(counter);
    let times = call_times(transcript);
    let mut policies = Vec::with_capacity(options.policies.len());
    let mut calibration = TokenCalibration::default();
    for &kind in &options.policies {
        let report = if kind == PolicyKind::Strata {
            StrataRun::new(transcript, options, counter)?.run(&times)?
        } else {
            replay_anchor(kind, transcript, options, &times, &mut tokens, &mut calibration)
        };
        policies.push(report);
    }
    Ok(SessionReport { name: transcript.name.clone(), calls: transcript.calls.len(), calibration, policies })
}

fn call_times(transcript: &Transcript) -> Vec<u64> {
    let mut last = 0;
    transcript
        .calls
        .iter()
        .map(|&(index, _)| {
            let at = transcript.messages[index]
                .at_ms
                .filter(|&t| t >= last)
                .unwrap_or(last + DEFAULT_CALL_SPACING_MS);
            last = at;
            at
        })
        .collect()
}

/// Token counts of message texts, counted once.
struct TokenMemo<'a> {
    counter: &'a TokenCounter,
    counts: HashMap<u64, u64>,
}

impl<'a> TokenMemo<'a> {
    fn new(counter: &'a TokenCounter) -> Self {
        TokenMemo { counter, counts: HashMap::new() }
    }

    fn block(&mut self, text: &str, breakpoint: bool) -> Block {
        let hash = block_hash(text);
        let tokens = *self
            .counts
            .entry(hash)
            .or_insert_with(|| u64::from(self.counter.count(text)) + u64::from(MESSAGE_OVERHEAD_TOKENS));
        Block { hash, tokens, breakpoint }
    }
}

fn reserved(budget: &BudgetPolicy) -> u64 {
    budget.reserved_completion_tokens + budget.protocol_overhead_tokens + budget.safety_margin_tokens
}

fn replay_anchor(
    kind: PolicyKind,
    transcript: &Transcript,
    options: &ReplayOptions,
    times: &[u64],
    tokens: &mut TokenMemo<'_>,
    calibration: &mut TokenCalibration,
) -> PolicyReport {
    let settings = &options.anchors;
    let messages = &transcript.messages;
    let index_of = MessageIndex::new(messages);
    let mut report = PolicyReport::new(kind);
    let mut cache = ProviderCache::new(options.provider);
    let mut cleared = vec![false; messages.len()];
    // (message, variant) → (hash, tokens): each variant's text is built and counted once.
    let mut variants: HashMap<(usize, Variant), (u64, u64)> = HashMap::new();
    let mut spilled = HashSet::new();
    let mut elided = HashSet::new();
    for (call, &(end, usage)) in transcript.calls.iter().enumerate() {
        let mut build = |cleared: &[bool]| -> Vec<Block> {
            (0..end)
                .map(|i| {
                    let variant = anchor_variant(kind, settings, messages, &index_of, i, end, cleared);
                    if let Variant::Seed002 { spilled: s, elided: e } = variant {
                        if s {
                            spilled.insert(i);
                        }
                        if e {
                            elided.insert(i);
                        }
                    }
                    let (hash, count) = *variants.entry((i, variant)).or_insert_with(|| {
                        let block = tokens.block(&variant_text(settings, &messages[i], variant), false);
                        (block.hash, block.tokens)
                    });
                    let breakpoint = i + 1 == end || (i == 0 && messages[0].role == Role::System);
                    Block { hash, tokens: count, breakpoint }
                })
                .collect()
        };
        let mut blocks = build(&cleared);
        let total: u64 = blocks.iter().map(|b| b.tokens).sum();
        if kind == PolicyKind::ClearToolUses && total > settings.clear_trigger_tokens {
            let results: Vec<usize> = (0..end).filter(|&i| messages[i].is_tool_result()).collect();
            for &i in results.iter().rev().skip(settings.clear_keep) {
                cleared[i] = true;
            }
            blocks = build(&cleared);
        }
        let cost = cache.price(&blocks, times[call]);
        if kind == PolicyKind::Naive
            && let Some(usage) = usage
        {
            calibration.calls += 1;
            calibration.recorded_prompt_tokens += usage.prompt_tokens;
            calibration.recorded_cached_tokens += usage.cached_tokens;
            calibration.counted_prompt_tokens += cost.total;
        }
        report.record(cost, reserved(&options.budget), options.context_window, false);
    }
    report.spills = spilled.len() as u64;
    report.elisions = elided.len() as u64;
    report.expirations = cleared.iter().filter(|c| **c).count() as u64;
    report
}

/// Lines that carry decisions, constraints and to-dos.
fn marker_pattern() -> Option<Regex> {
    Regex::new(r"(?i)\b(decided|decision|constraint|must not|TODO|FIXME)\b").ok()
}

/// The strata policy's state for one session.
struct StrataRun<'a> {
    transcript: &'a Transcript,
    options: &'a ReplayOptions,
    counter: &'a TokenCounter,
    journal: Journal,
    store: ArtifactStore,
    compiler: ContextCompiler,
    first: usize,
    redactor: Option<Redactor>,
    classifier: Option<Classifier>,
    dedup: DedupIndex,
    ttl_of: HashMap<EntryId, u32>,
    elided: HashSet<EntryId>,
    expired: HashSet<EntryId>,
    stored: Vec<(ArtifactRef, String)>,
    report: PolicyReport,
}

const TENANT: &str = "replay";

impl<'a> StrataRun<'a> {
    fn new(
        transcript: &'a Transcript,
        options: &'a ReplayOptions,
        counter: &'a TokenCounter,
    ) -> Result<Self, ReplayError> {
        let fail =
            |message: String| ReplayError::Engine { session: transcript.name.clone(), call: 0, message };
        // Tier 1: a leading system message is the stable prefix, if it is free of volatile material.
        let mut first = 0;
        let mut sources = StablePrefixSources::default();
        if let Some(system) = transcript.messages.first().filter(|m| m.role == Role::System) {
            let candidate =
                StablePrefixSources { system_prompt: system.text.clone(), ..StablePrefixSources::default() };
            if StablePrefix::build(&candidate, &mut ToolRegistry::new(), counter).is_ok() {
                sources = candidate;
                first = 1;
            }
        }
        let prefix = StablePrefix::build(&sources, &mut ToolRegistry::new(), counter)
            .map_err(|e| fail(e.to_string()))?;
        let mut journal_options = JournalOptions::new("replay", 0);
        journal_options.sync_policy = SyncPolicy::Batched { max_pending: 1 << 20 };
        let storage = Arc::new(SimStorage::new());
        let journal =
            Journal::open(storage.clone(), "/data", journal_options).map_err(|e| fail(e.to_string()))?.0;
        Ok(StrataRun {
            transcript,
            options,
            counter,
            journal,
            store: ArtifactStore::new(storage, "/data/artifacts"),
            compiler: ContextCompiler::new(prefix, BreakpointPlacement::Auto),
            first,
            redactor: Redactor::new(options.strata.redaction, &[]).ok().flatten(),
            classifier: Classifier::new(options.strata.retention_rules.clone()).ok(),
            dedup: DedupIndex::new(),
            ttl_of: HashMap::new(),
            elided: HashSet::new(),
            expired: HashSet::new(),
            stored: Vec::new(),
            report: PolicyReport::new(PolicyKind::Strata),
        })
    }

    fn fail(&self, call: usize, message: impl std::fmt::Display) -> ReplayError {
        ReplayError::Engine { session: self.transcript.name.clone(), call, message: message.to_string() }
    }

    fn run(mut self, times: &[u64]) -> Result<PolicyReport, ReplayError> {
        let first = self.first;
        let mut next = first;
        let mut cache = ProviderCache::new(self.options.provider);
        for (call, &(end, _)) in self.transcript.calls.iter().enumerate() {
            let now = times[call];
            while next < end {
                self.append(next, now).map_err(|e| self.fail(call, e))?;
                next += 1;
            }
            let compacted = self.before_call(call, now)?;
            let blocks = self.blocks(call)?;
            let cost = cache.price(&blocks, now);
            self.report.record(cost, reserved(&self.options.budget), self.options.context_window, compacted);
        }
        self.report.preservation = Some(self.preservation(first));
        Ok(self.report)
    }

    fn append(&mut self, index: usize, now: u64) -> Result<(), String> {
        let message = &self.transcript.messages[index];
        let text = match &self.redactor {
            Some(redactor) => redactor.redact(&message.text).text.into_owned(),
            None => message.text.clone(),
        };
        let (class, ttl) = match &self.classifier {
            Some(classifier) => classifier.classify(message.role, &text, message.tool_name.as_deref()),
            None => (crate::entry::RetentionClass::Working, None),
        };
        let (kind, content, refs) = if message.is_tool_result() {
            let outcome =
                spill(&text, &self.options.strata.spill, &self.store, TENANT).map_err(|e| e.to_string())?;
            let mut refs = Vec::new();
            if let Some(data_ref) = outcome.data_ref.clone() {
                self.report.spills += 1;
                self.stored.push((data_ref.clone(), text.clone()));
                refs.push(data_ref);
            }
            let result = ToolResult {
                call_id: format!("call_{index}"),
                name: message.tool_name.clone(),
                output: outcome.window_text,
            };
            (
                EntryKind::ToolResult,
                Content { text: String::new(), tool_calls: Vec::new(), tool_results: vec![result] },
                refs,
            )
        } else {
            (EntryKind::Message, Content::text(text.clone()), Vec::new())
        };
        let counted: String = content.tool_results.first().map_or(content.text.clone(), |r| r.output.clone());
        let draft = EntryDraft {
            kind,
            role: message.role,
            tokens: u64::from(self.counter.count(&counted)) + u64::from(MESSAGE_OVERHEAD_TOKENS),
            content,
            retention: class,
            created_at_ms: now,
            artifact_refs: refs,
        };
        let entry = self.journal.append(draft).map_err(|e| e.to_string())?;
        if let Some(ttl) = ttl {
            self.ttl_of.insert(entry.id, ttl);
        }
        let duplicate_of = self.dedup.observe(&entry);
        self.compiler.sync(self.journal.generation(), self.journal.entries(), self.counter);
        if let Some(original) = duplicate_of {
            let batch = BTreeMap::from([(
                entry.id,
                Treatment::Replace { text: render_duplicate(original), reason: InclusionReason::Duplicate },
            )]);
            self.compiler
                .apply_treatments(batch, self.journal.entries(), self.counter)
                .map_err(|e| e.to_string())?;
            self.report.deduplications += 1;
        }
        Ok(())
    }

    /// Expiry, elision and compaction, as the gateway runs them before forwarding a call.
    fn before_call(&mut self, call: usize, now: u64) -> Result<bool, ReplayError> {
        let remaining = crate::economics::expected_remaining_calls(call as u64);
        let pricing = match self.options.provider {
            Provider::Anthropic => CachePricing::ANTHROPIC,
            Provider::OpenAi => CachePricing::OPENAI,
        };
        let counter = self.counter;
        let mut batch = BTreeMap::new();
        let ttl_of = &self.ttl_of;
        let entries = self.journal.entries();
        let expiry = plan_expiry(
            entries,
            now,
            &self.expired,
            |e| ttl_of.get(&e.id).copied(),
            &self.options.strata.expiry,
            remaining,
            pricing,
        );
        let elision = plan_elision(
            entries,
            &self.elided,
            &self.options.strata.elision,
            |t| u64::from(counter.count(t)),
            remaining,
            pricing,
        );
        let to_elide: Vec<Entry> = elision
            .map(|batch| entries.iter().filter(|e| batch.ids.contains(&e.id)).cloned().collect())
            .unwrap_or_default();
        if let Some(expiry) = expiry {
            for id in expiry.ids {
                self.expired.insert(id);
                batch.insert(id, Treatment::Omit);
                self.report.expirations += 1;
            }
        }
        {
            for entry in &to_elide {
                let id = entry.id;
                let (content, refs) = elide_entry(entry, &self.options.strata.elision, &self.store, TENANT)
                    .map_err(|e| self.fail(call, e))?;
                for (data_ref, result) in refs.iter().zip(&entry.content.tool_results) {
                    self.stored.push((data_ref.clone(), result.output.clone()));
                }
                let text: Vec<String> = content.tool_results.iter().map(|r| r.output.clone()).collect();
                self.elided.insert(id);
                batch.insert(
                    id,
                    Treatment::Replace { text: text.join("\n"), reason: InclusionReason::Elided },
                );
                self.report.elisions += 1;
            }
        }
        if !batch.is_empty()
            && let Err(error) = self.compiler.apply_treatments(batch, self.journal.entries(), counter)
        {
            return Err(self.fail(call, error));
        }
        let used = self.compiler.context_tokens() + reserved(&self.options.budget);
        let trigger =
            self.options.context_window * u64::from(self.options.strata.compaction_trigger_percent) / 100;
        if !self.options.strata.automatic_compaction || used < trigger {
            return Ok(false);
        }
        let request = CompactionRequest {
            mode: CompactionMode::Budget,
            reason: Some("context reached the compaction trigger".into()),
            resume_instruction: None,
            settings: self.options.strata.compaction.clone(),
            now_ms: now,
        };
        let record = match compact_extractive(&mut self.journal, &self.store, TENANT, request, counter) {
            Ok(record) => record,
            Err(error) => return Err(self.fail(call, error)),
        };
        let compacted = record.result_generation != record.source_generation;
        self.report.compactions += u64::from(compacted);
        self.compiler.sync(self.journal.generation(), self.journal.entries(), counter);
        Ok(compacted)
    }

    fn blocks(&self, call: usize) -> Result<Vec<Block>, ReplayError> {
        let packet = self
            .compiler
            .compile(self.options.context_window, self.options.budget)
            .map_err(|e| self.fail(call, e))?;
        let mut blocks = Vec::with_capacity(packet.entries.len() + 2);
        let prefix_text = packet.prefix.text();
        if !prefix_text.is_empty() {
            let tokens = u64::from(packet.prefix.manifest().total_tokens);
            blocks.push(Block {
                hash: block_hash(&prefix_text),
                tokens,
                breakpoint: packet.breakpoints.contains(&Breakpoint::Tier1),
            });
        }
        for entry in packet.entries.iter().filter(|e| e.included) {
            let breakpoint = packet.breakpoints.contains(&Breakpoint::Entry { id: entry.id });
            blocks.push(Block { hash: block_hash(&entry.text), tokens: entry.tokens, breakpoint });
        }
        blocks.push(Block {
            hash: block_hash(&packet.telemetry),
            tokens: u64::from(self.counter.count(&packet.telemetry)),
            breakpoint: false,
        });
        Ok(blocks)
    }

    fn preservation(&self, first: usize) -> Preservation {
        let mut result = Preservation { stored_outputs: self.stored.len() as u64, ..Preservation::default() };
        result.readable_byte_exact = self
            .stored
            .iter()
            .filter(|(data_ref, original)| {
                self.store.get(TENANT, data_ref).is_ok_and(|bytes| bytes == original.as_bytes())
            })
            .count() as u64;
        let Some(pattern) = marker_pattern() else { return result };
        let Ok(packet) = self.compiler.compile(self.options.context_window, self.options.budget) else {
            return result;
        };
        let mut context = packet.prefix.text();
        for entry in packet.entries.iter().filter(|e| e.included) {
            context.push_str(&entry.text);
        }
        let archives: Vec<String> = self
            .journal
            .entries()
            .iter()
            .flat_map(|e| e.artifact_refs.iter())
            .filter_map(|r| self.store.get(TENANT, r).ok())
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .chain(self.stored.iter().map(|(_, original)| original.clone()))
            .collect();
        let end = self.transcript.calls.last().map_or(0, |&(end, _)| end);
        for message in &self.transcript.messages[first.min(end)..end] {
            for line in message.text.lines().filter(|l| pattern.is_match(l)) {
                let line = line.trim();
                result.markers += 1;
                let redacted =
                    self.redactor.as_ref().map_or(line.to_string(), |r| r.redact(line).text.into_owned());
                let found = context.contains(&redacted)
                    || archives.iter().any(|a| a.contains(line) || a.contains(&redacted));
                result.markers_surviving += u64::from(found);
            }
        }
        result
    }
}
