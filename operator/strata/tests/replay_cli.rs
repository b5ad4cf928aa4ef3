//! `strata replay` end to end: the shipped sample session, the synthetic fleet, and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

#[path = "../../core/tests/support/shared.rs"]
mod shared;

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

fn sample_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sessions")
}

#[test]
fn sample_session_prints_the_table_and_writes_plot_and_report() {
    let out = tempfile::tempdir().unwrap();
    let plot = out.path().join("replay.svg");
    let report = out.path().join("replay.json");
    let output = strata()
        .arg("replay")
        .arg(sample_dir())
        .arg("--plot")
        .arg(&plot)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for policy in ["naive", "observation-masking", "clear-tool-uses", "seed-002", "strata", "oracle"] {
        assert!(stdout.lines().any(|l| l.starts_with(policy)), "{policy} missing from:\n{stdout}");
    }
    assert!(stdout.contains("off-window outputs read back byte-exact (100.0%)"), "{stdout}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("strata"), "not a plot");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let totals = json["totals"].as_array().unwrap();
    assert_eq!(totals.len(), 6);
    let naive = &totals[0];
    assert_eq!(naive["policy"], "naive");
    assert!((naive["ratioToNaive"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    let strata = totals.iter().find(|t| t["policy"] == "strata").unwrap();
    assert!(strata["unitsToNaive"].is_null());
    assert!(
        strata["ratioToNaive"].as_f64().unwrap() < 1.0,
        "strata should cost less than naive on the sample"
    );
}

#[test]
fn bad_files_are_named_and_the_others_still_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(sample_dir().join("builder-overnight.json"), dir.path().join("good.json")).unwrap();
    std::fs::write(dir.path().join("broken.json"), "{\"messages\": [ {\"role\": \"user\"").unwrap();
    std::fs::write(dir.path().join("robot.json"), r#"{"messages":[{"role":"robot","content":"x"}]}"#)
        .unwrap();
    let output = strata().arg("replay").arg(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("broken.json: invalid JSON at line 1"), "{stderr}");
    assert!(stderr.contains("robot.json: messages[0]: unknown role"), "{stderr}");
    assert!(stdout.contains("1 sessions, "), "{stdout}");
}

#[test]
fn synthetic_fleet_never_exceeds_the_budget_under_strata() {
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("fleet.json");
    let output = strata()
        .args(["replay", "--synthetic-fleet", "--agents", "2", "--hours", "24", "--seed", "1"])
        // A small window forces budget compactions.
        .args(["--context-window", "32000", "--report"])
        .arg(&report)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let totals = json["totals"].as_array().unwrap();
    let by = |name: &str| totals.iter().find(|t| t["policy"] == name).unwrap().clone();
    assert!(by("naive")["callsOverBudget"].as_u64().unwrap() > 0, "the fleet overflows without a policy");
    assert_eq!(by("strata")["callsOverBudget"], 0);
    assert!(by("strata")["expirations"].as_u64().unwrap() > 0, "heartbeats must expire");
    assert!(by("strata")["compactions"].as_u64().unwrap() > 0, "the budget must have triggered compaction");
    assert_eq!(by("strata")["markers"][0], by("strata")["markers"][1], "every decision/TODO line survives");
}

#[test]
fn missing_inputs_fail_clearly() {
    let output = strata().args(["replay", "/nonexistent/sessions"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/sessions: no such file or directory"), "{stderr}");
    assert!(stderr.contains("no session could be replayed"), "{stderr}");
}

#[test]
fn the_seed_003_session_replays_as_pi_session_jsonl() {
    let Some(seeds) = shared::shared_path("the_seed_003_session_replays_as_pi_session_jsonl", "seeds") else {
        return;
    };
    let session = std::fs::read_dir(&seeds)
        .unwrap_or_else(|e| panic!("{} cannot be read: {e}", seeds.display()))
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("003_")))
        .expect("seed 003 session");
    let output = strata().arg("replay").arg(&session).args(["--format", "pi-session"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with("1 sessions, 1 model calls"), "{stdout}");
    assert!(stdout.contains("calibration:"), "the session records its usage: {stdout}");
}

/// A hand-written session: a long test log whose last line the agent quotes six rounds later.
fn quoting_session() -> String {
    let quoted = "FAILED tests/test_ledger.py::test_rounding_half_even - AssertionError: 0.125 != 0.13";
    let mut log: String =
        (0..100).map(|line| format!("tests/test_ledger.py::test_case_{line:03} PASSED\n")).collect();
    log.push_str(quoted);
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": "You are a careful coding agent."}),
        serde_json::json!({"role": "user", "content": "Run the ledger tests and fix what fails."}),
    ];
    for round in 0..7 {
        let id = format!("call_{round}");
        messages.push(serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "bash", "arguments": format!("{{\"cmd\": \"step {round}\"}}")}}]}));
        let output = if round == 0 { log.clone() } else { format!("ok {round}") };
        messages.push(serde_json::json!({"role": "tool", "tool_call_id": id, "content": output}));
    }
    messages
        .push(serde_json::json!({"role": "assistant", "content": format!("The failing test:\n{quoted}")}));
    serde_json::json!({"messages": messages}).to_string()
}

#[test]
fn sweep_prints_an_undominated_front_priced_with_read_backs() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    std::fs::create_dir(&corpus).unwrap();
    std::fs::write(corpus.join("quoting.json"), quoting_session()).unwrap();
    // Spill the log (1000) or keep it (8000); never elide it, with and without dedup.
    let grid = dir.path().join("grid.yaml");
    std::fs::write(
        &grid,
        "maxResultChars: [1000, 8000]\npreviewChars: [500]\nelideAfterRounds: [4]\n\
         elideOverChars: [1000000]\nelideKeepChars: [800]\ndeduplicate: [true, false]\n",
    )
    .unwrap();
    let report = dir.path().join("sweep.json");
    let output = strata()
        .args(["replay", "--sweep", "--jobs", "1", "--format", "openai-messages"])
        .arg(&corpus)
        .arg("--grid")
        .arg(&grid)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with("4 points swept, priced as anthropic, read-backs charged"), "{stdout}");
    assert!(stdout.contains("Pareto front"), "{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    let score = |point: &serde_json::Value| {
        let total = &point["total"];
        let naive = total["naiveUnits"].as_f64().unwrap();
        let cost = (total["units"].as_f64().unwrap() + total["readBackUnits"].as_f64().unwrap()) / naive;
        (cost, total["readBacks"].as_u64().unwrap())
    };
    for point in points {
        let spilled = point["point"]["maxResultChars"] == 1000;
        let (_, read_backs) = score(point);
        // The quoted line is past the 500-char preview: a spilled log costs one read-back.
        assert_eq!(read_backs, u64::from(spilled), "{point}");
        assert_eq!(point["total"]["readBackUnits"].as_f64().unwrap() > 0.0, spilled, "{point}");
        assert_eq!(point["total"]["unrecoverable"], 0);
    }
    let front: Vec<usize> =
        json["front"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as usize).collect();
    assert!(!front.is_empty());
    for &on in &front {
        let (cost, reads) = score(&points[on]);
        for other in points {
            let (other_cost, other_reads) = score(other);
            let dominated =
                other_cost <= cost && other_reads <= reads && (other_cost < cost || other_reads < reads);
            assert!(!dominated, "front point {on} is dominated by {other}");
        }
    }
}
