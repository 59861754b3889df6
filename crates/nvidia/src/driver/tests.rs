use std::os::unix::fs::{PermissionsExt as _, symlink};

use super::*;

const V: &str = "550.54.15";

/// A driver root as the NVIDIA installer leaves it, under `base` + `root`.
fn install(base: &Path, root: &str, libdir: &str) -> PathBuf {
    let r = base.join(root.trim_start_matches('/'));
    let lib = r.join(libdir);
    std::fs::create_dir_all(lib.join("vdpau")).unwrap();
    for name in [
        "libcuda",
        "libnvidia-ml",
        "libnvidia-ptxjitcompiler",
        "libnvidia-gpucomp",
    ] {
        std::fs::write(lib.join(format!("{name}.so.{V}")), name).unwrap();
    }
    symlink(format!("libcuda.so.{V}"), lib.join("libcuda.so.1")).unwrap();
    symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
    symlink(
        format!("libnvidia-ptxjitcompiler.so.{V}"),
        lib.join("libnvidia-ptxjitcompiler.so.1"),
    )
    .unwrap();
    // Another version's leftovers and an unrelated library are not mounted.
    std::fs::write(lib.join("libcuda.so.535.1.1"), "old").unwrap();
    std::fs::write(lib.join("libz.so.1"), "z").unwrap();
    std::fs::write(lib.join(format!("vdpau/libvdpau_nvidia.so.{V}")), "vdpau").unwrap();
    let bin = r.join("usr/bin");
    std::fs::create_dir_all(&bin).unwrap();
    for b in ["nvidia-smi", "nvidia-cuda-mps-control"] {
        elf(&bin.join(b));
    }
    // Not executable: not a tool.
    std::fs::write(bin.join("nvidia-debugdump"), "").unwrap();
    std::fs::create_dir_all(r.join(format!("lib/firmware/nvidia/{V}"))).unwrap();
    std::fs::write(
        r.join(format!("lib/firmware/nvidia/{V}/gsp_ga10x.bin")),
        "fw",
    )
    .unwrap();
    std::fs::create_dir_all(r.join("run/nvidia-persistenced")).unwrap();
    std::fs::write(r.join("run/nvidia-persistenced/socket"), "").unwrap();
    r
}

/// An executable that looks like an ELF program.
fn elf(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, b"\x7fELF\x02\x01\x01").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn mounts(e: &ContainerEdits) -> Vec<(String, String)> {
    e.mounts
        .iter()
        .map(|m| (m.host_path.clone(), m.container_path.clone()))
        .collect()
}

