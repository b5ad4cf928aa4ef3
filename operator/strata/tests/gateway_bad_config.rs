//! A bad hand-edited gateway.json never stops the gateway: at start it serves with the last good
//! config saved on the volume and says so (status, metrics), or, with none saved, stays up but not
//! ready (`/readyz` 503 naming the file and its error; provider requests 503 in their provider's
//! shape) and starts serving, without a restart, once the file is fixed (or the API key file it
//! names appears).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::time::Duration;

use gateway_support::{FakeUpstream, Harness, args, config, write_config};
use serde_json::{Value, json};
use strata_api::agent::Provider;

const CHAT: &str = "/v1/chat/completions";

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}

async fn get(client: &reqwest::Client, url: String) -> (u16, String) {
    let response = client.get(url).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Wait up to 10 s for `url` to answer `status`.
async fn until_status(client: &reqwest::Client, url: &str, status: u16) -> (u16, String) {
    let mut last = (0, String::new());
    for _ in 0..100 {
        last = get(client, url.to_string()).await;
        if last.0 == status {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

#[tokio::test]
async fn a_bad_file_at_start_serves_the_last_good_config_and_says_so() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let (status, _) = gateway.post_json(CHAT, &user("one"), &[]).await;
    assert_eq!(status, 200);
    let saved = gateway.data_dir.join("gateway/last-good-config.json");
    assert!(saved.exists(), "the usable file is saved on the volume");
    let good = std::fs::read(&gateway.config_path).unwrap();

    // A hand edit breaks the file while the gateway is down.
    let mut broken: Value = serde_json::from_slice(&good).unwrap();
    broken["policy"]["redaction"]["extraPatterns"] = json!(["(unclosed"]);
    std::fs::write(&gateway.config_path, serde_json::to_vec(&broken).unwrap()).unwrap();
    let gateway = gateway.restart().await;

    let (ready, _) = get(&gateway.client, gateway.url("/readyz")).await;
    assert_eq!(ready, 200, "the last good config serves");
    let (status, _) = gateway.post_json(CHAT, &user("two"), &[]).await;
    assert_eq!(status, 200);
    let state = gateway.get_json("/strata/v1/status").await;
    assert_eq!(state["config"]["inForce"], "lastGood", "{state}");
    let error = state["config"]["error"].as_str().unwrap();
    assert!(error.contains("gateway.json") && error.contains("extraPatterns"), "{error}");
    let metrics = gateway.metrics().await;
    assert_eq!(metric(&metrics, "strata_gateway_config_from_last_good"), Some(1.0));
    assert_eq!(metric(&metrics, "strata_gateway_config_rejected"), Some(1.0));

    // The fixed file is picked up without a restart.
    std::fs::write(&gateway.config_path, &good).unwrap();
    let mut fixed = false;
    for _ in 0..100 {
        if gateway.get_json("/strata/v1/status").await["config"]["inForce"] == "file" {
            fixed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fixed, "the fixed file was not loaded");
    let metrics = gateway.metrics().await;
    assert_eq!(metric(&metrics, "strata_gateway_config_from_last_good"), Some(0.0));
    assert_eq!(metric(&metrics, "strata_gateway_config_rejected"), Some(0.0));
    gateway.gateway.shutdown().await;
}

#[tokio::test]
async fn a_bad_file_with_nothing_saved_waits_not_ready_and_starts_once_fixed() {
    let fake = FakeUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("gateway.json");
    let data_dir = dir.path().join("data");
    std::fs::write(&config_path, b"{ \"version\": 1, not json").unwrap();
    let running = strata::gateway::start(&args(&config_path, &data_dir)).await.expect("starts anyway");
    // The gateway installs the TLS provider only once it has a config; the test's client needs one now.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", running.address);

    assert_eq!(get(&client, url("/healthz")).await.0, 200, "alive, so not restarted");
    let (ready, why) = get(&client, url("/readyz")).await;
    assert_eq!(ready, 503);
    assert!(why.contains(&config_path.display().to_string()) && why.contains("fix the file"), "{why}");

    let openai = client.post(url(CHAT)).json(&user("hi")).send().await.unwrap();
    assert_eq!(openai.status().as_u16(), 503);
    let body: Value = openai.json().await.unwrap();
    assert_eq!(body["error"]["type"], "gateway_unavailable", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("gateway.json"), "{body}");
    let anthropic = client
        .post(url("/v1/messages"))
        .json(&json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(anthropic.status().as_u16(), 503);
    let body: Value = anthropic.json().await.unwrap();
    assert_eq!(
        (body["type"].as_str(), body["error"]["type"].as_str()),
        (Some("error"), Some("gateway_unavailable"))
    );
    let metrics = get(&client, format!("http://{}/metrics", running.metrics_address)).await.1;
    assert_eq!(metric(&metrics, "strata_gateway_config_rejected"), Some(1.0));
    assert!(!data_dir.join("gateway/last-good-config.json").exists(), "nothing usable to save yet");

    // Fixing the file starts the gateway on the same ports, no restart.
    write_config(&config_path, &config(&fake, Provider::OpenAI, dir.path()));
    let (ready, body) = until_status(&client, &url("/readyz"), 200).await;
    assert_eq!(ready, 200, "{body}");
    let response = client.post(url(CHAT)).json(&user("hi")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let status: Value = client.get(url("/strata/v1/status")).send().await.unwrap().json().await.unwrap();
    assert_eq!(status["config"]["inForce"], "file");
    assert!(data_dir.join("gateway/last-good-config.json").exists(), "the fixed file is saved");
    running.shutdown().await;
}

/// A config whose API key file is missing at start (a Secret not mounted yet) waits not ready, and
/// starts once the key file appears, with gateway.json itself unchanged.
#[tokio::test]
async fn a_missing_key_file_at_start_waits_not_ready_and_starts_once_it_appears() {
    let fake = FakeUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("gateway.json");
    let data_dir = dir.path().join("data");
    let mut waiting = config(&fake, Provider::OpenAI, dir.path());
    let key_file = dir.path().join("mounted-later/api-key");
    waiting.upstream.api_key_file = Some(key_file.display().to_string());
    write_config(&config_path, &waiting);
    let running = strata::gateway::start(&args(&config_path, &data_dir)).await.expect("starts anyway");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", running.address);
    let (ready, why) = get(&client, url("/readyz")).await;
    assert_eq!(ready, 503);
    assert!(why.contains("mounted-later"), "the key file is named: {why}");

    std::fs::create_dir_all(key_file.parent().unwrap()).unwrap();
    std::fs::write(&key_file, "sk-mounted-late\n").unwrap();
    let (ready, body) = until_status(&client, &url("/readyz"), 200).await;
    assert_eq!(ready, 200, "{body}");
    let response = client.post(url(CHAT)).json(&user("hi")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let sent = fake.seen().pop().unwrap();
    assert_eq!(sent.headers["authorization"], "Bearer sk-mounted-late");
    running.shutdown().await;
}
