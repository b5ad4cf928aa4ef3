//! Read-back-aware replay on a small hand-written session: the agent quotes a line from a tool
//! output that Strata elided rounds earlier, so an agent behind Strata would have had to read it back.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use strata_core::replay::readback::AnchorKind;
use strata_core::replay::{InputFormat, PolicyKind, ReplayOptions, parse_transcript, replay_session};
use strata_core::tokens::{TokenCounter, TokenizerKind};

/// The line the agent quotes, far past the head that elision keeps.
const QUOTED: &str = "FAILED tests/test_ledger.py::test_rounding_half_even - AssertionError: 0.125 != 0.13";

fn session(quote_at_the_end: bool) -> String {
    let mut log = String::new();
    for line in 0..120 {
        log.push_str(&format!("tests/test_ledger.py::test_case_{line:03} PASSED\n"));
    }
    log.push_str(QUOTED);
    log.push('\n');
    let mut messages: Vec<Value> = vec![
        json!({"role": "system", "content": "You are a careful coding agent."}),
        json!({"role": "user", "content": "Run the ledger tests and fix what fails."}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"pytest\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_0", "content": log}),
    ];
    // Eleven more rounds of small, unrelated work: the long test log becomes old enough to elide,
    // and more than ten newer observations push it out of observation masking's window.
    for round in 1..=11 {
        messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": format!("call_{round}"), "type": "function",
             "function": {"name": "bash", "arguments": format!("{{\"cmd\": \"ls src/part{round}\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{round}"), "content": format!("mod_{round}.py")}));
    }
    let last = if quote_at_the_end {
        format!("The failing test is:\n{QUOTED}\nI will switch the rounding mode to half-up.")
    } else {
        "I will switch the rounding mode to half-up.".to_owned()
    };
    messages.push(json!({"role": "assistant", "content": last}));
    json!({"messages": messages}).to_string()
}

#[test]
fn a_quoted_line_of_an_elided_output_costs_exactly_one_read_back() {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let options = ReplayOptions::default();
    let transcript = parse_transcript("quoted.json", &session(true), InputFormat::OpenAiMessages).unwrap();
    let report = replay_session(&transcript, &options, &counter).unwrap();
    let strata = report.policies.iter().find(|p| p.policy == PolicyKind::Strata).unwrap();
    assert!(strata.elisions >= 1, "the long log is elided before the last call: {strata:?}");
    assert_eq!(strata.read_backs.uses_detected, 1, "{:?}", strata.read_back_examples);
    assert_eq!(strata.read_backs.read_backs, 1, "charged exactly once");
    assert_eq!(strata.read_backs.unrecoverable, 0, "the elided log is behind a data_ref");
    let example = &strata.read_back_examples[0];
    assert_eq!(example.call + 1, transcript.calls.len(), "the last call quotes it");
    assert_eq!(example.evidence.kind, AnchorKind::QuotedLine);
    assert_eq!(example.evidence.text, QUOTED);
    assert!(strata.read_backs.cost_units > 0.0);
    assert!(strata.units_with_read_backs() > strata.totals().units);

    // Naive keeps everything in context, so the quote is no evidence of a read-back.
    let naive = report.policies.iter().find(|p| p.policy == PolicyKind::Naive).unwrap();
    assert_eq!(naive.read_backs.uses_detected, 0);
    // Observation masking dropped the log for good: the use is counted, and it cannot be recovered.
    let masking = report.policies.iter().find(|p| p.policy == PolicyKind::ObservationMasking).unwrap();
    assert_eq!(masking.read_backs.uses_detected, 1);
    assert_eq!(masking.read_backs.unrecoverable, 1);
    assert_eq!(masking.read_backs.read_backs, 0);
    // seed-002 elides it too, behind a reference: one read-back.
    let seed002 = report.policies.iter().find(|p| p.policy == PolicyKind::Seed002).unwrap();
    assert_eq!((seed002.read_backs.read_backs, seed002.read_backs.unrecoverable), (1, 0));
}

#[test]
fn without_the_quote_nothing_is_charged() {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let transcript = parse_transcript("plain.json", &session(false), InputFormat::OpenAiMessages).unwrap();
    let report = replay_session(&transcript, &ReplayOptions::default(), &counter).unwrap();
    for policy in &report.policies {
        assert_eq!(
            policy.read_backs.uses_detected, 0,
            "{:?}: {:?}",
            policy.policy, policy.read_back_examples
        );
        assert_eq!(policy.units_with_read_backs(), policy.totals().units);
    }
}
