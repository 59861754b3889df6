//! The demo's device-plugin steps: kubedev registers its GPU resource, the kubelet learns
//! capacity, a pod gets 2 GPUs packed on one NUMA node with their container edits, a GPU fails
//! and recovers, the kubelet restarts, and SIGTERM stops the daemon cleanly.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kubedev_testkit::kubelet::KubeletEmulator;

use super::{Daemon, GPU, Setup, WAIT, say, show};

/// Starts `kubedev run` with the static backend and waits until it registers its resource.
pub(super) async fn start_daemon(
    step: &mut u32,
    bin: &Path,
    config_path: &Path,
    kubelet: &KubeletEmulator,
) -> anyhow::Result<Daemon> {
    say(
        step,
        "kubedev starts with the static backend: 4 GPUs for the device plugin, 2 NICs for DRA.",
    );
    let t0 = Instant::now();
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(config_path)
        .env(
            "RUST_LOG",
            std::env::var("KUBEDEV_DEMO_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .spawn()
        .context("starting kubedev")?;
    let daemon = Daemon(child);
    ensure!(
        kubelet.wait_registrations(1, WAIT).await,
        "kubedev did not register its resource: {:?}",
        kubelet.registrations()
    );
    println!("    registered in {:.0?}:", t0.elapsed());
    for r in kubelet.registrations() {
        println!(
            "    Register(version={}, resource={}, endpoint={})",
            r.version, r.resource, r.endpoint
        );
    }
    Ok(daemon)
}

/// Waits until the kubelet knows the capacity and allocatable of each resource.
pub(super) async fn show_capacity(step: &mut u32, kubelet: &KubeletEmulator) -> anyhow::Result<()> {
    say(
        step,
        "The kubelet opened ListAndWatch and now knows capacity and allocatable.",
    );
    for res in [GPU] {
        let st = kubelet
            .wait_for(res, WAIT, |r| r.connected && r.capacity > 0)
            .await
            .with_context(|| format!("no devices for {res}"))?;
        println!("    {res}: {}", show(&st));
    }
    Ok(())
}

/// GetPreferredAllocation packs 2 GPUs on one NUMA node, Allocate returns their container
/// edits, and an unknown device is refused.
pub(super) async fn allocate_gpus(step: &mut u32, kubelet: &KubeletEmulator) -> anyhow::Result<()> {
    say(
        step,
        "A pod asks for 2 GPUs: GetPreferredAllocation packs them on one NUMA node.",
    );
    let all: Vec<String> = (0..4).map(|i| format!("gpu-{i}")).collect();
    let preferred = kubelet
        .preferred_allocation(GPU, &all, &["gpu-2".to_string()], 2)
        .await
        .context("GetPreferredAllocation")?;
    println!("    available {all:?}, must include [\"gpu-2\"] -> preferred {preferred:?}");
    ensure!(
        preferred == ["gpu-2", "gpu-3"],
        "unexpected preference {preferred:?}"
    );

    say(
        step,
        "Allocate returns the container edits for those devices.",
    );
    let ids: Vec<&str> = preferred.iter().map(String::as_str).collect();
    let resp = kubelet.allocate(GPU, &ids).await.context("Allocate")?;
    for (k, v) in &resp.envs {
        println!("    env    {k}={v}");
    }
    for d in &resp.devices {
        println!(
            "    device {} -> {} ({})",
            d.host_path, d.container_path, d.permissions
        );
    }
    ensure!(resp.envs.get("STATIC_VISIBLE_DEVICES").map(String::as_str) == Some("gpu-2,gpu-3"));
    let err = kubelet.allocate(GPU, &["gpu-7"]).await.err();
    println!(
        "    Allocate([gpu-7]) -> {}",
        err.as_ref()
            .map(|e| format!("{:?}: {}", e.code(), e.message()))
            .unwrap_or_else(|| "accepted?!".into())
    );
    ensure!(err.is_some(), "unknown device was accepted");
    Ok(())
}

/// gpu-1's presence file disappears and comes back: the kubelet sees it Unhealthy, then
/// healthy again.
pub(super) async fn fail_and_recover(
    step: &mut u32,
    kubelet: &KubeletEmulator,
    health_dir: &Path,
) -> anyhow::Result<()> {
    say(
        step,
        "gpu-1 fails (its presence file disappears): the kubelet sees it Unhealthy.",
    );
    std::fs::remove_file(health_dir.join("gpu-1"))?;
    let st = kubelet
        .wait_for(GPU, WAIT, |r| r.allocatable == 3)
        .await
        .context("the kubelet never saw gpu-1 fail")?;
    println!("    {GPU}: {}", show(&st));

    say(step, "gpu-1 comes back: health recovers without a restart.");
    std::fs::write(health_dir.join("gpu-1"), "")?;
    let st = kubelet
        .wait_for(GPU, WAIT, |r| r.allocatable == 4)
        .await
        .context("gpu-1 never recovered")?;
    println!("    {GPU}: {}", show(&st));
    Ok(())
}

/// The kubelet restarts and wipes its sockets; kubedev registers again and serves all 4 GPUs.
pub(super) async fn restart_kubelet(
    step: &mut u32,
    kubelet: &mut KubeletEmulator,
) -> anyhow::Result<()> {
    say(
        step,
        "The kubelet restarts and wipes every socket; kubedev serves and registers again.",
    );
    let since = kubelet.uptime();
    let t = Instant::now();
    kubelet.restart().await?;
    ensure!(
        kubelet.wait_registered_since(GPU, since, WAIT).await,
        "kubedev did not re-register after the restart: {:?}",
        kubelet.registrations()
    );
    println!("    re-registered {:.0?} after the restart", t.elapsed());
    let st = kubelet
        .wait_for(GPU, WAIT, |r| r.connected && r.capacity == 4)
        .await
        .context("no devices after the restart")?;
    println!("    {GPU}: {}", show(&st));
    Ok(())
}

/// SIGTERM: the daemon exits cleanly and leaves no device-plugin or registration socket.
pub(super) async fn stop_daemon(
    step: &mut u32,
    daemon: &mut Daemon,
    setup: &Setup,
) -> anyhow::Result<()> {
    say(
        step,
        "SIGTERM: kubedev stops serving and removes its sockets.",
    );
    let pid = rustix::process::Pid::from_raw(i32::try_from(daemon.0.id())?)
        .context("daemon has no pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = daemon.0.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            bail!("kubedev did not stop within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(status.success(), "kubedev exited with {status}");
    let left: Vec<String> = std::fs::read_dir(&setup.dp_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "kubelet.sock")
        .collect();
    let reg_left: Vec<_> = std::fs::read_dir(setup.dra_root.join("plugins_registry"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ensure!(
        reg_left.is_empty(),
        "registration socket left behind: {reg_left:?}"
    );
    println!("    kubedev exited ({status}); sockets left behind: {left:?}");
    ensure!(left.is_empty(), "sockets left behind: {left:?}");
    Ok(())
}
