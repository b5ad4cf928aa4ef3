//! The tenant-scoped, content-addressed artifact store.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use strata_core::artifacts::{ArtifactError, ArtifactRef, ArtifactStore, SearchMatch};
use strata_core::journal::sim::{Fault, SimRng, SimStorage};
use strata_core::journal::{StdStorage, Storage};

const TEXT: &[u8] = b"first line\nsecond ERROR here\nthird\nfourth error\nfifth ERROR\n";

#[test]
fn put_get_round_trip_is_byte_exact_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(Arc::new(StdStorage), dir.path().join("artifacts"));
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let artifact = store.put("tenant-a", &bytes).unwrap();
    assert_eq!(artifact.to_string().len(), "art:sha256:".len() + 64);
    assert_eq!(artifact.to_string().parse::<ArtifactRef>().unwrap(), artifact);
    assert_eq!(store.put("tenant-a", &bytes).unwrap(), artifact);
    assert_eq!(store.get("tenant-a", &artifact).unwrap(), bytes);
    let path = store.path_of("tenant-a", &artifact).unwrap();
    let digest = artifact.digest_hex();
    assert_eq!(path, dir.path().join("artifacts/tenant-a").join(&digest[..2]).join(digest));
    assert!(matches!(store.get("tenant-b", &artifact), Err(ArtifactError::NotFound { .. })));
}

#[test]
fn corruption_is_detected_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(Arc::new(StdStorage), dir.path());
    let artifact = store.put("t", TEXT).unwrap();
    let path = store.path_of("t", &artifact).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let error = store.get("t", &artifact).unwrap_err();
    assert!(matches!(error, ArtifactError::Corrupt { .. }));
    assert!(error.to_string().contains(&path.display().to_string()));
    store.put("t", TEXT).unwrap();
    assert_eq!(store.get("t", &artifact).unwrap(), TEXT, "put repairs a corrupt copy");
}

#[test]
fn tenant_names_cannot_escape() {
    let store = ArtifactStore::new(Arc::new(SimStorage::new()), "/artifacts");
    for bad in ["", "..", ".", "a/b", "../x", ".hidden", "a\\b", "a\0b", "ümlaut"] {
        assert!(matches!(store.put(bad, b"x"), Err(ArtifactError::InvalidTenant { .. })), "{bad:?} accepted");
    }
    assert!(store.put("ns.agent-1_x", b"x").is_ok());
    for bad in ["sha256:00", "art:sha256:ABC", "art:md5:00"] {
        assert!(bad.parse::<ArtifactRef>().is_err());
    }
}

#[test]
fn head_slice_and_search_read_parts() {
    let store = ArtifactStore::new(Arc::new(SimStorage::new()), "/artifacts");
    let artifact = store.put("t", TEXT).unwrap();
    assert_eq!(store.head("t", &artifact, 2, 1000).unwrap(), "first line\nsecond ERROR here\n");
    assert_eq!(store.head("t", &artifact, 2, 7).unwrap(), "first l");
    assert_eq!(store.head("t", &artifact, 0, 7).unwrap(), "");
    assert_eq!(store.slice("t", &artifact, 6, 4).unwrap(), b"line");
    assert_eq!(store.slice("t", &artifact, TEXT.len() - 2, 10).unwrap(), b"R\n");
    assert!(store.slice("t", &artifact, 10_000, 5).unwrap().is_empty());
    let found = store.search("t", &artifact, "ERROR", 10).unwrap();
    assert_eq!(
        found,
        vec![
            SearchMatch { line_number: 2, line: "second ERROR here".into() },
            SearchMatch { line_number: 5, line: "fifth ERROR".into() },
        ]
    );
    assert_eq!(store.search("t", &artifact, "(?i)error", 2).unwrap().len(), 2);
    assert!(matches!(store.search("t", &artifact, "(", 1), Err(ArtifactError::BadPattern { .. })));
}

#[test]
fn crash_during_put_leaves_artifact_absent_or_intact() {
    let payload = b"artifact body that must never be half-visible".repeat(20);
    let mut rng = SimRng::new(42);
    for case in 0..300u64 {
        let sim = SimStorage::new();
        sim.set_fault(Some(Fault { kind: None, nth: 1 + rng.below(12), then_crash: true }));
        let store = ArtifactStore::new(Arc::new(sim.clone()), "/vol/artifacts");
        let acknowledged = store.put("t", &payload).is_ok();
        sim.crash(case);
        let artifact = ArtifactRef::for_bytes(&payload);
        match store.get("t", &artifact) {
            Ok(bytes) => assert_eq!(bytes, payload),
            Err(ArtifactError::NotFound { .. }) => {
                assert!(!acknowledged, "case {case}: acknowledged put lost")
            }
            Err(other) => panic!("case {case}: {other}"),
        }
        assert!(sim.exists(Path::new("/")).unwrap());
    }
}
