//! The files: a written spec reads back and validates, modes and temporary files, damaged specs
//! repaired without following links, removal and listing.

use super::*;

#[test]
fn written_spec_round_trips_and_validates() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    let devices = [prepared("gpu-0"), prepared("gpu-1")];
    let out = w.write_claim(&cuid(DIGIT_UID), &devices).unwrap();
    let text = fs::read(out.file.as_ref().unwrap()).unwrap();
    let parsed: CdiSpec = serde_json::from_slice(&text).unwrap();
    let (built, ids) = w.claim_spec(&cuid(DIGIT_UID), &devices).unwrap();
    assert_eq!(Some(&parsed), built.as_ref());
    assert_eq!(ids, out.device_ids);
    parsed.validate().unwrap();
    assert_eq!(parsed.devices.len(), 2);
    assert_eq!(parsed.devices[1].name, format!("{DIGIT_UID}-gpu-1"));
    assert_eq!(parsed.kind, w.kind());
}

#[test]
fn files_are_0644_and_no_temporary_file_remains() {
    let dir = TestDir::new("cdi");
    let cdi_dir = dir.path().join("run").join("cdi");
    let w = writer(&cdi_dir);
    let out = w.write_claim(&cuid(UID), &[prepared("gpu-0")]).unwrap();
    w.write_claim(&cuid(UID), &[prepared("gpu-1")]).unwrap();
    let path = out.file.unwrap();
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o644);
    let names: Vec<_> = fs::read_dir(&cdi_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, [format!("k8s.gpu.example.com-claim_{UID}.json")]);
    let spec: CdiSpec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        spec.devices[0].name,
        format!("{UID}-gpu-1"),
        "rewritten in place"
    );
}

/// Every kind of damage to a spec kubedev owns is found and repaired in place; a link's
/// target is never written.
#[test]
fn damaged_specs_are_rewritten_and_links_never_followed() {
    let dir = TestDir::new("cdi-damage");
    let cdi_dir = dir.path().join("cdi");
    let w = writer(&cdi_dir);
    let devices = [prepared("gpu-0"), prepared("gpu-1")];
    let path = w.write_claim(&cuid(UID), &devices).unwrap().file.unwrap();
    let good = fs::read(&path).unwrap();
    assert_eq!(
        w.ensure_claim(&cuid(UID), &devices).unwrap(),
        SpecCheck::Intact
    );
    let victim = dir.path().join("victim");
    fs::write(&victim, "not a spec").unwrap();

    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "missing",
            Box::new(|p: &Path| fs::remove_file(p).unwrap()),
            "no file",
        ),
        (
            "truncated",
            Box::new(|p: &Path| {
                let f = fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(300).unwrap();
            }),
            "truncated",
        ),
        (
            "garbage",
            Box::new(|p: &Path| fs::write(p, vec![0xffu8; 2000]).unwrap()),
            "other content",
        ),
        (
            "other spec",
            Box::new(|p: &Path| fs::write(p, b"{}").unwrap()),
            "truncated or different",
        ),
        (
            "directory",
            Box::new(|p: &Path| {
                fs::remove_file(p).unwrap();
                fs::create_dir(p).unwrap();
                fs::write(p.join("inside"), "x").unwrap();
            }),
            "a directory",
        ),
        (
            "symlink",
            Box::new({
                let victim = victim.clone();
                move |p: &Path| {
                    fs::remove_file(p).unwrap();
                    std::os::unix::fs::symlink(&victim, p).unwrap();
                }
            }),
            "a symbolic link",
        ),
        (
            "fifo",
            Box::new(|p: &Path| {
                fs::remove_file(p).unwrap();
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    p,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o644),
                    0,
                )
                .unwrap();
            }),
            "FIFO",
        ),
    ];
    for (what, damage, found) in cases {
        damage(&path);
        match w.ensure_claim(&cuid(UID), &devices).unwrap() {
            SpecCheck::Repaired { found: f } => assert!(f.contains(found), "{what}: {f}"),
            other => panic!("{what}: {other:?}"),
        }
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file(), "{what}: not a regular file after repair");
        assert_eq!(meta.permissions().mode() & 0o777, 0o644, "{what}");
        assert_eq!(fs::read(&path).unwrap(), good, "{what}");
        assert_eq!(
            w.ensure_claim(&cuid(UID), &devices).unwrap(),
            SpecCheck::Intact,
            "{what}"
        );
    }
    assert_eq!(fs::read_to_string(&victim).unwrap(), "not a spec");
    // The directory was moved aside, under a name no container runtime reads as a spec.
    let listed: Vec<_> = w.list_claim_files().unwrap();
    assert_eq!(listed, [(UID.to_string(), path.clone())]);
}

#[test]
fn remove_and_list_claim_files() {
    let dir = TestDir::new("cdi");
    let w = writer(dir.path());
    assert!(w.list_claim_files().unwrap().is_empty());
    assert!(
        !w.remove_claim(&cuid(UID)).unwrap(),
        "absent file is success"
    );
    w.write_claim(&cuid(UID), &[prepared("gpu-0")]).unwrap();
    w.write_claim(&cuid(DIGIT_UID), &[prepared("gpu-1")])
        .unwrap();
    // Files that are not ours.
    let other = writer(dir.path().join("unused").as_path());
    assert_ne!(other.dir(), w.dir());
    CdiWriter::new(dir.path(), &DriverName::new("other.example.com").unwrap())
        .write_claim(&cuid(UID), &[prepared("gpu-0")])
        .unwrap();
    fs::write(
        dir.path().join("k8s.gpu.example.com-claim_bad..uid.json"),
        b"{}",
    )
    .unwrap();
    fs::write(dir.path().join("k8s.gpu.example.com-claim_x.yaml"), b"{}").unwrap();
    fs::write(dir.path().join("vendor.json"), b"{}").unwrap();
    fs::write(
        dir.path()
            .join(format!(".k8s.gpu.example.com-claim_{UID}.json.tmp-1-2-3")),
        b"{",
    )
    .unwrap();

    let listed = w.list_claim_files().unwrap();
    let mut expected = vec![
        (UID.to_string(), w.claim_file(&cuid(UID)).unwrap()),
        (
            DIGIT_UID.to_string(),
            w.claim_file(&cuid(DIGIT_UID)).unwrap(),
        ),
    ];
    expected.sort();
    assert_eq!(listed, expected);

    assert!(w.remove_claim(&cuid(UID)).unwrap());
    assert!(!w.claim_file(&cuid(UID)).unwrap().exists());
    assert!(!w.remove_claim(&cuid(UID)).unwrap());
    assert_eq!(w.list_claim_files().unwrap().len(), 1);

    let removed = w.remove_stale_temp_files(Duration::ZERO).unwrap();
    assert_eq!(removed.len(), 1);
    assert!(removed[0].to_string_lossy().contains(".tmp-"));
    assert!(
        w.remove_stale_temp_files(Duration::ZERO)
            .unwrap()
            .is_empty()
    );
    // The other driver's file is untouched.
    assert!(
        dir.path()
            .join(format!("k8s.other.example.com-claim_{UID}.json"))
            .exists()
    );
}
