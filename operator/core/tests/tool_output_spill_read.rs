//! Spill and `strata_read_output`: previews, markers, argument parsing and byte-exact read-back.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use strata_core::artifacts::ArtifactStore;
use strata_core::journal::sim::SimStorage;
use strata_core::tool_output::spill::SPILL_MARKER_PREFIX;
use strata_core::tool_output::{ReadArgsError, ReadRequest, SpillPolicy, read_output, spill};

fn store() -> ArtifactStore {
    ArtifactStore::new(Arc::new(SimStorage::new()), "/artifacts")
}

fn big_output(lines: usize) -> String {
    (0..lines).map(|i| format!("line {i}: ünïcödé payload {}\n", "x".repeat(i % 37))).collect()
}

/// The stored text before the footer line of a read answer.
fn body(answer: &str) -> &str {
    &answer[..answer.rfind("\n[strata: ").unwrap()]
}

#[test]
fn small_output_is_kept_verbatim() {
    let store = store();
    let out = spill("ok\n", &SpillPolicy::default(), &store, "t1").unwrap();
    assert!(!out.spilled());
    assert_eq!(out.window_text, "ok\n");
    let exactly_max = "é".repeat(SpillPolicy::default().max_result_chars);
    assert!(!spill(&exactly_max, &SpillPolicy::default(), &store, "t1").unwrap().spilled());
}

#[test]
fn threshold_counts_chars_not_bytes() {
    let store = store();
    let over = SpillPolicy::default().max_result_chars + 1;
    let out = spill(&"é".repeat(over), &SpillPolicy::default(), &store, "t1").unwrap();
    assert!(out.spilled());
    assert_eq!(out.original_chars, over);
}

#[test]
fn large_output_spills_with_preview_and_marker() {
    let store = store();
    let output = big_output(1204);
    let out = spill(&output, &SpillPolicy::default(), &store, "t1").unwrap();
    let data_ref = out.data_ref.clone().unwrap();
    assert_eq!(store.get("t1", &data_ref).unwrap(), output.as_bytes());
    let (preview, marker) = out.window_text.rsplit_once('\n').unwrap();
    assert!(output.starts_with(preview));
    assert!(preview.lines().count() <= SpillPolicy::default().preview_lines);
    assert!(preview.chars().count() <= SpillPolicy::default().preview_chars);
    let expected_chars = output.chars().count().to_string();
    assert!(marker.starts_with(SPILL_MARKER_PREFIX), "{marker}");
    assert!(marker.contains("1,204 lines"), "{marker}");
    assert!(marker.contains(&format!("data_ref={data_ref}")), "{marker}");
    assert!(marker.contains("strata_read_output"));
    assert!(expected_chars.len() > 3);
    // Deterministic: same output, same window text.
    assert_eq!(spill(&output, &SpillPolicy::default(), &store, "t1").unwrap(), out);
}

#[test]
fn preview_cuts_on_line_boundary_under_char_limit() {
    let store = store();
    let policy = SpillPolicy { max_result_chars: 100, preview_chars: 50, preview_lines: 60 };
    let output = "0123456789012345678\n".repeat(20);
    let out = spill(&output, &policy, &store, "t1").unwrap();
    assert!(out.window_text.starts_with(&"0123456789012345678\n".repeat(2)));
    assert!(out.window_text[40..].starts_with(SPILL_MARKER_PREFIX), "{}", out.window_text);
    // One huge line: cut on a char boundary.
    let one_line = "é".repeat(500);
    let out = spill(&one_line, &policy, &store, "t1").unwrap();
    assert!(out.window_text.starts_with(&format!("{}\n{SPILL_MARKER_PREFIX}", "é".repeat(50))));
    assert!(out.window_text.contains("showing first 50 chars"));
}

#[test]
fn slices_read_back_every_byte_exactly() {
    let store = store();
    let output = big_output(3000);
    let data_ref = spill(&output, &SpillPolicy::default(), &store, "t1").unwrap().data_ref.unwrap();
    let mut rebuilt = String::new();
    let mut offset = 0;
    loop {
        let request = ReadRequest::from_arguments_json(&format!(
            r#"{{"data_ref":"{data_ref}","mode":"slice","offset":{offset},"length":7777}}"#
        ))
        .unwrap();
        let answer = read_output(&store, "t1", &request, 5000).unwrap();
        let chunk = body(&answer);
        assert!(chunk.chars().count() <= 5000, "answer bounded by max_chars");
        if chunk.is_empty() {
            assert!(answer.contains("end of output"));
            break;
        }
        rebuilt.push_str(chunk);
        offset += chunk.chars().count();
    }
    assert_eq!(rebuilt.as_bytes(), output.as_bytes());
}

