//! The checkpoint file as the daemon finds it on start-up, holding arbitrary bytes, or an
//! arbitrary JSON payload with a valid version and checksum (as another daemon version could
//! write it): opening the store never panics and never fails on content (a damaged file is moved
//! aside), and what it loads opens again to the same claims.
#![no_main]

use std::path::PathBuf;

use kubedev::checkpoint::{CHECKPOINT_FILE, CheckpointStore};
use libfuzzer_sys::fuzz_target;

struct Dirs {
    _root: tempfile::TempDir,
    state: PathBuf,
    boot: PathBuf,
}

fn dirs() -> &'static Dirs {
    static DIRS: std::sync::OnceLock<Dirs> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let root = tempfile::tempdir().expect("temp dir");
        let boot = root.path().join("boot_id");
        std::fs::write(&boot, "5a0c2e9f-1111-4000-8000-00000000abcd\n").expect("boot id");
        Dirs {
            state: root.path().join("state"),
            boot,
            _root: root,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let d = dirs();
    let _ = std::fs::remove_dir_all(&d.state);
    std::fs::create_dir_all(&d.state).expect("state dir");
    let file = match data.split_first() {
        Some((selector, payload)) if selector % 2 == 1 => {
            match serde_json::from_slice::<serde_json::Value>(payload) {
                Ok(payload) => kubedev::checkpoint::seal_for_fuzzing(&payload),
                Err(_) => return,
            }
        }
        _ => data.to_vec(),
    };
    std::fs::write(d.state.join(CHECKPOINT_FILE), file).expect("write checkpoint");
    let (store, _outcome) = CheckpointStore::open(&d.state, &d.boot)
        .unwrap_or_else(|e| panic!("a damaged checkpoint must be set aside, not fail: {e}"));
    let claims = store.claims().clone();
    drop(store);
    let (again, _) = CheckpointStore::open(&d.state, &d.boot).expect("reopen");
    assert_eq!(again.claims(), &claims);
});
