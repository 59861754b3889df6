//! The daemon as a process in DRA mode, against the API-server emulator and the kubelet
//! emulator: publication, prepare and unprepare, and randomized crashes at every fail point.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::process::{DRIVER, Daemon, Env, NODE, WAIT, slices_of, stop, wait_exit};
use kubedev_testkit::apiserver::{Fault, KubeRelease, Resource, Verb};
use kubedev_testkit::kubelet::ClaimId;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_slices_and_prepares_claims_from_the_api_server() {
    // The oldest and the newest supported release.
    for release in [KubeRelease::V1_34, KubeRelease::NEWEST] {
        publish_and_prepare(release).await;
    }
}

async fn publish_and_prepare(release: KubeRelease) {
    let env = Env::with_release(release).await;
    let daemon = env.start("").await;
    let deadline = Instant::now() + WAIT;
    while slices_of(&env.api).is_empty() {
        assert!(Instant::now() < deadline, "no ResourceSlice published");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let slice = &slices_of(&env.api)[0];
    assert_eq!(slice["spec"]["pool"]["name"], NODE);
    assert_eq!(slice["spec"]["devices"].as_array().unwrap().len(), 4);
    assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "node-uid-1");

    let claim = env.claim("train", "claim-uid-1", &["gpu-2", "gpu-3"]);
    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devs = out["claim-uid-1"].as_ref().unwrap();
    assert_eq!(
        devs.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(),
        ["gpu-2", "gpu-3"]
    );
    assert_eq!(env.cdi_files().len(), 1);
    // A claim whose UID does not match the API server's is refused.
    let wrong = ClaimId::new("default", "train", "other-uid");
    let out = env.kubelet.prepare(DRIVER, &[wrong]).await.unwrap();
    assert!(out["other-uid"].is_err());
    let un = env.kubelet.unprepare(DRIVER, &[claim]).await.unwrap();
    assert!(un["claim-uid-1"].is_ok());
    assert!(env.cdi_files().is_empty());
    stop(daemon);
}

/// A small deterministic generator, so a failing run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_crashes_leave_no_orphans_and_no_half_prepared_claims() {
    let runs: usize = std::env::var("KUBEDEV_CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash runs: {runs}, seed {seed}");
    let mut rng = Rng(seed);
    let env = Env::new().await;
    let devices = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"];
    let steps = kubedev::failpoint::STEPS;
    let mut crashes = 0;
    for run in 0..runs {
        let step = steps[rng.below(steps.len())];
        let n = 1 + rng.below(2);
        let first = rng.below(devices.len() - n + 1);
        let uid = format!("crash-{run}");
        let claim = env.claim(&format!("c{run}"), &uid, &devices[first..first + n]);
        let ctx = format!("run {run} (seed {seed}), fail point {step}");

        let mut daemon = env.start(step).await;
        let prepared = env
            .kubelet
            .prepare(DRIVER, std::slice::from_ref(&claim))
            .await;
        if step == "during-unprepare" {
            assert!(prepared.unwrap()[&uid].is_ok(), "{ctx}");
            let _ = env
                .kubelet
                .unprepare(DRIVER, std::slice::from_ref(&claim))
                .await;
        } else {
            assert!(
                prepared.is_err(),
                "{ctx}: prepare should have died with the daemon"
            );
        }
        let status = wait_exit(&mut daemon);
        assert!(!status.success(), "{ctx}: daemon did not abort ({status})");
        crashes += 1;

        // Restart without fail points: recovery must leave a consistent node.
        let daemon = env.start("").await;
        let cp = env.checkpoint();
        assert!(
            cp.iter().all(|(_, s)| s == "PrepareCompleted"),
            "{ctx}: half-prepared claim left: {cp:?}"
        );
        for f in env.cdi_files() {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                cp.iter().any(|(u, _)| name.contains(u.as_str())),
                "{ctx}: orphan CDI file {name}; checkpoint {cp:?}"
            );
        }
        // Re-prepare gives the allocated devices; unprepare completes and cleans up.
        let out = env
            .kubelet
            .prepare(DRIVER, std::slice::from_ref(&claim))
            .await
            .unwrap();
        let got: Vec<String> = out[&uid]
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| d.device.clone())
            .collect();
        assert_eq!(got, devices[first..first + n], "{ctx}");
        let un = env
            .kubelet
            .unprepare(DRIVER, std::slice::from_ref(&claim))
            .await
            .unwrap();
        assert!(un[&uid].is_ok(), "{ctx}");
        assert!(
            env.cdi_files().is_empty(),
            "{ctx}: CDI files left after unprepare"
        );
        assert!(
            env.checkpoint().is_empty(),
            "{ctx}: checkpoint not empty after unprepare"
        );
        stop(daemon);
    }
    assert_eq!(crashes, runs);
}

