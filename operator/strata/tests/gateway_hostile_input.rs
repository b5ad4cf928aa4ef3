//! Hostile request bodies (deep nesting, huge strings, wrong types, invalid UTF-8, unknown roles and
//! blocks, truncation) sent through the real gateway in front of a fake upstream: every answer is a
//! success or a 4xx in the provider's error shape, never a 5xx, and the gateway stays ready.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::collections::BTreeMap;

use gateway_support::{FakeUpstream, Harness};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};
use strata_api::agent::Provider;

/// Bodies sent per provider (quoted in RELIABILITY.md).
const CASES: u32 = 600;

const KEYS: [&str; 22] = [
    "role",
    "content",
    "messages",
    "type",
    "text",
    "tool_calls",
    "tool_call_id",
    "tool_use_id",
    "name",
    "id",
    "function",
    "arguments",
    "input",
    "tools",
    "stream",
    "system",
    "model",
    "n",
    "image_url",
    "source",
    "cache_control",
    "stream_options",
];

const ROLES: [&str; 9] =
    ["user", "assistant", "system", "tool", "developer", "function", "robot", "", "USER"];

const BLOCKS: [&str; 8] =
    ["text", "tool_use", "tool_result", "image", "image_url", "document", "thinking", "x"];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => (0..KEYS.len()).prop_map(|i| KEYS[i].to_owned()), 1 => ".{0,8}"]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,16}".prop_map(Value::from),
        (0..ROLES.len()).prop_map(|i| Value::from(ROLES[i])),
        (0..BLOCKS.len()).prop_map(|i| Value::from(BLOCKS[i])),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// A content block of a known or unknown type with random fields.
fn block() -> impl Strategy<Value = Value> {
    ((0..BLOCKS.len()), prop::collection::btree_map(key(), value(), 0..4)).prop_map(|(kind, fields)| {
        let mut block: Map<String, Value> = fields.into_iter().collect();
        block.insert("type".into(), BLOCKS[kind].into());
        Value::Object(block)
    })
}

/// A message with a known or unknown role and content of any shape.
fn message() -> impl Strategy<Value = Value> {
    let content = prop_oneof![
        ".{0,32}".prop_map(Value::from),
        prop::collection::vec(block(), 0..4).prop_map(Value::Array),
        value(),
    ];
    ((0..ROLES.len()), content, prop::collection::btree_map(key(), value(), 0..3)).prop_map(
        |(role, content, extra)| {
            let mut message: Map<String, Value> = extra.into_iter().collect();
            message.insert("role".into(), ROLES[role].into());
            message.insert("content".into(), content);
            Value::Object(message)
        },
    )
}

/// A valid body to mutate.
fn valid(text: &str) -> Value {
    json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": text}]})
}

fn nested(depth: usize, object: bool) -> String {
    let (open, close) = if object { ("{\"a\":", "}") } else { ("[", "]") };
    format!("{}1{}", open.repeat(depth), close.repeat(depth))
}

/// A hostile body and the kind it was made as.
fn hostile() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    prop_oneof![
        value().prop_map(|body| ("random_json", body.to_string().into_bytes())),
        (prop::collection::vec(message(), 0..5), prop::collection::btree_map(key(), value(), 0..4)).prop_map(
            |(messages, fields)| {
                let mut body: Map<String, Value> = fields.into_iter().collect();
                body.insert("messages".into(), Value::Array(messages));
                ("random_messages", Value::Object(body).to_string().into_bytes())
            }
        ),
        ((1usize..20_000), any::<bool>()).prop_map(|(depth, object)| {
            let body =
                format!("{{\"messages\":[{{\"role\":\"user\",\"content\":{}}}]}}", nested(depth, object));
            ("deep_nesting", body.into_bytes())
        }),
        (prop_oneof![Just(64 * 1024), Just(900 * 1024), Just(1_200 * 1024)], any::<bool>()).prop_map(
            |(length, as_key)| {
                let huge = "\u{e9}x".repeat(length / 3);
                let body = if as_key {
                    json!({"messages": [{"role": "user", "content": "hi", huge: 1}]})
                } else {
                    valid(&huge)
                };
                ("huge_string", body.to_string().into_bytes())
            }
        ),
        (".{0,16}", any::<prop::sample::Index>(), prop::collection::vec(0x80u8..=0xff, 1..4)).prop_map(
            |(text, at, bytes)| {
                let mut body = valid(&text).to_string().into_bytes();
                let at = at.index(body.len());
                body.splice(at..at, bytes);
                ("invalid_utf8", body)
            }
        ),
        (".{0,16}", any::<prop::sample::Index>()).prop_map(|(text, at)| {
            let body = valid(&text).to_string().into_bytes();
            let keep = at.index(body.len());
            ("truncated", body[..keep].to_vec())
        }),
        (key(), value()).prop_map(|(field, wrong)| {
            let mut body = valid("hi");
            body[field] = wrong;
            ("wrong_type", body.to_string().into_bytes())
        }),
    ]
}

