//! The driver's user-space files in containers: found for the version NVML reports, and found
//! again for the new version when the driver is upgraded under a running backend.

use std::path::Path;

use kubedev_core::{AllocatedDevice, Consumer, DeviceName, DeviceRef, DeviceSource, Preparer};

use super::Fixture;

/// Installs driver `version`'s libraries and firmware under the fake host root's `/`, as the
/// installer does, and the kernel module's version in sysfs.
fn install(root: &Path, version: &str) {
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join(format!("libcuda.so.{version}")), version).unwrap();
    let link = lib.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(format!("libcuda.so.{version}"), &link).unwrap();
    std::fs::create_dir_all(root.join(format!("lib/firmware/nvidia/{version}"))).unwrap();
    std::fs::create_dir_all(root.join("sys/module/nvidia")).unwrap();
    std::fs::write(
        root.join("sys/module/nvidia/version"),
        format!("{version}\n"),
    )
    .unwrap();
}

fn mounted(edits: &kubedev_core::ContainerEdits) -> Vec<String> {
    edits
        .mounts
        .iter()
        .map(|m| m.container_path.clone())
        .collect()
}

#[tokio::test]
async fn an_upgraded_driver_gives_prepared_devices_the_new_versions_files() {
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let machine = dir.path().join("machine.yaml");
    let original = std::fs::read_to_string(nvml_mock::machine_path("workstation")).unwrap();
    assert!(original.contains("550.54.15"));
    std::fs::write(&machine, &original).unwrap();
    let fx = Fixture::with_machine_file(&machine);
    let root = fx.ctx.host.root().to_path_buf();
    install(&root, "550.54.15");
    let backend = fx.backend(fx.config());
    backend.discover().await.unwrap();

    let device = DeviceRef::new(
        backend.pool_name().clone(),
        DeviceName::new("gpu-0").unwrap(),
    );
    let prepared = backend
        .prepare(
            &Consumer::Container {
                resource: "nvidia.com/gpu".into(),
            },
            &[AllocatedDevice::new(device.clone())],
        )
        .await
        .unwrap()
        .remove(0);
    let paths = mounted(&prepared.edits);
    for want in [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/lib/firmware/nvidia/550.54.15",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} in {paths:?}");
    }
    assert_eq!(
        backend.refreshed_edits(&prepared).await.unwrap(),
        None,
        "nothing changed yet"
    );
    // `cdi generate` gives the device what prepare gave it.
    assert_eq!(
        backend.planned_edits(&device).await.unwrap().as_ref(),
        Some(&prepared.edits)
    );

    // The driver is upgraded: new files, the module reports the new version, and NVML (read
    // again by the backend, as after a reload) reports it too.
    std::fs::write(&machine, original.replace("550.54.15", "560.35.03")).unwrap();
    install(&root, "560.35.03");
    backend.discover().await.unwrap();
    let fresh = backend
        .refreshed_edits(&prepared)
        .await
        .unwrap()
        .expect("the edits changed");
    let paths = mounted(&fresh);
    assert!(
        paths
            .iter()
            .any(|p| p == "/usr/lib/x86_64-linux-gnu/libcuda.so.560.35.03"),
        "{paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.contains("550.54.15")),
        "no file of the old version: {paths:?}"
    );
    assert_eq!(
        fresh.device_nodes, prepared.edits.device_nodes,
        "the device is the same"
    );
    assert_eq!(fresh.env, prepared.edits.env);
}
