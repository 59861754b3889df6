//! Tests of the PCI machines: sysfs links, SR-IOV links both ways, the kernel simulator,
//! generated machines.

use std::path::Path;
use std::time::Duration;

use super::kernel_sim::link_name;
use super::*;

#[test]
fn gpu_server_links_look_like_sysfs() {
    let root = dual_socket_gpu_server().unwrap();
    let link = std::fs::read_link(root.join("/sys/bus/pci/devices/0000:3b:00.0")).unwrap();
    assert_eq!(
        link,
        Path::new("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    );
    let dev = root.join("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
    assert_eq!(
        std::fs::read_link(dev.join("iommu_group")).unwrap(),
        Path::new("../../../../kernel/iommu_groups/20")
    );
    assert_eq!(
        std::fs::read_link(dev.join("driver")).unwrap(),
        Path::new("../../../../bus/pci/drivers/vfio-pci")
    );
    // The links resolve inside the root.
    assert!(
        root.join("/sys/bus/pci/devices/0000:3b:00.0/vendor")
            .exists()
    );
    assert!(
        root.join("/sys/bus/pci/devices/0000:3b:00.0/iommu_group/type")
            .exists()
    );
    assert!(
        root.join("/sys/bus/pci/devices/0000:3b:00.0/driver/bind")
            .exists()
    );
    assert!(
        root.join("/sys/kernel/iommu_groups/20/devices/0000:3b:00.0/vendor")
            .exists()
    );
    for g in [20, 30, 40, 50] {
        assert!(root.join(format!("/dev/vfio/{g}")).exists());
    }
    assert!(!root.join("/dev/vfio/2").exists(), "nvme is not on vfio");
    assert!(root.join("/dev/vfio/vfio").exists());
}

#[test]
fn sriov_links_point_both_ways() {
    let root = sriov_nic().unwrap();
    let vf = root.join("/sys/bus/pci/devices/0000:5e:02.3");
    assert_eq!(
        std::fs::read_link(vf.join("physfn")).unwrap(),
        Path::new("../0000:5e:00.0")
    );
    assert!(vf.join("physfn/sriov_totalvfs").exists());
    let pf = root.join("/sys/bus/pci/devices/0000:5e:00.0");
    assert_eq!(
        std::fs::read_link(pf.join("virtfn3")).unwrap(),
        Path::new("../0000:5e:02.3")
    );
    assert_eq!(
        std::fs::read_to_string(pf.join("sriov_numvfs")).unwrap(),
        "8\n"
    );
}

#[test]
fn kernel_sim_rebinds_and_restores() {
    let root = sriov_nic().unwrap();
    let sim = PciKernelSim::start(root.path());
    let pf = root.join("/sys/bus/pci/devices/0000:5e:00.0");
    let wait = |want: Option<&str>| {
        for _ in 0..2000 {
            if link_name(&pf.join("driver")).as_deref() == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("driver never became {want:?}");
    };
    std::fs::write(pf.join("driver_override"), "vfio-pci").unwrap();
    std::fs::write(
        root.join("/sys/bus/pci/drivers/i40e/unbind"),
        "0000:5e:00.0",
    )
    .unwrap();
    wait(None);
    std::fs::write(root.join("/sys/bus/pci/drivers_probe"), "0000:5e:00.0").unwrap();
    wait(Some(VFIO_PCI));
    assert!(root.join("/dev/vfio/30").exists());
    std::fs::write(pf.join("driver_override"), "\n").unwrap();
    std::fs::write(
        root.join("/sys/bus/pci/drivers/vfio-pci/unbind"),
        "0000:5e:00.0",
    )
    .unwrap();
    wait(None);
    assert!(!root.join("/dev/vfio/30").exists());
    std::fs::write(root.join("/sys/bus/pci/drivers/i40e/bind"), "0000:5e:00.0").unwrap();
    wait(Some("i40e"));
    drop(sim);
}

#[test]
fn generated_machine_has_n_functions() {
    let root = generated(20).unwrap();
    let n = std::fs::read_dir(root.join("/sys/bus/pci/devices"))
        .unwrap()
        .count();
    assert_eq!(n, 20);
    assert!(root.join("/dev/vfio/1019").exists());
}
