//! One agent's context state: the journal, the incremental compiler, Tier 1, the session index and
//! the rendering caches, with the operations the request pipeline performs on them.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use strata_core::artifacts::{ArtifactError, ArtifactStore};
use strata_core::budget::{Admission, ContextBudget, ContextStatus, OperationRequest};
use strata_core::compiler::{
    BreakpointPlacement, CompileError, ContextCompiler, InclusionDecision, InclusionReason, SyncOutcome,
    Treatment,
};
use strata_core::dedup::{DedupIndex, render_duplicate};
use strata_core::economics::CachePricing;
use strata_core::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role, ToolResult};
use strata_core::journal::{Journal, JournalError, JournalOptions, StdStorage, Storage, SyncPolicy};
use strata_core::prefix::{PrefixError, StablePrefix, StablePrefixSources, ToolOrderError, ToolRegistry};
use strata_core::retention::{ExpiryPolicy, plan_expiry};
use strata_core::tokens::{Calibration, TokenCounter, TokenizerError};
use strata_core::tool_output::{ElisionPolicy, ToolOutputError, elide_entry, plan_elision, spill};

use super::body::{Assembly, ChunkedBody};
use super::config::Settings;
use super::conversation::{Api, Turn};
use super::fragments::FragmentCache;
use super::ledger::CallLedger;
use super::tier1::Tier1Json;
use super::tool_schema::{memory_tools, to_api_shape};
use super::transparent::{ChainHash, IndexError, TransparentIndex};
use super::{render_anthropic, render_openai};

/// Model calls expected before the prompt changes anyway, for the economics of rewrites.
const REMAINING_CALLS_ESTIMATE: u64 = 20;

/// Cross-process compaction proposals are picked up at most this often.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// A failure of the context engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The journal refused an operation (locked, corrupt, poisoned, I/O).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The client's system prompt or tools cannot form a stable prefix.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// The client's tools cannot be ordered.
    #[error(transparent)]
    ToolOrder(#[from] ToolOrderError),
    /// The budget policy does not fit the context window.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// Spilling a tool output failed.
    #[error(transparent)]
    Spill(#[from] ToolOutputError),
    /// The artifact store failed.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// The tokenizer could not be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The transparent-session index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// Appended entries could not be made durable.
    #[error("journal fsync failed: {0}")]
    Durability(String),
    /// A gateway state file failed.
    #[error("gateway state file {path}: {reason}")]
    State {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl EngineError {
    /// Whether the client caused the error (a bad system prompt or tool list).
    pub fn is_client_error(&self) -> bool {
        matches!(self, EngineError::Prefix(_) | EngineError::ToolOrder(_))
    }
}

/// Which stable section changed first since the previous request, or why the cache broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChurnCause {
    /// Nothing changed: the previous prompt is a prefix of this one.
    None,
    /// The first request since start.
    Cold,
    /// The system section changed.
    System,
    /// The tools section changed.
    Tools,
    /// The constants section changed.
    Constants,
    /// Tier 2 was rewritten (purge, compaction, rollback).
    HistoryRewrite,
}

impl ChurnCause {
    /// Label value for metrics.
    pub fn label(self) -> &'static str {
        match self {
            ChurnCause::None => "none",
            ChurnCause::Cold => "cold",
            ChurnCause::System => "system",
            ChurnCause::Tools => "tools",
            ChurnCause::Constants => "constants",
            ChurnCause::HistoryRewrite => "history_rewrite",
        }
    }
}

/// A Tier-1 section as the inspector shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SectionSummary {
    /// `tier1.system`, `tier2`, `tier3.telemetry`, ….
    pub id: String,
    /// Tokens.
    pub tokens: u64,
    /// sha256 of the section (Tier 2: of the last included entry).
    pub hash: String,
}

