//! [`SessionEngine`]: one agent's context state (journal, incremental compiler, Tier 1, the
//! transparent-session index, the rendering caches) and the turn-level operations on it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::artifacts::{ArtifactError, ArtifactRef, ArtifactStore};
use crate::budget::stages::{SectionTokens, Stage, allocate};
use crate::budget::{
    Admission, BudgetExceeded, ContextBudget, ContextStatus, MaxTokensClamp, OperationId, OperationRequest,
    StageUsage, clamp_max_tokens,
};
use crate::compaction::CompactionMode;
use crate::compiler::{
    BreakpointPlacement, CompileError, ContextCompiler, InclusionDecision, InclusionReason, Packet,
    SyncOutcome, Treatment, tier1_section_id,
};
use crate::dedup::{DedupIndex, render_duplicate};
use crate::delegation::ExpertDigest;
use crate::derived::DerivedLedger;
use crate::economics::expected_remaining_calls;
use crate::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role, ToolResult};
use crate::history_index::EntryIndex;
use crate::journal::sim::SimStorage;
use crate::journal::{Journal, JournalError, JournalOptions, StdStorage, Storage, SyncPolicy};
use crate::prefix::{
    PrefixError, StablePrefix, StablePrefixSources, ToolOrderError, ToolRegistry, VolatileSplit,
    split_volatile_lines,
};
use crate::replay::pricing::{Block, block_hash};
use crate::retention::{ExpiryCandidates, plan_expiry};
use crate::tokens::{Calibration, DigitShapeCounts, TokenCounter, TokenizerError};
use crate::tool_output::{
    ElisionCandidates, ElisionPolicy, ToolOutputError, elide_entry, has_elidable_output, plan_elision_among,
    spill,
};

use super::capabilities::{ToolBlockStats, ToolRanking, ToolView};
use super::compacting::{CompactionAsk, CompactionOutcome};
use super::durable::DurableTarget;
use super::memory_tools;
use super::render::body::{Assembly, ChunkedBody};
use super::render::fragments::FragmentCache;
use super::render::ledger::CallLedger;
use super::render::tier1::Tier1Json;
use super::render::{anthropic as render_anthropic, openai as render_openai};
use super::request_keys::{KeyRefusal, KeyedPlacement, RequestKeys};
use super::revocation::{DERIVED_FILE, DerivedState};
use super::settings::SessionSettings;
use super::state::{CorruptState, StateDir};
use super::sweep::{LIFECYCLE_FILE, Lifecycle, LifecycleLedger};
use super::tool_schema::{is_memory_tool, load_tools_tool, memory_tools, to_api_shape};
use super::transparent::{ChainHash, IndexError, Placement, TransparentIndex, chain};
use super::turn::{Api, AssistantOutput, ChatRequest, Turn};

/// Cross-process compaction proposals are picked up at most this often.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Artifacts that moved off-window, each with the text it must read back as.
type Offloaded = Vec<(ArtifactRef, String)>;

/// Entries a treatment changed and the tokens it saves per later call.
#[derive(Debug, Default, Clone, Copy)]
struct Treated {
    entries: u64,
    tokens: u64,
}

/// A request's new turns as journal drafts.
#[derive(Debug, Default)]
struct Drafts {
    drafts: Vec<EntryDraft>,
    spilled_bytes: u64,
    offloaded: Offloaded,
    digests: Vec<DigestRecord>,
}

/// A delegation result the parent received as a digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DigestRecord {
    /// The delegation tool.
    pub tool: String,
    /// Structured or extractive.
    pub source: crate::delegation::DigestSource,
    /// Tokens of the full result (in the artifact store).
    pub full_tokens: u64,
    /// Tokens of the digest in the parent's context.
    pub return_tokens: u64,
    /// Items left out to meet the parent-return budget.
    pub omitted_items: usize,
    /// The artifact holding the full result.
    pub data_ref: String,
}

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
    /// The request's idempotency key cannot be honoured.
    #[error(transparent)]
    RequestKey(#[from] KeyRefusal),
    /// Appended entries could not be made durable.
    #[error("journal fsync failed: {0}")]
    Durability(String),
    /// An engine state file failed.
    #[error("engine state file {path}: {reason}")]
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
        matches!(self, EngineError::Prefix(_) | EngineError::ToolOrder(_) | EngineError::RequestKey(_))
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
    /// Every cause, in declaration order: `ChurnCause::ALL[cause as usize] == cause`.
    pub const ALL: [ChurnCause; 6] = [
        ChurnCause::None,
        ChurnCause::Cold,
        ChurnCause::System,
        ChurnCause::Tools,
        ChurnCause::Constants,
        ChurnCause::HistoryRewrite,
    ];

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
    /// Request body in the provider's shape.
    pub body: ChunkedBody,
    /// Context status at compile time.
    pub status: ContextStatus,
    /// Sections for the inspector.
    pub sections: Vec<SectionSummary>,
    /// Cache breakpoints placed.
    pub breakpoints: usize,
    /// Why the cached prefix changed, if it did.
    pub churn: ChurnCause,
    /// The client's tools as sent (full schemas and summaries).
    pub tools: ToolBlockStats,
    /// Names of the client's tools this call shows only summarised (empty unless schemas are lazy):
    /// a streamed round that calls one of them first can be dropped and repeated with the schema.
    pub summarised_tools: Vec<String>,
    /// Each section's budget and use, the output reserve first.
    pub stages: Vec<StageUsage>,
    /// The client's `max_tokens`, when it was above the output reserve and lowered to it.
    pub max_tokens_clamp: Option<MaxTokensClamp>,
    /// The source material behind the packet: the context with Tier 2 counted as journaled
    /// (before elision, expiry and deduplication) instead of as sent. Over `status.tokens` it is
    /// the context compression ratio (spec §17.20).
    pub source_tokens: u64,
}

/// The client's request as the engine takes it.
#[derive(Debug)]
pub struct TurnRequest<'a> {
    /// The request in neutral form (system text, tools, messages).
    pub request: &'a ChatRequest,
    /// Whether the client resends its whole history (new turns are found by chain hash) rather
    /// than only the new messages (a stateful session).
    pub transparent: bool,
    /// A stateful client's `Idempotency-Key`: the same key with the same messages again replaces
    /// the earlier attempt instead of journaling the turn twice (see [`crate::session::request_keys`]).
    pub request_key: Option<&'a str>,
    /// The operation, for admission and resume.
    pub operation_id: OperationId,
    /// The upstream body's leading fields (model, parameters, cache hints).
    pub head: Map<String, Value>,
    /// Now, unix milliseconds.
    pub now_ms: u64,
}

/// A turn the engine admitted: its new entries are journaled and the first call is compiled.
#[derive(Debug)]
pub struct AdmittedTurn {
    /// Entries journaled from the request.
    pub new_entries: usize,
    /// Bytes of tool output moved to the artifact store.
    pub spilled_bytes: u64,
    /// Tokens saved by deduplicating repeated outputs.
    pub deduplicated: u64,
    /// Outputs replaced by a reference to an identical earlier one.
    pub deduplicated_outputs: u64,
    /// Outputs spilled to the artifact store.
    pub spilled_outputs: u64,
    /// What moved off-window: each artifact with the text it must read back as.
    pub offloaded: Vec<(ArtifactRef, String)>,
    /// Compactions the engine ran to make room (automatic compaction).
    pub compactions: u64,
    /// Transparent sessions: the journal was rewound because the client's history diverged.
    pub rewind: Option<Rewind>,
    /// Kinds of volatile material the client's system prompt carried, moved below the cache
    /// boundary (empty when none).
    pub volatile_system: Vec<crate::prefix::VolatileKind>,
    /// Transparent sessions: the chain value after the request's last message, to which the
    /// answer is chained once the client has seen it.
    pub chain_tail: Option<ChainHash>,
    /// Transparent sessions: the chain value after each of the request's turns (for the caller's
    /// [`super::message_memo::MessageMemo`]); empty for a stateful request.
    pub chains: Vec<ChainHash>,
    /// Delegation results journaled as digests.
    pub digests: Vec<DigestRecord>,
    /// The first upstream call.
    pub first_call: UpstreamCall,
}

/// Why a transparent session's journal was rewound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RewindCause {
    /// The client resent a turn it had already sent: the answer it never saw was dropped.
    Retry,
    /// The client's history changed after a shared turn (an edited message, a client-side
    /// compaction that kept the opening turns).
    Edit,
    /// No turn of the request is in the journal: a new conversation, or a client-side
    /// compaction that replaced the whole history.
    NewConversation,
}

impl RewindCause {
    /// Label value for metrics.
    pub fn label(self) -> &'static str {
        match self {
            RewindCause::Retry => "retry",
            RewindCause::Edit => "edit",
            RewindCause::NewConversation => "new_conversation",
        }
    }
}

/// A rewind of the journal to the last turn the client's request still shares with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rewind {
    /// Why.
    pub cause: RewindCause,
    /// Journal entries kept.
    pub kept_entries: u64,
    /// Journal entries dropped (they stay in the parent generation).
    pub dropped_entries: u64,
    /// The new journal generation.
    pub generation: u64,
}

/// Where a request's turns go: the first new turn, the chain values of all of them, and the rewind
/// that made room for them, if any.
type Placed = (usize, Vec<ChainHash>, Option<Rewind>);

/// What the engine decided about a request.
#[derive(Debug)]
pub enum TurnOutcome {
    /// Journaled and compiled.
    Admitted(Box<AdmittedTurn>),
    /// Blocked by the budget; nothing was journaled (a transparent session's journal may have
    /// been rewound to the client's history first).
    Blocked(Box<BudgetExceeded>),
    /// The request's new turns begin among its hollow ones ([`ChatRequest::hollow_turns`]: the
    /// journal no longer holds turns the client's memo took for journaled: a rewind by a request of
    /// another conversation, a rollback, or an edit of a turn a compaction summarised). Nothing was
    /// changed: send it again with every turn whole.
    NeedsWholeHistory,
}

