//! Device health as the cluster sees it: the `kubedev` binary in DRA mode publishes an unhealthy
//! device with a taint naming why, and takes the taint away when the device recovers; on an API
//! server without device taints it leaves the device out instead.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::process::{DRIVER, Env, WAIT, slices_of, stop};
use kubedev_testkit::apiserver::KubeRelease;
use serde_json::Value;

/// The published devices: name → taints (`null` when it has none).
fn published(env: &Env) -> serde_json::Map<String, Value> {
    slices_of(&env.api)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| (d["name"].as_str().unwrap().to_owned(), d["taints"].clone()))
        .collect()
}

/// Waits until `check` holds for what is published; returns how long that took.
async fn until(
    env: &Env,
    what: &str,
    check: impl Fn(&serde_json::Map<String, Value>) -> bool,
) -> Duration {
    let start = Instant::now();
    common::eventually(WAIT, || {
        let now = published(env);
        let done = check(&now);
        async move {
            if done {
                Ok(())
            } else {
                Err(format!("{what}: published {now:?}"))
            }
        }
    })
    .await;
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_device_is_tainted_and_the_taint_goes_when_it_recovers() {
    let env = Env::new().await;
    let daemon = env.start("").await;
    until(&env, "all four healthy", |p| {
        p.len() == 4 && p.values().all(Value::is_null)
    })
    .await;

    env.set_present("gpu-1", false);
    let took = until(&env, "gpu-1 tainted", |p| !p["gpu-1"].is_null()).await;
    let p = published(&env);
    let taint = &p["gpu-1"][0];
    assert_eq!(taint["key"], format!("{DRIVER}/unhealthy"));
    assert_eq!(taint["effect"], "NoSchedule");
    // The reason ("<root>/present/gpu-1 is missing") as a label value, cut to 63 characters.
    let stored = taint["value"].as_str().unwrap();
    assert!(stored.len() <= 63, "{stored}");
    assert!(stored.ends_with("gpu-1-is-missing"), "{stored}");
    assert!(p["gpu-0"].is_null() && p["gpu-2"].is_null());
    eprintln!("gpu-1 tainted {took:?} after its presence file went");

    env.set_present("gpu-1", true);
    let took = until(&env, "gpu-1's taint removed", |p| {
        p.len() == 4 && p.values().all(Value::is_null)
    })
    .await;
    eprintln!("gpu-1's taint removed {took:?} after it came back");
    stop(daemon);
}

/// Kubernetes 1.35 drops device taints by default: the default (`auto`) leaves an unhealthy device
/// out, and puts it back when it recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_device_taints_an_unhealthy_device_is_left_out_until_it_recovers() {
    let env = Env::with_release(KubeRelease::V1_35).await;
    let daemon = env.start("").await;
    until(&env, "all four published", |p| p.len() == 4).await;
    env.set_present("gpu-2", false);
    until(&env, "gpu-2 left out", |p| {
        p.len() == 3 && !p.contains_key("gpu-2")
    })
    .await;
    assert!(published(&env).values().all(Value::is_null));
    env.set_present("gpu-2", true);
    until(&env, "gpu-2 back", |p| p.len() == 4).await;
    assert!(
        !env.log_text().contains("DRADeviceTaints"),
        "leaving out is what auto means there, not a missing feature: {}",
        env.log_text()
    );
    stop(daemon);
}

/// A backend whose health watch fails: the kubelet hears `Unknown` for its devices, with why,
/// while the ResourceSlices stay as they were; after a pause the daemon discovers the backend
/// again and watches it anew, and the kubelet hears the backend's health again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_health_watch_shows_as_unknown_until_the_backend_is_watched_again() {
    let env = Env::new().await;
    env.edit_config(|c| c.replace("  enabled: true\n", "  enabled: true\n  health: true\n"));
    let daemon = env.start("backend-watch=fail").await;
    let kubelet_sees = |state: &'static str| {
        move |k: &kubedev_testkit::kubelet::DraKubelet| {
            let h = k.health(DRIVER);
            h.len() == 4 && h.values().all(|d| d.health == state)
        }
    };
    assert!(
        env.kubelet.wait_until(WAIT, kubelet_sees("UNKNOWN")).await,
        "{:?}",
        env.kubelet.health(DRIVER)
    );
    let seen = env.kubelet.health(DRIVER)["node-a/gpu-0"].clone();
    assert!(
        seen.message
            .contains("static backend's health watch failed")
            && seen.message.contains("fail point backend-watch"),
        "{seen:?}"
    );
    assert_eq!(seen.timeout_seconds, 30);
    // Unknown is not unhealthy: nothing is tainted.
    until(&env, "all four published untainted", |p| {
        p.len() == 4 && p.values().all(Value::is_null)
    })
    .await;

    // Watched again (after 5 s): the backend's own health, and its changes, reach the kubelet.
    assert!(
        env.kubelet.wait_until(WAIT, kubelet_sees("HEALTHY")).await,
        "{:?}",
        env.kubelet.health(DRIVER)
    );
    env.set_present("gpu-1", false);
    assert!(
        env.kubelet
            .wait_until(WAIT, |k| k
                .health(DRIVER)
                .get("node-a/gpu-1")
                .is_some_and(|d| d.health == "UNHEALTHY"))
            .await
    );
    stop(daemon);
}