#[test]
fn a_driver_root_gives_its_versioned_libraries_under_every_name_tools_firmware_and_sockets() {
    let base = tempfile::tempdir().unwrap();
    install(
        base.path(),
        "/run/nvidia/driver",
        "usr/lib/x86_64-linux-gnu",
    );
    let host = HostFs::new(base.path());
    let files = DriverLocation {
        host: &host,
        root: Path::new("/run/nvidia/driver"),
        layout: LibraryLayout::Host,
        hook: None,
    }
    .find(V);
    let names: Vec<&str> = files.libraries.iter().map(|l| l.name.as_str()).collect();
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    assert_eq!(
        names,
        [
            format!("libcuda.so.{V}"),
            format!("libnvidia-gpucomp.so.{V}"),
            format!("libnvidia-ml.so.{V}"),
            format!("libnvidia-ptxjitcompiler.so.{V}"),
            format!("libvdpau_nvidia.so.{V}"),
        ]
    );
    let cuda = &files.libraries[0];
    assert_eq!(cuda.aliases, ["libcuda.so", "libcuda.so.1"]);
    assert_eq!(files.libraries[2].aliases, ["libnvidia-ml.so.1"], "always");
    let m = mounts(&files.edits());
    let lib = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu";
    for (host, container) in [
        (
            format!("{lib}/libcuda.so.{V}"),
            format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{V}"),
        ),
        (
            format!("{lib}/libcuda.so.{V}"),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        ),
        (
            format!("{lib}/libcuda.so.{V}"),
            "/usr/lib/x86_64-linux-gnu/libcuda.so".into(),
        ),
        (
            format!("{lib}/vdpau/libvdpau_nvidia.so.{V}"),
            format!("/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.{V}"),
        ),
        (
            "/run/nvidia/driver/usr/bin/nvidia-smi".into(),
            "/usr/bin/nvidia-smi".into(),
        ),
        (
            format!("/run/nvidia/driver/lib/firmware/nvidia/{V}"),
            format!("/lib/firmware/nvidia/{V}"),
        ),
        (
            "/run/nvidia/driver/run/nvidia-persistenced/socket".into(),
            "/run/nvidia-persistenced/socket".into(),
        ),
    ] {
        assert!(
            m.contains(&(host.clone(), container.clone())),
            "{host} -> {container} missing from {m:#?}"
        );
    }
    assert!(
        !m.iter()
            .any(|(h, _)| h.contains("535") || h.contains("libz"))
    );
    let all = files.edits();
    let smi = all
        .mounts
        .iter()
        .find(|m| m.container_path == "/usr/bin/nvidia-smi")
        .unwrap();
    assert!(smi.is_read_only(), "{smi:?}");
    let sock = all
        .mounts
        .iter()
        .find(|m| m.container_path.ends_with("socket"))
        .unwrap();
    assert!(!sock.is_read_only(), "clients connect: {sock:?}");
    assert!(all.hooks.is_empty());
    assert_eq!(
        files.binaries.len(),
        2,
        "nvidia-debugdump is not executable"
    );
    assert!(
        files.missing.iter().any(|m| m.contains("nvidia-debugdump"))
            && files
                .missing
                .iter()
                .any(|m| m.contains("nvidia-persistenced")),
        "{:?}",
        files.missing
    );
}

#[test]
fn the_cuda_image_layout_and_hooks() {
    let base = tempfile::tempdir().unwrap();
    // A cloud image's layout: the driver under /usr/local/nvidia with lib64 and bin.
    install(base.path(), "/usr/local/nvidia", "lib64");
    let hook = base.path().join("usr/bin/nvidia-cdi-hook");
    elf(&hook);
    // The tool beside the libraries wins over a wrapper script on the PATH that runs it (as
    // some cloud images have in /usr/bin).
    elf(&base.path().join("usr/local/nvidia/bin/nvidia-debugdump"));
    let wrapper = base
        .path()
        .join("usr/local/nvidia/usr/bin/nvidia-persistenced");
    std::fs::write(&wrapper, "#!/bin/sh\nexec /elsewhere \"$@\"\n").unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let host = HostFs::new(base.path());
    let loc = DriverLocation {
        host: &host,
        root: Path::new("/usr/local/nvidia"),
        layout: LibraryLayout::UsrLocalNvidia,
        hook: None,
    };
    let files = loc.find(V);
    let m = mounts(&files.edits());
    assert!(m.contains(&(
        format!("/usr/local/nvidia/lib64/libcuda.so.{V}"),
        "/usr/local/nvidia/lib64/libcuda.so.1".into()
    )));
    assert!(m.contains(&(
        "/usr/local/nvidia/usr/bin/nvidia-smi".into(),
        "/usr/local/nvidia/bin/nvidia-smi".into()
    )));
    assert!(m.contains(&(
        "/usr/local/nvidia/bin/nvidia-debugdump".into(),
        "/usr/local/nvidia/bin/nvidia-debugdump".into()
    )));
    assert!(
        files
            .missing
            .iter()
            .any(|m| m.contains("nvidia-persistenced (only a script")),
        "{:?}",
        files.missing
    );

    // With the hook the libraries are mounted once and linked and cached by it.
    let files = DriverLocation {
        hook: Some(Path::new("/usr/bin/nvidia-cdi-hook")),
        layout: LibraryLayout::Host,
        ..loc.clone()
    }
    .find(V);
    let e = files.edits();
    assert!(
        !e.mounts
            .iter()
            .any(|m| m.container_path.ends_with("libcuda.so.1")),
        "{e:#?}"
    );
    assert_eq!(e.hooks.len(), 2);
    assert_eq!(e.hooks[0].path, "/usr/bin/nvidia-cdi-hook");
    assert_eq!(e.hooks[0].hook_name, "createContainer");
    assert!(
        e.hooks[0]
            .args
            .contains(&format!("libcuda.so.{V}::/lib64/libcuda.so.1")),
        "{:?}",
        e.hooks[0].args
    );
    assert_eq!(
        e.hooks[1].args,
        [
            "nvidia-cdi-hook",
            "update-ldcache",
            "--folder",
            "/lib64",
            "--folder",
            "/lib64/vdpau"
        ]
    );

    // A hook that is not there is left out and said.
    let files = DriverLocation {
        hook: Some(Path::new("/opt/missing/nvidia-cdi-hook")),
        ..loc
    }
    .find(V);
    assert!(files.hook.is_none());
    assert!(files.edits().hooks.is_empty());
    assert!(files.missing.iter().any(|m| m.contains("/opt/missing")));
}

