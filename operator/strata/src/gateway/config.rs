//! gateway.json loading, the settings derived from it, polling hot reload of the file, and the
//! last good config kept on the volume so a bad hand edit never stops the gateway.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use strata_api::agent::Provider;
use strata_api::gateway_config::{GatewayConfig, GatewayConfigError};
use strata_core::budget::BudgetError;
use strata_core::cache_key::{CacheKey, RuntimeBinding, authorization_fingerprint, bind_runtime};
use strata_core::journal::Storage;
use strata_core::redaction::PatternError;
use strata_core::retention::RetentionRuleError;
use strata_core::session::{SessionSettings, StateDir};

use crate::engine_policy::{self, PolicyError};

/// How often the config file's modification time is checked.
pub const RELOAD_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A gateway.json that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("reading gateway config {path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The file is not a valid gateway config.
    #[error("{path}: {cause}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The format error.
        cause: GatewayConfigError,
    },
    /// The budget policy does not fit the context window.
    #[error("{path}: policy.budget: {cause}")]
    Budget {
        /// The file.
        path: PathBuf,
        /// The budget error.
        cause: BudgetError,
    },
    /// A retention rule cannot be compiled.
    #[error("{path}: policy.retention: {cause}")]
    Retention {
        /// The file.
        path: PathBuf,
        /// The rule error.
        cause: RetentionRuleError,
    },
    /// A redaction pattern does not compile.
    #[error("{path}: policy.redaction.extraPatterns: {cause}")]
    Redaction {
        /// The file.
        path: PathBuf,
        /// The pattern error.
        cause: PatternError,
    },
    /// The API key file cannot be read.
    #[error("reading the upstream API key file {path}: {cause}")]
    ApiKey {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
}

/// The runtime identity bound into every upstream cache key.
pub const RUNTIME_IDENTITY: &str = concat!("strata-gateway/", env!("CARGO_PKG_VERSION"));

/// The provider adapter that renders the upstream body, as bound into the cache key.
pub fn adapter_id(provider: Provider) -> &'static str {
    match provider {
        Provider::OpenAI => "openai-chat/v1",
        Provider::Anthropic => "anthropic-messages/v1",
        Provider::OpenAICompatible => "openai-compatible-chat/v1",
    }
}

/// The cache key the gateway sends upstream for `config`: the controller's key bound to the policy
/// version in force, the adapter, this runtime and the credential (see [`bind_runtime`]).
pub fn runtime_cache_key(config: &GatewayConfig, api_key: Option<&str>) -> CacheKey {
    let binding = RuntimeBinding {
        tenant: config.agent.namespace.clone(),
        privacy_scope: config.agent.privacy_scope.clone(),
        model: config.upstream.model.clone(),
        tokenizer: engine_policy::tokenizer_kind(config.upstream.tokenizer).as_str().to_owned(),
        policy_version: strata_api::effective::policy_hash(&config.policy),
        adapter: adapter_id(config.upstream.provider).to_owned(),
        runtime: RUNTIME_IDENTITY.to_owned(),
        authorization: authorization_fingerprint(api_key),
        epoch: config.cache_epoch,
    };
    bind_runtime(&config.cache_key, &binding)
}

/// Distinguishes loaded versions of the settings.
static REVISIONS: AtomicU64 = AtomicU64::new(0);

