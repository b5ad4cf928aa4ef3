//! Criterion benchmarks: token counting throughput, stable-prefix canonicalisation + hashing, and
//! cache-key derivation.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use strata_core::cache_key::{CacheKeyInputs, MasterKey, compute_cache_key, derive_tenant_key};
use strata_core::prefix::{
    CanonicalSection, SectionClass, StablePrefix, StablePrefixSources, ToolRegistry, canonicalize_text,
    prefix_hash,
};
use strata_core::tokens::{TokenCounter, TokenizerKind};

/// Tokens of the prefix used by the canonicalisation benchmarks.
const PREFIX_TOKENS: u32 = 10_000;

/// Directory of real agent trajectories, relative to the workspace root.
fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/swe-gemini3")
}

/// Concatenated message contents of the first trajectory (by name), if the corpus is present.
fn trajectory_text() -> Option<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let document: Value = serde_json::from_slice(&std::fs::read(files.first()?).ok()?).ok()?;
    let mut text = String::new();
    for message in document.get("messages")?.as_array()? {
        match message.get("content") {
            Some(Value::String(content)) => text.push_str(content),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .for_each(|part| text.push_str(part)),
            _ => {}
        }
        text.push('\n');
    }
    (!text.is_empty()).then_some(text)
}

/// Generated fallback: English-and-code text of roughly the same shape as a trajectory.
fn generated_text() -> String {
    let paragraph = "The agent inspects `src/modeling/separable.py`, runs the failing test and \
                     reads the traceback.\nfn separability_matrix(model: &Model) -> Matrix {\n    \
                     let left = model.left.separable();\n    combine(left, model.right.separable())\n}\n\n";
    paragraph.repeat(400)
}

fn benchmark_text() -> (String, &'static str) {
    match trajectory_text() {
        Some(text) => (text, "trajectory"),
        None => (generated_text(), "generated"),
    }
}

/// The longest prefix of `text` (at line granularity) with at most `tokens` o200k tokens.
fn truncate_to_tokens(counter: &TokenCounter, text: &str, tokens: u32) -> String {
    let mut kept = String::new();
    for line in text.split_inclusive('\n') {
        kept.push_str(line);
        if counter.count(&kept) > tokens {
            kept.truncate(kept.len() - line.len());
            break;
        }
    }
    kept
}

fn token_counting(criterion: &mut Criterion) {
    let (text, source) = benchmark_text();
    let mut group = criterion.benchmark_group(format!("count_tokens/{source}"));
    for kind in [TokenizerKind::O200kBase, TokenizerKind::Cl100kBase] {
        let counter = TokenCounter::new(kind).expect("embedded BPE ranks load");
        group.throughput(Throughput::Elements(u64::from(counter.count(&text))));
        group.bench_function(kind.as_str(), |bencher| bencher.iter(|| counter.count(black_box(&text))));
    }
    group.finish();
}

/// A clean stable prefix of about [`PREFIX_TOKENS`] tokens: policy prose, tool schemas, constants.
fn clean_prefix_sources(counter: &TokenCounter) -> StablePrefixSources {
    let tools: Vec<Value> = (0..40)
        .map(|index| {
            json!({
                "name": format!("tool_{}", char::from(b'a' + (index % 26) as u8).to_string().repeat(1 + index / 26)),
                "description": "Reads a file from the workspace and returns its content with line numbers.",
                "input_schema": {"type": "object", "required": ["path"], "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace root."},
                    "offset": {"type": "integer", "description": "First line to read."},
                    "limit": {"type": "integer", "description": "Number of lines to read."}
                }}
            })
        })
        .collect();
    let constants = BTreeMap::from([
        ("language".to_owned(), "Rust".to_owned()),
        ("repository".to_owned(), "strata".to_owned()),
    ]);
    let mut sources = StablePrefixSources { system_prompt: String::new(), tools, constants };
    let policy = "You are a careful software agent. Keep answers short, cite files by path, and \
                  never run destructive commands without confirmation.\n";
    while StablePrefix::build(&sources, &mut ToolRegistry::new(), counter)
        .map(|prefix| prefix.manifest().total_tokens < PREFIX_TOKENS)
        .unwrap_or(false)
    {
        sources.system_prompt.push_str(&policy.repeat(20));
    }
    sources
}

fn prefix_canonicalization(criterion: &mut Criterion) {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).expect("embedded BPE ranks load");
    let (text, source) = benchmark_text();
    let corpus_prefix = truncate_to_tokens(&counter, &text, PREFIX_TOKENS);
    let sources = clean_prefix_sources(&counter);
    let mut group = criterion.benchmark_group("prefix_10k_tokens");
    group.throughput(Throughput::Bytes(corpus_prefix.len() as u64));
    group.bench_function(format!("canonicalize_and_hash/{source}"), |bencher| {
        bencher.iter(|| {
            let section = CanonicalSection {
                class: SectionClass::System,
                text: canonicalize_text(black_box(&corpus_prefix)),
            };
            prefix_hash(std::slice::from_ref(&section))
        })
    });
    let built =
        StablePrefix::build(&sources, &mut ToolRegistry::new(), &counter).expect("clean prefix builds");
    group.throughput(Throughput::Bytes(built.text().len() as u64));
    group.bench_function("build_with_volatile_scan_and_counting", |bencher| {
        bencher.iter(|| {
            StablePrefix::build(black_box(&sources), &mut ToolRegistry::new(), &counter)
                .expect("clean prefix builds")
        })
    });
    group.finish();
}

fn cache_key_derivation(criterion: &mut Criterion) {
    let master = MasterKey::new(vec![42; 32]).expect("32-byte master key");
    let inputs = CacheKeyInputs {
        tenant: "acme".to_owned(),
        privacy_scope: "workspace:alpha".to_owned(),
        provider: "anthropic".to_owned(),
        model: "claude-sonnet-4-5".to_owned(),
        tokenizer: TokenizerKind::Approximate.as_str().to_owned(),
        system_policy_hash: "a".repeat(64),
        tool_contract_hash: "b".repeat(64),
        stable_context_hash: "c".repeat(64),
        canonicalization_version: strata_core::prefix::CANONICALIZATION_VERSION.to_owned(),
    };
    let tenant_key = derive_tenant_key(&master, "acme", 1).expect("tenant key");
    let mut group = criterion.benchmark_group("cache_key");
    group.bench_function("derive_tenant_key_and_compute", |bencher| {
        bencher.iter(|| {
            let key = derive_tenant_key(&master, black_box("acme"), 1).expect("tenant key");
            compute_cache_key(&key, black_box(&inputs)).expect("matching tenant")
        })
    });
    group.bench_function("compute_with_cached_tenant_key", |bencher| {
        bencher.iter(|| compute_cache_key(&tenant_key, black_box(&inputs)).expect("matching tenant"))
    });
    group.finish();
}

criterion_group!(benches, token_counting, prefix_canonicalization, cache_key_derivation);
criterion_main!(benches);