fn assert_error_shape(provider: Provider, status: u16, text: &str) {
    let body: Value =
        serde_json::from_str(text).unwrap_or_else(|_| panic!("{status}: error is not JSON: {text}"));
    match provider {
        Provider::Anthropic => {
            assert_eq!(body["type"], "error", "{text}");
            assert!(body["error"]["type"].is_string() && body["error"]["message"].is_string(), "{text}");
        }
        _ => assert!(body["error"]["type"].is_string() && body["error"]["message"].is_string(), "{text}"),
    }
}

fn run(provider: Provider, path: &'static str) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (fake, gateway) = runtime.block_on(async {
        let fake = FakeUpstream::start().await;
        let gateway = Harness::start(&fake, provider, |_| {}).await;
        (fake, gateway)
    });
    let statuses: std::cell::RefCell<BTreeMap<(&'static str, u16), u32>> = Default::default();
    let mut runner = TestRunner::new(Config { cases: CASES, failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&hostile(), |(kind, body)| {
        let (status, text) = runtime.block_on(async {
            let response = gateway
                .client
                .post(gateway.url(path))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        });
        *statuses.borrow_mut().entry((kind, status)).or_default() += 1;
        prop_assert!(status < 500, "{kind}: {status} {text}");
        if status >= 400 {
            assert_error_shape(provider, status, &text);
        }
        Ok(())
    });
    let statuses = statuses.into_inner();
    let total: u32 = statuses.values().sum();
    eprintln!("hostile input on {path}: {total} bodies sent; by kind and status: {statuses:?}");
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    runtime.block_on(async {
        let ready = gateway.client.get(gateway.url("/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 200, "the gateway stays ready");
        let (status, answer) = gateway.post(path, &valid("still there?"), &[]).await;
        assert_eq!(status, 200, "{answer}");
        drop(fake);
    });
    assert!(statuses.keys().any(|(_, status)| (400..500).contains(status)), "hostile bodies were refused");
}

#[test]
fn hostile_openai_bodies_get_a_4xx_in_openai_shape_never_a_5xx() {
    run(Provider::OpenAI, "/v1/chat/completions");
}

#[test]
fn hostile_anthropic_bodies_get_a_4xx_in_anthropic_shape_never_a_5xx() {
    run(Provider::Anthropic, "/v1/messages");
}

/// A body over the limit is read and discarded before the 413, so a client still sending reads the
/// refusal in its provider's shape, never a broken pipe or a reset (a declared length and a chunked
/// body both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_gets_its_413_not_a_broken_connection() {
    let fake = FakeUpstream::start().await;
    let gateway =
        Harness::start_with(&fake, Provider::OpenAI, |_| {}, |args| args.max_body_bytes = 64 * 1024).await;
    let oversized = vec![b' '; 4 * 1024 * 1024];
    for attempt in 0..10 {
        let declared = gateway
            .client
            .post(gateway.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(oversized.clone())
            .send()
            .await
            .unwrap_or_else(|error| panic!("attempt {attempt}, declared length: {error:?}"));
        assert_eq!(declared.status(), 413);
        assert_error_shape(Provider::OpenAI, 413, &declared.text().await.unwrap());
        let chunks = oversized
            .chunks(256 * 1024)
            .map(|chunk| Ok::<_, std::io::Error>(chunk.to_vec()))
            .collect::<Vec<_>>();
        let chunked = gateway
            .client
            .post(gateway.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
            .send()
            .await
            .unwrap_or_else(|error| panic!("attempt {attempt}, chunked: {error:?}"));
        assert_eq!(chunked.status(), 413);
    }
}