/// A rolling update: the new daemon starts while the old one is in the middle of a prepare. The
/// new one's start-up recovery must leave that prepare to the old one (which is alive), and the
/// prepare completes; after the old one stops, the new one answers the same for the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_does_not_roll_back_the_old_instances_prepare_in_flight() {
    let env = Env::new().await;
    let old = env
        .start_pod("after-prepare-started=pause:1500", Some("pod-old"))
        .await;
    let claim = env.claim("train", "claim-uid-roll", &["gpu-1"]);
    let in_flight = env.kubelet.prepare(DRIVER, std::slice::from_ref(&claim));
    let start_new = async {
        let deadline = Instant::now() + WAIT;
        while !env
            .checkpoint()
            .iter()
            .any(|(uid, state)| uid == "claim-uid-roll" && state == "PrepareStarted")
        {
            assert!(Instant::now() < deadline, "the prepare did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The new pod starts (its recovery runs before it registers) while the old one pauses.
        env.start_pod("", Some("pod-new")).await
    };
    let (first, new) = tokio::join!(in_flight, start_new);
    let first = first.unwrap();
    let first = first["claim-uid-roll"]
        .as_ref()
        .expect("the old instance's prepare completes")
        .clone();
    assert_eq!(
        env.checkpoint(),
        [("claim-uid-roll".to_string(), "PrepareCompleted".to_string())]
    );
    assert_eq!(env.cdi_files().len(), 1);

    // The old pod goes away; the new one serves the claim as prepared.
    stop(old);
    let again = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let again = again["claim-uid-roll"].as_ref().unwrap();
    assert_eq!(again[0].device, first[0].device);
    assert_eq!(again[0].cdi_device_ids, first[0].cdi_device_ids);
    let un = env.kubelet.unprepare(DRIVER, &[claim]).await.unwrap();
    assert!(un["claim-uid-roll"].is_ok());
    assert!(env.cdi_files().is_empty());
    stop(new);
}

/// A checkpoint cut short while the daemon was stopped used to make the next start delete the
/// CDI specs of every prepared claim. Now the claims the API server says are reserved on this
/// node are prepared again with the same specs, only a claim whose pod is gone loses its spec, a
/// damaged spec is repaired, and the loss is reported in the log, the metrics, `/readyz` and an
/// Event on the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_checkpoint_keeps_the_cdi_specs_of_claims_whose_pods_run() {
    let env = Env::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = env.root.path().join("kubedev.yaml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("metrics:\n  address: 127.0.0.1:{port}\n"));
    std::fs::write(&config, text).unwrap();

    let a = env.claim("a", "claim-uid-a", &["gpu-0"]);
    let b = env.claim("b", "claim-uid-b", &["gpu-1", "gpu-2"]);
    let gone = env.claim("gone", "claim-uid-gone", &["gpu-3"]);
    for (name, pod) in [("a", "pod-a"), ("b", "pod-b"), ("gone", "pod-gone")] {
        env.reserve(name, Some(pod));
    }
    let daemon = env.start("").await;
    let out = env.kubelet.prepare(DRIVER, &[a, b, gone]).await.unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    let spec = |uid: &str| {
        env.root
            .path()
            .join("cdi")
            .join(format!("k8s.{DRIVER}-claim_{uid}.json"))
    };
    let before_a = std::fs::read(spec("claim-uid-a")).unwrap();
    let before_b = std::fs::read(spec("claim-uid-b")).unwrap();
    stop(daemon);

    // The damage: the checkpoint cut to 300 bytes, claim b's spec truncated, and the pod of
    // `gone` deleted (its claim no longer reserved) while the daemon was down.
    let checkpoint = env.checkpoint_path();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&checkpoint)
        .unwrap()
        .set_len(300)
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(spec("claim-uid-b"))
        .unwrap()
        .set_len(10)
        .unwrap();
    env.reserve("gone", None);

    let daemon = env.start("").await;
    assert_eq!(
        std::fs::read(spec("claim-uid-a")).unwrap(),
        before_a,
        "claim a's spec changed"
    );
    assert_eq!(
        std::fs::read(spec("claim-uid-b")).unwrap(),
        before_b,
        "claim b's spec not repaired"
    );
    assert!(
        !spec("claim-uid-gone").exists(),
        "the spec of a claim with no pod is kept"
    );
    let mut records = env.checkpoint();
    records.sort();
    assert_eq!(
        records,
        [
            ("claim-uid-a".to_string(), "PrepareCompleted".to_string()),
            ("claim-uid-b".to_string(), "PrepareCompleted".to_string()),
        ]
    );
    let log = env.log_text();
    assert!(
        log.contains("ERROR") && log.contains("lost its record of prepared claims"),
        "{log}"
    );
    assert!(log.contains("Rebuilt 2 claim(s)"), "{log}");

    let deadline = Instant::now() + WAIT;
    let (status, ready) = loop {
        let (status, body) = common::http_get(port, "/readyz");
        if status == 200 || Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 200, "{ready}");
    assert!(
        ready.contains("note: DRA driver gpu.example.com lost its record"),
        "{ready}"
    );
    let (_, metrics) = common::http_get(port, "/metrics");
    for line in [
        "kubedev_dra_recovery_total{outcome=\"checkpoint_lost\"} 1",
        "kubedev_dra_recovery_total{outcome=\"rebuilt\"} 2",
        "kubedev_dra_recovery_total{outcome=\"cdi_removed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    let events = env.api.objects(Resource::Events);
    let event = events
        .iter()
        .find(|e| e["reason"] == "CheckpointLost")
        .unwrap_or_else(|| panic!("no CheckpointLost Event: {events:?}"));
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "Node");
    assert_eq!(event["regarding"]["name"], NODE);
    assert_eq!(event["metadata"]["namespace"], "default");
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .contains("Rebuilt 2 claim(s)")
    );

    // The rebuilt claims unprepare as usual.
    let a = ClaimId::new("default", "a", "claim-uid-a");
    let un = env.kubelet.unprepare(DRIVER, &[a]).await.unwrap();
    assert!(un["claim-uid-a"].is_ok());
    assert!(!spec("claim-uid-a").exists());
    stop(daemon);
}

