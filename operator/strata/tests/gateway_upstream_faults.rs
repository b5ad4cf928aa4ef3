//! Upstream faults (connection refused, reset mid-body, truncated and malformed SSE, non-JSON 200s,
//! 429 with Retry-After, 5xx, oversized answers) for both providers, streamed and not: the client
//! gets an error in its provider's shape, the journal holds no half turn, and the retry succeeds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::collections::BTreeMap;

use gateway_support::{FakeUpstream, Harness, RawReply, Reply, sse_events};
use serde_json::{Value, json};
use strata_api::agent::Provider;

/// How a fault shows to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// An error of the gateway's own, in the provider's shape, with this status (non-streamed) or
    /// as the stream's last event (streamed, after a 200), its message containing the text.
    Gateway(u16, &'static str),
    /// The upstream's status, body and `retry-after` passed through unchanged.
    PassThrough(u16),
}

struct Fault {
    kind: &'static str,
    reply: Reply,
    expect: Expect,
}

fn raw(status: u16, content_type: &str, body: &str, reset: bool) -> Reply {
    Reply::Raw(RawReply {
        status,
        headers: vec![("content-type".into(), content_type.into())],
        body: body.into(),
        reset_after_body: reset,
    })
}

fn provider_error(provider: Provider, kind: &str, message: &str) -> String {
    match provider {
        Provider::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
        _ => json!({"error": {"message": message, "type": kind, "code": kind}}),
    }
    .to_string()
}

/// A stream that starts well (role or message start, some text) and then stops.
fn partial_stream(provider: Provider) -> String {
    match provider {
        Provider::Anthropic => concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",",
            "\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"half an ans\"}}\n\n",
        )
        .to_owned(),
        _ => concat!(
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half an ans\"},\"finish_reason\":null}]}\n\n",
        )
        .to_owned(),
    }
}

fn faults(provider: Provider, stream: bool) -> Vec<Fault> {
    let partial = partial_stream(provider);
    let partial_json =
        r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"half"#;
    let mut rate_limited = RawReply {
        status: 429,
        headers: vec![("content-type".into(), "application/json".into()), ("retry-after".into(), "7".into())],
        body: provider_error(provider, "rate_limit_error", "Rate limit reached"),
        reset_after_body: false,
    };
    if provider == Provider::Anthropic {
        rate_limited.headers.push(("anthropic-ratelimit-requests-remaining".into(), "0".into()));
    } else {
        rate_limited.headers.push(("x-ratelimit-remaining-requests".into(), "0".into()));
    }
    let cut =
        if stream { (partial.as_str(), "text/event-stream") } else { (partial_json, "application/json") };
    let not_complete = if stream { "ended before the answer was complete" } else { "not JSON" };
    vec![
        Fault {
            kind: "reset_mid_body",
            reply: raw(200, cut.1, cut.0, true),
            expect: Expect::Gateway(502, ""),
        },
        Fault {
            kind: "truncated_body",
            reply: raw(200, cut.1, cut.0, false),
            expect: Expect::Gateway(502, not_complete),
        },
        Fault {
            kind: "malformed_sse",
            reply: raw(200, "text/event-stream", "data: {\"choices\": [oops\n\n", false),
            expect: Expect::Gateway(502, "not JSON"),
        },
        Fault {
            kind: "non_json_200",
            reply: raw(200, "text/html", "<html><body>502 Bad Gateway (proxy)</body></html>", false),
            expect: Expect::Gateway(
                502,
                if stream { "ended before the answer was complete" } else { "not JSON" },
            ),
        },
        Fault {
            kind: "status_429_retry_after",
            reply: Reply::Raw(rate_limited),
            expect: Expect::PassThrough(429),
        },
        Fault {
            kind: "status_500",
            reply: raw(
                500,
                "application/json",
                &provider_error(provider, "api_error", "Internal error"),
                false,
            ),
            expect: Expect::PassThrough(500),
        },
        Fault {
            kind: "status_503",
            reply: raw(
                503,
                "application/json",
                &provider_error(provider, "overloaded_error", "Overloaded"),
                false,
            ),
            expect: Expect::PassThrough(503),
        },
        Fault {
            kind: "oversized_answer",
            reply: raw(200, cut.1, &format!("{}{}", cut.0, " ".repeat(64 * 1024)), false),
            expect: Expect::Gateway(502, "exceeds the gateway's limit"),
        },
    ]
}

fn path(provider: Provider) -> &'static str {
    if provider == Provider::Anthropic { "/v1/messages" } else { "/v1/chat/completions" }
}

fn request(history: &[Value], stream: bool) -> Value {
    json!({"model": "m", "max_tokens": 64, "stream": stream, "messages": history})
}

/// Checks an error body's shape for `provider`; returns its message.
fn error_message(provider: Provider, body: &Value) -> String {
    let error = match provider {
        Provider::Anthropic => {
            assert_eq!(body["type"], "error", "{body}");
            &body["error"]
        }
        _ => &body["error"],
    };
    assert!(error["type"].is_string(), "{body}");
    error["message"].as_str().unwrap_or_else(|| panic!("no message: {body}")).to_owned()
}