/// Everything derived from one version of gateway.json.
pub struct Settings {
    /// The file as parsed.
    pub config: GatewayConfig,
    /// The session engine's settings.
    pub session: SessionSettings,
    /// Upstream API key, when a key file is configured.
    pub api_key: Option<String>,
    /// The cache key sent upstream and scoping the response cache ([`runtime_cache_key`]).
    pub cache_key: CacheKey,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("revision", &self.session.revision)
            .field("agent", &self.config.agent)
            .field("limit", &self.session.limit)
            .field("budget", &self.session.budget)
            .field("spill", &self.session.spill)
            .field("redaction", &self.session.redactor.is_some())
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Derives the settings from a parsed config (reading the API key file).
    pub fn from_config(config: GatewayConfig, path: &Path) -> Result<Self, ConfigError> {
        let session = engine_policy::session_settings(
            &config.policy,
            config.upstream.provider,
            config.upstream.context_window,
            config.upstream.tokenizer,
            &config.agent.namespace,
            &config.agent.privacy_scope,
        )
        .map_err(|cause| match cause {
            PolicyError::Budget(cause) => ConfigError::Budget { path: path.to_owned(), cause },
            PolicyError::Redaction(cause) => ConfigError::Redaction { path: path.to_owned(), cause },
            PolicyError::Retention(cause) => ConfigError::Retention { path: path.to_owned(), cause },
        })?;
        let session = SessionSettings {
            revision: REVISIONS.fetch_add(1, Ordering::Relaxed),
            cache_epoch: config.cache_epoch,
            stable_prefix: strata_core::prefix::StablePrefixSources {
                system_prompt: config.stable_prefix.system_prompt.clone(),
                tools: config.stable_prefix.tools.clone(),
                constants: config.stable_prefix.constants.clone(),
            },
            ..session
        };
        let api_key = match &config.upstream.api_key_file {
            Some(file) => {
                let key = std::fs::read_to_string(file)
                    .map_err(|cause| ConfigError::ApiKey { path: PathBuf::from(file), cause })?;
                Some(key.trim().to_owned())
            }
            None => None,
        };
        let cache_key = runtime_cache_key(&config, api_key.as_deref());
        Ok(Settings { config, session, api_key, cache_key })
    }

    /// Reads, parses and derives the settings of the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with_bytes(path).map(|(settings, _)| settings)
    }

    /// [`Settings::load`], also returning the file's bytes.
    pub fn load_with_bytes(path: &Path) -> Result<(Self, Vec<u8>), ConfigError> {
        let bytes =
            std::fs::read(path).map_err(|cause| ConfigError::Read { path: path.to_owned(), cause })?;
        Ok((Self::from_bytes(&bytes, path)?, bytes))
    }

    /// Parses and derives the settings of gateway.json's bytes (`path` names them in errors).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, ConfigError> {
        let config = GatewayConfig::from_json(bytes)
            .map_err(|cause| ConfigError::Parse { path: path.to_owned(), cause })?;
        Self::from_config(config, path)
    }

    /// The upstream provider.
    pub fn provider(&self) -> Provider {
        self.config.upstream.provider
    }
}

/// Which config is in force while gateway.json on disk cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum InForce {
    /// The last good config saved on the volume (the file was unusable at start).
    LastGood,
    /// The config loaded before the file was changed.
    Previous,
}

/// gateway.json on disk cannot be used: why, and what is in force instead.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigProblem {
    /// The file's error.
    pub error: String,
    /// The config serving meanwhile.
    pub in_force: InForce,
}

/// The current settings, replaced atomically on reload, and what is wrong with the file if anything.
#[derive(Debug, Clone)]
pub struct LiveSettings {
    current: Arc<RwLock<Arc<Settings>>>,
    problem: Arc<RwLock<Option<ConfigProblem>>>,
}

impl LiveSettings {
    /// Starts with `settings`.
    pub fn new(settings: Settings) -> Self {
        Self { current: Arc::new(RwLock::new(Arc::new(settings))), problem: Arc::default() }
    }

    /// What is wrong with gateway.json on disk, while an older config serves.
    pub fn problem(&self) -> Option<ConfigProblem> {
        match self.problem.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Records (or clears) what is wrong with gateway.json on disk.
    pub fn set_problem(&self, problem: Option<ConfigProblem>) {
        match self.problem.write() {
            Ok(mut guard) => *guard = problem,
            Err(poisoned) => *poisoned.into_inner() = problem,
        }
    }

    /// The settings in force now.
    pub fn get(&self) -> Arc<Settings> {
        match self.current.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the settings.
    pub fn replace(&self, settings: Settings) {
        let settings = Arc::new(settings);
        match self.current.write() {
            Ok(mut guard) => *guard = settings,
            Err(poisoned) => *poisoned.into_inner() = settings,
        }
    }
}

/// Name of the copy of the last usable gateway.json, in the gateway's state directory.
pub const LAST_GOOD_FILE: &str = "last-good-config.json";

/// The copy of the last usable gateway.json on the agent's volume (`gateway/last-good-config.json`
/// in the data directory), replaced durably whenever a changed file loads.
#[derive(Clone)]
pub struct LastGood {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
}

impl std::fmt::Debug for LastGood {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LastGood").field("path", &self.path()).finish()
    }
}

impl LastGood {
    /// The copy under `data_dir` on `storage`.
    pub fn new(storage: Arc<dyn Storage>, data_dir: &Path) -> Self {
        LastGood { storage, dir: data_dir.join("gateway") }
    }

