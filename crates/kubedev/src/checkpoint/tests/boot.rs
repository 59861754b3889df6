//! Boot IDs: a checkpoint from another boot is dropped, bad boot ID files are errors naming the
//! path, and this machine's boot ID reads.

use super::*;
use crate::checkpoint::store::read_boot_id;

#[test]
fn a_checkpoint_from_another_boot_is_dropped() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    store
        .start_prepare(&claim("u2"), &[allocated("gpu-1")])
        .unwrap();
    drop(store);
    fx.set_boot(BOOT_B);
    let (store, outcome) = fx.open();
    assert_eq!(
        outcome,
        LoadOutcome::BootChanged {
            previous: BOOT_A.into(),
            current: BOOT_B.into(),
            dropped: 2
        }
    );
    assert!(outcome.to_string().contains(BOOT_A));
    assert!(store.claims().is_empty());
    assert_eq!(store.boot_id(), BOOT_B);
    drop(store);
    let (_, again) = fx.open();
    assert_eq!(again, LoadOutcome::Loaded { claims: 0 });
}

#[test]
fn bad_boot_id_files_are_errors_naming_the_path() {
    let fx = Fixture::new();
    fs::write(fx.boot_path(), "  \n").unwrap();
    let err = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::InvalidBootId { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("boot_id"), "{err}");
    let missing = fx.boot_dir.path().join("missing");
    let err = CheckpointStore::open(fx.dir.path(), &missing).unwrap_err();
    assert!(matches!(err, CheckpointError::ReadBootId { ref path, .. } if *path == missing));
    fs::write(fx.boot_path(), "x".repeat(1000)).unwrap();
    let err = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap_err();
    assert!(err.to_string().contains("256"), "{err}");
}

#[test]
fn this_machines_boot_id_is_readable() {
    // Linux only; the project targets Linux nodes.
    if Path::new(DEFAULT_BOOT_ID_PATH).exists() {
        let id = read_boot_id(Path::new(DEFAULT_BOOT_ID_PATH)).unwrap();
        assert_eq!(id.len(), 36, "{id}");
    }
}
