//! Finding and parsing the session files given on the command line.

use std::path::{Path, PathBuf};

use strata_core::replay::{InputFormat, Transcript, parse_transcript};

/// Every `.json` / `.jsonl` file under `paths`, sorted, then parsed; failures go to `errors`.
pub fn load_all(paths: &[PathBuf], format: InputFormat, errors: &mut Vec<String>) -> Vec<Transcript> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files, errors);
    }
    files.sort();
    files.dedup();
    let mut transcripts = Vec::with_capacity(files.len());
    for file in files {
        let name = file.display().to_string();
        match std::fs::read_to_string(&file) {
            Ok(text) => match parse_transcript(&name, &text, format) {
                Ok(transcript) => transcripts.push(transcript),
                Err(error) => errors.push(error.to_string()),
            },
            Err(error) => errors.push(format!("{name}: cannot read: {error}")),
        }
    }
    transcripts
}

fn collect(path: &Path, files: &mut Vec<PathBuf>, errors: &mut Vec<String>) {
    if path.is_dir() {
        match std::fs::read_dir(path) {
            Ok(entries) => {
                for entry in entries.flatten() {
                    let child = entry.path();
                    if child.is_dir() || child.extension().is_some_and(|e| e == "json" || e == "jsonl") {
                        collect(&child, files, errors);
                    }
                }
            }
            Err(error) => errors.push(format!("{}: cannot list: {error}", path.display())),
        }
    } else if path.exists() {
        files.push(path.to_path_buf());
    } else {
        errors.push(format!("{}: no such file or directory", path.display()));
    }
}
