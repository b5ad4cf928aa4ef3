//! Compares the two BPE implementations Strata could count with (tiktoken-rs and bpe-openai) on the
//! real corpora: exact agreement of token counts, throughput, and the resident memory each adds.
//!
//! ```sh
//! cargo run --release -p strata-core --example tokenizer_eval             # agreement + throughput
//! cargo run --release -p strata-core --example tokenizer_eval -- rss tiktoken o200k
//! cargo run --release -p strata-core --example tokenizer_eval -- rss bpe-openai o200k
//! ```
//!
//! The corpora are read from `../shared/corpus` beside the checkout (long-sessions and swe-gemini3).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
}

/// Every message text of the corpora: contents, tool-call arguments and reasoning, one string each.
fn corpus_texts() -> Result<Vec<String>, String> {
    let root = corpus_root();
    let mut files = Vec::new();
    for folder in ["long-sessions/sessions", "swe-gemini3"] {
        let dir = root.join(folder);
        let listing = std::fs::read_dir(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
        for entry in listing.flatten() {
            if entry.path().extension().is_some_and(|ext| ext == "json") {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    let mut texts = Vec::new();
    for file in files {
        let bytes = std::fs::read(&file).map_err(|error| format!("{}: {error}", file.display()))?;
        let document: Value =
            serde_json::from_slice(&bytes).map_err(|error| format!("{}: {error}", file.display()))?;
        let messages = document.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
        for message in messages {
            collect_strings(&message, &mut texts);
        }
    }
    Ok(texts)
}

fn collect_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(text) if !text.is_empty() => out.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|item| collect_strings(item, out)),
        Value::Object(fields) => {
            for (key, field) in fields {
                // Recorded usage and raw provider responses are not prompt text.
                if key != "extra" && key != "usage" {
                    collect_strings(field, out);
                }
            }
        }
        _ => {}
    }
}

type Counter = Box<dyn Fn(&str) -> usize>;

fn counter(implementation: &str, encoding: &str) -> Result<Counter, String> {
    match (implementation, encoding) {
        ("tiktoken", "o200k") => {
            let bpe = tiktoken_rs::o200k_base().map_err(|error| error.to_string())?;
            Ok(Box::new(move |text| bpe.encode_ordinary(text).len()))
        }
        ("tiktoken", "cl100k") => {
            let bpe = tiktoken_rs::cl100k_base().map_err(|error| error.to_string())?;
            Ok(Box::new(move |text| bpe.encode_ordinary(text).len()))
        }
        ("bpe-openai", "o200k") => {
            let tokenizer = bpe_openai::o200k_base();
            Ok(Box::new(move |text| tokenizer.count(text)))
        }
        ("bpe-openai", "cl100k") => {
            let tokenizer = bpe_openai::cl100k_base();
            Ok(Box::new(move |text| tokenizer.count(text)))
        }
        ("tiktoken4", "o200k") | ("tiktoken4", "cl100k") => {
            let name = if encoding == "o200k" { "o200k_base" } else { "cl100k_base" };
            let bpe = tiktoken::get_encoding(name).ok_or_else(|| format!("tiktoken has no {name}"))?;
            Ok(Box::new(move |text| bpe.count(text)))
        }
        _ => Err(format!("unknown implementation/encoding {implementation}/{encoding}")),
    }
}

/// Resident set size of this process, from /proc/self/status, in KiB.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

fn measure_rss(implementation: &str, encoding: &str) -> Result<(), String> {
    let before = rss_kib().unwrap_or(0);
    let count = counter(implementation, encoding)?;
    // Count one text so lazily built tables are built too.
    let tokens = count("fn main() { println!(\"hello, world\"); } // warm up the encoder");
    let after = rss_kib().unwrap_or(0);
    println!(
        "{implementation} {encoding}: RSS {before} KiB before load, {after} KiB after ({} KiB added; {tokens} tokens)",
        after.saturating_sub(before)
    );
    Ok(())
}

fn compare(texts: &[String]) -> Result<(), String> {
    let bytes: usize = texts.iter().map(String::len).sum();
    println!("{} texts, {:.1} MB", texts.len(), bytes as f64 / 1e6);
    for encoding in ["o200k", "cl100k"] {
        let reference = counter("tiktoken", encoding)?;
        let reference_counts: Vec<usize> = texts.iter().map(|text| reference(text)).collect();
        let total_tiktoken: usize = reference_counts.iter().sum();
        let candidates = [
            ("bpe-openai", counter("bpe-openai", encoding)?),
            ("tiktoken4", counter("tiktoken4", encoding)?),
        ];
        for (name, candidate) in &candidates {
            let mut mismatches = 0usize;
            let mut first_mismatch = None;
            let mut total = 0usize;
            for (text, expected) in texts.iter().zip(&reference_counts) {
                let got = candidate(text);
                total += got;
                if got != *expected {
                    mismatches += 1;
                    first_mismatch
                        .get_or_insert_with(|| (*expected, got, text.chars().take(80).collect::<String>()));
                }
            }
            println!(
                "{encoding}: {name}: {mismatches} of {} texts differ from tiktoken-rs; tokens {total} vs {total_tiktoken}",
                texts.len()
            );
            if let Some((expected, got, head)) = first_mismatch {
                println!("  first difference: tiktoken-rs {expected}, {name} {got}, text starts {head:?}");
            }
        }
        let timed =
            [("tiktoken-rs", &reference), ("bpe-openai", &candidates[0].1), ("tiktoken4", &candidates[1].1)];
        for (name, count) in timed {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let started = Instant::now();
                let total: usize = texts.iter().map(|text| count(text)).sum();
                std::hint::black_box(total);
                best = best.min(started.elapsed().as_secs_f64());
            }
            println!(
                "  {name}: {:.0} ms for the corpus (best of 3), {:.1} M tokens/s",
                best * 1e3,
                total_tiktoken as f64 / best / 1e6
            );
        }
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [mode, implementation, encoding] if mode == "rss" => measure_rss(implementation, encoding),
        [] => compare(&corpus_texts()?),
        _ => Err("usage: tokenizer_eval [rss tiktoken|bpe-openai|tiktoken4 o200k|cl100k]".into()),
    }
}
