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
    // The log (about 5,500 characters) must stay whole until it is old enough to elide: the default
    // spill threshold would spill it at once (the sweep test below covers that case).
    let mut options = ReplayOptions::default();
    options.strata.spill.max_result_chars = 8000;
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
    // The oracle knows the log is quoted later. Alone, a read-back looks cheaper than carrying the
    // log's 1,400 tokens through twelve calls; but spilled, the prompts fall under the 1024-token
    // caching minimum and every call is billed fresh. Its flip search prices both choices whole
    // and keeps the log: nothing to read back, and the same bill as naive.
    let oracle = report.policies.iter().find(|p| p.policy == PolicyKind::Oracle).unwrap();
    assert_eq!((oracle.spills, oracle.read_backs.uses_detected), (0, 0), "{:?}", oracle.read_back_examples);
    assert!((oracle.units_with_read_backs() - naive.units_with_read_backs()).abs() < 1e-9);
}

#[test]
fn the_oracle_spills_exactly_the_outputs_no_later_call_uses() {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let options = ReplayOptions::default();
    let unused = parse_transcript("plain.json", &session(false), InputFormat::OpenAiMessages).unwrap();
    let report = replay_session(&unused, &options, &counter).unwrap();
    let policy = |report: &strata_core::replay::SessionReport, kind: PolicyKind| {
        report.policies.iter().find(|p| p.policy == kind).cloned().unwrap()
    };
    let (oracle, naive) = (policy(&report, PolicyKind::Oracle), policy(&report, PolicyKind::Naive));
    // Nobody quotes the log: the oracle spills it when it arrives and pays no read-back for it.
    assert_eq!(oracle.spills, 1);
    assert_eq!(oracle.read_backs.uses_detected, 0);
    assert!(
        oracle.units_with_read_backs() < naive.units_with_read_backs(),
        "spilling an unused 5,500-character log must cost less than keeping it"
    );
    assert!(
        oracle.peak_context + 1000 < naive.peak_context,
        "oracle {} against naive {}",
        oracle.peak_context,
        naive.peak_context
    );

    // Quoted at the end: the oracle keeps it (see above), and it is never dearer than strata with
    // read-backs.
    let quoted = parse_transcript("quoted.json", &session(true), InputFormat::OpenAiMessages).unwrap();
    let report = replay_session(&quoted, &options, &counter).unwrap();
    let (oracle, strata) = (policy(&report, PolicyKind::Oracle), policy(&report, PolicyKind::Strata));
    assert_eq!((oracle.spills, oracle.read_backs.read_backs), (0, 0));
    assert_eq!(strata.read_backs.read_backs, 1, "strata spills the log and reads it back");
    assert!(oracle.units_with_read_backs() <= strata.units_with_read_backs());
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

#[test]
fn the_sweep_prices_every_point_with_its_read_backs_and_keeps_an_undominated_front() {
    use strata_core::replay::param_sweep::{Corpus, SweepGrid, naive_units, pareto_front, run_sweep};

    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let options = ReplayOptions::default();
    let transcript = parse_transcript("quoted.json", &session(true), InputFormat::OpenAiMessages).unwrap();
    let corpora = vec![Corpus { name: "hand-written".into(), transcripts: vec![transcript] }];
    // Spill the log at once (2000) or not (8000); elide it when old (2000) or never (100000).
    let grid = SweepGrid {
        max_result_chars: vec![2000, 8000],
        preview_chars: vec![1500],
        elide_after_rounds: vec![4],
        elide_over_chars: vec![2000, 100_000],
        elide_keep_chars: vec![800],
        deduplicate: vec![true, false],
        tool_treatments: Vec::new(),
    };
    let points = grid.points();
    assert_eq!(points.len(), 8);
    let naive = naive_units(&corpora, &options, &counter).unwrap();
    assert!(naive[0] > 0.0);
    let results = run_sweep(&points, &corpora, &naive, &options, &[], 2, &|_, _| {}).unwrap();
    assert_eq!(results.len(), points.len());
    for result in &results {
        let score = &result.total;
        let removes = result.point.max_result_chars == 2000 || result.point.elide_over_chars == 2000;
        // The quoted line is past the spill preview and past the elided head: whichever removed
        // the log is charged one read-back, and a point that keeps it whole is charged none.
        assert_eq!(score.read_backs, u64::from(removes), "{}: {score:?}", result.point.label());
        assert_eq!(score.uses, score.read_backs);
        assert_eq!(score.unrecoverable, 0);
        assert_eq!(score.read_back_units > 0.0, removes, "{}", result.point.label());
        let expected = (score.units + score.read_back_units) / naive[0];
        assert!((score.ratio_with_read_backs() - expected).abs() < 1e-12);
    }
    let front = pareto_front(&results);
    assert!(!front.is_empty());
    let key = |i: usize| (results[i].total.ratio_with_read_backs(), results[i].total.read_backs);
    let dominates = |a: (f64, u64), b: (f64, u64)| a.0 <= b.0 && a.1 <= b.1 && (a.0 < b.0 || a.1 < b.1);
    for &on in &front {
        assert!(
            (0..results.len()).all(|other| !dominates(key(other), key(on))),
            "front point {} is dominated",
            results[on].point.label()
        );
    }
    for off in (0..results.len()).filter(|i| !front.contains(i)) {
        assert!(
            front.iter().any(|&on| dominates(key(on), key(off)) || key(on) == key(off)),
            "{} is neither on the front nor dominated by it",
            results[off].point.label()
        );
    }
    // The cheapest point with no read-back is on the front: keeping the log whole is the only way
    // to zero read-backs here.
    assert!(front.iter().any(|&i| results[i].total.read_backs == 0));
}

#[test]
fn the_oracle_replaces_a_repeated_output_by_a_reference() {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let listing: String = (0..80).map(|n| format!("src/module_{n:02}.py\n")).collect();
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful coding agent."}),
        json!({"role": "user", "content": "List the sources twice."}),
    ];
    for round in 0..2 {
        messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": format!("call_{round}"), "type": "function",
             "function": {"name": "bash", "arguments": "{\"cmd\": \"ls src\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{round}"), "content": listing}));
    }
    // The last answer names a file only the listing holds: the first listing is used, and keeping
    // its 400 tokens for two calls costs less than a read-back, so the oracle keeps it whole. The
    // second, identical listing becomes a reference to it.
    messages.push(json!({"role": "assistant", "content": "I will edit src/module_42.py."}));
    let text = json!({"messages": messages}).to_string();
    let transcript = parse_transcript("repeat.json", &text, InputFormat::OpenAiMessages).unwrap();
    let report = replay_session(&transcript, &ReplayOptions::default(), &counter).unwrap();
    let oracle = report.policies.iter().find(|p| p.policy == PolicyKind::Oracle).unwrap();
    let naive = report.policies.iter().find(|p| p.policy == PolicyKind::Naive).unwrap();
    assert_eq!(oracle.deduplications, 1, "{oracle:?}");
    assert_eq!((oracle.spills, oracle.read_backs.uses_detected), (0, 0), "{:?}", oracle.read_back_examples);
    assert!(
        oracle.peak_context + 300 < naive.peak_context,
        "{} against {}",
        oracle.peak_context,
        naive.peak_context
    );
}
