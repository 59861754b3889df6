//! The NVIDIA CDI hook: the runtime runs it to link the libraries and refresh the loader's
//! cache.

use serde_json::Value;

use super::{
    Fixture, LIB_DIR, VERSION, dra_node, gpus, nvidia_backend, prepare, run_spec, unprepare,
};

#[tokio::test]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn with_a_cdi_hook_the_runtime_runs_it_to_link_and_cache_the_libraries() {
    let Fixture {
        podman,
        root,
        dir,
        lib,
        ..
    } = Fixture::new();
    // A stand-in for NVIDIA's hook: it records its arguments and the container state the
    // runtime hands it on standard input, one file per run.
    let log = dir.path().join("hook-log");
    std::fs::create_dir_all(&log).unwrap();
    let hook = dir.path().join("nvidia-cdi-hook");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\nf={}/$$\necho \"$@\" > \"$f.args\"\ncat > \"$f.state\"\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let backends = format!(
        "{}    cdiHookPath: {}\n",
        nvidia_backend(&lib, &root),
        hook.display()
    );
    let node = dra_node(dir.path(), &backends).await;
    let one = gpus(&node, &["gpu-0"]).await;
    let spec = prepare(&node, dir.path(), "uid-hook", &[one[0].0.clone()]).await;
    let parsed: Value = serde_json::from_str(&spec).unwrap();
    assert_eq!(
        parsed["containerEdits"]["hooks"].as_array().map(Vec::len),
        None,
        "one device: its hooks stay on it"
    );
    // The libraries are mounted under their own names only; the hook makes the other names.
    let mounted: Vec<&str> = parsed["devices"][0]["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    assert!(
        mounted.contains(&format!("/{LIB_DIR}/libcuda.so.{VERSION}").as_str())
            && !mounted.iter().any(|m| m.ends_with("/libcuda.so.1")),
        "{mounted:?}"
    );
    let (installed, out) = run_spec(
        &podman,
        &spec,
        format!("ls /{LIB_DIR} | tr '\\n' ' ' | sed 's/^/libs=/'; echo"),
    );
    assert!(
        out.value("libs")
            .is_some_and(|l| l.contains(&format!("libcuda.so.{VERSION}"))),
        "{}",
        out.report()
    );
    drop(installed);
    let mut runs: Vec<String> = std::fs::read_dir(&log)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "args").then(|| std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    runs.sort();
    let dir_in_container = format!("/{LIB_DIR}");
    assert_eq!(runs.len(), 2, "both hooks ran once: {runs:?}");
    assert!(
        runs.iter().any(|r| r.starts_with("create-symlinks")
            && r.contains(&format!(
                "--link libcuda.so.{VERSION}::{dir_in_container}/libcuda.so.1"
            ))),
        "{runs:?}"
    );
    assert!(
        runs.iter()
            .any(|r| r.trim() == format!("update-ldcache --folder {dir_in_container}")),
        "{runs:?}"
    );
    // Each ran with the container's state, as a createContainer hook does.
    for entry in std::fs::read_dir(&log).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "state") {
            let state: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            assert!(state["bundle"].is_string(), "{state}");
            assert!(state["pid"].as_u64().is_some_and(|p| p > 0), "{state}");
        }
    }
    unprepare(&node, "uid-hook").await;
    node.stop().await;
}