/// One upstream call, ready to send.
#[derive(Debug)]
pub struct UpstreamCall {
    /// Request body.
    pub body: ChunkedBody,
    /// Context status at compile time.
    pub status: ContextStatus,
    /// Sections for the inspector.
    pub sections: Vec<SectionSummary>,
    /// Cache breakpoints placed.
    pub breakpoints: usize,
    /// Why the cached prefix changed, if it did.
    pub churn: ChurnCause,
}

/// One entry as `GET /strata/v1/entries` lists it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntrySummary {
    /// Entry ID.
    pub id: String,
    /// Producer.
    pub role: Role,
    /// Retention class.
    pub retention: RetentionClass,
    /// Journaled tokens.
    pub tokens: u64,
    /// Tokens as sent (after elision or deduplication).
    pub window_tokens: u64,
    /// Whether it is in the window.
    pub included: bool,
    /// Why it is (not) in the window.
    pub reason: InclusionReason,
    /// Creation time, unix ms.
    pub created_at_ms: u64,
    /// sha256 of the content.
    pub content_hash: String,
}

/// The lower limits the inspector simulates, in percent of the real limit.
pub const LOWER_BUDGET_PERCENTS: &[u8] = &[75, 50, 25];

/// The agent's context.
pub struct Engine {
    journal: Journal,
    store: Arc<ArtifactStore>,
    counter: TokenCounter,
    compiler: ContextCompiler,
    placement: BreakpointPlacement,
    api: Api,
    registry: ToolRegistry,
    state_dir: PathBuf,
    prefix_inputs: Option<[u8; 32]>,
    tier1: Tier1Json,
    transparent: TransparentIndex,
    dedup: DedupIndex,
    ledger: CallLedger,
    fragments: FragmentCache,
    assembly: Assembly,
    tier2_epoch: u64,
    elided: HashSet<EntryId>,
    expired: HashSet<EntryId>,
    pending_churn: ChurnCause,
    last_refresh: Instant,
    appended_seq: u64,
    index_unsynced: bool,
}

/// The files a group commit fsyncs, and the write count it covers.
#[derive(Debug)]
pub struct DurableTarget {
    /// Writes up to this count become durable.
    pub seq: u64,
    /// Files to fsync.
    pub paths: Vec<PathBuf>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("journal", &self.journal).finish_non_exhaustive()
    }
}

fn state_error(path: &Path, reason: impl ToString) -> EngineError {
    EngineError::State { path: path.to_owned(), reason: reason.to_string() }
}

fn read_state<T: serde::de::DeserializeOwned + Default>(path: &Path) -> Result<T, EngineError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| state_error(path, error)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(error) => Err(state_error(path, error)),
    }
}

fn write_state<T: Serialize>(path: &Path, value: &T) -> Result<(), EngineError> {
    let bytes = serde_json::to_vec(value).map_err(|error| state_error(path, error))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|error| state_error(&tmp, error))?;
    std::fs::rename(&tmp, path).map_err(|error| state_error(path, error))
}

/// Current time in unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

