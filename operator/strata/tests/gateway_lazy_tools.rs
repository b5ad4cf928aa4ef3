//! Lazy tool schemas, delegation digests and the max_tokens clamp through the real gateway over
//! HTTP, OpenAI and Anthropic: over the tools budget, unused tools go out as one-line summaries in
//! a fixed order; a call of a summarised tool gets its schema delivered in the history and is
//! retried once, invisibly to the client (streamed too, while nothing of the round was forwarded); `strata_load_tools` is answered by the gateway; a delegate's result reaches the model as
//! a digest; a max_tokens above the output reserve is lowered and reported.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use gateway_support::{FakeUpstream, Harness, Reply, call};
use serde_json::{Value, json};
use strata_api::agent::Provider;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const SUMMARY_MARKER: &str = "schema summarised";

/// 30 connector tools of about 200 tokens each, in the Anthropic/MCP shape.
fn tools() -> Vec<Value> {
    let mut tools = Vec::new();
    for server in ["github", "jira", "slack", "postgres", "kubernetes"] {
        for action in
            ["create_record", "list_records", "update_record", "delete_record", "deploy_service", "read_logs"]
        {
            let name = format!("{server}_{action}");
            tools.push(json!({
                "name": name,
                "description": format!(
                    "{action} on {server}. {}",
                    "Acts with the connector's credentials within the granted projects and returns JSON. ".repeat(4)
                ),
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "project": {"type": "string", "description": format!("The {server} project.")},
                        "id": {"type": "string", "description": "Identifier of the record."},
                        "body": {"type": "string", "description": "Content to write."}
                    },
                    "required": ["project"]
                }
            }));
        }
    }
    tools
}

fn openai_tools() -> Vec<Value> {
    tools()
        .into_iter()
        .map(|tool| {
            json!({"type": "function", "function": {
                "name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]
            }})
        })
        .collect()
}

/// (name, description) of every tool sent upstream, in order.
fn sent_tools(body: &Value) -> Vec<(String, String)> {
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| {
            let function = tool.get("function").unwrap_or(tool);
            (
                function["name"].as_str().unwrap().to_owned(),
                function["description"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn is_summarised(body: &Value, name: &str) -> bool {
    sent_tools(body).iter().any(|(tool, description)| tool == name && description.contains(SUMMARY_MARKER))
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(line_start))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

fn lazy_policy(config: &mut strata_api::gateway_config::GatewayConfig) {
    config.policy.budget.stages.tools_tokens = 2_000;
    config.policy.capabilities.full_schema_tools = 2;
}

#[tokio::test]
async fn openai_a_summarised_tool_call_is_retried_once_with_its_schema() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, lazy_policy).await;
    let deploy = call("c1", "kubernetes_deploy_service", json!({"project": "web"}));
    fake.script([
        Reply::Calls(String::new(), vec![deploy.clone()]),
        Reply::Calls(String::new(), vec![deploy]),
    ]);
    let request = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "open a github record for the outage"}],
        "tools": openai_tools(),
    });
    let (status, answer) = gateway.post_json(CHAT, &request, &[]).await;
    assert_eq!(status, 200, "{answer}");
    let calls = answer["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "the client sees one answer: {answer}");
    assert_eq!(calls[0]["function"]["name"], "kubernetes_deploy_service");

    let seen = fake.seen();
    assert_eq!(seen.len(), 2, "one retry");
    let (first, second) = (&seen[0].body, &seen[1].body);
    // The ranking gave the GitHub tools their schema; the rest went out summarised.
    assert!(!is_summarised(first, "github_create_record"));
    assert!(is_summarised(first, "kubernetes_deploy_service"));
    assert!(is_summarised(first, "slack_read_logs"));
    assert!(sent_tools(first).iter().any(|(name, _)| name == "strata_load_tools"));
    // The retry carries the called tool's full schema in the history; the tool block (and so the
    // cached prompt) did not change.
    assert_eq!(first["tools"], second["tools"]);
    let history = second["messages"].to_string();
    assert!(history.contains("Full schemas of kubernetes_deploy_service"), "{history}");
    assert!(history.contains(r#"\"required\":[\"project\"]"#), "{history}");
    let client_bytes = |body: &Value| -> usize {
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|tool| !tool["function"]["name"].as_str().unwrap().starts_with("strata_"))
            .map(|tool| tool.to_string().len())
            .sum()
    };
    assert!(
        client_bytes(first) * 2 < client_bytes(&json!({"tools": openai_tools()})),
        "summaries are much smaller"
    );

    // The next turn sends the same tool block: it changes only in batches.
    fake.script([Reply::Text("deployed".into())]);
    let follow = json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "open a github record for the outage"},
            answer["choices"][0]["message"].clone(),
            {"role": "tool", "tool_call_id": "c1", "content": "deployment started"}
        ],
        "tools": openai_tools(),
    });
    let (status, _) = gateway.post_json(CHAT, &follow, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(fake.last()["tools"], first["tools"]);

    let metrics = gateway.metrics().await;
    assert_eq!(metric(&metrics, "strata_gateway_tool_schema_retries_total"), 1.0, "{metrics}");
    assert_eq!(
        metric(&metrics, "strata_gateway_tool_schemas_loaded_total{trigger=\"summarised_call\"}"),
        1.0
    );
    assert!(metric(&metrics, "strata_gateway_tool_schemas{form=\"summarised\"}") >= 20.0);
    let inspect = gateway.get_json("/strata/v1/inspect").await;
    // Newest first: the retried request is the older one, with its dropped round first.
    let rounds = inspect["requests"][1]["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    assert_eq!(rounds[0]["schemaRetry"], json!(["kubernetes_deploy_service"]), "{inspect}");
}

#[tokio::test]
async fn anthropic_load_tools_and_a_summarised_call_are_handled_by_the_gateway() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::Anthropic, lazy_policy).await;
    fake.script([
        Reply::Calls(
            String::new(),
            vec![call("l1", "strata_load_tools", json!({"names": ["slack_read_logs"]}))],
        ),
        Reply::Calls(String::new(), vec![call("c2", "jira_delete_record", json!({"project": "ops"}))]),
        Reply::Calls(String::new(), vec![call("c2", "jira_delete_record", json!({"project": "ops"}))]),
    ]);
    let request = json!({
        "model": "m",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "check the postgres logs"}],
        "tools": tools(),
    });
    let (status, answer) = gateway.post_json(MESSAGES, &request, &[]).await;
    assert_eq!(status, 200, "{answer}");
    let blocks = answer["content"].as_array().unwrap();
    let names: Vec<&str> = blocks.iter().filter_map(|block| block["name"].as_str()).collect();
    assert_eq!(names, ["jira_delete_record"], "memory tool and retry hidden: {answer}");
    let seen = fake.seen();
    assert_eq!(seen.len(), 3);
    assert!(is_summarised(&seen[0].body, "slack_read_logs"));
    assert_eq!(seen[0].body["tools"], seen[1].body["tools"], "the tool block stays put");
    assert_eq!(seen[1].body["tools"], seen[2].body["tools"]);
    let loaded = seen[1].body["messages"].to_string();
    assert!(loaded.contains("Full schemas of slack_read_logs"), "{loaded}");
    let retried = seen[2].body["messages"].to_string();
    assert!(retried.contains("Full schemas of jira_delete_record"), "the retry carries its schema");
    let metrics = gateway.metrics().await;
    assert_eq!(metric(&metrics, "strata_gateway_tool_schemas_loaded_total{trigger=\"load_tool\"}"), 1.0);
    assert_eq!(metric(&metrics, "strata_gateway_tool_schema_retries_total"), 1.0);
}

