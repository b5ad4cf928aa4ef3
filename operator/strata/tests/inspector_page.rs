//! The Context Inspector page, loaded in headless Chromium against a gateway with a seeded journal:
//! the bar and the timeline render, the numbers on the page equal the JSON endpoints', and the page
//! logs no errors.
//!
//! Needs Debian's `chromium` (`apt-get install chromium`). Without it the test says it was skipped;
//! with STRATA_REQUIRE_CHROMIUM=1 (CI sets it) a missing browser is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use gateway_support::{FakeUpstream, Harness, Reply, call};
use serde_json::{Value, json};
use strata_api::agent::Provider;

const REQUIRE_CHROMIUM: &str = "STRATA_REQUIRE_CHROMIUM";

/// The Chromium binary, or `None` after saying why the test is skipped.
fn chromium(test: &str) -> Option<PathBuf> {
    let found =
        ["/usr/bin/chromium", "/usr/bin/chromium-browser"].iter().map(PathBuf::from).find(|p| p.exists());
    if found.is_none() {
        let why = format!("{test}: needs Debian's chromium (apt-get install chromium)");
        if std::env::var(REQUIRE_CHROMIUM).is_ok_and(|v| v == "1") {
            panic!("{why}; {REQUIRE_CHROMIUM}=1 makes this skip a failure");
        }
        eprintln!("skipped {why}; it is not installed. Set {REQUIRE_CHROMIUM}=1 to make this an error.");
    }
    found
}