impl Engine {
    /// Opens the agent's data directory: the journal at its root (taking the writer lock), artifacts
    /// under `artifacts/`, gateway state under `gateway/`.
    pub fn open(data_dir: &Path, settings: &Settings) -> Result<Self, EngineError> {
        let storage: Arc<dyn Storage> = Arc::new(StdStorage);
        let options = JournalOptions {
            sync_policy: SyncPolicy::Batched { max_pending: 0 },
            retain_generations: settings.config.policy.compaction.retain_generations as usize,
            ..JournalOptions::new("strata gateway", now_ms())
        };
        let (journal, report) = Journal::open(Arc::clone(&storage), data_dir, options)?;
        if let Some(torn) = &report.truncated {
            tracing::warn!(path = %torn.path.display(), bytes = torn.bytes, "journal: truncated a torn final record");
        }
        let store = Arc::new(ArtifactStore::new(storage, data_dir.join("artifacts")));
        let state_dir = data_dir.join("gateway");
        std::fs::create_dir_all(&state_dir).map_err(|error| state_error(&state_dir, error))?;
        let calibration: Option<Calibration> = read_state(&state_dir.join("calibration.json"))?;
        let counter = TokenCounter::with_calibration(settings.tokenizer(), calibration.unwrap_or_default())?;
        let registry: Option<ToolRegistry> = read_state(&state_dir.join("tool-registry.json"))?;
        let transparent = TransparentIndex::load(&state_dir.join("transparent-prefixes"))?;
        let elided: Option<HashSet<EntryId>> = read_state(&state_dir.join("elided.json"))?;
        let elided = elided.unwrap_or_default();
        let expired: Option<HashSet<EntryId>> = read_state(&state_dir.join("expired.json"))?;
        let expired = expired.unwrap_or_default();
        let api = match settings.provider() {
            strata_api::agent::Provider::Anthropic => Api::Anthropic,
            _ => Api::OpenAi,
        };
        let placeholder =
            StablePrefix::build(&StablePrefixSources::default(), &mut ToolRegistry::new(), &counter)?;
        let mut engine = Engine {
            journal,
            store,
            counter,
            compiler: ContextCompiler::new(placeholder, settings.placement),
            placement: settings.placement,
            api,
            registry: registry.unwrap_or_default(),
            state_dir,
            prefix_inputs: None,
            tier1: Tier1Json::default(),
            transparent,
            dedup: DedupIndex::new(),
            ledger: CallLedger::default(),
            fragments: FragmentCache::default(),
            assembly: Assembly::default(),
            tier2_epoch: 0,
            elided,
            expired,
            pending_churn: ChurnCause::Cold,
            last_refresh: Instant::now(),
            appended_seq: 0,
            index_unsynced: false,
        };
        engine.prepare_prefix(settings, "", &[])?;
        engine.rebuild_window(settings)?;
        engine.pending_churn = ChurnCause::Cold;
        Ok(engine)
    }

    /// The artifact store.
    pub fn store(&self) -> &Arc<ArtifactStore> {
        &self.store
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Tier 2 rendered from scratch, with deduplication treatments for every repeated output.
    fn rebuild_window(&mut self, settings: &Settings) -> Result<(), EngineError> {
        self.compiler = ContextCompiler::new(self.compiler.prefix().clone(), self.placement);
        self.compiler.sync(self.journal.generation(), self.journal.entries(), &self.counter);
        self.ledger.rebuild(self.journal.entries());
        self.dedup = DedupIndex::new();
        let mut batch = BTreeMap::new();
        for entry in self.journal.entries() {
            if let Some(original) = self.dedup.observe(entry) {
                batch.insert(
                    entry.id,
                    Treatment::Replace {
                        text: render_duplicate(original),
                        reason: InclusionReason::Duplicate,
                    },
                );
            }
        }
        self.compiler.apply_treatments(batch, self.journal.entries(), &self.counter)?;
        self.reapply_elisions(settings)?;
        self.fragments = FragmentCache::default();
        self.tier2_epoch += 1;
        Ok(())
    }

    /// Applies a settings change that affects the compiler, and picks up cross-process compactions.
    pub fn refresh(&mut self, settings: &Settings, force: bool) -> Result<(), EngineError> {
        if settings.placement != self.placement {
            self.placement = settings.placement;
            self.rebuild_window(settings)?;
        }
        if force || self.last_refresh.elapsed() >= REFRESH_INTERVAL {
            self.last_refresh = Instant::now();
            if self.journal.refresh()?.is_some() {
                self.sync_window()?;
            }
        }
        Ok(())
    }

    /// Brings Tier 2 up to date with the journal; returns the tokens saved by deduplication.
    fn sync_window(&mut self) -> Result<u64, EngineError> {
        let entries = self.journal.entries();
        match self.compiler.sync(self.journal.generation(), entries, &self.counter) {
            SyncOutcome::Appended(count) => {
                let new = &entries[entries.len() - count..];
                self.ledger.observe(new);
                let mut batch = BTreeMap::new();
                let mut saved = 0;
                for entry in new {
                    if let Some(original) = self.dedup.observe(entry) {
                        let text = render_duplicate(original);
                        saved += entry.tokens.saturating_sub(u64::from(self.counter.count(&text)));
                        batch.insert(
                            entry.id,
                            Treatment::Replace { text, reason: InclusionReason::Duplicate },
                        );
                    }
                }
                if !batch.is_empty() {
                    self.tier2_epoch += 1;
                }
                self.compiler.apply_treatments(batch, entries, &self.counter)?;
                Ok(saved)
            }
            SyncOutcome::Rebuilt(_) => {
                let live: HashSet<EntryId> = entries.iter().map(|entry| entry.id).collect();
                self.elided.retain(|id| live.contains(id));
                self.ledger.rebuild(entries);
                self.dedup = DedupIndex::new();
                for entry in entries {
                    self.dedup.observe(entry);
                }
                self.fragments.truncate(entries.len());
                self.tier2_epoch += 1;
                if self.pending_churn == ChurnCause::None {
                    self.pending_churn = ChurnCause::HistoryRewrite;
                }
                Ok(0)
            }
        }
    }

    fn elision_policy(settings: &Settings) -> ElisionPolicy {
        crate::engine_policy::elision_policy(&settings.config.policy.tool_results)
    }

    fn elision_treatment(content: &Content) -> Treatment {
        let mut text = content.text.clone();
        for result in &content.tool_results {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&result.output);
        }
        Treatment::Replace { text, reason: InclusionReason::Elided }
    }

