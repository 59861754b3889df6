//! The podman harness itself, against the real podman: a hand-written spec with every kind of
//! edit is applied and passes the check; the same container checked against a spec that says
//! something else fails on each difference; fake nodes never reach the host's `/dev`; nothing
//! is left behind.
#![allow(clippy::unwrap_used)]

use kubedev_testkit::podman::{Container, FakeNode, Podman, PodmanError, SPEC_DIR};
use serde_json::json;

fn spec(dir: &std::path::Path, kind: &str, env: &str, major: u32, ro: bool) -> String {
    let opts = if ro {
        json!(["ro", "nosuid", "nodev", "bind"])
    } else {
        json!(["rw", "bind"])
    };
    json!({
        "cdiVersion": "0.5.0",
        "kind": kind,
        "containerEdits": {"env": ["SPEC_LEVEL=yes"]},
        "devices": [{"name": "dev0", "containerEdits": {
            "env": [format!("DEV0={env}")],
            "deviceNodes": [
                {"path": "/dev/kubedev-harness/fake0", "permissions": "rw"},
                {"path": "/dev/fake1", "type": "c", "major": major, "minor": 5, "fileMode": 384}
            ],
            "mounts": [
                {"hostPath": dir.join("ro.txt"), "containerPath": "/usr/local/lib/ro.txt", "options": opts},
                {"hostPath": dir.join("rwdir"), "containerPath": "/mnt/rw", "options": ["rw", "bind"]}
            ]
        }}]
    })
    .to_string()
}

#[test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
fn a_spec_is_applied_and_checked_inside_the_container() {
    let podman = Podman::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ro.txt"), "read me\n").unwrap();
    std::fs::create_dir(dir.path().join("rwdir")).unwrap();
    std::fs::write(dir.path().join("rwdir/a"), "").unwrap();
    let kind = format!("harness.kubedev.test/probe{}", std::process::id());
    let good = spec(dir.path(), &kind, "a b", 1, true);
    let installed = podman.install_spec(&good).unwrap();
    assert!(installed.path().starts_with(SPEC_DIR));
    let node = FakeNode::char("/dev/kubedev-harness/fake0", 240, 12);
    let script =
        "stat -c 'fake0=%F %t:%T' /dev/kubedev-harness/fake0; touch /mnt/rw/from-container";
    let (ids, names) = (installed.device_ids(), installed.device_names());
    let run = |checked: &str| {
        podman
            .run(
                Container::new(script)
                    .devices(&ids)
                    .node(node.clone())
                    .check(checked, &names),
            )
            .unwrap()
    };

    let out = run(&good);
    out.assert_ok();
    assert_eq!(out.value("fake0"), Some("character special file f0:c"));
    assert!(dir.path().join("rwdir/from-container").exists(), "rw mount");
    assert!(
        !std::path::Path::new("/dev/kubedev-harness").exists(),
        "the fake node stays in the namespace"
    );

    // Checked against what the spec does not say, the same container fails on each point.
    std::fs::remove_file(dir.path().join("rwdir/from-container")).unwrap();
    let other = spec(dir.path(), &kind, "other", 2, true);
    let fails = run(&other).failures().to_vec();
    assert_eq!(fails.len(), 2, "{fails:#?}");
    assert!(
        fails[0].contains("/dev/fake1: expected a character device 2:5"),
        "{fails:#?}"
    );
    assert!(
        fails[1].contains("env DEV0 should be \"other\""),
        "{fails:#?}"
    );
    drop(installed);

    // A mount the spec makes read-write fails a check that expects it read-only.
    std::fs::remove_file(dir.path().join("rwdir/from-container")).unwrap();
    let rw = spec(dir.path(), &kind, "a b", 1, false);
    let installed = podman.install_spec(&rw).unwrap();
    let fails = run(&good).failures().to_vec();
    assert_eq!(fails.len(), 1, "{fails:#?}");
    assert!(fails[0].contains("options say ro"), "{fails:#?}");
    let path = installed.path().to_path_buf();
    drop(installed);
    assert!(!path.exists());
}

#[test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
fn specs_podman_cannot_read_are_refused_by_name() {
    let podman = Podman::new().unwrap();
    let newer = json!({"cdiVersion": "0.6.0", "kind": "harness.kubedev.test/new",
        "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}]})
    .to_string();
    match podman.install_spec(&newer) {
        Err(PodmanError::UnsupportedCdiVersion { version, .. }) => assert_eq!(version, "0.6.0"),
        other => panic!("{other:?}"),
    }
    // And an unknown device makes podman fail, with its reason on stderr.
    let out = podman
        .run(Container::new("true").device("harness.kubedev.test/none=d"))
        .unwrap();
    assert!(!out.success());
    assert!(
        out.stderr.contains("unresolvable CDI devices"),
        "{}",
        out.report()
    );
}