    /// Where the copy lives.
    pub fn path(&self) -> PathBuf {
        self.dir.join(LAST_GOOD_FILE)
    }

    fn state(&self) -> Result<StateDir, String> {
        StateDir::on_disk(Arc::clone(&self.storage), self.dir.clone()).map_err(|error| error.to_string())
    }

    fn saved(&self) -> Option<serde_json::Value> {
        let state = self.state().ok()?;
        match state.read::<Option<serde_json::Value>>(LAST_GOOD_FILE) {
            Ok((saved, None)) => saved,
            Ok((_, Some(corrupt))) => {
                tracing::warn!(path = %corrupt.path.display(), reason = %corrupt.reason, "the saved last good gateway config is corrupt; ignoring it");
                None
            }
            Err(error) => {
                tracing::warn!(%error, "reading the saved last good gateway config failed");
                None
            }
        }
    }

    /// Save `bytes` (a gateway.json that loaded) unless the copy already holds them. A failure is
    /// logged: it costs only the fallback of a later bad start.
    pub fn save(&self, bytes: &[u8]) {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return };
        if self.saved().as_ref() == Some(&value) {
            return;
        }
        let written = self
            .state()
            .and_then(|state| state.write(LAST_GOOD_FILE, &value).map_err(|error| error.to_string()));
        if let Err(error) = written {
            tracing::warn!(%error, path = %self.path().display(), "saving the last good gateway config failed; a bad gateway.json at the next start will leave the gateway not ready");
        }
    }

    /// The settings of the saved copy, if there is one and it still loads.
    pub fn load(&self) -> Option<Settings> {
        let value = self.saved()?;
        let bytes = serde_json::to_vec(&value).ok()?;
        match Settings::from_bytes(&bytes, &self.path()) {
            Ok(settings) => Some(settings),
            Err(error) => {
                tracing::warn!(%error, "the saved last good gateway config cannot be used either");
                None
            }
        }
    }
}

/// How gateway.json looked at start.
pub enum Startup {
    /// The file loads.
    Usable {
        /// Its settings.
        settings: Settings,
        /// Its bytes, saved as the last good copy once the gateway runs.
        bytes: Vec<u8>,
    },
    /// The file cannot be used; the last good copy saved on the volume serves.
    LastGood {
        /// The copy's settings.
        settings: Settings,
        /// The file's error.
        error: ConfigError,
    },
    /// The file cannot be used and there is no usable copy: the gateway waits for the file.
    Unusable(ConfigError),
}

impl Startup {
    /// Load gateway.json at `path`, falling back to `last_good`. Every failure is logged with
    /// the file, the problem and what to do.
    pub fn load(path: &Path, last_good: &LastGood) -> Startup {
        let error = match Settings::load_with_bytes(path) {
            Ok((settings, bytes)) => return Startup::Usable { settings, bytes },
            Err(error) => error,
        };
        match last_good.load() {
            Some(settings) => {
                tracing::error!(
                    %error,
                    last_good = %last_good.path().display(),
                    "gateway config {} cannot be used; serving with the last good config saved on the volume. Fix the file (the operator rewrites it from the Agent and its policies); the gateway loads it within a second, without a restart",
                    path.display()
                );
                Startup::LastGood { settings, error }
            }
            None => {
                tracing::error!(
                    %error,
                    "gateway config {} cannot be used and no last good config is saved on the volume; the gateway stays up but not ready (/readyz answers 503 with this error) until the file is fixed, which it picks up within a second, without a restart",
                    path.display()
                );
                Startup::Unusable(error)
            }
        }
    }
}

/// When the file at `path` was last modified, if it can be read.
pub(crate) fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|meta| meta.modified()).ok()
}