/// A device that does not allow multiple allocations used to be prepared for every claim that
/// named it. Now, in one kubelet call of many claims on one device, exactly one is prepared, the
/// others fail naming it, and claims on other devices and admin access are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_device_is_prepared_for_one_claim_at_a_time() {
    let env = Env::new().await;
    let daemon = env.start("").await;
    let mut claims: Vec<ClaimId> = (0..20)
        .map(|i| env.claim(&format!("c{i}"), &format!("uid-{i}"), &["gpu-0"]))
        .collect();
    claims.push(env.claim("other", "uid-other", &["gpu-1"]));
    env.api
        .put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "admin", "namespace": "default", "uid": "uid-admin"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "adminAccess": true}}]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0", "adminAccess": true}
                ]}}}
            }),
        )
        .unwrap();
    claims.push(ClaimId::new("default", "admin", "uid-admin"));
    let out = env.kubelet.prepare(DRIVER, &claims).await.unwrap();
    let winners: Vec<_> = (0..20)
        .filter(|i| out[&format!("uid-{i}")].is_ok())
        .collect();
    assert_eq!(winners.len(), 1, "{out:?}");
    let winner = format!("default/c{} (uid-{})", winners[0], winners[0]);
    for i in (0..20).filter(|i| *i != winners[0]) {
        let err = out[&format!("uid-{i}")].as_ref().unwrap_err();
        assert!(
            err.contains("gpu-0")
                && err.contains("does not allow multiple allocations")
                && err.contains(&winner),
            "{err}"
        );
    }
    assert!(out["uid-other"].is_ok(), "{out:?}");
    assert!(out["uid-admin"].is_ok(), "{out:?}");
    // Once the winner is unprepared, another claim can have the device.
    let first = claims[winners[0]].clone();
    let un = env.kubelet.unprepare(DRIVER, &[first]).await.unwrap();
    assert!(un.values().all(|r| r.is_ok()));
    let next = claims[(winners[0] + 1) % 20].clone();
    let out = env.kubelet.prepare(DRIVER, &[next]).await.unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    stop(daemon);
}