/// Sends `history`, checks the fault's answer, and returns whether the client saw an error.
async fn send_faulted(gateway: &Harness, provider: Provider, stream: bool, history: &[Value], fault: &Fault) {
    let response = gateway
        .client
        .post(gateway.url(path(provider)))
        .json(&request(history, stream))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    match fault.expect {
        Expect::PassThrough(expected) => {
            assert_eq!(status, expected, "{}: {text}", fault.kind);
            let Reply::Raw(raw) = &fault.reply else { unreachable!() };
            assert_eq!(text, raw.body, "{}: the upstream's error body passes through", fault.kind);
            for (name, value) in &raw.headers {
                assert_eq!(
                    headers.get(name.as_str()).unwrap(),
                    value.as_str(),
                    "{}: header {name}",
                    fault.kind
                );
            }
            error_message(provider, &serde_json::from_str(&text).unwrap());
        }
        Expect::Gateway(expected, needle) => {
            let message = if stream && status == 200 {
                let events = sse_events(&text);
                let (name, data) = events.last().unwrap_or_else(|| panic!("{}: empty stream", fault.kind));
                if provider == Provider::Anthropic {
                    assert_eq!(name.as_deref(), Some("error"), "{}: {text}", fault.kind);
                }
                error_message(provider, &serde_json::from_str(data).unwrap())
            } else {
                assert_eq!(status, expected, "{}: {text}", fault.kind);
                error_message(provider, &serde_json::from_str(&text).unwrap())
            };
            assert!(message.contains(needle), "{}: {message}", fault.kind);
        }
    }
}

/// The journal's roles, in order.
async fn roles(gateway: &Harness) -> Vec<String> {
    gateway.entries().await.iter().map(|entry| entry["role"].as_str().unwrap().to_owned()).collect()
}

fn alternating(turns: usize) -> Vec<String> {
    (0..turns).map(|turn| if turn % 2 == 0 { "user".to_owned() } else { "assistant".to_owned() }).collect()
}

async fn run(provider: Provider, injected: &mut BTreeMap<String, u32>) {
    let fake = FakeUpstream::start().await;
    let gateway =
        Harness::start_with(&fake, provider, |_| {}, |args| args.max_upstream_response_bytes = 32 * 1024)
            .await;
    let mut history: Vec<Value> = Vec::new();
    for stream in [false, true] {
        for fault in faults(provider, stream) {
            history.push(json!({"role": "user", "content": format!("{} (stream {stream})", fault.kind)}));
            fake.script([fault.reply.clone()]);
            send_faulted(&gateway, provider, stream, &history, &fault).await;
            *injected
                .entry(format!("{}{}", fault.kind, if stream { " (streamed)" } else { "" }))
                .or_default() += 1;
            assert_eq!(roles(&gateway).await, alternating(history.len()), "{}: no half turn", fault.kind);

            let (status, answer) = gateway.post(path(provider), &request(&history, stream), &[]).await;
            assert_eq!(status, 200, "{}: the retry succeeds: {answer}", fault.kind);
            history.push(json!({"role": "assistant", "content": "ok"}));
            assert_eq!(
                roles(&gateway).await,
                alternating(history.len()),
                "{}: the retry journals once",
                fault.kind
            );
        }
    }
    let ready = gateway.client.get(gateway.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn upstream_faults_answer_in_the_providers_shape_and_leave_no_half_turn() {
    let mut injected = BTreeMap::new();
    for provider in [Provider::OpenAI, Provider::Anthropic] {
        run(provider, &mut injected).await;
    }
    let total: u32 = injected.values().sum();
    eprintln!("upstream faults injected: {total}; by kind: {injected:?}");
    assert_eq!(total, 32);
}

#[tokio::test]
async fn a_refused_connection_answers_502_in_the_providers_shape() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let fake = FakeUpstream::start().await;
    for provider in [Provider::OpenAI, Provider::Anthropic] {
        let gateway = Harness::start(&fake, provider, |config| {
            config.upstream.endpoint = format!("http://127.0.0.1:{port}/v1");
        })
        .await;
        for stream in [false, true] {
            let history = [json!({"role": "user", "content": "anyone there?"})];
            let (status, body) = gateway.post_json(path(provider), &request(&history, stream), &[]).await;
            assert_eq!(status, 502, "{body}");
            assert!(error_message(provider, &body).contains("could not be reached"), "{body}");
            assert_eq!(roles(&gateway).await, ["user"], "only the user's turn, once");
        }
    }
}

#[tokio::test]
async fn an_upstream_that_refuses_a_moment_is_reached_on_a_later_attempt() {
    // A socket bound but not listening refuses connections until `listen` is called.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = socket.local_addr().unwrap().port();
    let placeholder = FakeUpstream::start().await;
    let gateway = Harness::start(&placeholder, Provider::OpenAI, |config| {
        config.upstream.endpoint = format!("http://127.0.0.1:{port}/v1");
    })
    .await;
    let history = [json!({"role": "user", "content": "anyone there?"})];
    let body = request(&history, false);
    let sent = tokio::spawn(async move { gateway.post_json(path(Provider::OpenAI), &body, &[]).await });
    // The gateway's first attempt is refused; the upstream starts listening before its next one.
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let late = FakeUpstream::serve(socket.listen(64).unwrap());
    late.script([Reply::Text("here".into())]);
    let (status, answer) = sent.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(late.seen().len(), 1, "one model call reached the upstream");
    assert!(placeholder.seen().is_empty());
}
