//! What is refused: hostile names before anything is written, the vendor, class and device name
//! rules, invalid content (the old file staying), annotation keys and version strings.

use super::*;
use crate::cdi::names::check_vendor_or_class;
use crate::cdi::validate::{MAX_ANNOTATIONS_BYTES, check_annotation_key, parse_version};

#[test]
fn hostile_names_are_rejected_before_anything_is_written() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    let long = "a".repeat(MAX_CLAIM_UID_LEN + 1);
    for bad in [
        "../x", "a/b", "", "..", "a..b", "-a", "a-", "a b", "a\0b", "ü", &long,
    ] {
        // The writer takes a checked `ClaimUid`: a hostile UID never becomes a path.
        let err = kubedev_core::ClaimUid::new(bad).unwrap_err();
        assert!(err.to_string().contains("claim UID"), "{bad:?}: {err}");
    }
    for good in [&*"a".repeat(MAX_CLAIM_UID_LEN), "0", "A:b_c.d-9"] {
        let file = w.claim_file(&cuid(good)).unwrap();
        assert_eq!(file.parent(), Some(dir.path()), "{good:?}");
    }

    for bad_share in [
        "../x",
        "a/b",
        "",
        "a..b",
        "-x",
        &"s".repeat(MAX_SHARE_ID_LEN + 1),
    ] {
        let mut p = prepared("gpu-0");
        p.device.share_id = Some(bad_share.to_owned());
        let err = w.write_claim(&cuid(UID), &[p]).unwrap_err();
        assert!(
            matches!(
                err,
                CdiError::InvalidName {
                    what: "share ID",
                    ..
                }
            ),
            "{bad_share:?}: {err:?}"
        );
    }
    assert!(
        !dir.path().exists() || dir.names().is_empty(),
        "{:?}",
        dir.names()
    );
}

#[test]
fn vendor_class_and_device_name_rules() {
    for ok in ["a", "k8s.gpu.example.com", "A_b-c.9"] {
        check_vendor_or_class("vendor", ok).unwrap();
    }
    for bad in ["", "9a", ".a", "a.", "a/b", "a=b", "a b"] {
        assert!(check_vendor_or_class("vendor", bad).is_err(), "{bad:?}");
    }
    for ok in ["0", "a", "uid-gpu-0", "x:y.z_w"] {
        validate_device_name(ok).unwrap();
    }
    for bad in ["", "-a", "a-", "a/b", "a=b", ":a", "a b"] {
        assert!(validate_device_name(bad).is_err(), "{bad:?}");
    }
    let spec = CdiSpec {
        cdi_version: "0.3.0".into(),
        kind: "noslash".into(),
        annotations: BTreeMap::new(),
        devices: Vec::new(),
        container_edits: CdiContainerEdits::default(),
    };
    let err = spec.validate().unwrap_err();
    assert!(
        matches!(err, CdiError::InvalidName { what: "kind", .. }),
        "{err:?}"
    );
}

#[test]
fn invalid_content_is_rejected_and_the_old_file_stays() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    let out = w.write_claim(&cuid(UID), &[prepared("gpu-0")]).unwrap();
    let path = out.file.unwrap();
    let before = fs::read(&path).unwrap();

    let mut cases: Vec<(PreparedDevice, &str)> = Vec::new();
    let mut p = prepared("gpu-0");
    p.edits.env.insert("A=B".into(), "1".into());
    cases.push((p, "environment"));
    let mut p = prepared("gpu-0");
    p.edits.env.insert(String::new(), "1".into());
    cases.push((p, "empty name"));
    let mut p = prepared("gpu-0");
    p.edits.device_nodes[0].permissions = Some("rwx".into());
    cases.push((p, "permissions"));
    let mut p = prepared("gpu-0");
    p.edits.device_nodes[0].path.clear();
    cases.push((p, "empty path"));
    let mut p = prepared("gpu-0");
    p.edits.hooks.push(Hook::new("beforeBoot", "/bin/true"));
    cases.push((p, "hook name"));
    let mut p = prepared("gpu-0");
    p.edits
        .hooks
        .push(Hook::new("poststop", "/bin/true").with_env(vec!["NOEQUALS".into()]));
    cases.push((p, "no '='"));
    let mut p = prepared("gpu-0");
    p.edits.mounts.push(Mount::bind("", "/x", true));
    cases.push((p, "empty host path"));
    let mut p = prepared("gpu-0");
    p.edits.annotations.insert("bad key!".into(), "v".into());
    cases.push((p, "annotation key"));
    let mut p = prepared("gpu-0");
    p.edits
        .annotations
        .insert("big".into(), "x".repeat(MAX_ANNOTATIONS_BYTES));
    cases.push((p, "bytes"));

    for (p, why) in cases {
        let err = w.write_claim(&cuid(UID), &[p]).unwrap_err();
        assert!(
            matches!(err, CdiError::InvalidContent { .. }),
            "{why}: {err:?}"
        );
        assert!(err.to_string().contains(why), "{why}: {err}");
        assert_eq!(fs::read(&path).unwrap(), before, "{why}: old file changed");
    }
    assert_eq!(dir.names().len(), 1);
}

#[test]
fn annotation_keys_follow_kubernetes_rules() {
    for ok in ["a", "gpu.example.com/model", "A_b.c-9", "Example.COM/x"] {
        check_annotation_key(ok).unwrap();
    }
    for bad in [
        "",
        "/a",
        "a/",
        "a/b/c",
        "-a",
        "a b",
        "bad_domain/x",
        &"n".repeat(64),
    ] {
        assert!(check_annotation_key(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn version_parsing() {
    assert_eq!(parse_version("0.5.0"), Some((0, 5, 0)));
    assert_eq!(parse_version("1.10.2"), Some((1, 10, 2)));
    for bad in ["", "1", "1.2", "1.2.3.4", "v1.2.3", "1.x.3"] {
        assert_eq!(parse_version(bad), None, "{bad:?}");
    }
}
