//! Xid events and lost GPUs through `watch`.

use std::time::Duration;

use kubedev_core::{DeviceSource, HealthState, SourceEvent};
use kubedev_nvidia::NvidiaConfig;
use tokio::sync::mpsc;

use crate::{Fixture, discover};

async fn next(rx: &mut mpsc::Receiver<SourceEvent>) -> (String, HealthState, String) {
    let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10 s")
        .expect("watcher alive");
    match ev {
        SourceEvent::Health { device, health } => (
            device.device.to_string(),
            health.state,
            health.reason.unwrap_or_default(),
        ),
        other => panic!("unexpected event {other:?}"),
    }
}

async fn quiet(rx: &mut mpsc::Receiver<SourceEvent>, for_ms: u64) {
    if let Ok(ev) = tokio::time::timeout(Duration::from_millis(for_ms), rx.recv()).await {
        panic!("unexpected event {ev:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_makes_a_gpu_unhealthy_until_it_recovers() {
    let f = Fixture::new("dgx-a100");
    let b = f.backend(NvidiaConfig {
        health_recheck_seconds: 1,
        health_poll_millis: 50,
        ..f.config()
    });
    discover(&b).await;
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    // Give the watcher time to register its event set: events queue until then anyway.
    f.control(r#"{"xid": 13, "gpu": 2}"#);
    f.control(r#"{"xid": 79, "gpu": 3}"#);
    let (dev, state, reason) = next(&mut rx).await;
    assert_eq!(dev, "gpu-3", "the ignored Xid 13 on GPU 2 changed nothing");
    assert_eq!(state, HealthState::Unhealthy);
    assert!(reason.starts_with("Xid 79"), "{reason}");
    // Discovery now reports it unhealthy too.
    let pool = discover(&b).await;
    assert!(!pool.device("gpu-3").unwrap().health.is_healthy());
    assert!(pool.device("gpu-2").unwrap().health.is_healthy());
    // After the recheck period without a new Xid, the GPU answers and recovers.
    let (dev, state, _) = next(&mut rx).await;
    assert_eq!((dev.as_str(), state), ("gpu-3", HealthState::Healthy));
    quiet(&mut rx, 300).await;
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_gpu_is_unhealthy_and_recovers_when_restored() {
    let f = Fixture::new("workstation");
    let b = f.backend(NvidiaConfig {
        health_recheck_seconds: 1,
        health_poll_millis: 50,
        ..f.config()
    });
    discover(&b).await;
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    f.control(r#"{"lost": 1}"#);
    let (dev, state, reason) = next(&mut rx).await;
    assert_eq!((dev.as_str(), state), ("gpu-1", HealthState::Unhealthy));
    assert!(reason.contains("GPU lost"), "{reason}");
    // A lost GPU stays published (unhealthy) under its name.
    let pool = discover(&b).await;
    assert_eq!(pool.devices.len(), 2);
    assert!(!pool.device("gpu-1").unwrap().health.is_healthy());
    f.control(r#"{"restore": 1}"#);
    let (dev, state, _) = next(&mut rx).await;
    assert_eq!((dev.as_str(), state), ("gpu-1", HealthState::Healthy));
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_watch_future_stops_the_watcher() {
    let f = Fixture::new("workstation");
    let b = f.backend(NvidiaConfig {
        health_poll_millis: 50,
        ..f.config()
    });
    let (tx, rx) = mpsc::channel(16);
    let fut = b.watch(tx);
    // Cancel it mid-wait; the blocking thread sees the flag within one short wait and ends,
    // dropping its sender.
    let _ = tokio::time::timeout(Duration::from_millis(300), fut).await;
    let mut rx = rx;
    let closed = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the sender is dropped once the watcher ends");
    assert!(closed.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_scoped_to_a_gpu_instance_affects_only_its_mig_device() {
    let f = Fixture::new("h100-mig");
    let b = f.backend(NvidiaConfig {
        mig_strategy: kubedev_nvidia::MigStrategy::Static,
        health_recheck_seconds: 1,
        health_poll_millis: 50,
        ..f.config()
    });
    discover(&b).await;
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    // GPU instance 9 is the 1g.10gb at memory slice 2.
    f.control(r#"{"xid": 94, "gpu": 0, "gi": 9, "ci": 0}"#);
    let (dev, state, reason) = next(&mut rx).await;
    assert_eq!(
        (dev.as_str(), state),
        ("gpu-0-mig-1g10gb-2", HealthState::Unhealthy)
    );
    assert!(
        reason.contains("Xid 94") && reason.contains("GPU instance 9"),
        "{reason}"
    );
    let pool = discover(&b).await;
    let unhealthy: Vec<_> = pool
        .devices
        .iter()
        .filter(|d| !d.health.is_healthy())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(unhealthy, ["gpu-0-mig-1g10gb-2"]);
    // An unscoped Xid takes every MIG device of the GPU down; the GPU's reason wins.
    f.control(r#"{"xid": 79, "gpu": 0}"#);
    let mut down = std::collections::BTreeSet::new();
    while down.len() < 7 {
        let (dev, state, reason) = next(&mut rx).await;
        assert_eq!(state, HealthState::Unhealthy);
        assert!(reason.starts_with("Xid 79"), "{reason}");
        down.insert(dev);
    }
    // Then all recover.
    let mut up = std::collections::BTreeSet::new();
    while up.len() < 7 {
        let (dev, state, _) = next(&mut rx).await;
        assert_eq!(state, HealthState::Healthy);
        up.insert(dev);
    }
    watcher.abort();
}
