//! What replay measures is what the gateway does: recorded sessions are driven through the real
//! gateway over HTTP (a client resending its whole history each call, an in-process upstream
//! answering with the recorded assistant messages, tool calls included) and through the strata
//! policy of `strata replay`; the upstream prompts must be byte-identical, call by call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::path::PathBuf;

use gateway_support::corpus::{files, load, reply_of, seed_003, shared};
use gateway_support::{FakeUpstream, args, config, write_config};
use serde_json::{Map, Value};
use strata::gateway::config::Settings;
use strata_api::agent::Provider;
use strata_core::replay::simulate::replay_strata;
use strata_core::replay::{PolicyKind, ReplayOptions, Transcript};

/// Drives `transcript` through a fresh gateway and through replay; returns the calls compared.
async fn assert_same_prompts(fake: &FakeUpstream, transcript: &Transcript) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut gateway_config = config(fake, Provider::OpenAI, dir.path());
    gateway_config.upstream.context_window = 200_000;
    gateway_config.stable_prefix.system_prompt = String::new();
    let config_path = dir.path().join("gateway.json");
    write_config(&config_path, &gateway_config);
    let settings = Settings::from_config(gateway_config.clone(), &config_path).unwrap();

    // Replay: the same engine settings, the head the gateway adds to every upstream body.
    let mut head = Map::new();
    head.insert("model".into(), gateway_config.upstream.model.clone().into());
    head.insert("prompt_cache_key".into(), settings.cache_key.as_hex().into());
    let options = ReplayOptions {
        provider: strata_core::replay::Provider::OpenAi,
        strata: settings.session,
        head,
        policies: vec![PolicyKind::Strata],
        ..ReplayOptions::default()
    };
    let mut expected: Vec<Option<Vec<u8>>> = Vec::new();
    let times: Vec<u64> = (0..transcript.calls.len() as u64).map(|call| 1_000 + call).collect();
    replay_strata(transcript, &options, &times, |_, call| expected.push(call.map(|c| c.body.to_vec())))
        .unwrap();

    // The gateway, over HTTP.
    let mut gateway_args = args(&config_path, &dir.path().join("data"));
    gateway_args.max_body_bytes = 64 * 1024 * 1024;
    let gateway = strata::gateway::start(&gateway_args).await.unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{}/v1/chat/completions", gateway.address);
    let wires: Vec<Value> = transcript.messages.iter().map(|m| m.wire.clone()).collect();
    let seen_before = fake.seen().len();
    for (call, &(end, _)) in transcript.calls.iter().enumerate() {
        fake.unscript();
        fake.script([reply_of(&wires[end])]);
        let body = serde_json::json!({"model": "client-model", "messages": &wires[..end]});
        let response = client.post(&url).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let seen = fake.seen();
        match &expected[call] {
            Some(prompt) => {
                assert_eq!(status, 200, "{} call {call}: {text}", transcript.name);
                let forwarded = seen.last().unwrap().raw.as_bytes();
                assert_eq!(seen.len(), seen_before + expected[..=call].iter().flatten().count());
                assert!(
                    forwarded == prompt.as_slice(),
                    "{} call {call}: the gateway forwarded a different prompt than replay priced\n gateway: {}\n replay:  {}",
                    transcript.name,
                    first_difference(forwarded, prompt),
                    first_difference(prompt, forwarded),
                );
            }
            None => assert_ne!(
                status, 200,
                "{} call {call}: replay blocked it, the gateway did not",
                transcript.name
            ),
        }
    }
    gateway.shutdown().await;
    expected.len()
}

fn first_difference(a: &[u8], b: &[u8]) -> String {
    let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let start = at.saturating_sub(80);
    let end = (at + 160).min(a.len());
    format!("byte {at} of {}: …{}…", a.len(), String::from_utf8_lossy(&a[start..end]))
}

async fn check_all(paths: Vec<PathBuf>) {
    let fake = FakeUpstream::start().await;
    let mut calls = 0;
    for path in &paths {
        calls += assert_same_prompts(&fake, &load(path)).await;
    }
    assert!(calls > 0);
    eprintln!("{} sessions, {calls} calls: identical upstream prompts", paths.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_003_session_prompts_are_identical() {
    let Some(shared) = shared() else { return };
    check_all(seed_003(&shared)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_sessions_prompts_are_identical() {
    let Some(shared) = shared() else { return };
    check_all(files(&shared.join("corpus/long-sessions/sessions"), ".json")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swe_gemini3_sample_prompts_are_identical() {
    let Some(shared) = shared() else { return };
    check_all(files(&shared.join("corpus/swe-gemini3"), ".json").into_iter().step_by(10).collect()).await;
}
