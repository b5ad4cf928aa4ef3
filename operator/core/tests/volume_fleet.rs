//! The synthetic 24 h always-on fleet (seed 003's shape) replayed through the session engine with
//! the artifact sweeper on simulated time: under the default volume retention policy the agent's
//! volume stays under its 1Gi PersistentVolumeClaim, and with a tight artifact budget the sweeper
//! holds the store to it while every live data_ref stays readable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_core::entry::RetentionClass;
use strata_core::lifecycle::{KeepLimits, VolumeRetention};
use strata_core::replay::synthetic::{FleetSpec, generate_fleet};
use strata_core::replay::volume::replay_volume;
use strata_core::replay::{Provider, ReplayOptions};
use strata_core::retention::{Classifier, RetentionMatch, RetentionRule};
use strata_core::session::{Api, SessionSettings};

const GI: u64 = 1024 * 1024 * 1024;

/// The engine as the gateway runs it for this fleet: the default heartbeat rule, a 32k window so
/// that compactions (and so superseded generations) happen through the day.
fn options(volume: VolumeRetention) -> ReplayOptions {
    let mut strata = SessionSettings::defaults(Api::Anthropic, 32_000);
    strata.classifier = Classifier::new(vec![RetentionRule {
        name: "heartbeats".into(),
        class: RetentionClass::Ephemeral,
        matcher: RetentionMatch {
            content_regex: Some(r"(?i)^\s*(heartbeat|HEARTBEAT_OK|status check|ping)\b".into()),
            ..RetentionMatch::default()
        },
        ttl_seconds: Some(3600),
    }])
    .unwrap();
    strata.volume = volume;
    ReplayOptions { provider: Provider::Anthropic, strata, ..ReplayOptions::default() }
}

#[test]
fn a_day_of_an_always_on_agent_stays_under_its_1gi_volume_with_the_default_policy() {
    let fleet = generate_fleet(&FleetSpec { agents: 1, hours: 24, seed: 1 });
    let replay = replay_volume(&fleet[0], &options(VolumeRetention::default())).unwrap();
    println!("{}", serde_json::to_string(&replay).unwrap());
    assert!(replay.simulated_ms >= 23 * 3_600_000, "a whole simulated day: {replay:?}");
    assert!(replay.sweeps >= 200, "the sweeper ran every 5 simulated minutes: {replay:?}");
    assert!(replay.compactions > 0, "the day compacted, leaving superseded generations: {replay:?}");
    assert!(replay.peak_bytes > 0 && replay.peak_bytes < GI, "peak {} bytes: {replay:?}", replay.peak_bytes);
    assert_eq!(replay.live_refs_unreadable, 0, "{replay:?}");
}

#[test]
fn a_tight_policy_sweeps_expired_artifacts_and_generations_but_never_a_live_reference() {
    let tight = VolumeRetention {
        artifacts: KeepLimits { max_age_seconds: 3_600, max_bytes: 256 * 1024 },
        generations: KeepLimits { max_age_seconds: 3_600, max_bytes: 4 * 1024 * 1024 },
        ..VolumeRetention::default()
    };
    let fleet = generate_fleet(&FleetSpec { agents: 1, hours: 24, seed: 7 });
    let replay = replay_volume(&fleet[0], &options(tight)).unwrap();
    println!("{}", serde_json::to_string(&replay).unwrap());
    assert!(replay.compactions > 0, "{replay:?}");
    assert!(replay.files_swept > 0 && replay.bytes_swept > 0, "expired files were deleted: {replay:?}");
    assert!(replay.live_refs_checked > 0, "{replay:?}");
    assert_eq!(replay.live_refs_unreadable, 0, "every live data_ref still reads back: {replay:?}");
}
