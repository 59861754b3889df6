//! Tests of host path resolution, reading and writing, and the sysfs parsers.

use super::*;
use std::os::unix::fs::symlink;

fn tree() -> (tempfile::TempDir, HostFs) {
    let d = tempfile::tempdir().unwrap();
    let fs = HostFs::new(d.path());
    let dev = d
        .path()
        .join("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
    std::fs::create_dir_all(d.path().join("sys/bus/pci/devices")).unwrap();
    std::fs::create_dir_all(d.path().join("sys/bus/pci/drivers/vfio-pci")).unwrap();
    std::fs::create_dir_all(d.path().join("sys/kernel/iommu_groups/12")).unwrap();
    symlink(
        "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
        d.path().join("sys/bus/pci/devices/0000:01:00.0"),
    )
    .unwrap();
    symlink("../../../../bus/pci/drivers/vfio-pci", dev.join("driver")).unwrap();
    symlink(
        "../../../../kernel/iommu_groups/12",
        dev.join("iommu_group"),
    )
    .unwrap();
    (d, fs)
}

#[test]
fn pci_placement_of_sysfs_paths() {
    let usb = Path::new("/sys/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1.4");
    assert_eq!(pcie_root_of(usb).as_deref(), Some("pci0000:00"));
    assert_eq!(
        pci_function_of(usb),
        Some(PathBuf::from("/sys/devices/pci0000:00/0000:00:14.0"))
    );
    let gpu = Path::new("/sys/devices/pci10000:3a/10000:3a:00.0/10000:3b:00.0");
    assert_eq!(pcie_root_of(gpu).as_deref(), Some("pci10000:3a"));
    assert_eq!(pci_function_of(gpu), Some(gpu.to_path_buf()));
    let virt = Path::new("/sys/devices/platform/dummy_hcd.0/usb3/3-1");
    assert_eq!(pcie_root_of(virt), None);
    assert_eq!(pci_function_of(virt), None);
    assert_eq!(pcie_root_of(Path::new("/sys/devices/pcifoo")), None);
    assert_eq!(
        pci_function_of(Path::new("/sys/devices/pci0000:00/0000:00:14.8")),
        None
    );
}

#[test]
fn presence_tells_missing_from_cannot_tell() {
    let (d, fs) = tree();
    assert_eq!(
        fs.presence("/sys/bus/pci/devices/0000:01:00.0/vendor").ok(),
        Some(true)
    );
    assert_eq!(
        fs.presence("/sys/bus/pci/devices/0000:02:00.0").ok(),
        Some(false)
    );
    // A file where a directory should be: absent too.
    assert_eq!(
        fs.presence("/sys/bus/pci/devices/0000:01:00.0/vendor/x")
            .ok(),
        Some(false)
    );
    // A link loop: nobody can tell.
    symlink("loop", d.path().join("loop")).unwrap();
    let err = fs.presence("/loop").unwrap_err();
    assert!(err.to_string().contains("symbolic links"), "{err}");
}

#[test]
fn relative_links_resolve_like_sysfs() {
    let (_d, fs) = tree();
    assert_eq!(
        fs.canonicalize("/sys/bus/pci/devices/0000:01:00.0")
            .unwrap(),
        PathBuf::from("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0")
    );
    assert_eq!(
        fs.read_hex("/sys/bus/pci/devices/0000:01:00.0/vendor")
            .unwrap(),
        0x10de
    );
    assert_eq!(
        fs.read_dec("/sys/bus/pci/devices/0000:01:00.0/numa_node")
            .unwrap(),
        -1
    );
    assert_eq!(
        fs.read_link_name("/sys/bus/pci/devices/0000:01:00.0/driver")
            .unwrap(),
        "vfio-pci"
    );
    assert_eq!(
        fs.read_link_name("/sys/bus/pci/devices/0000:01:00.0/iommu_group")
            .unwrap(),
        "12"
    );
    assert_eq!(
        fs.canonicalize("/sys/bus/pci/devices/0000:01:00.0/iommu_group")
            .unwrap(),
        PathBuf::from("/sys/kernel/iommu_groups/12")
    );
}

#[test]
fn absolute_links_and_dotdot_stay_inside_the_root() {
    let (d, fs) = tree();
    // A link to the machine's real /etc stays in the fake root's /etc.
    std::fs::create_dir_all(d.path().join("etc")).unwrap();
    std::fs::write(d.path().join("etc/hostname"), "fake\n").unwrap();
    symlink("/etc/hostname", d.path().join("sys/escape")).unwrap();
    assert_eq!(fs.read_attr("/sys/escape").unwrap(), "fake");
    symlink(
        "../../../../../../../../etc/hostname",
        d.path().join("sys/escape2"),
    )
    .unwrap();
    assert_eq!(fs.read_attr("/sys/escape2").unwrap(), "fake");
    assert_eq!(fs.read_attr("/../../etc/hostname").unwrap(), "fake");
    assert!(fs.join("/../x").starts_with(d.path()));
}

#[test]
fn loops_and_missing_files_are_errors_naming_the_host_path() {
    let (d, fs) = tree();
    symlink("b", d.path().join("sys/a")).unwrap();
    symlink("a", d.path().join("sys/b")).unwrap();
    let e = fs.read_attr("/sys/a").unwrap_err();
    assert!(matches!(e, HostFsError::Loop { .. }), "{e}");
    assert!(e.to_string().contains("/sys/a"), "{e}");
    let e = fs
        .read_attr("/sys/bus/pci/devices/0000:01:00.0/missing")
        .unwrap_err();
    assert!(e.is_not_found());
    assert!(
        crate::echo::chain(&e)
            .starts_with("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/missing"),
        "{e}"
    );
    assert_eq!(fs.read_attr_opt("/sys/nothing/here").unwrap(), None);
    assert!(!fs.exists("/sys/nothing"));
    assert!(fs.exists("/sys/bus/pci/devices/0000:01:00.0"));
}

#[test]
fn parse_errors_name_file_and_value() {
    let (d, fs) = tree();
    std::fs::write(d.path().join("sys/bad"), "zz\n").unwrap();
    let e = fs.read_hex("/sys/bad").unwrap_err();
    assert_eq!(
        crate::echo::chain(&e),
        "/sys/bad: \"zz\" is not a hexadecimal number"
    );
    let e = fs.read_dec("/sys/bad").unwrap_err();
    assert!(e.to_string().contains("decimal"), "{e}");
}

#[test]
fn list_and_write() {
    let (d, fs) = tree();
    assert_eq!(
        fs.list_dir("/sys/bus/pci/devices").unwrap(),
        vec!["0000:01:00.0"]
    );
    let p = d
        .path()
        .join("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/driver_override");
    std::fs::write(&p, "(null)\n").unwrap();
    fs.write_attr(
        "/sys/bus/pci/devices/0000:01:00.0/driver_override",
        "vfio-pci",
    )
    .unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "vfio-pci");
    let e = fs
        .write_attr("/sys/bus/pci/devices/0000:01:00.0/nope", "x")
        .unwrap_err();
    assert!(e.is_not_found());
}

