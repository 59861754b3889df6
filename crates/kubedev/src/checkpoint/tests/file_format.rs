//! The file's format and its damage: CRC-32, canonical JSON, newer minor versions, corrupt files
//! moved aside, special files at our paths, the version and checksum written, and arbitrary
//! content loading without a panic.

use proptest::prelude::*;

use super::*;
use crate::checkpoint::file::{checksum_of, crc32, encode, write_canonical};

#[test]
fn crc32_matches_the_standard_check_value() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
}

#[test]
fn canonical_form_sorts_keys_at_every_level() {
    let v = serde_json::json!({"b": [ {"z": 1, "a": "x"} ], "a": null});
    let mut out = Vec::new();
    write_canonical(&v, &mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"a":null,"b":[{"a":"x","z":1}]}"#
    );
}

/// Re-encodes a file's payload after `edit`, with a valid checksum, as another writer would.
fn rewrite_payload(path: &Path, version: &str, edit: impl FnOnce(&mut Value)) {
    let mut doc: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    edit(&mut doc["payload"]);
    doc["checksum"] = Value::String(checksum_of(&doc["payload"]).unwrap());
    doc["version"] = Value::String(version.into());
    fs::write(path, serde_json::to_vec(&doc).unwrap()).unwrap();
}

#[test]
fn unknown_fields_of_a_newer_minor_version_are_tolerated() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    store
        .complete_prepare("u1", &[prepared("gpu-0")], Some("f.json"))
        .unwrap();
    store
        .start_prepare(&claim("u2"), &[allocated("gpu-1")])
        .unwrap();
    let expected = store.claims().clone();
    drop(store);
    rewrite_payload(&fx.file(), "1.9", |p| {
        p["futureTopLevel"] = serde_json::json!({"x": [1, 2]});
        p["claims"]["u1"]["futureField"] = serde_json::json!("hello");
        p["claims"]["u1"]["claim"]["futureRef"] = serde_json::json!(true);
        p["claims"]["u1"]["prepared"][0]["edits"]["futureEdit"] = serde_json::json!(1);
        // A state this version does not know counts as unfinished.
        p["claims"]["u2"]["state"] = serde_json::json!("PrepareVerified");
    });
    let mut doc: Value = serde_json::from_slice(&fs::read(fx.file()).unwrap()).unwrap();
    doc["writtenBy"] = serde_json::json!("kubedev 9.9");
    fs::write(fx.file(), serde_json::to_vec(&doc).unwrap()).unwrap();

    let (store, outcome) = fx.open();
    assert_eq!(outcome, LoadOutcome::Loaded { claims: 2 });
    assert_eq!(store.claims(), &expected);
    assert_eq!(store.get("u2").unwrap().state, ClaimState::PrepareStarted);
    assert_eq!(fx.dir.names(), [INSTANCES_DIR, CHECKPOINT_FILE, LOCK_FILE]);
}

fn assert_moved_aside(fx: &Fixture, content: &[u8], reason_part: &str, n: u32) {
    fs::write(fx.file(), content).unwrap();
    let (store, outcome) = fx.open();
    let LoadOutcome::Corrupt { moved_to, reason } = &outcome else {
        panic!("expected corrupt outcome, got {outcome:?}");
    };
    assert!(
        reason.contains(reason_part),
        "reason {reason:?} should mention {reason_part:?}"
    );
    assert_eq!(
        moved_to,
        &fx.dir.path().join(format!("{CHECKPOINT_FILE}.corrupt-{n}"))
    );
    assert_eq!(
        fs::read(moved_to).unwrap(),
        content,
        "corrupt file kept as is"
    );
    assert!(store.claims().is_empty());
    assert!(outcome.to_string().contains("corrupt"), "{outcome}");
    // A fresh, valid checkpoint replaced it: the next open loads cleanly.
    drop(store);
    let (_, again) = fx.open();
    assert_eq!(again, LoadOutcome::Loaded { claims: 0 });
}

