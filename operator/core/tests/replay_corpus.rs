//! Replay on real trajectories: every policy prices every call, Strata keeps spilled and elided
//! output readable byte-exact, and the anchors behave as published.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use strata_core::replay::{InputFormat, PolicyKind, ReplayOptions, parse_transcript, replay_session};
use strata_core::tokens::{TokenCounter, TokenizerKind};
use support::corpus_files;

#[test]
fn corpus_sessions_replay_under_every_policy() {
    let Some(files) = corpus_files("corpus_sessions_replay_under_every_policy") else { return };
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let options = ReplayOptions::default();
    let mut units = [0.0f64; 6];
    for path in files.into_iter().step_by(7) {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let transcript = parse_transcript(&name, &text, InputFormat::Auto).unwrap();
        let report = replay_session(&transcript, &options, &counter).unwrap();
        assert_eq!(report.policies.len(), 6);
        for (slot, policy) in report.policies.iter().enumerate() {
            assert_eq!(policy.calls.len(), transcript.calls.len(), "{name} {:?}", policy.policy);
            let totals = policy.totals();
            assert_eq!(totals.total, totals.fresh + totals.cache_write + totals.cache_read);
            units[slot] += totals.units;
            if std::env::var_os("REPLAY_DEBUG").is_some() {
                eprintln!(
                    "{name} {:?} fresh {} write {} read {} units {:.0} spills {} elisions {} dedup {}",
                    policy.policy,
                    totals.fresh,
                    totals.cache_write,
                    totals.cache_read,
                    totals.units,
                    policy.spills,
                    policy.elisions,
                    policy.deduplications
                );
            }
        }
        let naive = &report.policies[0];
        let strata = report.policies.iter().find(|p| p.policy == PolicyKind::Strata).unwrap();
        assert!(
            strata.peak_context <= naive.peak_context + 2_000,
            "{name}: strata peak {} vs naive {}",
            strata.peak_context,
            naive.peak_context
        );
        let preservation = strata.preservation.as_ref().unwrap();
        assert_eq!(preservation.readable_byte_exact, preservation.stored_outputs, "{name}");
        assert!(report.calibration.calls > 0, "{name}: the corpus records usage");
    }
    eprintln!(
        "units: naive {:.0} masking {:.0} clear {:.0} seed002 {:.0} strata {:.0} oracle {:.0}",
        units[0], units[1], units[2], units[3], units[4], units[5]
    );
}
