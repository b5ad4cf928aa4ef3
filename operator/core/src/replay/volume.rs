//! A session replayed through the session engine with the artifact sweeper on the replay's
//! (simulated) clock: how many bytes the agent's volume holds at its peak under a retention policy.
//!
//! The engine runs on an in-memory volume exactly as [`super::simulate::replay_strata`] drives it;
//! after every call the volume is measured (every file under the data directory: journal
//! generations, artifacts, compaction records, state) and, whenever `sweepIntervalSeconds` of
//! simulated time have passed, the sweeper runs as the gateway would run it.

use serde::Serialize;

use super::simulate::{ReplayError, ReplayOptions, call_times, replay_strata_with};
use super::transcript::Transcript;
use std::collections::BTreeSet;

use crate::artifacts::ArtifactRef;
use crate::lifecycle::{VolumeRetention, scan_refs};
use crate::session::SessionEngine;

/// The volume over one replayed session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeReplay {
    /// The session.
    pub session: String,
    /// Calls replayed.
    pub calls: usize,
    /// Simulated time covered, milliseconds.
    pub simulated_ms: u64,
    /// Most bytes on the volume after any call.
    pub peak_bytes: u64,
    /// Bytes on the volume after the last call and a final sweep.
    pub final_bytes: u64,
    /// Sweeps run.
    pub sweeps: u64,
    /// Files the sweeper deleted.
    pub files_swept: u64,
    /// Bytes the sweeper deleted.
    pub bytes_swept: u64,
    /// Most bytes any artifact-store sweep left (referenced artifacts included).
    pub peak_artifact_bytes_after_sweep: u64,
    /// Compactions the engine ran (each leaves a superseded generation).
    pub compactions: u64,
    /// Artifacts the live generation names (recorded refs and `data_ref`s in its text), checked
    /// after the last sweep.
    pub live_refs_checked: u64,
    /// Of which no longer readable byte-exact (must be 0: the sweeper never deletes them).
    pub live_refs_unreadable: u64,
}

/// Replays `transcript` through the session engine under `options.strata` (whose `volume` is the
/// retention policy), sweeping every `sweepIntervalSeconds` of simulated time.
pub fn replay_volume(transcript: &Transcript, options: &ReplayOptions) -> Result<VolumeReplay, ReplayError> {
    let retention: VolumeRetention = options.strata.volume;
    let interval_ms = u64::from(retention.sweep_interval_seconds.max(1)) * 1000;
    let times = call_times(transcript);
    let mut result = VolumeReplay {
        session: transcript.name.clone(),
        calls: times.len(),
        simulated_ms: times.last().copied().unwrap_or(0).saturating_sub(times.first().copied().unwrap_or(0)),
        ..VolumeReplay::default()
    };
    let mut next_sweep = times.first().copied().unwrap_or(0) + interval_ms;
    let mut calls_done = 0;
    let (mut checked, mut unreadable) = (0, 0);
    let report = replay_strata_with(
        transcript,
        options,
        &times,
        |_, _| {},
        |engine, now| {
            result.peak_bytes = result.peak_bytes.max(engine.volume_bytes()?);
            if now >= next_sweep || calls_done + 1 == times.len() {
                let sweep = engine.maintain_volume(&options.strata, now)?;
                result.sweeps += 1;
                result.files_swept += sweep.files_swept();
                result.bytes_swept += sweep.bytes_swept();
                for kind in sweep.kinds.iter().filter(|k| k.kind == crate::lifecycle::SweepKind::Artifact) {
                    result.peak_artifact_bytes_after_sweep =
                        result.peak_artifact_bytes_after_sweep.max(kind.bytes_kept);
                }
                next_sweep = now + interval_ms;
                result.final_bytes = engine.volume_bytes()?;
            }
            calls_done += 1;
            if calls_done == times.len() {
                (checked, unreadable) = check_live_refs(engine, &options.strata.tenant);
            }
            Ok(())
        },
    )?;
    result.compactions = report.compactions;
    result.live_refs_checked = checked;
    result.live_refs_unreadable = unreadable;
    Ok(result)
}

/// Every artifact the live generation names (recorded refs, and `data_ref`s written in its text and
/// outputs), and how many of them no longer read back (a read verifies the content hash).
fn check_live_refs(engine: &SessionEngine, tenant: &str) -> (u64, u64) {
    let mut named = BTreeSet::new();
    for entry in engine.journal().entries() {
        named.extend(entry.artifact_refs.iter().map(|r| r.digest_hex().to_owned()));
        scan_refs(&entry.content.text, &mut named);
        for result in &entry.content.tool_results {
            scan_refs(&result.output, &mut named);
        }
    }
    let unreadable = named
        .iter()
        .filter_map(|digest| format!("art:sha256:{digest}").parse::<ArtifactRef>().ok())
        .filter(|data_ref| engine.store().get(tenant, data_ref).is_err())
        .count();
    (named.len() as u64, unreadable as u64)
}