/// A FIFO where the checkpoint belongs used to hang the daemon in `open`, holding the node lock
/// and deaf to SIGTERM. Now it is never opened: it is moved aside like a corrupt checkpoint, the
/// error names the path and what was there, and the daemon starts, serves and stops on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_at_the_checkpoint_path_is_moved_aside_not_opened() {
    let env = Env::new().await;
    let state = env.root.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let checkpoint = state.join(kubedev::checkpoint::CHECKPOINT_FILE);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &checkpoint,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let daemon = env.start("").await;
    let log = env.log_text();
    assert!(
        log.contains(&checkpoint.display().to_string())
            && log.contains("a FIFO (named pipe), not a regular file"),
        "{log}"
    );
    let aside = state.join(format!(
        "{}.corrupt-1",
        kubedev::checkpoint::CHECKPOINT_FILE
    ));
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&aside)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(std::fs::symlink_metadata(&checkpoint).unwrap().is_file());
    let claim = env.claim("after", "claim-uid-after", &["gpu-0"]);
    let out = env.kubelet.prepare(DRIVER, &[claim]).await.unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    stop(daemon);
}

/// A regular file at the DRA socket path used to be replaced silently. The daemon now refuses
/// to start, naming the path and what is there, and leaves the file as it was; a stale socket
/// (its server gone) is replaced as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regular_file_at_the_socket_path_is_refused_and_a_stale_socket_replaced() {
    let env = Env::new().await;
    let plugins = env.root.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let socket = plugins.join("dra.sock");
    std::fs::write(&socket, "someone's data").unwrap();
    let mut daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_kubedev"))
            .args(["run", "--config"])
            .arg(env.root.path().join("kubedev.yaml"))
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = wait_exit(&mut daemon);
    assert!(!status.success());
    let mut err = String::new();
    use std::io::Read;
    daemon
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains(&socket.display().to_string()) && err.contains("a regular file of 14 bytes"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "someone's data");
    std::fs::remove_file(&socket).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let daemon = env.start("").await;
    stop(daemon);
}