/// Loads `url` in headless Chromium and returns the DOM after the page's scripts ran, and stderr.
fn dump_dom(browser: &Path, url: &str, profile: &Path) -> (String, String) {
    let output = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("chromium runs");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// With STRATA_SCREENSHOT_DIR set, saves a screenshot of `url` there as `name` (the README's
/// pictures: `STRATA_SCREENSHOT_DIR=$PWD/docs cargo test -p strata --test inspector_page`).
fn screenshot(browser: &Path, url: &str, profile: &Path, name: &str) {
    let Some(dir) = std::env::var_os("STRATA_SCREENSHOT_DIR") else { return };
    let target = Path::new(&dir).join(name);
    let status = Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .args(["--hide-scrollbars", "--window-size=1280,1900", "--virtual-time-budget=10000"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", target.display()))
        .arg(url)
        .status()
        .expect("chromium runs");
    assert!(status.success(), "screenshot of {url} failed");
    eprintln!("wrote {}", target.display());
}

/// The text of the element with `id` in `dom`.
fn text_of(dom: &str, id: &str) -> String {
    let marker = format!("id=\"{id}\"");
    let at = dom.find(&marker).unwrap_or_else(|| panic!("no element #{id} in the page")) + marker.len();
    let start = at + dom[at..].find('>').expect("tag closes") + 1;
    let end = start + dom[start..].find('<').expect("element closes");
    dom[start..end].to_owned()
}

/// The numeric values of attribute `name` on every element that has it.
fn attribute_values(dom: &str, name: &str) -> Vec<String> {
    let marker = format!(" {name}=\"");
    dom.match_indices(&marker)
        .map(|(at, _)| {
            let start = at + marker.len();
            dom[start..start + dom[start..].find('"').unwrap()].to_owned()
        })
        .collect()
}

fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

async fn seeded_gateway(fake: &FakeUpstream) -> Harness {
    let harness = Harness::start(fake, Provider::OpenAI, |config| {
        config.upstream.context_window = 32_000;
        config.policy.tool_results.max_result_chars = 2_000;
    })
    .await;
    let build_log: String =
        (0..400).map(|line| format!("step {line}: compiled module_{line}.rs in 0.{line}s\n")).collect();
    let mut messages = vec![json!({"role": "user", "content": "Build the project and tell me what failed."})];
    fake.script([Reply::Calls(String::new(), vec![call("call_1", "bash", json!({"cmd": "make"}))])]);
    let (status, answer) =
        harness.post_json("/v1/chat/completions", &json!({"model": "m", "messages": messages}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    messages.push(answer["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": build_log}));
    fake.script([Reply::Text("The build passed; nothing failed.".into())]);
    let (status, answer) =
        harness.post_json("/v1/chat/completions", &json!({"model": "m", "messages": messages}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    messages.push(answer["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "Thanks. Summarise the build in one line."}));
    fake.script([Reply::Text("All 400 modules compiled.".into())]);
    let (status, answer) =
        harness.post_json("/v1/chat/completions", &json!({"model": "m", "messages": messages}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    harness
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_what_the_json_endpoints_say() {
    let Some(browser) = chromium("the_page_shows_what_the_json_endpoints_say") else { return };
    let fake = FakeUpstream::start().await;
    let harness = seeded_gateway(&fake).await;
    let metrics = harness.gateway.metrics_address;
    let get = |path: &'static str| {
        let client = harness.client.clone();
        async move {
            let response = client.get(format!("http://{metrics}{path}")).send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            response.json::<Value>().await.unwrap()
        }
    };
    let status = get("/strata/v1/status").await;
    let entries = get("/strata/v1/entries").await;
    let inspect = get("/strata/v1/inspect?limit=32").await;

    let profile = tempfile::tempdir().unwrap();
    let (dom, stderr) = dump_dom(&browser, &format!("http://{metrics}/strata/v1/ui"), profile.path());
    assert!(dom.contains("data-state=\"ready\""), "the page did not finish rendering:\n{dom}\n{stderr}");
    assert_eq!(text_of(&dom, "errors"), "", "the page reported errors");
    screenshot(&browser, &format!("http://{metrics}/strata/v1/ui"), profile.path(), "inspector-live.png");
    let console_errors: Vec<&str> =
        stderr.lines().filter(|line| line.contains("CONSOLE") && line.contains("ERROR")).collect();
    assert!(console_errors.is_empty(), "console errors: {console_errors:?}");

    // The header numbers are the status endpoint's.
    let context = &status["context"];
    assert_eq!(text_of(&dom, "now-tokens"), thousands(context["tokens"].as_u64().unwrap()));
    assert_eq!(text_of(&dom, "now-limit"), thousands(context["limit"].as_u64().unwrap()));
    assert_eq!(text_of(&dom, "now-percent"), context["percent"].as_u64().unwrap().to_string());
    assert_eq!(text_of(&dom, "generation"), status["generation"].as_u64().unwrap().to_string());

    // One table row per journal entry, with the entries endpoint's IDs in order.
    let listed: Vec<&str> =
        entries["entries"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert!(listed.len() >= 6, "the seeded journal has the three turns: {listed:?}");
    assert_eq!(text_of(&dom, "entry-count"), listed.len().to_string());
    assert_eq!(attribute_values(&dom, "data-id"), listed);

    // The stage budgets of the last call, the output reserve first.
    assert_eq!(
        attribute_values(&dom, "data-stage"),
        ["output_reserve", "system", "tools", "memory", "tool_results", "history"]
    );

    // The bar: Tier 1 sections and Tier 3 from the decisions, Tier 2 by class from the entries.
    let decisions = inspect["decisions"].as_array().unwrap();
    let tier_tokens = |tier: u64| -> u64 {
        decisions
            .iter()
            .filter(|d| d["tier"] == tier && d["included"] == true)
            .map(|d| d["tokens"].as_u64().unwrap())
            .sum()
    };
    let window: u64 = entries["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["included"] == true)
        .map(|e| e["windowTokens"].as_u64().unwrap())
        .sum();
    let expected_used = tier_tokens(1) + window + tier_tokens(3);
    let used = attribute_values(&dom, "data-used");
    assert_eq!(
        used.first().map(String::as_str),
        Some(expected_used.to_string().as_str()),
        "context bar total"
    );
    let segments = attribute_values(&dom, "data-segment");
    assert!(segments.iter().any(|s| s.starts_with("tier1.")), "Tier 1 in the bar: {segments:?}");
    assert!(segments.iter().any(|s| s.starts_with("tier2.")), "Tier 2 in the bar: {segments:?}");
    assert!(segments.iter().any(|s| s == "reserve"), "the output reserve in the bar: {segments:?}");

    // The timeline: one point per upstream round, with the rounds' context tokens, in time order.
    let mut rounds: Vec<u64> = Vec::new();
    for request in inspect["requests"].as_array().unwrap().iter().rev() {
        for round in request["rounds"].as_array().unwrap() {
            rounds.push(round["status"]["tokens"].as_u64().unwrap());
        }
    }
    assert_eq!(attribute_values(&dom, "data-calls"), vec![rounds.len().to_string()]);
    let points: Vec<u64> =
        attribute_values(&dom, "data-context").iter().map(|v| v.parse().unwrap()).collect();
    assert_eq!(points, rounds, "timeline points");
    // The spill of the build log is marked on the call that admitted it.
    let spills = dom.matches("data-event=\"spill\"").count();
    assert_eq!(spills, 1, "one spill marker:\n{dom}");

    // The lower-budget simulation: one bar per simulated limit.
    let simulated: Vec<String> = inspect["lowerBudgets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["percentOfLimit"].as_u64().unwrap().to_string())
        .collect();
    assert_eq!(attribute_values(&dom, "data-percent"), simulated);

    // An entry opens with its journaled content; the spilled output names its data_ref.
    let spilled = entries["entries"].as_array().unwrap().iter().find(|e| e["role"] == "tool").unwrap();
    let id = spilled["id"].as_str().unwrap();
    let detail = get_detail(&harness, id).await;
    assert_eq!(detail["id"], id);
    let refs = detail["dataRefs"].as_array().unwrap();
    assert_eq!(refs.len(), 1, "{detail}");
    assert!(refs[0].as_str().unwrap().starts_with("art:sha256:"));
    // The table names it too, without opening the entry.
    assert_eq!(spilled["dataRefs"], detail["dataRefs"], "the listing and the detail agree");
    assert!(
        attribute_values(&dom, "data-ref").contains(&refs[0].as_str().unwrap().to_owned()),
        "the row names the data_ref"
    );
    let missing =
        harness.client.get(format!("http://{metrics}/strata/v1/entries/msg_999999")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

async fn get_detail(harness: &Harness, id: &str) -> Value {
    let url = format!("http://{}/strata/v1/entries/{id}", harness.gateway.metrics_address);
    harness.client.get(url).send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_self_contained_and_served_with_a_strict_policy() {
    let fake = FakeUpstream::start().await;
    let harness = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let url = format!("http://{}/strata/v1/ui", harness.gateway.metrics_address);
    let response = harness.client.get(url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let policy = response.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"), "{policy}");
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let page = response.text().await.unwrap();
    assert!(page.contains("id=\"context-bar\"") && page.contains("id=\"timeline\""));
    // The API listener does not serve it: the Inspector lives on the metrics listener only.
    let api = harness.client.get(harness.url("/strata/v1/ui")).send().await.unwrap();
    assert_eq!(api.status(), 404);
}

#[test]
fn replay_writes_the_same_page_for_a_recorded_session() {
    let Some(browser) = chromium("replay_writes_the_same_page_for_a_recorded_session") else { return };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let report = dir.path().join("report.json");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sessions/builder-overnight.json");
    let output = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["replay", "--context-window", "32000"])
        .arg(&sample)
        .arg("--html")
        .arg(&page)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let strata = report["sessions"][0]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "strata")
        .unwrap()
        .clone();
    let calls: Vec<u64> =
        strata["calls"].as_array().unwrap().iter().map(|c| c["cost"]["total"].as_u64().unwrap()).collect();

    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}", page.display());
    let (dom, stderr) = dump_dom(&browser, &url, profile.path());
    assert!(dom.contains("data-state=\"ready\""), "the offline page did not render:\n{dom}\n{stderr}");
    assert_eq!(text_of(&dom, "errors"), "");
    let points: Vec<u64> =
        attribute_values(&dom, "data-context").iter().map(|v| v.parse().unwrap()).collect();
    assert_eq!(points, calls, "one timeline point per replayed call, with its prompt tokens");
    let spills = strata["spills"].as_u64().unwrap() as usize;
    assert!(spills > 0, "the sample spills");
    assert!(dom.matches("data-event=\"spill\"").count() >= 1, "spills are marked on the timeline");
    assert!(attribute_values(&dom, "data-segment").iter().any(|s| s.starts_with("tier2.")));
    screenshot(&browser, &url, profile.path(), "inspector-replay.png");
}
