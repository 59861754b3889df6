//! Recording claims: batches of changes, the round trip through the file, removal, unknown
//! claims, restarted prepares, temporary files and the file's mode.

use super::*;

#[test]
fn a_batch_of_changes_is_one_write_with_per_change_results() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    let results = store
        .apply(vec![
            Change::Start {
                claim: claim("u1"),
                devices: vec![allocated("gpu-0")],
            },
            Change::Start {
                claim: claim("u2"),
                devices: vec![allocated("gpu-1")],
            },
            Change::Complete {
                uid: "u1".parse().unwrap(),
                prepared: vec![prepared("gpu-0")],
                cdi_file: Some("spec.json".into()),
                pod_claim_name: Some("gpu".into()),
            },
            Change::Complete {
                uid: "nope".parse().unwrap(),
                prepared: vec![],
                cdi_file: None,
                pod_claim_name: None,
            },
            Change::Remove {
                uid: "u2".parse().unwrap(),
            },
        ])
        .unwrap();
    assert_eq!(results.len(), 5);
    assert!(results[..3].iter().all(Result::is_ok));
    assert!(matches!(
        results[3],
        Err(CheckpointError::UnknownClaim { .. })
    ));
    assert!(results[4].is_ok());
    let (again, _) = fx.open();
    assert_eq!(again.claims().len(), 1);
    assert_eq!(again.get("u1").unwrap().state, ClaimState::PrepareCompleted);
    assert_eq!(
        again.get("u1").unwrap().pod_claim_name.as_deref(),
        Some("gpu"),
        "where the claim's device metadata appears in containers survives a restart"
    );
}

#[test]
fn claims_round_trip_through_the_file() {
    let fx = Fixture::new();
    let (mut store, outcome) = fx.open();
    assert_eq!(outcome, LoadOutcome::Created);
    assert!(fx.file().exists(), "a fresh checkpoint is written at once");
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-0"), allocated("gpu-1")])
        .unwrap();
    store
        .start_prepare(&claim("u2"), &[allocated("gpu-2")])
        .unwrap();
    store
        .complete_prepare(
            "u1",
            &[prepared("gpu-0"), prepared("gpu-1")],
            Some("k8s.gpu.example.com-claim_u1.json"),
        )
        .unwrap();
    let expected = store.claims().clone();
    drop(store);

    let (store, outcome) = fx.open();
    assert_eq!(outcome, LoadOutcome::Loaded { claims: 2 });
    assert_eq!(store.claims(), &expected);
    let u1 = store.get("u1").unwrap();
    assert_eq!(u1.state, ClaimState::PrepareCompleted);
    assert_eq!(u1.claim, claim("u1"));
    assert_eq!(u1.devices, [allocated("gpu-0"), allocated("gpu-1")]);
    assert_eq!(u1.prepared, [prepared("gpu-0"), prepared("gpu-1")]);
    assert_eq!(
        u1.cdi_file.as_deref(),
        Some("k8s.gpu.example.com-claim_u1.json")
    );
    let started = store.started_claims();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].claim.uid, "u2");
    assert_eq!(started[0].state, ClaimState::PrepareStarted);
    assert!(started[0].prepared.is_empty());
    assert_eq!(store.boot_id(), BOOT_A);
}

#[test]
fn remove_persists_and_unknown_claims_are_fine() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    assert!(store.remove(&"u1".parse().unwrap()).unwrap());
    assert!(!store.remove(&"u1".parse().unwrap()).unwrap());
    assert!(!store.remove(&"never-seen".parse().unwrap()).unwrap());
    let (store, outcome) = fx.open();
    assert_eq!(outcome, LoadOutcome::Loaded { claims: 0 });
    assert!(store.claims().is_empty());
}

#[test]
fn completing_an_unknown_claim_is_an_error_naming_it() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    let err = store
        .complete_prepare("ghost", &[prepared("gpu-0")], None)
        .unwrap_err();
    assert!(matches!(err, CheckpointError::UnknownClaim { ref uid, .. } if uid == "ghost"));
    assert!(err.to_string().contains("ghost"), "{err}");
    assert!(store.claims().is_empty());
}

#[test]
fn restarting_a_prepare_replaces_the_record() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    store
        .complete_prepare("u1", &[prepared("gpu-0")], Some("f.json"))
        .unwrap();
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-1")])
        .unwrap();
    let r = store.get("u1").unwrap();
    assert_eq!(r.state, ClaimState::PrepareStarted);
    assert_eq!(r.devices, [allocated("gpu-1")]);
    assert!(r.prepared.is_empty());
    assert_eq!(r.cdi_file, None);
}

#[test]
fn no_temporary_file_remains_and_stale_ones_are_removed() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    for i in 0..5 {
        store
            .start_prepare(&claim(&format!("u{i}")), &[allocated("gpu-0")])
            .unwrap();
    }
    assert_eq!(fx.dir.names(), [INSTANCES_DIR, CHECKPOINT_FILE, LOCK_FILE]);
    drop(store);
    let stale = format!(".{CHECKPOINT_FILE}.tmp-99-0-0");
    fs::write(fx.dir.path().join(&stale), b"{\"half").unwrap();
    let (_store, outcome) = fx.open();
    assert_eq!(outcome, LoadOutcome::Loaded { claims: 5 });
    assert_eq!(fx.dir.names(), [INSTANCES_DIR, CHECKPOINT_FILE, LOCK_FILE]);
}

#[test]
fn open_creates_the_directory_and_file_mode_is_private() {
    let fx = Fixture::new();
    let nested = fx.dir.path().join("plugins").join("gpu.example.com");
    let (store, outcome) = CheckpointStore::open(&nested, fx.boot_path()).unwrap();
    assert_eq!(outcome, LoadOutcome::Created);
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(store.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    for dir in [nested.clone(), nested.join(INSTANCES_DIR)] {
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
}