#[test]
fn corrupt_files_are_moved_aside_and_a_fresh_checkpoint_starts() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    drop(store);
    let good = fs::read(fx.file()).unwrap();

    assert_moved_aside(&fx, b"\x00\xffgarbage", "not valid JSON", 1);
    assert_moved_aside(&fx, &good[..good.len() / 2], "not valid JSON", 2);
    assert_moved_aside(&fx, b"", "not valid JSON", 3);
    assert_moved_aside(&fx, b"[1, 2]", "not a JSON object", 4);

    let tampered = String::from_utf8(good.clone())
        .unwrap()
        .replace("gpu-0", "gpu-9");
    assert_ne!(tampered.as_bytes(), &good[..]);
    assert_moved_aside(&fx, tampered.as_bytes(), "checksum mismatch", 5);

    let future = String::from_utf8(good.clone())
        .unwrap()
        .replace("\"version\":\"1.1\"", "\"version\":\"2.0\"");
    assert!(future.contains("\"2.0\""), "test edits the version");
    assert_moved_aside(&fx, future.as_bytes(), "unsupported format version", 6);

    let no_version = String::from_utf8(good.clone())
        .unwrap()
        .replace("\"version\":\"1.1\"", "\"version\":1");
    assert_moved_aside(&fx, no_version.as_bytes(), "version", 7);

    // Valid checksum, but the content breaks the model's rules (invalid device name).
    fs::write(fx.file(), &good).unwrap();
    rewrite_payload(&fx.file(), "1.0", |p| {
        p["claims"]["u1"]["devices"][0]["device"]["device"] = serde_json::json!("../GPU");
    });
    let bad_shape = fs::read(fx.file()).unwrap();
    assert_moved_aside(&fx, &bad_shape, "wrong shape", 8);

    // A record filed under another claim's UID.
    fs::write(fx.file(), &good).unwrap();
    rewrite_payload(&fx.file(), "1.0", |p| {
        p["claims"]["u1"]["claim"]["uid"] = serde_json::json!("u2");
    });
    let mismatched = fs::read(fx.file()).unwrap();
    assert_moved_aside(&fx, &mismatched, "UID", 9);
}

/// Special files where the checkpoint, the lock or the boot ID belong are refused at once
/// (a FIFO used to block `open` forever while the node lock was held).
#[test]
fn special_files_in_place_of_our_files_are_refused_without_blocking() {
    let mkfifo = |p: &Path| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            p,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap()
    };
    for target in [LOCK_FILE, "boot"] {
        let fx = Fixture::new();
        let path = if target == "boot" {
            fs::remove_file(fx.boot_path()).unwrap();
            fx.boot_path()
        } else {
            fx.dir.path().join(target)
        };
        mkfifo(&path);
        let started = std::time::Instant::now();
        let err = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{target}: blocked"
        );
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("FIFO"),
            "{target}: {text}"
        );
    }
    // At the checkpoint's own path a FIFO, a link or a directory is never opened: it is
    // moved aside like a corrupt file (a link is not followed, and what it points at is left
    // alone), and a fresh checkpoint starts.
    let fx = Fixture::new();
    let elsewhere = fx.boot_dir.path().join("elsewhere.json");
    fs::write(&elsewhere, "not ours").unwrap();
    type Plant<'a> = Box<dyn Fn(&Path) + 'a>;
    let plants: Vec<(&str, Plant)> = vec![
        ("FIFO", Box::new(mkfifo)),
        (
            "symbolic link",
            Box::new(|p: &Path| std::os::unix::fs::symlink(&elsewhere, p).unwrap()),
        ),
        ("directory", Box::new(|p: &Path| fs::create_dir(p).unwrap())),
    ];
    for (n, (what, plant)) in plants.into_iter().enumerate() {
        plant(&fx.file());
        let started = std::time::Instant::now();
        let (store, outcome) = CheckpointStore::open(fx.dir.path(), fx.boot_path()).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: blocked"
        );
        match outcome {
            LoadOutcome::Corrupt { moved_to, reason } => {
                assert!(reason.contains(what), "{what}: {reason}");
                let aside = format!(".corrupt-{}", n + 1);
                assert!(moved_to.to_string_lossy().ends_with(&aside), "{moved_to:?}");
            }
            other => panic!("{what}: {other:?}"),
        }
        drop(store);
        assert!(fs::symlink_metadata(fx.file()).unwrap().is_file(), "{what}");
        fs::remove_file(fx.file()).unwrap();
    }
    assert_eq!(fs::read_to_string(&elsewhere).unwrap(), "not ours");
}