#[tokio::test]
async fn under_the_tools_budget_every_schema_is_sent_in_full() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    fake.script([Reply::Text("ok".into())]);
    let request =
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": openai_tools()[..3]});
    let (status, _) = gateway.post_json(CHAT, &request, &[]).await;
    assert_eq!(status, 200);
    let sent = sent_tools(&fake.last());
    assert!(sent.iter().all(|(_, description)| !description.contains(SUMMARY_MARKER)));
    assert!(!sent.iter().any(|(name, _)| name == "strata_load_tools"));
}

#[tokio::test]
async fn a_delegates_result_reaches_the_model_as_a_digest() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
        config.policy.delegation.return_tokens = 300;
    })
    .await;
    fake.script([Reply::Text("thanks".into())]);
    let report = format!(
        "Investigated the outage.\n{}Should we page the owner?\n",
        "- log line of the sub-agent's work\n".repeat(800)
    );
    let request = json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "investigate"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "task", "arguments": "{\"prompt\":\"investigate\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "t1", "content": report}
        ]
    });
    let (status, _) = gateway.post_json(CHAT, &request, &[]).await;
    assert_eq!(status, 200);
    let sent = fake.last()["messages"].to_string();
    assert!(sent.contains("delegation digest of task: extractive"), "{sent}");
    assert!(sent.contains("Should we page the owner?"));
    assert!(sent.matches("log line of the sub-agent").count() < 40, "the transcript stays out");
    let metrics = gateway.metrics().await;
    assert_eq!(metric(&metrics, "strata_gateway_delegation_digests_total{source=\"extractive\"}"), 1.0);
}

#[tokio::test]
async fn max_tokens_above_the_reserve_is_clamped_and_reported() {
    for provider in [Provider::OpenAI, Provider::Anthropic] {
        let fake = FakeUpstream::start().await;
        let gateway = Harness::start(&fake, provider, |_| {}).await;
        fake.script([Reply::Text("ok".into())]);
        let path = if provider == Provider::Anthropic { MESSAGES } else { CHAT };
        let request =
            json!({"model": "m", "max_tokens": 100_000, "messages": [{"role": "user", "content": "hi"}]});
        let response = gateway.client.post(gateway.url(path)).json(&request).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let header = response.headers()["x-strata-max-tokens-clamped"].to_str().unwrap().to_owned();
        assert_eq!(header, "requested=100000, applied=8192");
        assert_eq!(fake.last()["max_tokens"], 8_192, "{provider:?}");
        let metrics = gateway.metrics().await;
        assert_eq!(metric(&metrics, "strata_gateway_max_tokens_clamped_total"), 1.0);
        let inspect = gateway.get_json("/strata/v1/inspect").await;
        let round = &inspect["requests"][0]["rounds"][0];
        assert_eq!(round["maxTokensClamp"], json!({"requested": 100_000, "applied": 8_192}));
        let stages: Vec<&str> =
            round["stages"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap()).collect();
        assert_eq!(stages, ["output_reserve", "system", "tools", "memory", "tool_results", "history"]);
    }
}

