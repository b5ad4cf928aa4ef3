//! gateway.json loading, the settings derived from it, and polling hot reload of the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use strata_api::agent::Provider;
use strata_api::gateway_config::{GatewayConfig, GatewayConfigError};
use strata_core::budget::BudgetError;
use strata_core::redaction::PatternError;
use strata_core::retention::RetentionRuleError;
use strata_core::session::SessionSettings;

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
    /// A policy field does not translate to the engine's settings.
    #[error("{path}: {cause}")]
    Policy {
        /// The file.
        path: PathBuf,
        /// What does not translate.
        cause: PolicyError,
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
            cause => ConfigError::Policy { path: path.to_owned(), cause },
        })?;
        let session = SessionSettings {
            revision: REVISIONS.fetch_add(1, Ordering::Relaxed),
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
        Ok(Settings { config, session, api_key })
    }

    /// Reads, parses and derives the settings of the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let bytes =
            std::fs::read(path).map_err(|cause| ConfigError::Read { path: path.to_owned(), cause })?;
        let config = GatewayConfig::from_json(&bytes)
            .map_err(|cause| ConfigError::Parse { path: path.to_owned(), cause })?;
        Self::from_config(config, path)
    }

    /// The upstream provider.
    pub fn provider(&self) -> Provider {
        self.config.upstream.provider
    }
}

/// The current settings, replaced atomically on reload.
#[derive(Debug, Clone)]
pub struct LiveSettings {
    current: Arc<RwLock<Arc<Settings>>>,
}

impl LiveSettings {
    /// Starts with `settings`.
    pub fn new(settings: Settings) -> Self {
        Self { current: Arc::new(RwLock::new(Arc::new(settings))) }
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

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|meta| meta.modified()).ok()
}

/// Polls `path` and swaps in the new settings whenever the file changes and parses; an invalid file
/// is logged and the previous settings stay in force.
pub async fn watch(path: PathBuf, live: LiveSettings) {
    let mut last_seen = modified(&path);
    let mut last_bytes = std::fs::read(&path).ok();
    let mut ticker = tokio::time::interval(RELOAD_POLL_INTERVAL);
    loop {
        ticker.tick().await;
        let now = modified(&path);
        if now == last_seen {
            continue;
        }
        last_seen = now;
        let bytes = std::fs::read(&path).ok();
        if bytes == last_bytes {
            continue;
        }
        last_bytes = bytes;
        match Settings::load(&path) {
            Ok(settings) => {
                tracing::info!(path = %path.display(), "gateway config reloaded");
                live.replace(settings);
            }
            Err(error) => {
                tracing::error!(%error, "gateway config change rejected; the previous config stays in force");
            }
        }
    }
}