#[test]
fn the_file_says_its_version_and_checksum() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    store
        .start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    let doc: Value = serde_json::from_slice(&fs::read(fx.file()).unwrap()).unwrap();
    assert_eq!(doc["version"], "1.1");
    assert_eq!(doc["payload"]["bootId"], BOOT_A);
    assert_eq!(doc["payload"]["claims"]["u1"]["state"], "PrepareStarted");
    assert_eq!(
        doc["payload"]["claims"]["u1"]["claim"]["namespace"],
        "default"
    );
    let checksum = doc["checksum"].as_str().unwrap();
    assert!(
        checksum.starts_with("crc32:") && checksum.len() == 14,
        "{checksum}"
    );
    let mut map = BTreeMap::new();
    map.insert("u1".parse().unwrap(), store.get("u1").unwrap().clone());
    assert_eq!(fs::read(fx.file()).unwrap(), encode(BOOT_A, &map).unwrap());
}

#[test]
fn a_file_written_change_by_change_is_the_file_of_its_records() {
    let fx = Fixture::new();
    let (mut store, _) = fx.open();
    for uid in ["u1", "u2", "u3"] {
        store
            .start_prepare(&claim(uid), &[allocated("gpu-0")])
            .unwrap();
    }
    store
        .complete_prepare("u2", &[prepared("gpu-0")], Some("f.json"))
        .unwrap();
    store.remove(&"u1".parse().unwrap()).unwrap();
    store
        .start_prepare(&claim("u3"), &[allocated("gpu-1")])
        .unwrap();
    assert_eq!(
        store.get("u3").unwrap().devices[0].device.device.as_str(),
        "gpu-1"
    );
    assert_eq!(
        fs::read(fx.file()).unwrap(),
        encode(BOOT_A, store.claims()).unwrap(),
        "only the changed records were encoded again, and the file is still exact"
    );
    // Another instance's write (a rolling update) is read before this store's next change.
    let (mut other, _) = fx.open();
    other
        .start_prepare(&claim("u9"), &[allocated("gpu-9")])
        .unwrap();
    store
        .start_prepare(&claim("u4"), &[allocated("gpu-4")])
        .unwrap();
    let uids: Vec<&str> = store.claims().keys().map(|u| u.as_str()).collect();
    assert_eq!(uids, ["u2", "u3", "u4", "u9"]);
    assert_eq!(
        fs::read(fx.file()).unwrap(),
        encode(BOOT_A, store.claims()).unwrap()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_file_content_loads_without_panicking(content in proptest::collection::vec(any::<u8>(), 0..512)) {
        let fx = Fixture::new();
        fs::write(fx.file(), &content).unwrap();
        let (store, outcome) = fx.open();
        prop_assert!(matches!(outcome, LoadOutcome::Corrupt { .. }), "{:?}", outcome);
        prop_assert!(store.claims().is_empty());
    }

    #[test]
    fn mangled_json_never_panics(cut in 0usize..2000, flip in 0usize..2000) {
        let fx = Fixture::new();
        let (mut store, _) = fx.open();
        store.start_prepare(&claim("u1"), &[allocated("gpu-0")]).unwrap();
        store.complete_prepare("u1", &[prepared("gpu-0")], Some("f.json")).unwrap();
        drop(store);
        let mut good = fs::read(fx.file()).unwrap();
        let len = good.len();
        if flip < len {
            good[flip] ^= 0x20;
        }
        good.truncate(cut.min(len));
        fs::write(fx.file(), &good).unwrap();
        // Either it still loads (the change hit only formatting) or it is moved aside.
        let (store, outcome) = fx.open();
        match outcome {
            LoadOutcome::Loaded { claims } => prop_assert_eq!(claims, store.claims().len()),
            LoadOutcome::Corrupt { .. } => prop_assert!(store.claims().is_empty()),
            other => prop_assert!(false, "unexpected outcome {:?}", other),
        }
    }
}