#[test]
fn number_parsers() {
    assert_eq!(parse_hex("0x10DE\n"), Some(0x10de));
    assert_eq!(parse_hex("046d"), Some(0x046d));
    assert_eq!(parse_hex("0x"), None);
    assert_eq!(parse_hex(""), None);
    assert_eq!(parse_hex("+1"), None);
    assert_eq!(parse_hex("0x10000000000000000"), None);
    assert_eq!(parse_dec("-1\n"), Some(-1));
    assert_eq!(parse_dec("12"), Some(12));
    assert_eq!(parse_dec("-"), None);
    assert_eq!(parse_dec("+3"), None);
    assert_eq!(parse_dec("99999999999999999999"), None);
}

#[test]
fn uevent() {
    let u = parse_uevent("MAJOR=189\nMINOR=1\nDEVNAME=bus/usb/001/002\nDEVTYPE=usb_device\n\nPRODUCT=46d/c52b/1201\n").unwrap();
    assert_eq!(u["DEVNAME"], "bus/usb/001/002");
    assert_eq!(u["PRODUCT"], "46d/c52b/1201");
    let e = parse_uevent("A=1\nnonsense\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(parse_uevent("=x").is_err());
    assert!(parse_uevent("A B=x").is_err());
    assert_eq!(parse_uevent("A=b=c").unwrap()["A"], "b=c");
}

proptest::proptest! {
    #[test]
    fn parsers_never_panic(s in "\\PC*") {
        let _ = parse_hex(&s);
        let _ = parse_dec(&s);
        let _ = parse_uevent(&s);
    }
}