    /// Re-applies persisted elisions and expirations after the window was rebuilt from scratch (e.g. at start).
    fn reapply_elisions(&mut self, settings: &Settings) -> Result<(), EngineError> {
        if self.elided.is_empty() && self.expired.is_empty() {
            return Ok(());
        }
        let policy = Self::elision_policy(settings);
        let mut batch = BTreeMap::new();
        for entry in self.journal.entries().iter().filter(|entry| self.expired.contains(&entry.id)) {
            batch.insert(entry.id, Treatment::Omit);
        }
        for entry in self
            .journal
            .entries()
            .iter()
            .filter(|entry| self.elided.contains(&entry.id) && !self.expired.contains(&entry.id))
        {
            let (content, _) = elide_entry(entry, &policy, &self.store, &settings.tenant)?;
            batch.insert(entry.id, Self::elision_treatment(&content));
        }
        self.compiler.apply_treatments(batch, self.journal.entries(), &self.counter)?;
        Ok(())
    }

    /// Removes Ephemeral entries whose retention TTL has passed, in cache-aware batches (an entry
    /// overdue by twice its TTL forces a batch). Returns the tokens removed per later call.
    pub fn expire_ephemeral(&mut self, settings: &Settings, now_ms: u64) -> Result<u64, EngineError> {
        let pricing = match settings.provider() {
            strata_api::agent::Provider::Anthropic => CachePricing::ANTHROPIC,
            _ => CachePricing::OPENAI,
        };
        let entries = self.journal.entries();
        let ttl_of = |entry: &Entry| {
            if entry.retention != RetentionClass::Ephemeral {
                return None;
            }
            let tool_name = entry.content.tool_results.first().and_then(|r| r.name.as_deref());
            let text =
                entry.content.tool_results.first().map_or(entry.content.text.as_str(), |r| r.output.as_str());
            settings.classifier.classify(entry.role, text, tool_name).1
        };
        let Some(planned) = plan_expiry(
            entries,
            now_ms,
            &self.expired,
            ttl_of,
            &ExpiryPolicy::default(),
            REMAINING_CALLS_ESTIMATE,
            pricing,
        ) else {
            return Ok(0);
        };
        let batch: BTreeMap<EntryId, Treatment> =
            planned.ids.iter().map(|id| (*id, Treatment::Omit)).collect();
        self.expired.extend(batch.keys().copied());
        self.compiler.apply_treatments(batch, entries, &self.counter)?;
        self.tier2_epoch += 1;
        if self.pending_churn == ChurnCause::None {
            self.pending_churn = ChurnCause::HistoryRewrite;
        }
        write_state(&self.state_dir.join("expired.json"), &Some(&self.expired))?;
        Ok(planned.saved_tokens)
    }