/// What recording one round's answer did.
#[derive(Debug, Default)]
pub struct AnswerEffects {
    /// The round called only memory tools: the engine answered them and the model must be called
    /// again ([`SessionEngine::next_call`]).
    pub internal: bool,
    /// Names of the memory tools the round called, in order.
    pub memory_calls: Vec<String>,
    /// Purges run.
    pub purges: u64,
    /// Compactions run.
    pub compactions: u64,
    /// Tokens per later call saved by elision.
    pub elided_tokens: u64,
    /// Tokens per later call saved by retention expiry.
    pub expired_tokens: u64,
    /// Entries elided.
    pub elided_entries: u64,
    /// Entries expired.
    pub expired_entries: u64,
    /// What elision and expiry moved off-window: each artifact with the text it must read back as.
    pub offloaded: Vec<(ArtifactRef, String)>,
    /// Tool schemas the model loaded with `strata_load_tools`.
    pub tools_loaded: u64,
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
    /// Artifacts holding the entry's full output (spilled, or elided from the window).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_refs: Vec<String>,
    /// Where it comes from (see [`InclusionDecision::source`]).
    pub source: &'static str,
    /// How far it is trusted.
    pub trust_class: crate::compiler::TrustClass,
    /// The privacy scope it belongs to.
    pub privacy_scope: String,
}

/// The lower limits the inspector simulates, in percent of the real limit.
pub const LOWER_BUDGET_PERCENTS: &[u8] = &[75, 50, 25];

/// What a stable prefix was built from, besides the client's tools (kept whole beside it).
#[derive(Debug)]
struct PrefixInputs {
    /// The settings' revision.
    revision: u64,
    /// The stable part of the client's system prompt.
    stable_system: String,
}

/// One agent's context, and the only place that decides what the model sees.
pub struct SessionEngine {
    pub(super) journal: Journal,
    pub(super) storage: Arc<dyn Storage>,
    pub(super) store: Arc<ArtifactStore>,
    counter: TokenCounter,
    /// The telemetry line's count by its shape (it changes its numbers on every request).
    telemetry_counts: DigitShapeCounts,
    compiler: ContextCompiler,
    placement: BreakpointPlacement,
    api: Api,
    registry: ToolRegistry,
    pub(super) state: StateDir,
    /// The artifact sweeper's clocks and per-generation reference cache.
    pub(super) lifecycle: Lifecycle,
    /// What the stable prefix in force was built from; `None` asks the next request to build it.
    prefix_inputs: Option<PrefixInputs>,
    tier1: Tier1Json,
    transparent: TransparentIndex,
    request_keys: RequestKeys,
    keys_unsynced: bool,
    dedup: DedupIndex,
    ledger: CallLedger,
    fragments: FragmentCache,
    assembly: Assembly,
    tier2_epoch: u64,
    elided: HashSet<EntryId>,
    expired: HashSet<EntryId>,
    /// Where the unexpired Ephemeral entries are, so expiry planning skips the rest of the history.
    ephemeral: EntryIndex,
    /// Where the unelided elidable tool outputs are, under the elision policy they were tested with.
    elidable: (Option<ElisionPolicy>, EntryIndex),
    pending_churn: ChurnCause,
    /// A transparent request's chain values are built in this vector, the one an earlier request
    /// handed back ([`Self::recycle_chains`]), so a long history's values are not allocated and
    /// freed again on every request.
    spare_chains: Vec<ChainHash>,
    last_refresh: Instant,
    appended_seq: u64,
    index_unsynced: bool,
    calls: u64,
    torn_record: Option<(PathBuf, u64)>,
    warnings: Vec<String>,
    client_system: String,
    system_split: VolatileSplit,
    pub(super) tenant: String,
    /// The agent's privacy scope, recorded on every inclusion decision.
    privacy_scope: String,
    /// State files found corrupt at open (started afresh).
    corrupt_state: Vec<CorruptState>,
    /// A compaction waiting for the host's model summariser.
    asked: Option<CompactionAsk>,
    /// Which client tools have their full schema.
    tool_view: ToolView,
    /// The client's tools as last presented (re-shaped when the view grows).
    client_tools: super::tool_block::Tools,
    /// The configured and client tools in their stable order, unshaped: the client's block itself,
    /// shared, when that is what they are (no configured tools, the client's order).
    ordered_tools: super::tool_block::Tools,
    /// The words of `ordered_tools`, split when a request first ranks them.
    tool_ranking: Option<ToolRanking>,
    /// The tool block at the last shaping.
    tool_stats: ToolBlockStats,
    /// The request text the tools were last ranked against.
    ranked_query: String,
    /// Derived context stamped with its cache scope (the revocation purge).
    pub(super) derived: DerivedState,
    /// Compactions concluded since the host last took them.
    compaction_outcomes: Vec<CompactionOutcome>,
}

impl std::fmt::Debug for SessionEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEngine").field("journal", &self.journal).finish_non_exhaustive()
    }
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

const CALIBRATION_FILE: &str = "calibration.json";
const REGISTRY_FILE: &str = "tool-registry.json";
const ELIDED_FILE: &str = "elided.json";
const EXPIRED_FILE: &str = "expired.json";
const TOOL_VIEW_FILE: &str = "tool-view.json";

impl SessionEngine {
    /// Opens the agent's data directory: the journal at its root (taking the writer lock), artifacts
    /// under `artifacts/`, engine state under `gateway/`.
    pub fn open(data_dir: &Path, settings: &SessionSettings, now_ms: u64) -> Result<Self, EngineError> {
        Self::open_on(Arc::new(StdStorage), data_dir, settings, now_ms)
    }

    /// [`SessionEngine::open`] on the given storage (the gateway's fault tests inject write and
    /// fsync errors through it).
    pub fn open_on(
        storage: Arc<dyn Storage>,
        data_dir: &Path,
        settings: &SessionSettings,
        now_ms: u64,
    ) -> Result<Self, EngineError> {
        let state = StateDir::on_disk(Arc::clone(&storage), data_dir.join("gateway"))?;
        let gateway_dir = data_dir.join("gateway");
        let transparent =
            TransparentIndex::load(Arc::clone(&storage), &gateway_dir.join("transparent-prefixes"))?;
        let request_keys = RequestKeys::load(Arc::clone(&storage), &gateway_dir.join("request-keys"))?;
        let options = JournalOptions {
            sync_policy: SyncPolicy::Batched { max_pending: 0 },
            retain_generations: settings.retain_generations,
            ..JournalOptions::new("strata gateway", now_ms)
        };
        Self::start(storage, data_dir, options, state, (transparent, request_keys), settings)
    }

    /// A session on an in-memory volume: nothing touches the disk (replay).
    pub fn in_memory(settings: &SessionSettings, now_ms: u64) -> Result<Self, EngineError> {
        let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
        let mut options = JournalOptions::new("strata replay", now_ms);
        options.sync_policy = SyncPolicy::Batched { max_pending: 1 << 20 };
        options.retain_generations = settings.retain_generations;
        Self::start(
            storage,
            Path::new("/data"),
            options,
            StateDir::in_memory(),
            (TransparentIndex::in_memory(), RequestKeys::in_memory()),
            settings,
        )
    }

    fn start(
        storage: Arc<dyn Storage>,
        data_dir: &Path,
        options: JournalOptions,
        state: StateDir,
        indexes: (TransparentIndex, RequestKeys),
        settings: &SessionSettings,
    ) -> Result<Self, EngineError> {
        let opened_at_ms = options.now_ms;
        let (journal, report) = Journal::open(Arc::clone(&storage), data_dir, options)?;
        let (mut transparent, mut request_keys) = indexes;
        transparent.forget_unissued(journal.next_entry_number())?;
        request_keys.forget_unissued(journal.next_entry_number())?;
        let torn_record = report.truncated.as_ref().map(|torn| (torn.path.clone(), torn.bytes));
        let store = Arc::new(ArtifactStore::new(Arc::clone(&storage), data_dir.join("artifacts")));
        let mut corrupt = Vec::new();
        let (calibration, damaged): (Option<Calibration>, _) = state.read(CALIBRATION_FILE)?;
        corrupt.extend(damaged);
        let counter = TokenCounter::with_calibration(settings.tokenizer, calibration.unwrap_or_default())?;
        let (registry, damaged): (Option<ToolRegistry>, _) = state.read(REGISTRY_FILE)?;
        corrupt.extend(damaged);
        let (elided, damaged): (Option<HashSet<EntryId>>, _) = state.read(ELIDED_FILE)?;
        corrupt.extend(damaged);
        let (expired, damaged): (Option<HashSet<EntryId>>, _) = state.read(EXPIRED_FILE)?;
        corrupt.extend(damaged);
        let (ledger, damaged): (LifecycleLedger, _) = state.read(LIFECYCLE_FILE)?;
        corrupt.extend(damaged);
        let (tool_view, damaged): (ToolView, _) = state.read(TOOL_VIEW_FILE)?;
        corrupt.extend(damaged);
        let (derived, damaged): (DerivedLedger, _) = state.read(DERIVED_FILE)?;
        corrupt.extend(damaged);
        for (digest, at_ms) in &ledger.swept {
            store.mark_swept(digest, *at_ms);
        }
        let placeholder =
            StablePrefix::build(&StablePrefixSources::default(), &mut ToolRegistry::new(), &counter)?;
        let calls = journal.entries().iter().filter(|entry| entry.role == Role::Assistant).count() as u64;
        let mut engine = SessionEngine {
            journal,
            storage,
            store,
            counter,
            telemetry_counts: DigitShapeCounts::default(),
            compiler: ContextCompiler::new(placeholder, settings.placement),
            placement: settings.placement,
            api: settings.api,
            registry: registry.unwrap_or_default(),
            state,
            lifecycle: Lifecycle::new(ledger),
            prefix_inputs: None,
            tier1: Tier1Json::default(),
            transparent,
            request_keys,
            keys_unsynced: false,
            dedup: DedupIndex::with_enabled(settings.deduplicate),
            ledger: CallLedger::default(),
            fragments: FragmentCache::default(),
            assembly: Assembly::default(),
            tier2_epoch: 0,
            elided: elided.unwrap_or_default(),
            expired: expired.unwrap_or_default(),
            ephemeral: EntryIndex::default(),
            elidable: (None, EntryIndex::default()),
            pending_churn: ChurnCause::Cold,
            spare_chains: Vec::new(),
            last_refresh: Instant::now(),
            appended_seq: 0,
            index_unsynced: false,
            calls,
            torn_record,
            warnings: Vec::new(),
            client_system: String::new(),
            system_split: VolatileSplit::default(),
            tenant: settings.tenant.clone(),
            privacy_scope: settings.compaction.privacy_scope.clone(),
            corrupt_state: corrupt,
            asked: None,
            tool_view,
            client_tools: Default::default(),
            ordered_tools: super::tool_block::Tools::default(),
            tool_ranking: None,
            tool_stats: ToolBlockStats::default(),
            ranked_query: String::new(),
            derived: DerivedState::new(derived),
            compaction_outcomes: Vec::new(),
        };
        engine.prepare_prefix(settings, "", &Default::default())?;
        engine.rebuild_window(settings)?;
        engine.validate_derived(settings, opened_at_ms)?;
        engine.pending_churn = ChurnCause::Cold;
        Ok(engine)
    }

