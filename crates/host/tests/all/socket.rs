//! Socket devices: health, the directory mount, ownership without following symbolic links,
//! SELinux detection.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;

use kubedev_core::{Consumer, DeviceSource, Preparer, SourceEvent};
use kubedev_host::ownership::{selinux_enabled, set_socket_access};
use kubedev_host::{HostError, Owner};
use kubedev_testkit::hostroot::HostRoot;

use crate::{alloc, backend, dref, next, start_watch};

const SOCKET: &str = "/var/run/qgs/qgs.socket";

fn consumer() -> Consumer {
    Consumer::Container {
        resource: "example.com/qgs".into(),
    }
}

/// Binds a real Unix socket at `host_path` under the root.
fn bind(root: &HostRoot, host_path: &str) -> UnixListener {
    root.dir(std::path::Path::new(host_path).parent().unwrap())
        .unwrap();
    UnixListener::bind(root.join(host_path)).unwrap()
}

/// IDs the test may give files: others when running as root, our own otherwise.
fn owner() -> Owner {
    if rustix::process::geteuid().is_root() {
        Owner {
            uid: 4242,
            gid: 4343,
        }
    } else {
        Owner {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }
}

fn socket_config(extra: serde_json::Value) -> serde_json::Value {
    let mut dev = serde_json::json!({"name": "qgs", "path": SOCKET, "slots": 2});
    dev.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    serde_json::json!({"socketDevices": [dev]})
}

#[tokio::test]
async fn health_follows_the_socket() {
    let root = HostRoot::new().unwrap();
    let listener = bind(&root, SOCKET);
    let b = backend(&root, socket_config(serde_json::json!({})));
    let pool = b.discover().await.unwrap().remove(0);
    assert_eq!(pool.devices.len(), 2);
    assert!(pool.devices.iter().all(|d| d.health.is_healthy()));
    let kind = pool.devices[0].attribute("host.kubedev.io/kind").cloned();
    assert_eq!(
        kind,
        Some(kubedev_core::AttributeValue::String("socket".into()))
    );

    let (task, mut rx) = start_watch(&b).await;
    drop(listener);
    root.remove(SOCKET).unwrap();
    for slot in ["qgs-0", "qgs-1"] {
        match next(&mut rx).await {
            SourceEvent::Health { device, health } => {
                assert_eq!(device, dref(slot));
                assert!(
                    health
                        .reason
                        .unwrap()
                        .contains("socket /var/run/qgs/qgs.socket is missing")
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // The server re-creates its socket.
    let _listener = bind(&root, SOCKET);
    for _ in 0..2 {
        match next(&mut rx).await {
            SourceEvent::Health { health, .. } => assert!(health.is_healthy()),
            other => panic!("unexpected {other:?}"),
        }
    }
    task.abort();
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_unhealthy_and_optional_sockets_always_healthy() {
    let root = HostRoot::new().unwrap();
    root.file(SOCKET, "").unwrap();
    let b = backend(&root, socket_config(serde_json::json!({})));
    let d = b.discover().await.unwrap().remove(0).devices.remove(0);
    assert!(d.health.reason.unwrap().contains("is not a socket"));

    let root = HostRoot::new().unwrap();
    let b = backend(&root, socket_config(serde_json::json!({"optional": true})));
    let d = b.discover().await.unwrap().remove(0).devices.remove(0);
    assert!(d.health.is_healthy());
}

#[tokio::test]
async fn prepare_mounts_the_directory_and_sets_ownership() {
    let root = HostRoot::new().unwrap();
    let _listener = bind(&root, SOCKET);
    let o = owner();
    let b = backend(
        &root,
        socket_config(
            serde_json::json!({"owner": {"uid": o.uid, "gid": o.gid}, "containerDir": "/run/qgs"}),
        ),
    );
    let out = b.prepare(&consumer(), &[alloc("qgs-1")]).await.unwrap();
    let m = &out[0].edits.mounts;
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].host_path, "/var/run/qgs");
    assert_eq!(m[0].container_path, "/run/qgs");
    assert!(!m[0].is_read_only());
    assert!(out[0].edits.device_nodes.is_empty());
    for p in [SOCKET, "/var/run/qgs"] {
        let meta = std::fs::symlink_metadata(root.join(p)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (o.uid, o.gid), "{p}");
    }
    // Idempotent.
    let again = b.prepare(&consumer(), &[alloc("qgs-1")]).await.unwrap();
    assert_eq!(again, out);
}

#[tokio::test]
async fn planned_edits_equal_prepares_without_changing_ownership() {
    let root = HostRoot::new().unwrap();
    let _listener = bind(&root, SOCKET);
    let before = std::fs::symlink_metadata(root.join(SOCKET)).unwrap();
    let o = owner();
    let b = backend(
        &root,
        socket_config(
            serde_json::json!({"owner": {"uid": o.uid, "gid": o.gid}, "containerDir": "/run/qgs"}),
        ),
    );
    let planned = b.planned_edits(&dref("qgs-1")).await.unwrap().unwrap();
    let after = std::fs::symlink_metadata(root.join(SOCKET)).unwrap();
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    let out = b.prepare(&consumer(), &[alloc("qgs-1")]).await.unwrap();
    assert_eq!(planned, out[0].edits);

    // A required socket that is missing cannot be described either.
    let empty = HostRoot::new().unwrap();
    empty.dir("/var/run/qgs").unwrap();
    let b = backend(&empty, socket_config(serde_json::json!({})));
    let err = b.planned_edits(&dref("qgs-0")).await.unwrap_err();
    assert!(err.to_string().contains(SOCKET), "{err}");
}

#[tokio::test]
async fn a_missing_required_socket_fails_prepare_but_an_optional_one_does_not() {
    let root = HostRoot::new().unwrap();
    root.dir("/var/run/qgs").unwrap();
    let b = backend(&root, socket_config(serde_json::json!({})));
    let err = b
        .prepare(&consumer(), &[alloc("qgs-0")])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("qgs-0") && err.contains(SOCKET), "{err}");
    let b = backend(&root, socket_config(serde_json::json!({"optional": true})));
    let out = b.prepare(&consumer(), &[alloc("qgs-0")]).await.unwrap();
    assert_eq!(out[0].edits.mounts[0].host_path, "/var/run/qgs");
}

#[tokio::test]
async fn ownership_change_refuses_to_follow_a_symlinked_socket() {
    let root = HostRoot::new().unwrap();
    let target = root.file("/etc/shadow", "secret").unwrap();
    let before = std::fs::metadata(&target).unwrap();
    root.link(SOCKET, "/etc/shadow").unwrap();
    let dir_before = std::fs::metadata(root.join("/var/run/qgs")).unwrap();
    let o = owner();
    let err = set_socket_access(
        &kubedev_core::HostFs::new(root.path()),
        std::path::Path::new(SOCKET),
        Some(o),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, HostError::Symlink { .. }), "{err}");
    assert!(err.to_string().contains(SOCKET), "{err}");
    let after = std::fs::metadata(&target).unwrap();
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    // Nothing was changed, not even the directory.
    let dir_after = std::fs::metadata(root.join("/var/run/qgs")).unwrap();
    assert_eq!(
        (dir_after.uid(), dir_after.gid()),
        (dir_before.uid(), dir_before.gid())
    );

    // Through the backend: an error naming the device and the link.
    let b = backend(
        &root,
        socket_config(serde_json::json!({"owner": {"uid": o.uid, "gid": o.gid}})),
    );
    let err = b
        .prepare(&consumer(), &[alloc("qgs-0")])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("qgs-0") && err.contains("symbolic link"),
        "{err}"
    );
}

#[tokio::test]
async fn ownership_change_refuses_a_symlinked_directory_but_resolves_parents() {
    let root = HostRoot::new().unwrap();
    // /var/run -> /run as on most hosts: a link above the socket's directory is fine.
    root.link("/var/run", "/run").unwrap();
    let _listener = bind(&root, "/run/qgs/qgs.socket");
    let host = kubedev_core::HostFs::new(root.path());
    let present =
        set_socket_access(&host, std::path::Path::new(SOCKET), Some(owner()), None).unwrap();
    assert!(present);
    // The socket's directory itself a link: refused.
    root.dir("/srv/elsewhere").unwrap();
    root.link("/run/linked", "/srv/elsewhere").unwrap();
    let err = set_socket_access(
        &host,
        std::path::Path::new("/run/linked/qgs.socket"),
        Some(owner()),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, HostError::Symlink { .. }), "{err}");
    assert!(err.to_string().contains("/run/linked"), "{err}");
}

#[test]
fn selinux_is_detected_from_selinuxfs_under_the_host_root() {
    let root = HostRoot::new().unwrap();
    let host = kubedev_core::HostFs::new(root.path());
    assert!(!selinux_enabled(&host));
    root.file("/sys/fs/selinux/enforce", "1").unwrap();
    assert!(selinux_enabled(&host));
}

#[tokio::test]
async fn without_selinux_prepare_sets_no_label() {
    let root = HostRoot::new().unwrap();
    let _listener = bind(&root, SOCKET);
    let b = backend(
        &root,
        socket_config(serde_json::json!({"selinuxContext": "system_u:object_r:qgs_t:s0"})),
    );
    b.prepare(&consumer(), &[alloc("qgs-0")]).await.unwrap();
    let mut buf = [0u8; 256];
    // Either no such attribute, or (on an SELinux kernel) the kernel's own label, never ours.
    if let Ok(n) = rustix::fs::lgetxattr(root.join(SOCKET), "security.selinux", &mut buf) {
        assert!(!String::from_utf8_lossy(&buf[..n]).contains("qgs_t"));
    }
}