    /// Elides old large tool results when the batch pays for the cache rewrite (seed 002 #5).
    /// Returns the tokens saved per later call.
    pub fn elide_old_results(&mut self, settings: &Settings) -> Result<u64, EngineError> {
        let policy = Self::elision_policy(settings);
        let pricing = match settings.provider() {
            strata_api::agent::Provider::Anthropic => CachePricing::ANTHROPIC,
            _ => CachePricing::OPENAI,
        };
        let counter = &self.counter;
        let entries = self.journal.entries();
        let Some(planned) = plan_elision(
            entries,
            &self.elided,
            &policy,
            |text| u64::from(counter.count(text)),
            REMAINING_CALLS_ESTIMATE,
            pricing,
        ) else {
            return Ok(0);
        };
        let wanted: HashSet<EntryId> = planned.ids.iter().copied().collect();
        let mut batch = BTreeMap::new();
        for entry in entries.iter().filter(|entry| wanted.contains(&entry.id)) {
            let (content, _) = elide_entry(entry, &policy, &self.store, &settings.tenant)?;
            batch.insert(entry.id, Self::elision_treatment(&content));
        }
        self.elided.extend(batch.keys().copied());
        self.compiler.apply_treatments(batch, entries, &self.counter)?;
        self.tier2_epoch += 1;
        if self.pending_churn == ChurnCause::None {
            self.pending_churn = ChurnCause::HistoryRewrite;
        }
        write_state(&self.state_dir.join("elided.json"), &Some(&self.elided))?;
        Ok(planned.saved_tokens)
    }

