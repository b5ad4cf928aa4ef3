//! Transparent mode follows the client: a new conversation that starts like the old one, a
//! client-side compaction, an edited earlier message and a retried turn each go upstream as the
//! client's own conversation (never spliced onto the journal's), and a dated system prompt is
//! accepted with its date moved below the cache boundary. Each test checks the exact messages
//! that went upstream, and that every request kept the provider's tool-pairing rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use gateway_support::{FakeUpstream, Harness, Reply, call};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_core::session::Api;
use strata_core::session::protocol::check_request;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

/// The conversation the upstream saw: `(role, text)` of each Tier-2 message, the entry ID tag
/// removed, without the leading system message and the trailing telemetry.
fn conversation(body: &Value) -> Vec<(String, String)> {
    let messages = body["messages"].as_array().unwrap();
    let untag = |text: &str| match text.strip_prefix('[').and_then(|rest| rest.split_once("] ")) {
        Some((_, rest)) => rest.to_owned(),
        None => text.to_owned(),
    };
    messages[1..messages.len() - 1]
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap().to_owned();
            let text = m["content"].as_str().map(untag).unwrap_or_default();
            (role, text)
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(role, text)| ((*role).to_owned(), (*text).to_owned())).collect()
}

fn assert_all_valid(fake: &FakeUpstream, api: Api) {
    for (index, seen) in fake.seen().iter().enumerate() {
        if let Err(violation) = check_request(api, &seen.body) {
            panic!("upstream request {index} breaks the protocol: {violation}\n{}", seen.raw);
        }
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

async fn send(gateway: &Harness, history: &[Value]) -> Value {
    let (status, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    answer["choices"][0]["message"].clone()
}

#[tokio::test]
async fn a_new_conversation_that_starts_like_the_old_one_is_not_spliced() {
    let fake = FakeUpstream::start().await;
    fake.script(["a1", "a2", "b1", "b2"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let a1 = send(&gateway, &[user("Hi")]).await;
    send(&gateway, &[user("Hi"), a1.clone(), user("Plan the trip")]).await;
    // A new conversation with the same opening message.
    let b1 = send(&gateway, &[user("Hi")]).await;
    assert_eq!(conversation(&fake.last()), pairs(&[("user", "Hi")]), "the old turns are not sent");
    send(&gateway, &[user("Hi"), b1, user("Fix the bug")]).await;
    assert_eq!(
        conversation(&fake.last()),
        pairs(&[("user", "Hi"), ("assistant", "b1"), ("user", "Fix the bug")])
    );
    assert_all_valid(&fake, Api::OpenAi);
    let metrics = gateway.metrics().await;
    assert!(metrics.contains("strata_gateway_transparent_rewinds_total{cause=\"retry\"} 1"), "{metrics}");
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["generation"], 2, "the rewind is a new generation: {status}");
}

#[tokio::test]
async fn a_client_side_compaction_replaces_the_history_upstream() {
    let fake = FakeUpstream::start().await;
    fake.script(["a1", "a2", "a3"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let a1 = send(&gateway, &[user("Read the logs")]).await;
    send(&gateway, &[user("Read the logs"), a1, user("Find the errors")]).await;
    // The client compacts its own history into a summary and goes on.
    let summary = "Summary of the conversation so far: the logs show two timeouts.";
    send(&gateway, &[json!({"role": "system", "content": "Be brief."}), user(summary), user("Go on")]).await;
    assert_eq!(conversation(&fake.last()), pairs(&[("user", summary), ("user", "Go on")]));
    assert_all_valid(&fake, Api::OpenAi);
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("strata_gateway_transparent_rewinds_total{cause=\"new_conversation\"} 1"),
        "{metrics}"
    );
    let roles: Vec<String> =
        gateway.entries().await.iter().map(|e| e["role"].as_str().unwrap().to_owned()).collect();
    assert_eq!(roles, ["user", "user", "assistant"], "the journal holds the client's conversation");
}

#[tokio::test]
async fn an_edited_earlier_message_forks_from_the_last_shared_turn() {
    let fake = FakeUpstream::start().await;
    fake.script(["a1", "a2", "a3", "a2 again"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let a1 = send(&gateway, &[user("u1")]).await;
    let a2 = send(&gateway, &[user("u1"), a1.clone(), user("u2")]).await;
    send(&gateway, &[user("u1"), a1.clone(), user("u2"), a2, user("u3")]).await;
    // The client edits u2 and resends from there.
    send(&gateway, &[user("u1"), a1, user("u2, edited")]).await;
    assert_eq!(
        conversation(&fake.last()),
        pairs(&[("user", "u1"), ("assistant", "a1"), ("user", "u2, edited")])
    );
    assert_all_valid(&fake, Api::OpenAi);
    assert!(gateway.metrics().await.contains("strata_gateway_transparent_rewinds_total{cause=\"edit\"} 1"));
}

/// The counter of transparent messages read as `read` ("reused" or "parsed").
fn messages_read(metrics: &str, read: &str) -> u64 {
    let name = format!("strata_gateway_transparent_messages_total{{read=\"{read}\"}} ");
    metrics.lines().find_map(|line| line.strip_prefix(name.as_str())?.parse().ok()).unwrap_or(0)
}

/// Three turns after `system`, each request resending the whole history before it; checks that
/// each reused all of the previous one's messages. Returns the three answers.
async fn three_turns(gateway: &Harness, system: &Value) -> [Value; 3] {
    let a1 = send(gateway, &[system.clone(), user("u1")]).await;
    let a2 = send(gateway, &[system.clone(), user("u1"), a1.clone(), user("u2")]).await;
    let a3 =
        send(gateway, &[system.clone(), user("u1"), a1.clone(), user("u2"), a2.clone(), user("u3")]).await;
    let metrics = gateway.metrics().await;
    assert_eq!(
        (messages_read(&metrics, "reused"), messages_read(&metrics, "parsed")),
        (2 + 4, 2 + 2 + 2),
        "each request reuses the whole history the previous one sent: {metrics}"
    );
    [a1, a2, a3]
}

/// The history a client resends is taken from the last request's memo, not parsed and hashed
/// again; an edited message and everything after it are read afresh, and a history sent with other
/// bytes (pretty-printed) is read whole and still recognised.
#[tokio::test]
async fn a_resent_history_is_reused_byte_for_byte_and_an_edit_is_read_again() {
    let fake = FakeUpstream::start().await;
    fake.script(["a1", "a2", "a3", "a2 again", "a3 again"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let system = json!({"role": "system", "content": "Be brief."});
    let [a1, _, _] = three_turns(&gateway, &system).await;

    // The client edits u2: the messages before it are reused, the rest read, the journal forks.
    send(&gateway, &[system.clone(), user("u1"), a1.clone(), user("u2, edited")]).await;
    assert_eq!(
        conversation(&fake.last()),
        pairs(&[("user", "u1"), ("assistant", "a1"), ("user", "u2, edited")])
    );
    let metrics = gateway.metrics().await;
    assert_eq!(messages_read(&metrics, "reused"), 6 + 3, "{metrics}");
    assert!(metrics.contains("strata_gateway_transparent_rewinds_total{cause=\"edit\"} 1"), "{metrics}");

    // The same conversation in other bytes: nothing is reused, and nothing is rewound either.
    let a2_again = json!({"role": "assistant", "content": "a2 again"});
    let history = json!({"messages": [system, user("u1"), a1, user("u2, edited"), a2_again, user("u3")]});
    let response = reqwest::Client::new()
        .post(gateway.url(CHAT))
        .header("content-type", "application/json")
        .body(serde_json::to_string_pretty(&history).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        conversation(&fake.last()),
        pairs(&[
            ("user", "u1"),
            ("assistant", "a1"),
            ("user", "u2, edited"),
            ("assistant", "a2 again"),
            ("user", "u3")
        ])
    );
    let metrics = gateway.metrics().await;
    assert_eq!(messages_read(&metrics, "reused"), 9, "other bytes are never reused: {metrics}");
    assert!(!metrics.contains("cause=\"retry\""), "{metrics}");
    assert!(!metrics.contains("cause=\"new_conversation\""), "{metrics}");
    assert_all_valid(&fake, Api::OpenAi);
}

/// Bodies past 14 KiB are read into the buffer the last one left and compared with it as they
/// arrive; what they share stands for the history's digest. A resent history is still reused, and
/// an edit anywhere in it, in the middle or in its first bytes, is still found, though the body
/// that carries it is longer than the last one.
#[tokio::test]
async fn a_large_history_compared_with_the_last_body_still_finds_every_edit() {
    let fake = FakeUpstream::start().await;
    fake.script(["a1", "a2", "a3", "a4", "a5"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let rules = "Answer in one line. ".repeat(1_000);
    let system = json!({"role": "system", "content": rules});
    let [a1, a2, a3] = three_turns(&gateway, &system).await;

    // An edit in the middle, resent with everything after it and a new message: the messages
    // before it are reused, the rest read, and the client's conversation goes upstream.
    let edited = [system.clone(), user("u1"), a1.clone(), user("U2"), a2.clone(), user("u3"), a3.clone()];
    let a4 = send(&gateway, &[&edited[..], &[user("u4")]].concat()).await;
    assert_eq!(
        conversation(&fake.last()),
        pairs(&[
            ("user", "u1"),
            ("assistant", "a1"),
            ("user", "U2"),
            ("assistant", "a2"),
            ("user", "u3"),
            ("assistant", "a3"),
            ("user", "u4")
        ])
    );
    let metrics = gateway.metrics().await;
    assert_eq!(messages_read(&metrics, "reused"), 6 + 3, "{metrics}");
    assert!(metrics.contains("strata_gateway_transparent_rewinds_total{cause=\"edit\"} 1"), "{metrics}");

    // An edit in the first bytes of the system prompt, resent with the whole history: nothing is
    // reused, and the edited prompt goes upstream.
    let edited_system = json!({"role": "system", "content": rules.replacen("Answer", "ANSWER", 1)});
    let mut history = edited.to_vec();
    history[0] = edited_system;
    history.extend([user("u4"), a4, user("u5")]);
    send(&gateway, &history).await;
    let metrics = gateway.metrics().await;
    assert_eq!(messages_read(&metrics, "reused"), 9, "nothing of an edited opening is reused: {metrics}");
    let upstream_system = fake.last()["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(upstream_system.contains("ANSWER in one line."), "the edited prompt went upstream");
    assert_all_valid(&fake, Api::OpenAi);
}

#[tokio::test]
async fn a_retried_turn_adds_nothing() {
    let fake = FakeUpstream::start().await;
    fake.script([
        Reply::Text("a1".into()),
        Reply::Error(500, r#"{"error":{"message":"boom","type":"server_error"}}"#.into()),
        Reply::Text("a2".into()),
        Reply::Text("a2, second try".into()),
    ]);
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let a1 = send(&gateway, &[user("u1")]).await;
    let history = [user("u1"), a1, user("u2")];
    // The first attempt fails upstream: the client retries the same request.
    let (status, _) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    assert_eq!(status, 500);
    send(&gateway, &history).await;
    let expected = pairs(&[("user", "u1"), ("assistant", "a1"), ("user", "u2")]);
    assert_eq!(conversation(&fake.last()), expected);
    // The answer is lost on the way back: the client retries again; the unseen answer is dropped.
    send(&gateway, &history).await;
    assert_eq!(conversation(&fake.last()), expected, "the unseen answer is not sent back upstream");
    let roles: Vec<String> =
        gateway.entries().await.iter().map(|e| e["role"].as_str().unwrap().to_owned()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"], "each turn is journaled once");
    assert_all_valid(&fake, Api::OpenAi);
}

#[tokio::test]
async fn a_dated_system_prompt_is_accepted_and_its_date_sent_below_the_cache_boundary() {
    let fake = FakeUpstream::start().await;
    fake.script(["a1", "a2"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let system = |date: &str| json!({"role": "system", "content": format!("You are a helpful assistant.\nToday's date is {date}.\nCurrent time: 09:41\nAnswer briefly.")});
    let (status, answer) =
        gateway.post_json(CHAT, &json!({"messages": [system("2026-11-30"), user("Hi")]}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    let first = fake.last();
    let prefix = first["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(prefix.contains("You are a helpful assistant.\nAnswer briefly."), "{prefix}");
    assert!(!prefix.contains("2026"), "the date is not in the cached prefix: {prefix}");
    let tail = first["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(
        tail.starts_with("Today's date is 2026-11-30.\nCurrent time: 09:41\n\nStatus: Context: "),
        "{tail}"
    );
    let reply = answer["choices"][0]["message"].clone();
    // The next day: only the line below the cache boundary changes.
    send(&gateway, &[system("2026-12-01"), user("Hi"), reply, user("And now?")]).await;
    let second = fake.last();
    assert_eq!(second["messages"][0], first["messages"][0], "the stable prefix is byte-identical");
    let tail = second["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(tail.starts_with("Today's date is 2026-12-01."), "{tail}");
    let inspect = gateway.get_json("/strata/v1/inspect?limit=1").await;
    assert_eq!(inspect["requests"][0]["rounds"][0]["churn"], "none", "{inspect}");
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("strata_gateway_volatile_system_requests_total{kind=\"current date\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn anthropic_edits_and_parallel_tool_calls_stay_protocol_valid() {
    let fake = FakeUpstream::start().await;
    fake.script([
        Reply::Calls(
            "checking".into(),
            vec![call("toolu_1", "ls", json!({})), call("toolu_2", "cat", json!({}))],
        ),
        Reply::Text("done".into()),
        Reply::Text("done, edited".into()),
    ]);
    let gateway = Harness::start(&fake, Provider::Anthropic, |_| {}).await;
    let text = |role: &str, text: &str| json!({"role": role, "content": [{"type": "text", "text": text}]});
    let opening = text("user", "List and read");
    let (status, answer) = gateway
        .post_json(MESSAGES, &json!({"model": "m", "max_tokens": 100, "messages": [opening]}), &[])
        .await;
    assert_eq!(status, 200, "{answer}");
    let called = json!({"role": "assistant", "content": answer["content"]});
    let results = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "hello"}
    ]});
    let history = json!([opening, called, results]);
    let (status, _) = gateway
        .post_json(MESSAGES, &json!({"model": "m", "max_tokens": 100, "messages": history}), &[])
        .await;
    assert_eq!(status, 200);
    // The client edits its opening message.
    let edited = json!([text("user", "Only list")]);
    let (status, _) =
        gateway.post_json(MESSAGES, &json!({"model": "m", "max_tokens": 100, "messages": edited}), &[]).await;
    assert_eq!(status, 200);
    let last = fake.last();
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "only the edited conversation goes upstream: {last}");
    assert!(messages[0]["content"][0]["text"].as_str().unwrap().ends_with("Only list"), "{last}");
    assert_all_valid(&fake, Api::Anthropic);
}

/// A stateful client that resends a turn with its `Idempotency-Key` (its answer was cut off on the
/// way) gets the turn journaled once: the upstream sees the turn once and never the lost answer.
/// The same key with other messages is refused with a 422 in the provider's shape, and journals
/// nothing.
#[tokio::test]
async fn a_stateful_turn_resent_with_its_idempotency_key_is_journaled_once() {
    let fake = FakeUpstream::start().await;
    fake.script(["a.txt and b.txt", "lost on the way", "a.txt says hello"].map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let keyed = |key| [("x-strata-session", "main"), ("idempotency-key", key)];
    let turn = |text| json!({"messages": [user(text)]});
    let (status, _) = gateway.post_json(CHAT, &turn("List the files"), &keyed("turn-1")).await;
    assert_eq!(status, 200);
    let (status, _) = gateway.post_json(CHAT, &turn("Now read a.txt"), &keyed("turn-2")).await;
    assert_eq!(status, 200);
    let (status, answer) = gateway.post_json(CHAT, &turn("Now read a.txt"), &keyed("turn-2")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "a.txt says hello");
    assert_eq!(
        conversation(&fake.last()),
        pairs(&[("user", "List the files"), ("assistant", "a.txt and b.txt"), ("user", "Now read a.txt")])
    );
    let (status, refused) = gateway.post_json(CHAT, &turn("Delete a.txt"), &keyed("turn-2")).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"]["type"], "invalid_request_error");
    assert!(refused["error"]["message"].as_str().unwrap().contains("send a fresh key"), "{refused}");
    let entries = gateway.entries().await;
    assert_eq!(entries.len(), 4, "two turns and their answers, nothing twice: {entries:?}");
    assert_eq!(fake.seen().len(), 3, "the refused request never went upstream");
    assert_all_valid(&fake, Api::OpenAi);
}

/// A gateway whose compaction keeps none of the client's turns (`keepRecentEntries: 0`), after three
/// turns answered "a0" to "a2" and compacted over HTTP; the upstream answers `then` afterwards.
/// Returns the gateway and the client's history.
async fn summarised_conversation<const N: usize>(
    fake: &FakeUpstream,
    then: [&str; N],
) -> (Harness, Vec<Value>) {
    fake.script(["a0", "a1", "a2"].into_iter().chain(then).map(|t| Reply::Text(t.into())));
    let gateway = Harness::start(fake, Provider::OpenAI, |config| {
        config.policy.compaction.keep_recent_entries = 0;
    })
    .await;
    let mut history = Vec::new();
    for step in 0..3 {
        history.push(user(&format!("Step {step}: decided to keep the API stable.")));
        let answer = send(&gateway, &history).await;
        history.push(answer);
    }
    let (status, record) = gateway.post_json("/strata/v1/compact", &json!({}), &[]).await;
    assert_eq!(status, 200, "{record}");
    (gateway, history)
}

/// A compaction that keeps none of the client's turns (`keepRecentEntries: 0`) leaves the summary
/// alone in the journal. The client's next request resends the history the summary covers and
/// extends the journal after it: upstream gets the summary and the new turn, not the old turns
/// again, and nothing is rewound. Before, the request was taken for a new conversation, which
/// dropped the summary and journaled the whole history again.
#[tokio::test]
async fn a_history_a_compaction_summarised_whole_is_not_journaled_again() {
    let fake = FakeUpstream::start().await;
    let (gateway, mut history) = summarised_conversation(&fake, ["a3", "a4"]).await;
    let generation = gateway.get_json("/strata/v1/status").await["generation"].clone();
    let compacted = gateway.entries().await;
    let is_summary = |entry: &Value| entry["id"].as_str().unwrap().starts_with("summary_");
    assert!(is_summary(&compacted[0]), "{compacted:?}");
    assert!(
        compacted.iter().all(|entry| entry["role"] != "assistant"),
        "every answer was summarised: {compacted:?}"
    );

    history.push(user("Step 3: and now?"));
    let answer = send(&gateway, &history).await;
    let upstream = conversation(&fake.last());
    assert_eq!(upstream.last(), Some(&("user".to_owned(), "Step 3: and now?".to_owned())));
    assert!(
        upstream.iter().all(|(_, text)| !text.starts_with("Step 0") && !text.starts_with("Step 2")),
        "the summarised turns are not sent again: {upstream:?}"
    );
    let entries = gateway.entries().await;
    assert_eq!(entries.len(), compacted.len() + 2, "the new turn and its answer: {entries:?}");
    assert!(is_summary(&entries[0]), "the summary stays: {entries:?}");
    assert_eq!(gateway.get_json("/strata/v1/status").await["generation"], generation, "no rewind");

    // The conversation goes on from there, its reused messages taken from the memo.
    history.push(answer);
    history.push(user("Step 4: thanks"));
    send(&gateway, &history).await;
    assert_eq!(gateway.entries().await.len(), compacted.len() + 4);
    assert_all_valid(&fake, Api::OpenAi);
    let metrics = gateway.metrics().await;
    assert!(!metrics.contains("strata_gateway_transparent_rewinds_total{"), "{metrics}");
    assert!(messages_read(&metrics, "reused") > 0, "{metrics}");
}

/// After the same compaction, a client that edits a summarised turn sends its own conversation:
/// it goes upstream as sent, never spliced onto a summary of turns it no longer has. The memo
/// had taken the unchanged turns before the edit for journaled and sent them without their
/// content; the engine, whose journal no longer holds them, asks for the whole history, and the
/// gateway reads the request again (its only path to that re-read over HTTP).
#[tokio::test]
async fn an_edit_of_a_summarised_turn_goes_upstream_as_the_clients_own_conversation() {
    let fake = FakeUpstream::start().await;
    let (gateway, mut history) = summarised_conversation(&fake, ["a1 again"]).await;
    let parsed_before = messages_read(&gateway.metrics().await, "parsed");

    history.truncate(2);
    history.push(user("Step 1, edited: make the API versioned."));
    send(&gateway, &history).await;
    assert_eq!(
        conversation(&fake.last()),
        pairs(&[
            ("user", "Step 0: decided to keep the API stable."),
            ("assistant", "a0"),
            ("user", "Step 1, edited: make the API versioned.")
        ]),
        "the client's conversation, whole and without the summary"
    );
    let roles: Vec<String> =
        gateway.entries().await.iter().map(|e| e["role"].as_str().unwrap().to_owned()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant"],
        "the journal holds the client's conversation"
    );
    assert_all_valid(&fake, Api::OpenAi);
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("strata_gateway_transparent_rewinds_total{cause=\"new_conversation\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        messages_read(&metrics, "parsed") - parsed_before,
        3,
        "the request was read again whole, every message parsed: {metrics}"
    );
}