/// The SSE `data:` payloads of a stream, `[DONE]` left out.
fn stream_events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

/// Streams the outage request with the OpenAI tool set; returns the client's stream as text.
async fn stream_outage_request(gateway: &Harness) -> String {
    let request = json!({
        "model": "m",
        "stream": true,
        "messages": [{"role": "user", "content": "open a github record for the outage"}],
        "tools": openai_tools(),
    });
    let (status, text) = gateway.post(CHAT, &request, &[]).await;
    assert_eq!(status, 200, "{text}");
    text
}

#[tokio::test]
async fn openai_a_streamed_summarised_call_is_retried_before_the_client_sees_it() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, lazy_policy).await;
    let first = call("c1", "kubernetes_deploy_service", json!({"project": "draft"}));
    let repeated = call("c1", "kubernetes_deploy_service", json!({"project": "web"}));
    fake.script([Reply::Calls(String::new(), vec![first]), Reply::Calls(String::new(), vec![repeated])]);
    let text = stream_outage_request(&gateway).await;
    let events = stream_events(&text);
    let calls: Vec<&Value> = events
        .iter()
        .filter_map(|event| event["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    let names: Vec<&str> = calls.iter().filter_map(|c| c["function"]["name"].as_str()).collect();
    assert_eq!(names, ["kubernetes_deploy_service"], "the client sees the repeated round only: {text}");
    let arguments: String = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
    assert_eq!(arguments, json!({"project": "web"}).to_string(), "{text}");
    let roles = events.iter().filter(|event| event["choices"][0]["delta"]["role"].is_string()).count();
    assert_eq!(roles, 1, "one role delta: {text}");
    let finishes: Vec<&Value> = events
        .iter()
        .map(|event| &event["choices"][0]["finish_reason"])
        .filter(|reason| !reason.is_null())
        .collect();
    assert_eq!(finishes, [&json!("tool_calls")], "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");

    let seen = fake.seen();
    assert_eq!(seen.len(), 2, "one retry");
    assert_eq!(seen[0].body["tools"], seen[1].body["tools"], "the tool block stays put");
    let history = seen[1].body["messages"].to_string();
    assert!(history.contains("Full schemas of kubernetes_deploy_service"), "{history}");
    let metrics = gateway.metrics().await;
    assert_eq!(metric(&metrics, "strata_gateway_tool_schema_retries_total"), 1.0, "{metrics}");
}

#[tokio::test]
async fn openai_a_streamed_round_the_client_already_saw_text_of_is_not_retried() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, lazy_policy).await;
    let deploy = call("c1", "kubernetes_deploy_service", json!({"project": "web"}));
    fake.script([Reply::Calls("Deploying now.".into(), vec![deploy])]);
    let text = stream_outage_request(&gateway).await;
    assert!(text.contains("kubernetes_deploy_service"), "the call is forwarded as made: {text}");
    assert_eq!(fake.seen().len(), 1, "text already streamed: no invisible retry is possible");
}

#[tokio::test]
async fn anthropic_a_streamed_summarised_call_is_retried_before_the_client_sees_it() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::Anthropic, lazy_policy).await;
    fake.script([
        Reply::Calls(String::new(), vec![call("c2", "jira_delete_record", json!({"project": "draft"}))]),
        Reply::Calls(String::new(), vec![call("c2", "jira_delete_record", json!({"project": "ops"}))]),
    ]);
    let request = json!({
        "model": "m",
        "max_tokens": 1024,
        "stream": true,
        "messages": [{"role": "user", "content": "check the postgres logs"}],
        "tools": tools(),
    });
    let (status, text) = gateway.post(MESSAGES, &request, &[]).await;
    assert_eq!(status, 200, "{text}");
    let events = stream_events(&text);
    let kinds: Vec<&str> = events.iter().filter_map(|event| event["type"].as_str()).collect();
    assert_eq!(kinds.iter().filter(|kind| **kind == "message_start").count(), 1, "{text}");
    assert_eq!(kinds.iter().filter(|kind| **kind == "content_block_start").count(), 1, "{text}");
    assert_eq!(kinds.iter().filter(|kind| **kind == "message_delta").count(), 1, "{text}");
    let input: String = events.iter().filter_map(|event| event["delta"]["partial_json"].as_str()).collect();
    assert_eq!(input, json!({"project": "ops"}).to_string(), "the repeated round's input: {text}");
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    let retried = seen[1].body["messages"].to_string();
    assert!(retried.contains("Full schemas of jira_delete_record"), "{retried}");
}