/// When the API server cannot list the claims at start, a lost checkpoint keeps every spec (none
/// can be proven orphaned) and the rebuild is tried again in the background until it answers:
/// then the reserved claims get their records back and the spec of a claim with no pod goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_the_api_server_refused_at_start_finishes_later() {
    let env = Env::new().await;
    let a = env.claim("a", "claim-uid-a", &["gpu-0"]);
    let gone = env.claim("gone", "claim-uid-gone", &["gpu-1"]);
    env.reserve("a", Some("pod-a"));
    env.reserve("gone", Some("pod-gone"));
    let daemon = env.start("").await;
    let out = env.kubelet.prepare(DRIVER, &[a, gone]).await.unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    stop(daemon);
    let checkpoint = env.checkpoint_path();
    std::fs::write(&checkpoint, "not a checkpoint").unwrap();
    env.reserve("gone", None);
    env.api.fail_next(
        Verb::List,
        Resource::ResourceClaims,
        1,
        Fault::InternalError,
    );

    let daemon = env.start("").await;
    assert_eq!(
        env.cdi_files().len(),
        2,
        "a spec was removed without asking the API server"
    );
    assert!(env.checkpoint().is_empty());
    wait_for_only_record_and_spec(&env, "claim-uid-a", "the rebuild was not finished").await;
    stop(daemon);
}

/// A reserved claim the rebuild after a lost checkpoint could not prepare again, for a reason
/// the next try may not meet (the API server failed its GET), is tried again in the background:
/// the kubelet never prepares a running pod's claim again, so only kubedev can bring back its
/// record and spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_rebuild_could_not_prepare_is_tried_again_later() {
    let env = Env::new().await;
    let a = env.claim("a", "claim-uid-a", &["gpu-0"]);
    env.reserve("a", Some("pod-a"));
    let daemon = env.start("").await;
    let out = env.kubelet.prepare(DRIVER, &[a]).await.unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    stop(daemon);
    let checkpoint = env.checkpoint_path();
    std::fs::write(&checkpoint, "not a checkpoint").unwrap();
    env.api
        .fail_next(Verb::Get, Resource::ResourceClaims, 1, Fault::InternalError);

    let daemon = env.start("").await;
    assert!(
        env.checkpoint().is_empty(),
        "the first try failed, so the claim has no record yet"
    );
    wait_for_only_record_and_spec(&env, "claim-uid-a", "the claim was not prepared again").await;
    stop(daemon);
}

