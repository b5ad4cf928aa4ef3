//! Log output of the long-running commands: plain text without colour codes unless stdout is a
//! terminal (and `NO_COLOR` is unset), or one JSON object per line with `--log-format json`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for log collectors.
    Json,
}

/// The logging flags shared by `strata controller` and `strata gateway`.
#[derive(Clone, Copy, Debug, Default, clap::Args)]
pub struct LogArgs {
    /// Log line format; the level filter comes from RUST_LOG (default: info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Whether colour codes may be written: stdout is a terminal and `NO_COLOR` is not set.
pub fn colour_allowed() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Install the global subscriber for `args` (a second call keeps the first one).
pub fn init(args: LogArgs) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match args.log_format {
        LogFormat::Text => builder.with_ansi(colour_allowed()).try_init(),
        LogFormat::Json => builder.json().with_ansi(false).flatten_event(true).try_init(),
    };
}