#[test]
fn nothing_installed_or_a_hostile_version_gives_no_files_and_says_why() {
    let base = tempfile::tempdir().unwrap();
    let host = HostFs::new(base.path());
    let loc = DriverLocation {
        host: &host,
        root: Path::new("/"),
        layout: LibraryLayout::Host,
        hook: None,
    };
    let files = loc.find(V);
    assert!(files.is_empty());
    assert!(files.edits().is_empty());
    assert!(
        files.missing.iter().any(|m| m.contains("libcuda.so.550")),
        "{:?}",
        files.missing
    );
    for bad in ["../../etc", "", "1/2"] {
        let files = loc.find(bad);
        assert!(files.is_empty());
        assert!(files.missing[0].contains("not a plain version"), "{bad}");
    }
}

#[test]
fn links_in_the_driver_root_are_followed_inside_the_host_root() {
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    // The driver root is an absolute link on the host (`/opt/nvidia -> /drivers/580`), as a
    // driver container's mount may be: it must be read in the host root, not in kubedev's own
    // file system.
    install(base.path(), "/drivers/580", "usr/lib/x86_64-linux-gnu");
    elf(&base.path().join("drivers/580/usr/bin/nvidia-debugdump"));
    std::fs::create_dir_all(base.path().join("opt")).unwrap();
    symlink("/drivers/580", base.path().join("opt/nvidia")).unwrap();
    let host = HostFs::new(base.path());
    let files = DriverLocation {
        host: &host,
        root: Path::new("/opt/nvidia"),
        layout: LibraryLayout::Host,
        hook: None,
    }
    .find(V);
    let cuda = files
        .libraries
        .iter()
        .find(|l| l.name == format!("libcuda.so.{V}"))
        .unwrap_or_else(|| panic!("{files:?}"));
    assert_eq!(
        cuda.host_path,
        Path::new("/drivers/580/usr/lib/x86_64-linux-gnu").join(&cuda.name)
    );
    assert_eq!(
        cuda.container_dir,
        Path::new("/usr/lib/x86_64-linux-gnu"),
        "the driver root is taken off where its link leads too"
    );
    let tools: Vec<_> = files
        .binaries
        .iter()
        .map(|(h, c)| (h.display().to_string(), c.display().to_string()))
        .collect();
    assert!(
        tools.contains(&(
            "/drivers/580/usr/bin/nvidia-debugdump".into(),
            "/usr/bin/nvidia-debugdump".into()
        )),
        "{tools:?}"
    );
}
