//! Several daemon instances on one directory: records kept across instances, the node lock's
//! exclusion, prepares in progress elsewhere, dead leases, and lock errors.

use super::*;

#[test]
fn two_instances_do_not_lose_each_others_records() {
    let fx = Fixture::new();
    let (mut old, _) = fx.open();
    let (mut new, _) = fx.open();
    old.start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    new.start_prepare(&claim("u2"), &[allocated("gpu-1")])
        .unwrap();
    old.complete_prepare("u1", &[prepared("gpu-0")], None)
        .unwrap();
    // `new` can complete a claim `old` started: it re-reads the file first.
    new.complete_prepare("u1", &[prepared("gpu-0")], Some("f.json"))
        .unwrap();
    assert_eq!(new.claims().len(), 2);
    assert_eq!(old.claims().len(), 2, "old saw u2 when it re-read the file");
    assert_eq!(
        old.get("u1").unwrap().cdi_file,
        None,
        "old has not re-read yet"
    );
    assert_eq!(old.reload().unwrap(), LoadOutcome::Loaded { claims: 2 });
    assert_eq!(old.get("u1").unwrap().cdi_file.as_deref(), Some("f.json"));
    let (fresh, _) = fx.open();
    assert_eq!(fresh.claims(), new.claims());
}

#[test]
fn node_lock_excludes_a_second_holder() {
    let dir = TestDir::new("lock");
    let first = NodeLock::try_acquire(dir.path())
        .unwrap()
        .expect("free lock");
    assert_eq!(first.path(), dir.path().join(LOCK_FILE));
    assert!(NodeLock::try_acquire(dir.path()).unwrap().is_none());

    // A blocking acquirer in another thread gets the lock only after `first` is dropped.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = dir.path().to_owned();
    let waiter = std::thread::spawn(move || {
        let lock = NodeLock::acquire(&path).unwrap();
        tx.send(()).unwrap();
        drop(lock);
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        rx.try_recv().is_err(),
        "acquire must wait while the lock is held"
    );
    drop(first);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("waiter gets the lock after drop");
    waiter.join().unwrap();

    let again = NodeLock::try_acquire(dir.path()).unwrap();
    assert!(again.is_some(), "free again after all holders dropped");
}

#[test]
fn a_prepare_is_in_progress_elsewhere_only_while_its_instance_lives() {
    let fx = Fixture::new();
    // Two instances side by side, as during a rolling update.
    let (mut old, _) = fx.open();
    let (mut new, _) = fx.open();
    assert_ne!(old.instance(), new.instance());
    old.start_prepare(&claim("u1"), &[allocated("gpu-0")])
        .unwrap();
    new.reload().unwrap();
    let record = new.get("u1").unwrap().clone();
    assert_eq!(record.owner.as_deref(), Some(old.instance()));
    assert!(new.in_progress_elsewhere(&record));
    // Its own prepares and completed ones are not.
    assert!(!old.in_progress_elsewhere(&record));
    old.complete_prepare("u1", &[], None).unwrap();
    new.reload().unwrap();
    assert!(!new.in_progress_elsewhere(new.get("u1").unwrap()));

    // The old instance goes away (its process dies: the lease is released).
    old.start_prepare(&claim("u2"), &[allocated("gpu-1")])
        .unwrap();
    let lease = fx
        .dir
        .path()
        .join(INSTANCES_DIR)
        .join(format!("{}.lock", old.instance()));
    assert!(lease.exists());
    drop(old);
    new.reload().unwrap();
    assert!(!new.in_progress_elsewhere(new.get("u2").unwrap()));
    assert!(!lease.exists());
    // A record without an owner (format 1.0) or with a made-up one is never in progress.
    let mut r = new.get("u2").unwrap().clone();
    r.owner = None;
    assert!(!new.in_progress_elsewhere(&r));
    r.owner = Some("../kubedev".into());
    assert!(!new.in_progress_elsewhere(&r));
}

#[test]
fn a_dead_instances_lease_file_is_not_alive() {
    let fx = Fixture::new();
    let (store, _) = fx.open();
    // A lease file left by a process that died (nobody holds its lock).
    let dir = fx.dir.path().join(INSTANCES_DIR);
    fs::write(dir.join("4242-1-0.lock"), b"").unwrap();
    assert!(!InstanceLease::is_held(fx.dir.path(), "4242-1-0"));
    assert!(
        !dir.join("4242-1-0.lock").exists(),
        "the dead lease is cleaned up"
    );
    assert!(InstanceLease::is_held(fx.dir.path(), store.instance()));
    assert!(!store.other_instances_alive());
    let (other, _) = fx.open();
    assert!(store.other_instances_alive());
    drop(other);
    assert!(!store.other_instances_alive());
}

#[test]
fn lock_errors_name_the_path() {
    let dir = TestDir::new("lock");
    let missing = dir.path().join("no-such-dir");
    let err = NodeLock::acquire(&missing).unwrap_err();
    assert!(err.to_string().contains("no-such-dir"), "{err}");
}