/// Derives the config in force again, so that it sends the key its key file holds now: a key
/// rotated while gateway.json on disk cannot be used still reaches the upstream before the provider
/// revokes the old one.
fn rotate_key_in_force(live: &LiveSettings, path: &Path) {
    let in_force = live.get();
    match Settings::from_config(in_force.config.clone(), path) {
        Ok(settings) => {
            tracing::info!("the config in force sends the rotated upstream API key");
            live.replace(settings);
        }
        Err(error) => {
            tracing::error!(%error, "the rotated upstream API key cannot be used; the key in force stays")
        }
    }
}

/// When the upstream API key file of `settings` was last changed, if it names one.
fn api_key_modified(settings: &Settings) -> Option<SystemTime> {
    settings.config.upstream.api_key_file.as_deref().and_then(|file| modified(Path::new(file)))
}

/// Whether the upstream API key file of `settings` now holds another key than the one in force
/// (an unreadable file counts, so the reload reports it).
fn api_key_rotated(settings: &Settings) -> bool {
    let Some(file) = &settings.config.upstream.api_key_file else { return false };
    match std::fs::read_to_string(file) {
        Ok(key) => Some(key.trim()) != settings.api_key.as_deref(),
        Err(_) => true,
    }
}

/// What a config reload reports to: the live settings, the saved last good copy and the metrics.
#[derive(Clone, Debug)]
pub struct ReloadTargets {
    /// The settings in force.
    pub live: LiveSettings,
    /// The copy of the last usable file.
    pub last_good: LastGood,
    /// `strata_gateway_config_rejected`.
    pub rejected: prometheus::IntGauge,
    /// `strata_gateway_config_from_last_good`.
    pub from_last_good: prometheus::IntGauge,
}

/// Polls `path` and swaps in the new settings whenever the file changes and loads (saving it as
/// the last good copy), or when the upstream API key in the file it names changes (a rotated
/// Secret, which the kubelet swaps in place); an unusable file is logged, reported in the status
/// and metrics, and the config in force stays. `loaded` is the file the settings in force came
/// from, if they came from it.
pub async fn watch(path: PathBuf, targets: ReloadTargets, loaded: Option<Vec<u8>>) {
    // The first tick compares the files with what the settings in force were loaded from (their
    // modification times are not known yet), so a change made while the gateway started is seen.
    let (mut last_seen, mut last_key_seen, mut first_tick) = (None, None, true);
    let mut last_bytes = loaded.or_else(|| std::fs::read(&path).ok());
    let mut ticker = tokio::time::interval(RELOAD_POLL_INTERVAL);
    loop {
        ticker.tick().await;
        let now = modified(&path);
        let in_force = targets.live.get();
        let key_now = api_key_modified(&in_force);
        if now == last_seen && key_now == last_key_seen {
            continue;
        }
        let key_touched = key_now != last_key_seen;
        (last_seen, last_key_seen) = (now, key_now);
        let bytes = std::fs::read(&path).ok();
        // A key file that changed is read again when it holds another key, and also when the last
        // load failed: it may have been the key file that failed (unreadable for a moment).
        let retry_failed = !first_tick && targets.live.problem().is_some();
        first_tick = false;
        let key_rotated = key_touched && (retry_failed || api_key_rotated(&in_force));
        if bytes == last_bytes && !key_rotated {
            continue;
        }
        last_bytes = bytes;
        if key_rotated {
            tracing::info!("the upstream API key file changed; loading the gateway config again");
        }
        match Settings::load_with_bytes(&path) {
            Ok((settings, bytes)) => {
                tracing::info!(path = %path.display(), "gateway config reloaded");
                targets.live.replace(settings);
                targets.live.set_problem(None);
                targets.rejected.set(0);
                targets.from_last_good.set(0);
                targets.last_good.save(&bytes);
            }
            Err(error) => {
                let in_force = match targets.live.problem() {
                    Some(ConfigProblem { in_force: InForce::LastGood, .. }) => InForce::LastGood,
                    _ => InForce::Previous,
                };
                tracing::error!(%error, "gateway config change rejected; the config in force stays. Fix the file; it is loaded within a second of the next change");
                targets.live.set_problem(Some(ConfigProblem { error: error.to_string(), in_force }));
                targets.rejected.set(1);
                if key_rotated {
                    rotate_key_in_force(&targets.live, &path);
                }
            }
        }
    }
}