/// Waits up to 30 s until the checkpoint holds only claim `uid` and the CDI directory only its
/// spec; fails with `what` and what is there.
async fn wait_for_only_record_and_spec(env: &Env, uid: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.checkpoint().len() != 1 || env.cdi_files().len() != 1 {
        assert!(
            Instant::now() < deadline,
            "{what}: records {:?}, specs {:?}",
            env.checkpoint(),
            env.cdi_files()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(env.checkpoint()[0].0, uid);
    assert!(env.cdi_files()[0].to_string_lossy().contains(uid));
}

/// After a lost checkpoint, a reserved claim of this node whose pool no backend serves at the
/// moment (the backend's discovery failed at start) keeps its CDI spec, is named with its pool
/// in the recovery's report, and is prepared again once a later discovery finds the pool: the
/// kubelet never prepares a running pod's claim again. Both ways of telling the claim is this
/// node's are covered: an allocation that names the node, and a spec left on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_pool_is_not_served_after_a_lost_checkpoint_keeps_its_spec_until_rebuilt() {
    let env = Env::new().await;
    let named = env.claim("named", "claim-uid-named", &["gpu-0"]);
    allocate_on(&env, "named", NODE);
    let unnamed = env.claim("unnamed", "claim-uid-unnamed", &["gpu-1"]);
    env.reserve("named", Some("pod-named"));
    env.reserve("unnamed", Some("pod-unnamed"));
    let daemon = env.start("").await;
    let out = env
        .kubelet
        .prepare(DRIVER, &[named, unnamed])
        .await
        .unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    stop(daemon);
    let specs = env.cdi_files();
    assert_eq!(specs.len(), 2);
    let written: Vec<String> = specs
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    std::fs::write(env.checkpoint_path(), "not a checkpoint").unwrap();
    // Another node's claim, reserved there: not this node's to rebuild or report.
    env.claim("elsewhere", "claim-uid-elsewhere", &["gpu-2"]);
    allocate_on(&env, "elsewhere", "node-b");
    env.reserve("elsewhere", Some("pod-elsewhere"));

    let daemon = env.start("startup-discovery=fail").await;
    assert!(env.checkpoint().is_empty(), "no pool is served yet");
    assert_eq!(
        env.cdi_files(),
        specs,
        "the specs of the running pods' claims were removed"
    );
    let log = env.log_text();
    assert!(
        log.contains("claim-uid-named: no backend of this node serves its pool(s) node-a now")
            && log.contains(
                "claim-uid-unnamed: no backend of this node serves its pool(s) node-a now"
            )
            && !log.contains("claim-uid-elsewhere"),
        "{log}"
    );
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(40);
    while env.checkpoint().len() != 2 {
        assert!(
            Instant::now() < deadline,
            "the claims were not prepared again once their pool was served: records {:?}",
            env.checkpoint()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("rebuilt {:?} after the restart", started.elapsed());
    assert!(
        env.checkpoint()
            .iter()
            .all(|(_, s)| s == "PrepareCompleted")
    );
    let now: Vec<String> = env
        .cdi_files()
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(
        now, written,
        "the rebuilt specs differ from the prepared ones"
    );
    assert!(
        slices_of(&env.api).iter().any(|s| s["spec"]["devices"]
            .as_array()
            .is_some_and(|d| d.len() == 4)),
        "the pool discovered again was not published"
    );
    stop(daemon);
}

/// After a lost checkpoint, a reserved claim with one device in a pool a backend serves and
/// one in a pool that no backend serves at the moment waits as a whole, as a claim with none
/// served does: preparing it now would fail for good (prepare refuses a device no backend owns)
/// and leave the running pod without a way back. Its spec stays, the recovery names the pool
/// that is missing, and the claim gets no record until it can be prepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_one_pool_not_served_after_a_lost_checkpoint_waits_as_a_whole() {
    let env = Env::new().await;
    let split = env.claim("split", "claim-uid-split", &["gpu-0", "gpu-1"]);
    allocate_on(&env, "split", NODE);
    env.reserve("split", Some("pod-split"));
    let daemon = env.start("").await;
    let out = env.kubelet.prepare(DRIVER, &[split]).await.unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
    stop(daemon);
    let specs = env.cdi_files();
    assert_eq!(specs.len(), 1);
    let written = std::fs::read_to_string(&specs[0]).unwrap();
    std::fs::write(env.checkpoint_path(), "not a checkpoint").unwrap();
    // As if gpu-1 came from a second backend of this node whose discovery fails now.
    let mut claim = env
        .api
        .get(Resource::ResourceClaims, Some("default"), "split")
        .unwrap();
    claim["status"]["allocation"]["devices"]["results"][1]["pool"] = json!("node-a-nics");
    env.api.put_raw(Resource::ResourceClaims, claim).unwrap();

    let daemon = env.start("").await;
    let log = env.log_text();
    assert!(
        log.contains("claim-uid-split: no backend of this node serves its pool(s) node-a-nics now"),
        "the recovery does not say which pool the claim waits for: {log}"
    );
    assert!(
        env.checkpoint().is_empty(),
        "the claim was recorded although one of its pools is not served: {:?}",
        env.checkpoint()
    );
    assert_eq!(env.cdi_files(), specs, "the running pod's spec was removed");
    assert_eq!(std::fs::read_to_string(&specs[0]).unwrap(), written);
    stop(daemon);
}

/// Makes claim `name`'s allocation name `node` as the scheduler does for devices of a node's own
/// slices, its devices in the pool `node` (as `Env`'s backend names its pool).
fn allocate_on(env: &Env, name: &str, node: &str) {
    let mut claim = env
        .api
        .get(Resource::ResourceClaims, Some("default"), name)
        .unwrap();
    let allocation = &mut claim["status"]["allocation"];
    for result in allocation["devices"]["results"].as_array_mut().unwrap() {
        result["pool"] = json!(node);
    }
    allocation["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}
    ]}]});
    env.api.put_raw(Resource::ResourceClaims, claim).unwrap();
}
