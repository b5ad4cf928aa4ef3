//! Recorded sessions from `../shared` (seed 003, the long sessions, swe-gemini3) as a client
//! would send them: the transcripts, and each recorded assistant message as the fake's answer.

use std::path::{Path, PathBuf};

use serde_json::Value;
use strata_core::replay::{InputFormat, Transcript, parse_transcript};

use super::Reply;

/// `../shared` beside the checkout, or `None` after saying the test was skipped (a failure with
/// STRATA_REQUIRE_SHARED=1).
pub fn shared() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        std::env::var("STRATA_REQUIRE_SHARED").as_deref() != Ok("1"),
        "STRATA_REQUIRE_SHARED=1 but {} is missing",
        dir.display()
    );
    eprintln!("skipped: {} is missing (the seeds and corpora live beside the checkout)", dir.display());
    None
}

/// The files in `dir` whose names end with `suffix`, sorted.
pub fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *{suffix} in {}", dir.display());
    files
}

/// Seed 003's session.
pub fn seed_003(shared: &Path) -> Vec<PathBuf> {
    files(&shared.join("seeds"), ".txt")
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/003_"))
        .collect()
}

/// The transcript at `path`.
pub fn load(path: &Path) -> Transcript {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    parse_transcript(&name, &std::fs::read_to_string(path).unwrap(), InputFormat::Auto).unwrap()
}

/// The recorded assistant message as the fake upstream's answer.
pub fn reply_of(message: &Value) -> Reply {
    let text = message["content"].as_str().unwrap_or_default().to_owned();
    let calls = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|call| {
            (
                call["id"].as_str().unwrap().to_owned(),
                call["function"]["name"].as_str().unwrap().to_owned(),
                call["function"]["arguments"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    Reply::Calls(text, calls)
}