    /// Rebuilds Tier 1 when the configured sources, the client's system text or its tools changed.
    pub fn prepare_prefix(
        &mut self,
        settings: &Settings,
        client_system: &str,
        client_tools: &[Value],
    ) -> Result<(), EngineError> {
        let mut hasher = Sha256::new();
        hasher.update(settings.revision.to_le_bytes());
        hasher.update((client_system.len() as u64).to_le_bytes());
        hasher.update(client_system.as_bytes());
        for tool in client_tools {
            hasher.update(tool.to_string().as_bytes());
            hasher.update([0]);
        }
        let inputs: [u8; 32] = hasher.finalize().into();
        if self.prefix_inputs == Some(inputs) {
            return Ok(());
        }
        let configured = &settings.config.stable_prefix;
        let mut combined: Vec<Value> =
            configured.tools.iter().map(|tool| to_api_shape(self.api, tool)).collect();
        let configured_names: Vec<String> = combined
            .iter()
            .filter_map(|tool| strata_core::prefix::tool_name(tool).map(str::to_owned))
            .collect();
        combined.extend(
            client_tools
                .iter()
                .filter(|tool| {
                    strata_core::prefix::tool_name(tool)
                        .is_none_or(|name| !configured_names.iter().any(|n| n == name))
                })
                .cloned(),
        );
        let mut registry = self.registry.clone();
        let mut ordered: Vec<Value> = registry.arrange(&combined)?.into_iter().cloned().collect();
        ordered.extend(memory_tools(self.api));
        let system_prompt = [configured.system_prompt.as_str(), client_system]
            .iter()
            .filter(|text| !text.trim().is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("\n\n");
        let sources = StablePrefixSources {
            system_prompt,
            tools: ordered.clone(),
            constants: configured.constants.clone(),
        };
        let prefix = StablePrefix::build(&sources, &mut ToolRegistry::new(), &self.counter)?;
        if registry != self.registry {
            write_state(&self.state_dir.join("tool-registry.json"), &registry)?;
            self.registry = registry;
        }
        let old = self.compiler.prefix().manifest();
        if self.pending_churn == ChurnCause::None && old.prefix_hash != prefix.manifest().prefix_hash {
            let changed = old
                .sections
                .iter()
                .zip(&prefix.manifest().sections)
                .find(|(before, after)| before.source_hash != after.source_hash)
                .map(|(before, _)| before.class);
            self.pending_churn = match changed {
                Some(strata_core::prefix::SectionClass::System) => ChurnCause::System,
                Some(strata_core::prefix::SectionClass::Tools) => ChurnCause::Tools,
                _ => ChurnCause::Constants,
            };
        }
        self.tier1 = Tier1Json::build(self.api, &prefix, ordered);
        self.compiler.set_prefix(prefix);
        self.prefix_inputs = Some(inputs);
        Ok(())
    }

    /// Which of `turns` are new: all of them in a stateful session, the ones after the longest
    /// journaled prefix in a transparent one. Returns the chain values for [`Self::remember_chain`].
    pub fn new_turns(&self, turns: &[Turn], transparent: bool) -> (usize, Vec<ChainHash>) {
        if !transparent {
            return (0, Vec::new());
        }
        let (chains, first_new) = self.transparent.split(turns);
        (first_new, chains)
    }

    /// Remembers transparent-session chain values once their turns are journaled (durable with
    /// the next group commit).
    pub fn remember_chain(&mut self, chains: &[ChainHash]) -> Result<(), EngineError> {
        if self.transparent.remember(chains)? {
            self.index_unsynced = true;
            self.appended_seq += 1;
        }
        Ok(())
    }

    /// Counts every write that still needs an fsync.
    pub fn appended_seq(&self) -> u64 {
        self.appended_seq
    }

    /// What a group commit must fsync to make every write up to now durable.
    pub fn durable_target(&mut self) -> DurableTarget {
        let mut paths = vec![self.journal.log_path()];
        if std::mem::take(&mut self.index_unsynced) {
            paths.push(self.transparent.path().to_owned());
        }
        DurableTarget { seq: self.appended_seq, paths }
    }

    /// Journal draft of a client turn: redacted, tool outputs spilled, classified and counted.
    pub fn draft(
        &self,
        settings: &Settings,
        turn: &Turn,
        now: u64,
    ) -> Result<(EntryDraft, u64), EngineError> {
        let redact = |text: &str| match &settings.redactor {
            Some(redactor) => redactor.redact(text).text.into_owned(),
            None => text.to_owned(),
        };
        let mut content = Content { text: redact(&turn.content.text), ..Content::default() };
        let mut counted = content.text.clone();
        for call in &turn.content.tool_calls {
            let mut call = call.clone();
            call.arguments_json = redact(&call.arguments_json);
            counted.push_str(&call.name);
            counted.push_str(&call.arguments_json);
            content.tool_calls.push(call);
        }
        let mut artifact_refs = Vec::new();
        let mut spilled_bytes = 0;
        for result in &turn.content.tool_results {
            let output = redact(&result.output);
            let outcome = spill(&output, &settings.spill, &self.store, &settings.tenant)?;
            if let Some(data_ref) = outcome.data_ref {
                spilled_bytes += output.len() as u64;
                artifact_refs.push(data_ref);
            }
            counted.push('\n');
            counted.push_str(&outcome.window_text);
            let name =
                result.name.clone().or_else(|| self.ledger.tool_name(&result.call_id).map(str::to_owned));
            content.tool_results.push(ToolResult {
                call_id: result.call_id.clone(),
                name,
                output: outcome.window_text,
            });
        }
        let tool_name = content
            .tool_results
            .first()
            .and_then(|result| result.name.as_deref())
            .or_else(|| content.tool_calls.first().map(|call| call.name.as_str()));
        let classified_text =
            content.tool_results.first().map_or(content.text.as_str(), |result| result.output.as_str());
        let (retention, _) = settings.classifier.classify(turn.role, classified_text, tool_name);
        let tokens = u64::from(self.counter.count_message(role_name(turn.role), &counted));
        let draft = EntryDraft {
            kind: turn.kind(),
            role: turn.role,
            content,
            retention,
            created_at_ms: now,
            tokens,
            artifact_refs,
        };
        Ok((draft, spilled_bytes))
    }

    /// The context status now.
    pub fn status(&self, settings: &Settings) -> Result<ContextStatus, EngineError> {
        Ok(self.compiler.compile(settings.limit, settings.budget)?.status)
    }

    /// Seed-000 admission of an operation adding `request.estimated_tokens` to the context.
    pub fn admit(&self, settings: &Settings, request: &OperationRequest) -> Result<Admission, EngineError> {
        let status = self.status(settings)?;
        let budget = ContextBudget::new(settings.limit, status.tokens, settings.budget)
            .map_err(|error| EngineError::Compile(CompileError::Budget(error)))?;
        Ok(budget.admit(request))
    }

    /// Appends drafts and updates Tier 2 (durable after the next group commit).
    /// Returns the tokens saved by deduplicating repeated outputs.
    pub fn append(&mut self, drafts: Vec<EntryDraft>) -> Result<u64, EngineError> {
        if drafts.is_empty() {
            return Ok(0);
        }
        for draft in drafts {
            self.journal.append(draft)?;
        }
        self.appended_seq += 1;
        self.sync_window()
    }

    /// Appends an entry produced by the gateway itself (assistant answer or memory-tool result).
    pub fn append_own(
        &mut self,
        settings: &Settings,
        role: Role,
        content: Content,
    ) -> Result<Entry, EngineError> {
        let redact = |text: &str| match &settings.redactor {
            Some(redactor) => redactor.redact(text).text.into_owned(),
            None => text.to_owned(),
        };
        let mut content = content;
        content.text = redact(&content.text);
        for call in &mut content.tool_calls {
            call.arguments_json = redact(&call.arguments_json);
        }
        for result in &mut content.tool_results {
            result.output = redact(&result.output);
        }
        let mut counted = content.text.clone();
        for call in &content.tool_calls {
            counted.push_str(&call.name);
            counted.push_str(&call.arguments_json);
        }
        for result in &content.tool_results {
            counted.push_str(&result.output);
        }
        let kind = if !content.tool_results.is_empty() {
            EntryKind::ToolResult
        } else if !content.tool_calls.is_empty() {
            EntryKind::ToolCall
        } else {
            EntryKind::Message
        };
        let tool_name = content.tool_calls.first().map(|call| call.name.clone());
        let (retention, _) = settings.classifier.classify(role, &counted, tool_name.as_deref());
        let draft = EntryDraft {
            kind,
            role,
            tokens: u64::from(self.counter.count_message(role_name(role), &counted)),
            content,
            retention,
            created_at_ms: now_ms(),
            artifact_refs: Vec::new(),
        };
        let entry = self.journal.append(draft)?;
        self.appended_seq += 1;
        self.sync_window()?;
        Ok(entry)
    }

    /// Compiles the packet and serialises the upstream request around `head`.
    pub fn plan_call(
        &mut self,
        settings: &Settings,
        head: Map<String, Value>,
    ) -> Result<UpstreamCall, EngineError> {
        let packet = self.compiler.compile(settings.limit, settings.budget)?;
        self.assembly.check_epoch(self.tier2_epoch);
        let (fragments, assembly, ledger) = (&mut self.fragments, &mut self.assembly, &self.ledger);
        let body = match self.api {
            Api::OpenAi => render_openai::body(head, &self.tier1, &packet, fragments, assembly, ledger),
            Api::Anthropic => render_anthropic::body(head, &self.tier1, &packet, fragments, assembly, ledger),
        };
        let mut sections: Vec<SectionSummary> = packet
            .prefix
            .manifest()
            .sections
            .iter()
            .map(|section| SectionSummary {
                id: format!("tier1.{}", section.id),
                tokens: u64::from(section.tokens),
                hash: section.source_hash.clone(),
            })
            .collect();
        let tier2_tokens = self.compiler.context_tokens() - u64::from(packet.prefix.manifest().total_tokens);
        sections.push(SectionSummary {
            id: "tier2".into(),
            tokens: tier2_tokens,
            hash: packet
                .entries
                .iter()
                .rev()
                .find(|e| e.included)
                .map(|e| e.source_hash.clone())
                .unwrap_or_default(),
        });
        sections.push(SectionSummary {
            id: "tier3.telemetry".into(),
            tokens: u64::from(self.counter.count(&packet.telemetry)),
            hash: String::new(),
        });
        let call = UpstreamCall {
            body,
            status: packet.status,
            sections,
            breakpoints: packet.breakpoints.len(),
            churn: std::mem::replace(&mut self.pending_churn, ChurnCause::None),
        };
        Ok(call)
    }

    /// Feeds a provider-reported prompt size back into calibration (Approximate tokenizers only).
    pub fn observe_usage(
        &mut self,
        estimated_tokens: u64,
        actual_prompt_tokens: u64,
    ) -> Result<(), EngineError> {
        let ratio = self.counter.calibration().ratio();
        let base = (estimated_tokens as f64 / ratio).round() as u64;
        let before = *self.counter.calibration();
        self.counter.observe_usage(
            u32::try_from(base).unwrap_or(u32::MAX),
            u32::try_from(actual_prompt_tokens).unwrap_or(u32::MAX),
        );
        if *self.counter.calibration() != before {
            write_state(&self.state_dir.join("calibration.json"), &Some(*self.counter.calibration()))?;
        }
        Ok(())
    }

    /// Mutable access for memory tools (journal, store, counter).
    pub fn parts_mut(&mut self) -> (&mut Journal, &ArtifactStore, &TokenCounter) {
        (&mut self.journal, &self.store, &self.counter)
    }

    /// Re-synchronises Tier 2 after a memory tool rewrote the journal.
    pub fn after_rewrite(&mut self) -> Result<(), EngineError> {
        self.sync_window().map(|_| ())
    }

    /// Every entry of the current generation with its window treatment.
    pub fn entry_summaries(&self) -> Vec<EntrySummary> {
        let decisions = self.compiler.decisions();
        let window: std::collections::HashMap<&str, &InclusionDecision> =
            decisions.iter().filter(|d| d.tier == 2).map(|d| (d.id.as_str(), d)).collect();
        self.journal
            .entries()
            .iter()
            .map(|entry| {
                let id = entry.id.to_string();
                let decision = window.get(id.as_str());
                EntrySummary {
                    retention: entry.retention,
                    role: entry.role,
                    tokens: entry.tokens,
                    window_tokens: decision.map_or(0, |d| d.tokens),
                    included: decision.is_some_and(|d| d.included),
                    reason: decision.map_or(InclusionReason::Journal, |d| d.reason),
                    created_at_ms: entry.created_at_ms,
                    content_hash: entry.content_hash.clone(),
                    id,
                }
            })
            .collect()
    }

    /// What the current packet would lose under lower limits (75%, 50% and 25% of the real one).
    pub fn lower_budgets(&self, settings: &Settings) -> Vec<strata_core::compiler::LowerBudgetOutcome> {
        self.compiler.simulate_lower_budgets(settings.limit, settings.budget, LOWER_BUDGET_PERCENTS)
    }

    /// Every inclusion decision of the current packet, Tier 1 to Tier 3.
    pub fn decisions(&self) -> Vec<InclusionDecision> {
        self.compiler.decisions()
    }
}