#[test]
fn head_and_search_render_bounded_answers() {
    let store = store();
    let output = big_output(2000);
    let data_ref = spill(&output, &SpillPolicy::default(), &store, "t1").unwrap().data_ref.unwrap();
    let head = ReadRequest::Head { data_ref: data_ref.clone(), lines: Some(3), chars: None };
    let answer = read_output(&store, "t1", &head, 8000).unwrap();
    assert!(answer.starts_with("line 0: "));
    assert_eq!(body(&answer).lines().count(), 3);
    assert!(answer.contains("continue with mode slice offset"));

    let search = ReadRequest::from_arguments_json(&format!(
        r#"{{"data_ref":"{data_ref}","mode":"search","pattern":"^line 1[0-9]{{3}}:","max_matches":5}}"#
    ))
    .unwrap();
    let answer = read_output(&store, "t1", &search, 8000).unwrap();
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 6, "{answer}");
    assert!(lines[0].starts_with("line 1001: line 1000: "), "{answer}");
    assert!(lines[5].contains("5 matching lines shown; more matches exist"));

    let tight = ReadRequest::Search { data_ref, pattern: "payload".into(), max_matches: Some(1000) };
    let answer = read_output(&store, "t1", &tight, 500).unwrap();
    assert!(answer.chars().count() < 700, "{answer}");
    assert!(answer.contains("answer size limit reached"));
}

#[test]
fn argument_errors_name_the_field() {
    let good = format!("art:sha256:{}", "a".repeat(64));
    let cases = [
        ("not json".to_owned(), "not valid JSON"),
        ("[]".to_owned(), "JSON object"),
        (r#"{"mode":"head"}"#.to_owned(), "`data_ref`"),
        (format!(r#"{{"data_ref":"{good}"}}"#), "`mode`"),
        (format!(r#"{{"data_ref":"{good}","mode":"tail"}}"#), "`mode`"),
        (r#"{"data_ref":"art:md5:1","mode":"head"}"#.to_owned(), "`data_ref`"),
        (format!(r#"{{"data_ref":"{good}","mode":"slice","offset":-1}}"#), "`offset`"),
        (format!(r#"{{"data_ref":"{good}","mode":"head","lines":"3"}}"#), "`lines`"),
        (format!(r#"{{"data_ref":"{good}","mode":"search"}}"#), "`pattern`"),
        (format!(r#"{{"data_ref":"{good}","mode":"head","pattern":"x"}}"#), "`pattern`"),
    ];
    for (arguments, needle) in cases {
        let error = ReadRequest::from_arguments_json(&arguments).unwrap_err();
        assert!(error.to_string().contains(needle), "{arguments}: {error}");
    }
    assert_eq!(
        ReadRequest::from_arguments_json(r#"{"mode":"head"}"#).unwrap_err(),
        ReadArgsError::Missing { field: "data_ref" }
    );
}

#[test]
fn serde_form_matches_tool_arguments() {
    let arguments =
        format!(r#"{{"data_ref":"art:sha256:{}","mode":"slice","offset":10,"length":5}}"#, "b".repeat(64));
    let parsed = ReadRequest::from_arguments_json(&arguments).unwrap();
    let via_serde: ReadRequest = serde_json::from_str(&arguments).unwrap();
    assert_eq!(parsed, via_serde);
}

#[test]
fn reading_another_tenants_output_fails_with_context() {
    let store = store();
    let data_ref = spill(&big_output(1000), &SpillPolicy::default(), &store, "t1").unwrap().data_ref.unwrap();
    let request = ReadRequest::Head { data_ref: data_ref.clone(), lines: None, chars: None };
    let error = read_output(&store, "t2", &request, 8000).unwrap_err().to_string();
    assert!(
        error.contains(&data_ref.to_string()) && error.contains("t2") && error.contains("not found"),
        "{error}"
    );
}