    /// The torn final journal record that opening truncated (file, bytes), if any.
    pub fn torn_record(&self) -> Option<&(PathBuf, u64)> {
        self.torn_record.as_ref()
    }

    /// State files found corrupt when the data directory was opened; each started afresh and is
    /// rebuilt from the journal and the next requests.
    pub fn corrupt_state(&self) -> &[CorruptState] {
        &self.corrupt_state
    }

    /// Problems that did not fail an operation (e.g. a compaction record that could not be
    /// written), for the caller to log; drained.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// The artifact store.
    pub fn store(&self) -> &Arc<ArtifactStore> {
        &self.store
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Upstream calls answered so far (the economics horizon of rewrites grows with it).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The token counter (calibrated).
    pub fn counter(&self) -> &TokenCounter {
        &self.counter
    }

    /// Tier 2 rendered from scratch, with deduplication treatments for every repeated output.
    fn rebuild_window(&mut self, settings: &SessionSettings) -> Result<(), EngineError> {
        let volatile = self.compiler.volatile_context().to_owned();
        self.compiler = ContextCompiler::new(self.compiler.prefix().clone(), self.placement);
        self.compiler.set_volatile_context(&volatile, &self.counter);
        self.compiler.sync(self.journal.generation(), self.journal.entries(), &self.counter);
        self.ledger.rebuild(self.journal.entries());
        self.dedup.clear();
        let mut batch = BTreeMap::new();
        for entry in self.journal.entries() {
            if let Some(original) = self.dedup.observe(entry) {
                let text = Self::duplicate_text(&self.store, &self.tenant, entry, original)?;
                batch.insert(entry.id, Treatment::Replace { text, reason: InclusionReason::Duplicate });
            }
        }
        self.compiler.apply_treatments(batch, self.journal.entries(), &self.counter)?;
        self.reapply_elisions(settings)?;
        self.fragments = FragmentCache::default();
        self.tier2_epoch += 1;
        Ok(())
    }

    /// Applies a settings change that affects the compiler, and picks up cross-process compactions.
    pub fn refresh(&mut self, settings: &SessionSettings, force: bool) -> Result<(), EngineError> {
        if settings.placement != self.placement {
            self.placement = settings.placement;
            self.rebuild_window(settings)?;
        }
        if force || self.last_refresh.elapsed() >= REFRESH_INTERVAL {
            self.last_refresh = Instant::now();
            let refreshed = self.journal.refresh();
            // A proposal's switch is committed before its file is removed, so the journal can be
            // in a new generation even when the refresh failed after it: Tier 2 follows the
            // journal's generation either way, or the next request would render the old one.
            if self.compiler.generation() != self.journal.generation() {
                self.sync_window()?;
            }
            refreshed?;
        }
        self.validate_derived(settings, now_ms())?;
        Ok(())
    }

    /// Brings Tier 2 up to date with the journal; returns what deduplication replaced.
    fn sync_window(&mut self) -> Result<Treated, EngineError> {
        let entries = self.journal.entries();
        match self.compiler.sync(self.journal.generation(), entries, &self.counter) {
            SyncOutcome::Appended(count) => {
                let new = &entries[entries.len() - count..];
                self.ledger.observe(new);
                let mut batch = BTreeMap::new();
                let mut saved = 0;
                for entry in new {
                    if let Some(original) = self.dedup.observe(entry) {
                        let text = Self::duplicate_text(&self.store, &self.tenant, entry, original)?;
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
                let treated = Treated { entries: batch.len() as u64, tokens: saved };
                self.compiler.apply_treatments(batch, entries, &self.counter)?;
                Ok(treated)
            }
            SyncOutcome::Rebuilt(_) => {
                let live: HashSet<EntryId> = entries.iter().map(|entry| entry.id).collect();
                self.elided.retain(|id| live.contains(id));
                self.ledger.rebuild(entries);
                self.dedup.clear();
                for entry in entries {
                    self.dedup.observe(entry);
                }
                // Pairing of calls and results may differ in the new generation: render afresh.
                self.fragments = FragmentCache::default();
                self.tier2_epoch += 1;
                if self.pending_churn == ChurnCause::None {
                    self.pending_churn = ChurnCause::HistoryRewrite;
                }
                Ok(Treated::default())
            }
        }
    }

    /// The window text of a duplicated output, with the artifacts holding it byte-exact.
    fn duplicate_text(
        store: &ArtifactStore,
        tenant: &str,
        entry: &Entry,
        original: EntryId,
    ) -> Result<String, EngineError> {
        let refs = Self::store_outputs(store, tenant, entry)?;
        Ok(render_duplicate(original, &refs))
    }

    /// Puts every tool output of `entry` in the artifact store (content-addressed: a no-op when
    /// already there) and returns the references.
    fn store_outputs(
        store: &ArtifactStore,
        tenant: &str,
        entry: &Entry,
    ) -> Result<Vec<ArtifactRef>, EngineError> {
        let mut refs = Vec::with_capacity(entry.content.tool_results.len());
        for result in &entry.content.tool_results {
            refs.push(store.put(tenant, result.output.as_bytes())?);
        }
        Ok(refs)
    }

    /// How an entry past its retention leaves the window without breaking the protocol: a tool
    /// result stays as a stub naming the artifacts that hold its output (its call stays answered),
    /// an assistant message that called tools keeps its calls with its text dropped, anything else
    /// is omitted.
    fn expiry_treatment(
        store: &ArtifactStore,
        tenant: &str,
        entry: &Entry,
    ) -> Result<Treatment, EngineError> {
        if !entry.content.tool_results.is_empty() {
            let refs: Vec<String> =
                Self::store_outputs(store, tenant, entry)?.iter().map(ToString::to_string).collect();
            return Ok(Treatment::Replace {
                text: format!("[expired: past its retention; full output: data_ref {}]", refs.join(", ")),
                reason: InclusionReason::Expired,
            });
        }
        if !entry.content.tool_calls.is_empty() {
            return Ok(Treatment::Replace { text: String::new(), reason: InclusionReason::Expired });
        }
        Ok(Treatment::Omit)
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
    fn reapply_elisions(&mut self, settings: &SessionSettings) -> Result<(), EngineError> {
        if self.elided.is_empty() && self.expired.is_empty() {
            return Ok(());
        }
        let policy = &settings.elision;
        let mut batch = BTreeMap::new();
        for entry in self.journal.entries().iter().filter(|entry| self.expired.contains(&entry.id)) {
            batch.insert(entry.id, Self::expiry_treatment(&self.store, &settings.tenant, entry)?);
        }
        for entry in self
            .journal
            .entries()
            .iter()
            .filter(|entry| self.elided.contains(&entry.id) && !self.expired.contains(&entry.id))
        {
            let (content, _) = elide_entry(entry, policy, &self.store, &settings.tenant)?;
            batch.insert(entry.id, Self::elision_treatment(&content));
        }
        self.compiler.apply_treatments(batch, self.journal.entries(), &self.counter)?;
        Ok(())
    }

    /// Removes Ephemeral entries whose retention TTL has passed, in cache-aware batches (an entry
    /// overdue by twice its TTL forces a batch). Returns the entries and the tokens removed per
    /// later call.
    fn expire_ephemeral(
        &mut self,
        settings: &SessionSettings,
        now_ms: u64,
    ) -> Result<(Treated, Offloaded), EngineError> {
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
        let ephemeral = |entry: &Entry| entry.retention == RetentionClass::Ephemeral;
        self.ephemeral.refresh(self.journal.generation(), entries, ephemeral, &self.expired);
        let positions = self.ephemeral.matches().iter().map(|indexed| indexed.position);
        let candidates = ExpiryCandidates { entries, positions };
        let Some(planned) = plan_expiry(
            candidates,
            now_ms,
            &self.expired,
            ttl_of,
            &settings.expiry,
            expected_remaining_calls(self.calls),
            settings.pricing(),
        ) else {
            return Ok((Treated::default(), Vec::new()));
        };
        let wanted: HashSet<EntryId> = planned.ids.iter().copied().collect();
        let mut batch = BTreeMap::new();
        let mut offloaded = Vec::new();
        for entry in entries.iter().filter(|entry| wanted.contains(&entry.id)) {
            batch.insert(entry.id, Self::expiry_treatment(&self.store, &settings.tenant, entry)?);
            // The stub names the artifacts holding each output (stored just above; `put` is
            // idempotent and content-addressed).
            for result in &entry.content.tool_results {
                let data_ref = self.store.put(&settings.tenant, result.output.as_bytes())?;
                offloaded.push((data_ref, result.output.clone()));
            }
        }
        self.expired.extend(batch.keys().copied());
        self.compiler.apply_treatments(batch, entries, &self.counter)?;
        self.tier2_epoch += 1;
        if self.pending_churn == ChurnCause::None {
            self.pending_churn = ChurnCause::HistoryRewrite;
        }
        self.state.write(EXPIRED_FILE, &Some(&self.expired))?;
        Ok((Treated { entries: planned.ids.len() as u64, tokens: planned.saved_tokens }, offloaded))
    }

    /// Elides old large tool results when the batch pays for the cache rewrite (seed 002 #5).
    /// Returns the entries and the tokens saved per later call, and what moved off-window.
    fn elide_old_results(&mut self, settings: &SessionSettings) -> Result<(Treated, Offloaded), EngineError> {
        let policy = &settings.elision;
        let counter = &self.counter;
        let entries = self.journal.entries();
        let (tested_with, index) = &mut self.elidable;
        if *tested_with != Some(*policy) {
            *tested_with = Some(*policy);
            index.reset();
        }
        index.refresh(
            self.journal.generation(),
            entries,
            |entry| has_elidable_output(entry, policy),
            &self.elided,
        );
        let candidates =
            index.matches().iter().map(|indexed| (indexed.position, index.rounds_after(indexed)));
        let Some(planned) = plan_elision_among(
            ElisionCandidates { entries, candidates },
            &self.elided,
            policy,
            |text| u64::from(counter.count(text)),
            expected_remaining_calls(self.calls),
            settings.pricing(),
        ) else {
            return Ok((Treated::default(), Vec::new()));
        };
        let wanted: HashSet<EntryId> = planned.ids.iter().copied().collect();
        let mut batch = BTreeMap::new();
        let mut offloaded = Vec::new();
        for entry in entries.iter().filter(|entry| wanted.contains(&entry.id)) {
            let (content, refs) = elide_entry(entry, policy, &self.store, &settings.tenant)?;
            for (data_ref, result) in refs.into_iter().zip(&entry.content.tool_results) {
                offloaded.push((data_ref, result.output.clone()));
            }
            batch.insert(entry.id, Self::elision_treatment(&content));
        }
        self.elided.extend(batch.keys().copied());
        self.compiler.apply_treatments(batch, entries, &self.counter)?;
        self.tier2_epoch += 1;
        if self.pending_churn == ChurnCause::None {
            self.pending_churn = ChurnCause::HistoryRewrite;
        }
        self.state.write(ELIDED_FILE, &Some(&self.elided))?;
        Ok((Treated { entries: planned.ids.len() as u64, tokens: planned.saved_tokens }, offloaded))
    }

    /// Keeps `tools` as the client's tool block when it is not already the one kept.
    fn keep_tools(&mut self, tools: &super::tool_block::Tools) {
        if !Arc::ptr_eq(tools, &self.client_tools) {
            self.client_tools = Arc::clone(tools);
        }
    }

    /// Rebuilds Tier 1 when the configured sources, the client's system text or its tools changed.
    /// The lines of the client's system text that carry volatile material (today's date, a time,
    /// a UUID, a counter) move below the cache boundary, beside the Tier-3 telemetry; the stable
    /// remainder stays in Tier 1, so a dated system prompt neither is refused nor breaks the cache.
    pub fn prepare_prefix(
        &mut self,
        settings: &SessionSettings,
        client_system: &str,
        client_tools: &super::tool_block::Tools,
    ) -> Result<(), EngineError> {
        if client_system != self.client_system {
            self.system_split = split_volatile_lines(client_system).map_err(PrefixError::from)?;
            self.client_system = client_system.to_owned();
        }
        self.compiler.set_volatile_context(&self.system_split.moved, &self.counter);
        // Compared, not hashed: a client resends the same tool block (often tens of thousands of
        // tokens) with every request. The gateway hands the same bytes over as the same shared
        // value, which compares at once; other callers' blocks are compared whole.
        let same_tools = Arc::ptr_eq(client_tools, &self.client_tools) || *client_tools == self.client_tools;
        let unchanged = same_tools
            && self.prefix_inputs.as_ref().is_some_and(|built| {
                built.revision == settings.revision && built.stable_system == self.system_split.stable
            });
        // An equal block in another allocation (sent with other bytes, or parsed twice by requests
        // that came together) is kept too, so the next request's compares at once.
        self.keep_tools(client_tools);
        if unchanged {
            return Ok(());
        }
        // Until the new prefix is in force, a failure below leaves it to the next request.
        self.prefix_inputs = None;
        let configured = &settings.stable_prefix;
        let mut combined: Vec<Value> =
            configured.tools.iter().map(|tool| to_api_shape(self.api, tool)).collect();
        let configured_names: Vec<String> =
            combined.iter().filter_map(|tool| crate::prefix::tool_name(tool).map(str::to_owned)).collect();
        combined.extend(
            client_tools
                .iter()
                .filter(|tool| {
                    crate::prefix::tool_name(tool)
                        .is_none_or(|name| !configured_names.iter().any(|n| n == name))
                })
                .cloned(),
        );
        let mut registry = self.registry.clone();
        let arranged: Vec<Value> = registry.arrange(&combined)?.into_iter().cloned().collect();
        let mut ordered = self.shape_tools(settings, &arranged)?;
        if *arranged != *self.ordered_tools {
            self.tool_ranking = None;
        }
        self.ordered_tools =
            if *arranged == **client_tools { Arc::clone(client_tools) } else { arranged.into() };
        ordered.extend(memory_tools(self.api));
        if self.tool_stats.lazy {
            ordered.push(load_tools_tool(self.api));
        }
        let system_prompt = [configured.system_prompt.as_str(), self.system_split.stable.as_str()]
            .iter()
            .filter(|text| !text.trim().is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("\n\n");
        let sources =
            StablePrefixSources { system_prompt, tools: ordered, constants: configured.constants.clone() };
        let prefix = StablePrefix::build(&sources, &mut ToolRegistry::new(), &self.counter)?;
        if registry != self.registry {
            self.state.write(REGISTRY_FILE, &registry)?;
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
                Some(crate::prefix::SectionClass::System) => ChurnCause::System,
                Some(crate::prefix::SectionClass::Tools) => ChurnCause::Tools,
                _ => ChurnCause::Constants,
            };
        }
        self.tier1 = Tier1Json::build(self.api, &prefix, &sources.tools);
        self.compiler.set_prefix(prefix);
        self.prefix_inputs = Some(PrefixInputs {
            revision: settings.revision,
            stable_system: self.system_split.stable.clone(),
        });
        Ok(())
    }

    /// Which of `turns` are new: all of them in a stateful session; in a transparent one, the
    /// ones after the longest journaled prefix when the request extends the journal. When the
    /// client's history diverged from the journal, the journal is first rewound (a fork
    /// generation) to the last turn both share, so the new turns never splice onto another
    /// history. Returns the first new turn, the chain values and the rewind, if any; `None`, with
    /// nothing changed, when the new turns would begin among the first `hollow` turns, which may
    /// have come without their content (or when their chain values are not all given).
    fn place_turns(
        &mut self,
        turns: &[Turn],
        known_chains: &[ChainHash],
        hollow: usize,
        now_ms: u64,
    ) -> Result<Option<Placed>, EngineError> {
        if hollow > known_chains.len() {
            return Ok(None);
        }
        let buffer = std::mem::take(&mut self.spare_chains);
        let (chains, first_known) = self.transparent.split_into(turns, known_chains, buffer);
        let placement = self.transparent.locate(&chains, first_known, self.journal.entries());
        let first_new = match placement {
            Placement::Extends { first_new } | Placement::Diverged { first_new, .. } => first_new,
        };
        if first_new < hollow {
            return Ok(None);
        }
        let (keep, first_new, dropped) = match placement {
            Placement::Extends { first_new } => return Ok(Some((first_new, chains, None))),
            // The journal ends at the last shared turn: nothing to drop, the request extends it.
            Placement::Diverged { first_new, dropped: 0, .. } => return Ok(Some((first_new, chains, None))),
            Placement::Diverged { keep, first_new, dropped } => (keep, first_new, dropped),
        };
        let cause = if keep == 0 {
            RewindCause::NewConversation
        } else if first_new == turns.len() {
            RewindCause::Retry
        } else {
            RewindCause::Edit
        };
        let reason = match cause {
            RewindCause::Retry => {
                format!("the client retried a turn: {dropped} entries it never saw dropped")
            }
            RewindCause::Edit => {
                format!("the client's history diverged after its turn {first_new}: {dropped} entries dropped")
            }
            RewindCause::NewConversation if first_known == 0 => {
                format!("a new conversation (no turn shared with the journal): {dropped} entries dropped")
            }
            // An edit of a summarised turn, or a retry whose older turns only a dropped summary held.
            RewindCause::NewConversation => format!(
                "the client's history is journaled again whole (the summaries holding its turns cannot be kept): {dropped} entries dropped"
            ),
        };
        let switch = self.journal.fork(keep, &reason, now_ms)?;
        self.after_rewrite()?;
        if cause == RewindCause::NewConversation && self.transparent.retain_only(&chains)? > 0 {
            // The rewritten index is durable already (written whole, fsynced and renamed over the
            // old file); the next group commit syncs it once more, as after any index write.
            self.index_unsynced = true;
            self.appended_seq += 1;
        }
        Ok(Some((
            first_new,
            chains,
            Some(Rewind {
                cause,
                kept_entries: keep as u64,
                dropped_entries: dropped as u64,
                generation: switch.to_generation,
            }),
        )))
    }

    /// Where a stateful request's messages go: all of them are new, unless its idempotency key
    /// names the latest keyed turn with the same messages. Then the earlier attempt's messages are
    /// already journaled, and never again: when entries the client never saw followed them (an
    /// answer cut off on its way), the journal is rewound to just after them, keeping the summary
    /// of a compaction that ran meanwhile.
    fn place_keyed(
        &mut self,
        request_key: Option<&str>,
        turns: &[Turn],
        now_ms: u64,
    ) -> Result<Placed, EngineError> {
        let Some(key) = request_key else { return Ok((0, Vec::new(), None)) };
        let KeyedPlacement::Retry(attempt) = self.request_keys.place(key, turns)? else {
            return Ok((0, Vec::new(), None));
        };
        let entries = self.journal.entries();
        let Some(position) = entries.iter().position(|entry| entry.id == attempt.first_entry) else {
            // Journaled, then folded into a summary (or dropped by a rollback): not again.
            return Ok((turns.len(), Vec::new(), None));
        };
        // The client saw nothing journaled after the attempt's messages: that is the answer it
        // never got, and it goes. A compaction that ran meanwhile stays: its summary and resume
        // instruction stand after the attempt (placed before a call still waiting for its result)
        // and cover what came before it, so a rewind past them would lose history.
        let attempt_end = position + turns.len();
        let keep = entries[position..]
            .iter()
            .rposition(|entry| entry.id.kind() == EntryKind::Summary)
            .map_or(attempt_end, |summary| attempt_end.max(position + summary + 2))
            .min(entries.len());
        if keep == entries.len() {
            return Ok((turns.len(), Vec::new(), None));
        }
        let dropped = entries.len() - keep;
        let reason =
            format!("the client retried a turn with the same Idempotency-Key: {dropped} entries dropped");
        let switch = self.journal.fork(keep, &reason, now_ms)?;
        self.after_rewrite()?;
        let rewind = Rewind {
            cause: RewindCause::Retry,
            kept_entries: keep as u64,
            dropped_entries: dropped as u64,
            generation: switch.to_generation,
        };
        Ok((turns.len(), Vec::new(), Some(rewind)))
    }

    /// Remembers a stateful turn's idempotency key with its first entry (durable with the next
    /// group commit).
    fn remember_key(&mut self, key: &str, turns: &[Turn], first_entry: EntryId) -> Result<(), EngineError> {
        self.request_keys.remember(key, turns, first_entry)?;
        self.keys_unsynced = true;
        self.appended_seq += 1;
        Ok(())
    }

    /// Remembers transparent-session chain values, each with the journal entry holding its turn,
    /// once their turns are journaled (durable with the next group commit).
    fn remember_chain(&mut self, chains: &[(ChainHash, EntryId)]) -> Result<(), EngineError> {
        if self.transparent.remember(chains)? {
            self.index_unsynced = true;
            self.appended_seq += 1;
        }
        Ok(())
    }

    /// Whether a list that grows with every entry (the journal's entries, the compiler's rendered
    /// entries, the cached fragments, a transparent session's index) is close to reallocating: the
    /// caller should run [`Self::make_room`] after answering, so the next request does not pay for
    /// the copy.
    pub fn room_low(&self) -> bool {
        self.journal.room_low()
            || self.compiler.room_low()
            || self.fragments.room_low()
            || self.transparent.room_low()
    }

    /// Grows the lists [`Self::room_low`] watches ahead of need (see [`crate::room_ahead`]); returns
    /// whether one grew. Writes nothing and changes no output.
    pub fn make_room(&mut self) -> bool {
        // Each list is grown, not only up to the first low one.
        let grown = [
            self.journal.make_room(),
            self.compiler.make_room(),
            self.fragments.make_room(),
            self.transparent.make_room(),
        ];
        grown.contains(&true)
    }

    /// Counts every write that still needs an fsync.
    pub fn appended_seq(&self) -> u64 {
        self.appended_seq
    }

    /// What a group commit must fsync to make every write up to now durable.
    pub fn durable_target(&mut self) -> DurableTarget {
        let mut files = Vec::new();
        if std::mem::take(&mut self.index_unsynced)
            && let Some(file) = self.transparent.sync_target()
        {
            files.push(file);
        }
        if std::mem::take(&mut self.keys_unsynced)
            && let Some(file) = self.request_keys.sync_target()
        {
            files.push(file);
        }
        DurableTarget::new(self.appended_seq, &self.journal, files)
    }

    /// Journal draft of a client turn: redacted, tool outputs spilled, classified and counted.
    fn draft(
        &self,
        settings: &SessionSettings,
        turn: &Turn,
        now: u64,
        out: &mut Drafts,
    ) -> Result<(), EngineError> {
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
        for result in &turn.content.tool_results {
            let output = redact(&result.output);
            let name = result
                .name
                .clone()
                .or_else(|| self.ledger.tool_name(&result.call_id).map(str::to_owned))
                .or_else(|| called_in(&out.drafts, &result.call_id));
            let delegation = name.as_deref().filter(|name| settings.delegation.is_delegation(name));
            let window_text = match delegation {
                Some(tool) => {
                    let (text, data_ref, record) = self.digest_result(settings, tool, &output)?;
                    out.digests.push(record);
                    out.offloaded.push((data_ref.clone(), output.clone()));
                    artifact_refs.push(data_ref);
                    text
                }
                None => {
                    let outcome = spill(&output, &settings.spill, &self.store, &settings.tenant)?;
                    if let Some(data_ref) = outcome.data_ref {
                        out.spilled_bytes += output.len() as u64;
                        out.offloaded.push((data_ref.clone(), output.clone()));
                        artifact_refs.push(data_ref);
                    }
                    outcome.window_text
                }
            };
            counted.push('\n');
            counted.push_str(&window_text);
            content.tool_results.push(ToolResult {
                call_id: result.call_id.clone(),
                name,
                output: window_text,
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
        out.drafts.push(draft);
        Ok(())
    }

    /// A delegation's result as the parent sees it: the full result goes to the artifact store and
    /// the window gets its digest, held to the parent-return budget.
    fn digest_result(
        &self,
        settings: &SessionSettings,
        tool: &str,
        output: &str,
    ) -> Result<(String, ArtifactRef, DigestRecord), EngineError> {
        let data_ref = self.store.put(&settings.tenant, output.as_bytes())?;
        let full_tokens = u64::from(self.counter.count(output));
        let digest = ExpertDigest::of_result(tool, output);
        let budget = settings.delegation.return_tokens;
        let rendered =
            digest.render(&data_ref, full_tokens, budget, |text| u64::from(self.counter.count(text)));
        let record = DigestRecord {
            tool: tool.to_owned(),
            source: digest.source,
            full_tokens,
            return_tokens: u64::from(self.counter.count(&rendered.text)),
            omitted_items: rendered.omitted_items,
            data_ref: data_ref.to_string(),
        };
        Ok((rendered.text, data_ref, record))
    }

    /// The configured and client tools as sent: in full under the lazy threshold, otherwise the
    /// view's full schemas and summaries (the first selection runs here). Records the block's stats.
    fn shape_tools(
        &mut self,
        settings: &SessionSettings,
        arranged: &[Value],
    ) -> Result<Vec<Value>, EngineError> {
        let policy = &settings.lazy_tools;
        let count = |tools: &[Value]| -> u64 {
            tools.iter().map(|tool| u64::from(self.counter.count(&tool.to_string()))).sum()
        };
        let full_tokens = count(arranged);
        if policy.threshold_tokens == 0 || full_tokens <= policy.threshold_tokens {
            self.tool_stats = ToolBlockStats {
                lazy: false,
                full: arranged.len() as u64,
                summarised: 0,
                sent_tokens: full_tokens,
                full_tokens,
            };
            return Ok(arranged.to_vec());
        }
        if !self.tool_view.initialised {
            let used = self.used_tool_names();
            self.tool_view.initialise(arranged, &self.ranked_query, used, policy);
            self.state.write(TOOL_VIEW_FILE, &self.tool_view)?;
        }
        let shaped = self.tool_view.shape(self.api, arranged);
        let summarised = arranged
            .iter()
            .filter(|tool| {
                crate::prefix::tool_name(tool).is_some_and(|name| !self.tool_view.full.contains(name))
            })
            .count() as u64;
        self.tool_stats = ToolBlockStats {
            lazy: true,
            full: arranged.len() as u64 - summarised,
            summarised,
            sent_tokens: count(&shaped),
            full_tokens,
        };
        Ok(shaped)
    }

    /// Names of every tool the journal shows called or answered.
    fn used_tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for entry in self.journal.entries() {
            let called = entry.content.tool_calls.iter().map(|call| call.name.as_str());
            let answered = entry.content.tool_results.iter().filter_map(|result| result.name.as_deref());
            for name in called.chain(answered) {
                if !names.iter().any(|known| known == name) {
                    names.push(name.to_owned());
                }
            }
        }
        names
    }

    /// A new request text: remembered for the first selection, and, once schemas are lazy, a
    /// batch of the tools it ranks highest when enough of them are summarised.
    fn rank_tools(&mut self, settings: &SessionSettings, query: &str) -> Result<(), EngineError> {
        if query == self.ranked_query {
            return Ok(());
        }
        query.clone_into(&mut self.ranked_query);
        if self.tool_stats.lazy
            && self.tool_view.initialised
            && self.tool_view.rerank(
                self.tool_ranking.get_or_insert_with(|| ToolRanking::new(&self.ordered_tools)),
                query,
                &settings.lazy_tools,
            )
        {
            self.state.write(TOOL_VIEW_FILE, &self.tool_view)?;
            self.prefix_inputs = None;
        }
        Ok(())
    }

    /// Tools the model called in `output` that it saw only summarised (the gateway loads their
    /// schemas and retries the call).
    pub fn summarised_calls(&self, output: &AssistantOutput) -> Vec<String> {
        if !self.tool_stats.lazy {
            return Vec::new();
        }
        let mut names: Vec<String> = output
            .tool_calls
            .iter()
            .map(|call| call.name.clone())
            .filter(|name| self.tool_view.is_unseen(&self.ordered_tools, name))
            .collect();
        names.dedup();
        names
    }

    /// The client's tools the model sees only summarised now, in the tool block's order.
    fn summarised_tool_names(&self) -> Vec<String> {
        if !self.tool_stats.lazy {
            return Vec::new();
        }
        self.tool_view.unseen_names(&self.ordered_tools).map(str::to_owned).collect()
    }

    /// The `strata_load_tools` answer for `names`: the full schemas of those sent as a summary
    /// (they count as delivered from now on), and the count loaded. The tool block is left alone,
    /// so the cached prompt stays valid.
    pub(super) fn load_tools(&mut self, names: &[String]) -> Result<(String, usize), EngineError> {
        let loaded = self.tool_view.load(&self.ordered_tools, names);
        let loaded_names: Vec<&str> =
            loaded.iter().filter_map(|tool| crate::prefix::tool_name(tool)).collect();
        let skipped: Vec<&str> =
            names.iter().map(String::as_str).filter(|name| !loaded_names.contains(name)).collect();
        let answer = super::capabilities::load_answer(self.api, &loaded, &skipped);
        let count = loaded.len();
        self.state.write(TOOL_VIEW_FILE, &self.tool_view)?;
        Ok((answer, count))
    }

    /// The model called tools in `output` it saw only summarised and never loaded: their schemas
    /// are delivered as a `strata_load_tools` round appended to the history (the answer itself is
    /// not journaled; the caller repeats the call). Returns the tools delivered.
    pub fn deliver_schemas(
        &mut self,
        settings: &SessionSettings,
        output: &AssistantOutput,
        now_ms: u64,
    ) -> Result<Vec<String>, EngineError> {
        let names = self.summarised_calls(output);
        if names.is_empty() {
            return Ok(names);
        }
        let (answer, _) = self.load_tools(&names)?;
        let call_id = format!("strata_load_{}", self.journal.next_entry_number());
        let call = crate::entry::ToolCall {
            call_id: call_id.clone(),
            name: super::capabilities::LOAD_TOOLS_NAME.to_owned(),
            arguments_json: serde_json::json!({ "names": names }).to_string(),
        };
        self.append_own(
            settings,
            Role::Assistant,
            Content { tool_calls: vec![call], ..Content::default() },
            now_ms,
        )?;
        let result = ToolResult {
            call_id,
            name: Some(super::capabilities::LOAD_TOOLS_NAME.to_owned()),
            output: answer,
        };
        self.append_tool_result(settings, result, now_ms)?;
        Ok(names)
    }

    /// Journals the gateway's own answer to one of its tools (a memory tool, `strata_load_tools`).
    fn append_tool_result(
        &mut self,
        settings: &SessionSettings,
        result: ToolResult,
        now_ms: u64,
    ) -> Result<(), EngineError> {
        let content = Content { tool_results: vec![result], ..Content::default() };
        self.append_own(settings, Role::Tool, content, now_ms).map(drop)
    }

    /// The client's tools as last sent.
    pub fn tool_stats(&self) -> ToolBlockStats {
        self.tool_stats
    }

    /// The context status now.
    pub fn status(&self, settings: &SessionSettings) -> Result<ContextStatus, EngineError> {
        Ok(self.compiler.status(settings.limit, settings.budget)?)
    }

    /// Seed-000 admission of an operation adding `request.estimated_tokens` to the context.
    pub fn admit(
        &self,
        settings: &SessionSettings,
        request: &OperationRequest,
    ) -> Result<Admission, EngineError> {
        let status = self.status(settings)?;
        let budget = ContextBudget::new(settings.limit, status.tokens, settings.budget)
            .map_err(|error| EngineError::Compile(CompileError::Budget(error)))?;
        Ok(budget.admit(request))
    }

    /// Appends drafts and updates Tier 2 (durable after the next group commit).
    /// Returns what deduplicating repeated outputs replaced.
    fn append(&mut self, drafts: Vec<EntryDraft>) -> Result<(Treated, Vec<EntryId>), EngineError> {
        if drafts.is_empty() {
            return Ok((Treated::default(), Vec::new()));
        }
        let mut ids = Vec::with_capacity(drafts.len());
        for draft in drafts {
            ids.push(self.journal.append_kept(draft)?.id);
        }
        self.appended_seq += 1;
        Ok((self.sync_window()?, ids))
    }

    /// Appends an entry produced by the gateway itself (assistant answer or memory-tool result);
    /// returns its ID.
    pub fn append_own(
        &mut self,
        settings: &SessionSettings,
        role: Role,
        content: Content,
        now_ms: u64,
    ) -> Result<EntryId, EngineError> {
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
            created_at_ms: now_ms,
            artifact_refs: Vec::new(),
        };
        let id = self.journal.append_kept(draft)?.id;
        self.appended_seq += 1;
        self.sync_window()?;
        Ok(id)
    }

    /// Takes back a vector of chain values a transparent request is done with (its
    /// [`ChatRequest::known_chains`], once the turn was admitted): the next transparent request's
    /// values are built in it. The larger of it and the one kept is kept, unless its room is many
    /// times what the request used ([`super::message_memo::worth_keeping`]); the values are cleared.
    pub fn recycle_chains(&mut self, mut chains: Vec<ChainHash>) {
        if chains.capacity() > self.spare_chains.capacity()
            && super::message_memo::worth_keeping(chains.capacity(), chains.len())
        {
            chains.clear();
            self.spare_chains = chains;
        }
    }

    /// Compiles the packet and serialises the upstream request around `head`: the next call of
    /// the current turn (after a round that only called memory tools).
    pub fn next_call(
        &mut self,
        settings: &SessionSettings,
        head: Map<String, Value>,
    ) -> Result<UpstreamCall, EngineError> {
        let mut head = head;
        let max_tokens_clamp = clamp_max_tokens(&mut head, settings.budget.reserved_completion_tokens);
        let packet = self.compiler.compile(self.journal.entries(), settings.limit, settings.budget)?;
        self.assembly.check_epoch(self.tier2_epoch);
        let (fragments, assembly, ledger) = (&mut self.fragments, &mut self.assembly, &self.ledger);
        let body = match self.api {
            Api::OpenAi => render_openai::body(head, &self.tier1, &packet, fragments, assembly, ledger),
            Api::Anthropic => render_anthropic::body(head, &self.tier1, &packet, fragments, assembly, ledger),
        };
        let tier1 = &packet.prefix.manifest().sections;
        // Tier 1's sections, then Tier 2 and the telemetry: sized once, as every request builds it.
        let mut sections: Vec<SectionSummary> = Vec::with_capacity(tier1.len() + 2);
        sections.extend(tier1.iter().map(|section| SectionSummary {
            id: tier1_section_id(&section.id),
            tokens: u64::from(section.tokens),
            hash: section.source_hash.clone(),
        }));
        let telemetry_tokens = u64::from(self.telemetry_counts.count(&self.counter, &packet.telemetry));
        let tier2_tokens = self.compiler.context_tokens()
            - self.compiler.volatile_tokens()
            - u64::from(packet.prefix.manifest().total_tokens);
        sections.push(SectionSummary {
            id: "tier2".into(),
            tokens: tier2_tokens,
            hash: packet
                .entries
                .iter()
                .rposition(|e| e.included)
                .map(|index| packet.source_hash(index).to_owned())
                .unwrap_or_default(),
        });
        sections.push(SectionSummary {
            id: "tier3.telemetry".into(),
            tokens: telemetry_tokens,
            hash: String::new(),
        });
        let source_tokens = packet.status.tokens.saturating_sub(tier2_tokens) + self.journal.total_tokens();
        let call = UpstreamCall {
            body,
            status: packet.status,
            sections,
            breakpoints: packet.breakpoints.len(),
            churn: std::mem::replace(&mut self.pending_churn, ChurnCause::None),
            tools: self.tool_stats,
            summarised_tools: self.summarised_tool_names(),
            stages: allocate(
                settings.limit,
                &settings.budget,
                &settings.stages,
                settings.lazy_tools.threshold_tokens,
                section_tokens(&packet, self.compiler.volatile_tokens() + telemetry_tokens),
            ),
            max_tokens_clamp,
            source_tokens,
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
            self.state.write(CALIBRATION_FILE, &Some(*self.counter.calibration()))?;
        }
        Ok(())
    }

    /// Mutable access for memory tools (journal, store, counter).
    pub(super) fn parts_mut(&mut self) -> (&mut Journal, &ArtifactStore, &TokenCounter) {
        (&mut self.journal, &self.store, &self.counter)
    }

    pub(super) fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    pub(super) fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    pub(super) fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }

    pub(super) fn asked_mut(&mut self) -> &mut Option<CompactionAsk> {
        &mut self.asked
    }

    pub(super) fn compaction_outcomes_mut(&mut self) -> &mut Vec<CompactionOutcome> {
        &mut self.compaction_outcomes
    }

    /// Re-synchronises Tier 2 after a memory tool rewrote the journal.
    pub(super) fn after_rewrite(&mut self) -> Result<(), EngineError> {
        self.sync_window().map(|_| ())
    }

    /// The current prompt as providers price it: one block per cacheable unit (Tier 1, each
    /// included Tier-2 entry, the telemetry) with its breakpoint. Replay prices the call it just
    /// rendered with this; the gateway never needs it.
    pub fn prompt_blocks(&self, settings: &SessionSettings) -> Result<Vec<Block>, EngineError> {
        let packet = self.compiler.compile(self.journal.entries(), settings.limit, settings.budget)?;
        Ok(prompt_blocks(&packet, &self.counter))
    }

    /// The text of the current context: Tier 1 and every included Tier-2 entry.
    pub fn context_text(&self, settings: &SessionSettings) -> Result<String, EngineError> {
        let packet = self.compiler.compile(self.journal.entries(), settings.limit, settings.budget)?;
        let mut context = packet.prefix.text();
        for (index, entry) in packet.entries.iter().enumerate() {
            if entry.included {
                packet.write_text(index, &mut context);
            }
        }
        Ok(context)
    }

    /// Every entry of the current generation with its window treatment.
    pub fn entry_summaries(&self) -> Vec<EntrySummary> {
        let decisions = self.decisions();
        let window: std::collections::HashMap<&str, &InclusionDecision> =
            decisions.iter().filter(|d| d.tier == 2).map(|d| (d.id.as_str(), d)).collect();
        self.journal
            .entries()
            .iter()
            .map(|entry| {
                let id = entry.id.to_string();
                let decision = window.get(id.as_str());
                let reason = decision.map_or(InclusionReason::Journal, |d| d.reason);
                EntrySummary {
                    retention: entry.retention,
                    role: entry.role,
                    tokens: entry.tokens,
                    window_tokens: decision.map_or(0, |d| d.tokens),
                    included: decision.is_some_and(|d| d.included),
                    reason,
                    created_at_ms: entry.created_at_ms,
                    content_hash: entry.content_hash.clone(),
                    data_refs: super::inspect::data_refs(entry, reason).into_iter().collect(),
                    source: decision.map_or("journal", |d| d.source),
                    trust_class: decision.map_or_else(
                        || crate::compiler::entry_provenance(entry.id.kind(), entry.role).1,
                        |d| d.trust_class,
                    ),
                    privacy_scope: self.privacy_scope.clone(),
                    id,
                }
            })
            .collect()
    }

    /// What the current packet would lose under lower limits (75%, 50% and 25% of the real one).
    pub fn lower_budgets(&self, settings: &SessionSettings) -> Vec<crate::compiler::LowerBudgetOutcome> {
        self.compiler.simulate_lower_budgets(settings.limit, settings.budget, LOWER_BUDGET_PERCENTS)
    }

    /// Every inclusion decision of the current packet, Tier 1 to Tier 3.
    pub fn decisions(&self) -> Vec<InclusionDecision> {
        self.compiler.decisions(self.journal.entries(), &self.privacy_scope)
    }

    /// Here is the client's request: journals its new turns (redacted, spilled, deduplicated),
    /// admits them against the budget (compacting first when automatic compaction is on and the
    /// context would block or has reached the trigger) and compiles the first upstream call.
    pub fn begin_turn(
        &mut self,
        settings: &SessionSettings,
        turn: TurnRequest<'_>,
    ) -> Result<TurnOutcome, EngineError> {
        let TurnRequest { request, transparent, request_key, operation_id, head, now_ms } = turn;
        if self.tenant != settings.tenant {
            self.tenant.clone_from(&settings.tenant);
        }
        if self.privacy_scope != settings.compaction.privacy_scope {
            self.privacy_scope.clone_from(&settings.compaction.privacy_scope);
        }
        self.refresh(settings, false)?;
        self.rank_tools(settings, latest_user_text(&request.turns))?;
        self.prepare_prefix(settings, &request.system_text, &request.tools)?;
        let (first_new, chains, rewind) = if transparent {
            let placed =
                self.place_turns(&request.turns, &request.known_chains, request.hollow_turns, now_ms)?;
            let Some(placed) = placed else { return Ok(TurnOutcome::NeedsWholeHistory) };
            placed
        } else {
            self.place_keyed(request_key, &request.turns, now_ms)?
        };
        let mut drafted = Drafts::default();
        for turn in &request.turns[first_new..] {
            self.draft(settings, turn, now_ms, &mut drafted)?;
        }
        let Drafts { drafts, spilled_bytes, offloaded, digests } = drafted;
        let estimated_tokens: u64 = drafts.iter().map(|draft| draft.tokens).sum();
        let admission = OperationRequest {
            operation_id,
            estimated_tokens,
            high_volume: estimated_tokens >= settings.high_volume_tokens(),
        };
        let mut compactions = 0;
        if let Admission::Blocked(notice) = self.admit(settings, &admission)? {
            if !settings.automatic_compaction {
                return Ok(TurnOutcome::Blocked(Box::new(notice)));
            }
            let reason = "the request would otherwise be blocked by the budget";
            compactions +=
                u64::from(self.compact_in_process(settings, CompactionMode::Emergency, reason, now_ms)?);
            if let Admission::Blocked(notice) = self.admit(settings, &admission)? {
                return Ok(TurnOutcome::Blocked(Box::new(notice)));
            }
        }
        let new_entries = drafts.len();
        // Write-ahead: the client's turns are remembered with the IDs their entries are about to
        // get before they are appended. A crash between the two then leaves a remembered turn that
        // is not journaled (its unissued ID is forgotten at the next open, and the retry journals
        // it), never a journaled turn the index does not know (the retry would journal it twice).
        let next_number = self.journal.next_entry_number();
        let expected: Vec<(ChainHash, EntryId)> = chains
            .get(first_new..)
            .unwrap_or_default()
            .iter()
            .copied()
            .zip(drafts.iter().zip(next_number..).map(|(draft, number)| EntryId::new(draft.kind, number)))
            .collect();
        self.remember_chain(&expected)?;
        let keyed = request_key.filter(|_| !transparent);
        if let Some(key) = keyed
            && let Some(first) = drafts.first()
        {
            self.remember_key(key, &request.turns, EntryId::new(first.kind, next_number))?;
        }
        let (deduplicated, ids) = self.append(drafts)?;
        if let (Some(key), Some(first)) = (keyed, ids.first())
            && first.number() != next_number
        {
            self.remember_key(key, &request.turns, *first)?;
        }
        let spilled_outputs = offloaded.len() as u64;
        let journaled: Vec<(ChainHash, EntryId)> =
            chains.get(first_new..).unwrap_or_default().iter().copied().zip(ids).collect();
        if journaled != expected {
            self.remember_chain(&journaled)?;
        }
        if settings.automatic_compaction && self.reached_trigger(settings) {
            let reason = "the context reached the compaction trigger";
            compactions +=
                u64::from(self.compact_in_process(settings, CompactionMode::Budget, reason, now_ms)?);
        }
        let chain_tail = transparent.then(|| chains.last().copied().unwrap_or([0; 32]));
        self.validate_derived(settings, now_ms)?;
        let first_call = self.next_call(settings, head)?;
        Ok(TurnOutcome::Admitted(Box::new(AdmittedTurn {
            new_entries,
            spilled_bytes,
            deduplicated: deduplicated.tokens,
            deduplicated_outputs: deduplicated.entries,
            spilled_outputs,
            offloaded,
            compactions,
            rewind,
            volatile_system: self.system_split.kinds.clone(),
            chain_tail,
            chains: if transparent { chains } else { Vec::new() },
            digests,
            first_call,
        })))
    }

    /// Whether the context plus its reservations reached the compaction trigger, the history stage
    /// is over its ceiling, or the memory stage is over its ceiling with summaries a compaction can
    /// merge.
    fn reached_trigger(&self, settings: &SessionSettings) -> bool {
        let used = self.compiler.context_tokens() + settings.reserved_tokens();
        used >= settings.limit * u64::from(settings.compaction_trigger_percent) / 100
            || self.stage_over(settings, Stage::History)
            || self.memory_mergeable(settings)
    }

    /// Whether summaries take more than the memory stage allows and there are two or more of them
    /// in the window: a compaction folds them into one state. One summary over the ceiling is
    /// reported, not compacted again and again.
    fn memory_mergeable(&self, settings: &SessionSettings) -> bool {
        if settings.stages.memory_tokens == 0 {
            return false;
        }
        let Ok(packet) = self.compiler.compile(self.journal.entries(), settings.limit, settings.budget)
        else {
            return false;
        };
        let summaries =
            packet.entries.iter().filter(|entry| entry.included && entry.id.kind() == EntryKind::Summary);
        summaries.take(2).count() == 2 && self.stage_over(settings, Stage::Memory)
    }

    /// Whether `stage` takes more than its allocation now.
    fn stage_over(&self, settings: &SessionSettings, stage: Stage) -> bool {
        let ceiling = match stage {
            Stage::History => settings.stages.history_tokens,
            Stage::ToolResults => settings.stages.tool_results_tokens,
            Stage::Memory => settings.stages.memory_tokens,
            _ => return false,
        };
        if ceiling == 0 {
            return false;
        }
        let Ok(packet) = self.compiler.compile(self.journal.entries(), settings.limit, settings.budget)
        else {
            return false;
        };
        allocate(
            settings.limit,
            &settings.budget,
            &settings.stages,
            settings.lazy_tools.threshold_tokens,
            section_tokens(&packet, self.compiler.volatile_tokens()),
        )
        .iter()
        .any(|usage| usage.stage == stage && usage.over)
    }

    /// Tool results over their stage ceiling are elided, oldest first, in one batch, until the
    /// section fits (or nothing elidable is left). Returns what was elided and moved off-window.
    fn enforce_tool_results_budget(
        &mut self,
        settings: &SessionSettings,
    ) -> Result<(Treated, Offloaded), EngineError> {
        if !self.stage_over(settings, Stage::ToolResults) {
            return Ok((Treated::default(), Vec::new()));
        }
        let packet = self.compiler.compile(self.journal.entries(), settings.limit, settings.budget)?;
        let allocated = allocate(
            settings.limit,
            &settings.budget,
            &settings.stages,
            settings.lazy_tools.threshold_tokens,
            section_tokens(&packet, self.compiler.volatile_tokens()),
        )
        .into_iter()
        .find(|usage| usage.stage == Stage::ToolResults)
        .map_or(0, |usage| usage.used.saturating_sub(usage.allocated));
        let candidates: BTreeMap<EntryId, u64> = packet
            .entries
            .iter()
            .filter(|entry| {
                entry.included
                    && entry.id.kind() == EntryKind::ToolResult
                    && entry.reason == InclusionReason::Journal
            })
            .map(|entry| (entry.id, entry.tokens))
            .collect();
        let mut over = allocated;
        let mut batch = BTreeMap::new();
        let mut offloaded = Vec::new();
        let mut saved = 0;
        for entry in self.journal.entries() {
            if over == 0 {
                break;
            }
            let Some(&tokens) = candidates.get(&entry.id) else { continue };
            let (content, refs) = elide_entry(entry, &settings.elision, &self.store, &settings.tenant)?;
            if refs.is_empty() {
                continue;
            }
            for (data_ref, result) in refs.into_iter().zip(&entry.content.tool_results) {
                offloaded.push((data_ref, result.output.clone()));
            }
            let treatment = Self::elision_treatment(&content);
            let kept = match &treatment {
                Treatment::Replace { text, .. } => u64::from(self.counter.count(text)),
                Treatment::Omit => 0,
            };
            let entry_saved = tokens.saturating_sub(kept);
            saved += entry_saved;
            over = over.saturating_sub(entry_saved);
            batch.insert(entry.id, treatment);
        }
        if batch.is_empty() {
            return Ok((Treated::default(), Vec::new()));
        }
        let treated = Treated { entries: batch.len() as u64, tokens: saved };
        self.elided.extend(batch.keys().copied());
        self.compiler.apply_treatments(batch, self.journal.entries(), &self.counter)?;
        self.tier2_epoch += 1;
        if self.pending_churn == ChurnCause::None {
            self.pending_churn = ChurnCause::HistoryRewrite;
        }
        self.state.write(ELIDED_FILE, &Some(&self.elided))?;
        Ok((treated, offloaded))
    }

    /// Automatic compaction (Budget at the trigger, Emergency before a block); returns whether the
    /// journal was rewritten. A compaction that cannot run (nothing to compact, summary rejected)
    /// leaves the context as it was. With a model summariser in the host, a Budget compaction is
    /// asked of the host instead ([`SessionEngine::take_compaction_ask`]).
    pub(super) fn compact_in_process(
        &mut self,
        settings: &SessionSettings,
        mode: CompactionMode,
        reason: &str,
        now_ms: u64,
    ) -> Result<bool, EngineError> {
        let ask = CompactionAsk::new(mode, reason);
        if settings.model_summarizer && mode != CompactionMode::Emergency {
            self.ask_compaction(ask);
            return Ok(false);
        }
        Ok(match self.compact(settings, &ask, now_ms)? {
            Ok(record) => record.result_generation != record.source_generation,
            Err(_) => false,
        })
    }

    /// Here is what came back: journals the answer, learns from its usage, expires and elides
    /// what no longer pays its way, and answers the memory tools the model called.
    pub fn record_answer(
        &mut self,
        settings: &SessionSettings,
        call: &UpstreamCall,
        output: &AssistantOutput,
        now_ms: u64,
    ) -> Result<AnswerEffects, EngineError> {
        let memory_calls: Vec<_> =
            output.tool_calls.iter().filter(|c| is_memory_tool(&c.name)).cloned().collect();
        let content = Content {
            text: output.text.clone(),
            tool_calls: output.tool_calls.clone(),
            tool_results: Vec::new(),
        };
        self.append_own(settings, Role::Assistant, content, now_ms)?;
        self.calls += 1;
        if let Some(usage) = output.usage {
            self.observe_usage(call.status.tokens, usage.prompt_tokens)?;
        }
        let (expired, mut offloaded) = self.expire_ephemeral(settings, now_ms)?;
        let (mut elided, elided_offloaded) = self.elide_old_results(settings)?;
        offloaded.extend(elided_offloaded);
        let (budget_elided, budget_offloaded) = self.enforce_tool_results_budget(settings)?;
        elided.entries += budget_elided.entries;
        elided.tokens += budget_elided.tokens;
        offloaded.extend(budget_offloaded);
        let mut effects = AnswerEffects {
            internal: !memory_calls.is_empty() && memory_calls.len() == output.tool_calls.len(),
            memory_calls: memory_calls.iter().map(|c| c.name.clone()).collect(),
            expired_tokens: expired.tokens,
            expired_entries: expired.entries,
            elided_tokens: elided.tokens,
            elided_entries: elided.entries,
            offloaded,
            ..AnswerEffects::default()
        };
        let loaded_before = self.tool_view.loaded_on_demand;
        for memory_call in &memory_calls {
            let outcome = memory_tools::execute(self, settings, memory_call, now_ms)?;
            effects.purges += u64::from(outcome.purged);
            effects.compactions += u64::from(outcome.compacted);
            let result = ToolResult {
                call_id: memory_call.call_id.clone(),
                name: Some(memory_call.name.clone()),
                output: outcome.output,
            };
            self.append_tool_result(settings, result, now_ms)?;
        }
        effects.tools_loaded = self.tool_view.loaded_on_demand - loaded_before;
        Ok(effects)
    }

    /// Remembers the answer the client saw (transparent sessions), so its echo in the next request
    /// is recognised as journaled.
    pub fn remember_answer(
        &mut self,
        chain_tail: Option<ChainHash>,
        visible: &Turn,
    ) -> Result<(), EngineError> {
        match (chain_tail, self.journal.entries().last()) {
            (Some(tail), Some(last)) => {
                let last = last.id;
                self.remember_chain(&[(chain(&tail, visible), last)])
            }
            _ => Ok(()),
        }
    }
}

/// The name of the tool called as `call_id` by one of `drafts` (a call and its result arriving in
/// the same request).
fn called_in(drafts: &[EntryDraft], call_id: &str) -> Option<String> {
    drafts
        .iter()
        .rev()
        .flat_map(|draft| draft.content.tool_calls.iter())
        .find(|call| call.call_id == call_id)
        .map(|call| call.name.clone())
}

/// The text of the request's latest user message (what the tools are ranked against), at most
/// 4,000 bytes.
fn latest_user_text(turns: &[Turn]) -> &str {
    let text =
        turns.iter().rev().find(|turn| turn.has_user_text()).map_or("", |turn| turn.content.text.as_str());
    let mut end = text.len().min(4_000);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Tokens of each section of `packet` (`tail` is the volatile lines and the telemetry, counted as
/// history).
fn section_tokens(packet: &Packet<'_>, tail: u64) -> SectionTokens {
    use crate::prefix::SectionClass;
    let mut tokens = SectionTokens { history: tail, ..SectionTokens::default() };
    for section in &packet.prefix.manifest().sections {
        match section.class {
            SectionClass::Tools => tokens.tools += u64::from(section.tokens),
            SectionClass::System | SectionClass::Constants => tokens.system += u64::from(section.tokens),
        }
    }
    tokens.memory += packet.tier2.memory;
    tokens.tool_results += packet.tier2.tool_results;
    tokens.history += packet.tier2.history;
    tokens
}

/// The prompt's cacheable units in order, as providers price them.
fn prompt_blocks(packet: &Packet<'_>, counter: &TokenCounter) -> Vec<Block> {
    use crate::compiler::Breakpoint;
    let mut blocks = Vec::with_capacity(packet.entries.len() + 2);
    let prefix_text = packet.prefix.text();
    if !prefix_text.is_empty() {
        blocks.push(Block {
            hash: block_hash(&prefix_text),
            tokens: u64::from(packet.prefix.manifest().total_tokens),
            breakpoint: packet.breakpoints.contains(&Breakpoint::Tier1),
        });
    }
    // One buffer for every entry's text: it is written, hashed and cleared, not allocated again.
    let mut text = String::new();
    for (index, entry) in packet.entries.iter().enumerate().filter(|(_, entry)| entry.included) {
        text.clear();
        packet.write_text(index, &mut text);
        blocks.push(Block {
            hash: block_hash(&text),
            tokens: entry.tokens,
            breakpoint: packet.breakpoints.contains(&Breakpoint::Entry { id: entry.id }),
        });
    }
    blocks.push(Block {
        hash: block_hash(&packet.telemetry),
        tokens: u64::from(counter.count(&packet.telemetry)),
        breakpoint: false,
    });
    blocks
}

#[cfg(test)]
mod churn_cause_tests {
    use super::ChurnCause;

    #[test]
    fn all_lists_every_cause_at_its_own_index() {
        for (index, cause) in ChurnCause::ALL.into_iter().enumerate() {
            assert_eq!(cause as usize, index, "{cause:?}");
        }
    }
}
