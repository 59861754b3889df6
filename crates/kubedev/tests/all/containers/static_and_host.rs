//! Static and host backend devices in a container: a static claim's nodes, variables and
//! read-only mounts, a host character device slot, a host socket's directory, and consumable
//! capacity shares reaching one socket from two containers.

use std::path::{Path, PathBuf};

use kubedev_testkit::hostroot::HostRoot;
use kubedev_testkit::podman::{Container, FakeNode};

use super::{allocated, char_dev, dra_node, node_of, podman, run, stat_node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn static_backend_claim_nodes_env_and_read_only_mounts() {
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("fw.bin"), "example firmware v1\n").unwrap();
    std::fs::create_dir(d.join("lib")).unwrap();
    std::fs::write(d.join("lib/libexample.so.1"), "not really ELF\n").unwrap();
    let backends = format!(
        "  static:\n    pool: node-a\n    devices:\n\
         \x20     - name: gpu-0\n        deviceNodes: [\"/dev/example/gpu0\"]\n\
         \x20       env: {{EXAMPLE_MODEL: \"Example X1\", EXAMPLE_FLAGS: \"a=b c\"}}\n\
         \x20       mounts: {{{d}/fw.bin: /lib/firmware/example/fw.bin}}\n\
         \x20     - name: gpu-1\n        deviceNodes: [\"/dev/example/gpu1\"]\n\
         \x20       mounts: {{{d}/lib: /usr/local/example/lib}}\n",
        d = d.display()
    );
    let node = dra_node(d, None, "static.example.com", &backends).await;
    let gpus = [
        node.device_named("gpu-0").await,
        node.device_named("gpu-1").await,
    ];
    let uid = "5f1d2c3b-0000-4000-8000-00000000a001";
    let p = node
        .prepare(uid, gpus.iter().map(allocated).collect())
        .await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let script = format!(
        "{}{}\
         echo \"visible=$STATIC_VISIBLE_DEVICES\"\n\
         echo \"model=$EXAMPLE_MODEL\"\necho \"flags=$EXAMPLE_FLAGS\"\n\
         echo \"fw=$(cat /lib/firmware/example/fw.bin)\"\n\
         echo \"fw_write=$( (echo x >> /lib/firmware/example/fw.bin) 2>&1 && echo written)\"\n\
         echo \"lib=$(ls /usr/local/example/lib)\"\n\
         echo \"lib_write=$( (touch /usr/local/example/lib/new) 2>&1 && echo written)\"\n",
        stat_node("gpu0", "/dev/example/gpu0"),
        stat_node("gpu1", "/dev/example/gpu1"),
    );
    let out = run(
        &podman,
        Container::new(script)
            .devices(&p.ids)
            .node(FakeNode::char("/dev/example/gpu0", 240, 0))
            .node(FakeNode::char("/dev/example/gpu1", 240, 1))
            .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    assert_eq!(node_of(&out, "gpu0"), char_dev(240, 0), "{}", out.report());
    assert_eq!(node_of(&out, "gpu1"), char_dev(240, 1), "{}", out.report());
    assert_eq!(
        out.value("visible"),
        Some("gpu-0,gpu-1"),
        "{}",
        out.report()
    );
    assert_eq!(out.value("model"), Some("Example X1"));
    assert_eq!(out.value("flags"), Some("a=b c"));
    assert_eq!(out.value("fw"), Some("example firmware v1"));
    let fw_write = out.value("fw_write").unwrap();
    assert!(fw_write.contains("Read-only file system"), "{fw_write}");
    assert_eq!(out.value("lib"), Some("libexample.so.1"));
    let lib_write = out.value("lib_write").unwrap();
    assert!(lib_write.contains("Read-only file system"), "{lib_write}");
    assert_eq!(
        std::fs::read_to_string(d.join("fw.bin")).unwrap(),
        "example firmware v1\n"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn host_character_device_slot_gives_the_node() {
    let podman = podman();
    let machine = HostRoot::new().unwrap();
    machine.device_node("/dev/kvm").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let backends =
        "  host:\n    characterDevices:\n      - {name: kvm, path: /dev/kvm, slots: 3}\n";
    let node = dra_node(
        dir.path(),
        Some(machine.path()),
        "host.example.com",
        backends,
    )
    .await;
    let slot = node.device_named("kvm-1").await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a002";
    let p = node.prepare(uid, vec![allocated(&slot)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let script = format!(
        "{}echo \"open=$( (: <> /dev/kvm) 2>&1 && echo opened)\"\n",
        stat_node("kvm", "/dev/kvm")
    );
    let out = run(
        &podman,
        Container::new(script)
            .devices(&p.ids)
            .node(FakeNode::char("/dev/kvm", 10, 232))
            .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    assert_eq!(node_of(&out, "kvm"), char_dev(10, 232), "{}", out.report());
    // Opened where the host has KVM, "No such device" where it does not: never refused.
    let open = out.value("open").unwrap();
    assert!(
        !open.contains("Operation not permitted"),
        "the device cgroup refuses /dev/kvm: {open}"
    );
    node.stop().await;
}

/// A Unix socket listening in `dir/<name>/<name>.socket`.
fn socket(dir: &Path, name: &str) -> (PathBuf, std::os::unix::net::UnixListener) {
    let sock_dir = dir.join(name);
    std::fs::create_dir_all(&sock_dir).unwrap();
    let path = sock_dir.join(format!("{name}.socket"));
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    (path, listener)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn host_socket_device_mounts_the_socket_directory() {
    use std::os::unix::fs::MetadataExt as _;
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let (sock, _listener) = socket(dir.path(), "qgs");
    let backends = format!(
        "  host:\n    socketDevices:\n      - {{name: qgs, path: {}, containerDir: /var/run/tdx-qgs}}\n",
        sock.display()
    );
    let node = dra_node(dir.path(), None, "sockets.example.com", &backends).await;
    let qgs = node.device_named("qgs-0").await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a003";
    let p = node.prepare(uid, vec![allocated(&qgs)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let out = run(
        &podman,
        Container::new(
            "echo \"sock=$(stat -c '%F|%i' /var/run/tdx-qgs/qgs.socket 2>&1)\"\n\
             touch /var/run/tdx-qgs/from-container\n",
        )
        .devices(&p.ids)
        .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    let ino = std::fs::metadata(&sock).unwrap().ino();
    assert_eq!(
        out.value("sock"),
        Some(format!("socket|{ino}").as_str()),
        "the host's socket at the configured container directory\n{}",
        out.report()
    );
    assert!(
        sock.parent().unwrap().join("from-container").exists(),
        "the directory is mounted read-write"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn consumable_capacity_shares_reach_one_socket_from_two_containers() {
    use std::os::unix::fs::MetadataExt as _;
    let podman = podman();
    let dir = tempfile::tempdir().unwrap();
    let (sock, _listener) = socket(dir.path(), "qgs");
    let backends = format!(
        "  host:\n    socketDevices:\n      - {{name: qgs, path: {}, slots: 4, consumableCapacity: true}}\n",
        sock.display()
    );
    let node = dra_node(dir.path(), None, "shares.example.com", &backends).await;
    let qgs = node.device_named("qgs").await;
    let shares = [
        (
            "5f1d2c3b-0000-4000-8000-00000000a004",
            "4b1e0a1c-5f5e-4a43-9d3c-8a5f0e1c2d3e",
        ),
        (
            "5f1d2c3b-0000-4000-8000-00000000a005",
            "9c2d1e0f-7a6b-4c5d-8e9f-0a1b2c3d4e5f",
        ),
    ];
    let mut prepared = Vec::new();
    for (uid, share) in shares {
        let p = node
            .prepare(uid, vec![allocated(&qgs).with_share_id(share)])
            .await;
        assert_eq!(p.ids.len(), 1);
        assert!(
            p.ids[0].ends_with(share),
            "one CDI device per share: {:?}",
            p.ids
        );
        prepared.push(p);
    }
    let _specs: Vec<_> = prepared
        .iter()
        .map(|p| podman.install_spec(&p.spec).unwrap())
        .collect();
    let sock_dir = sock.parent().unwrap();
    let ino = std::fs::metadata(&sock).unwrap().ino();
    for (i, p) in prepared.iter().enumerate() {
        let script = format!(
            "echo \"sock=$(stat -c '%F|%i' {s} 2>&1)\"\ntouch {d}/from-share-{i}\n",
            s = sock.display(),
            d = sock_dir.display()
        );
        let out = run(
            &podman,
            Container::new(script)
                .devices(&p.ids)
                .check(&p.spec, &p.ids),
        );
        out.assert_ok();
        assert_eq!(
            out.value("sock"),
            Some(format!("socket|{ino}").as_str()),
            "{}",
            out.report()
        );
    }
    for i in 0..2 {
        assert!(sock_dir.join(format!("from-share-{i}")).exists());
    }
    node.stop().await;
}
