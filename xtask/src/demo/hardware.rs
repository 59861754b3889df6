//! The demo's hardware backends: NVIDIA GPUs of a DGX A100 (through the NVML stand-in library)
//! and `/dev/kvm` slots of a host root, in one device-plugin daemon; an Xid error and its
//! recovery; and a resource added to the configuration file while the daemon runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, ensure};
use kubedev_testkit::kubelet::{KubeletEmulator, ResourceState};

use super::{Daemon, NODE, WAIT, say, show};

/// The hardware steps, in a directory beneath `tmp` (see the module docs).
pub(super) async fn hardware_story(step: &mut u32, bin: &Path, tmp: &Path) -> anyhow::Result<()> {
    let machine = Machine::new(tmp)?;
    std::fs::write(&machine.config_path, machine.config(false))?;
    discover(step, bin, &machine.config_path)?;

    say(
        step,
        "kubedev serves the GPUs as nvidia.com/gpu (a CEL selector picks them).",
    );
    let kubelet = KubeletEmulator::start(&machine.dp).await?;
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&machine.config_path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .context("starting kubedev")?;
    let _daemon = Daemon(child);
    let st = kubelet
        .wait_for("nvidia.com/gpu", WAIT, |r| r.connected && r.capacity == 8)
        .await
        .context("the GPUs were not registered")?;
    println!("    nvidia.com/gpu: {}", show(&st));
    let a = kubelet.allocate("nvidia.com/gpu", &["gpu-5"]).await?;
    println!(
        "    Allocate gpu-5 → NVIDIA_VISIBLE_DEVICES={}, devices {:?}",
        a.envs
            .get("NVIDIA_VISIBLE_DEVICES")
            .cloned()
            .unwrap_or_default(),
        a.devices
            .iter()
            .map(|d| d.host_path.as_str())
            .collect::<Vec<_>>()
    );

    xid_and_recovery(step, &kubelet, &machine.control).await?;
    live_configuration(step, &kubelet, &machine).await?;
    kubelet.stop().await;
    Ok(())
}

/// The hardware steps' directory: the device-plugin directory, a host root with `/dev/kvm`,
/// the NVML stand-in's control file and library, and where the configuration goes.
struct Machine {
    dir: PathBuf,
    dp: PathBuf,
    host: PathBuf,
    /// Lines written here reach the NVML stand-in (an Xid event).
    control: PathBuf,
    /// The NVML stand-in library of a DGX A100.
    lib: PathBuf,
    config_path: PathBuf,
}

impl Machine {
    /// Creates the directories and files beneath `tmp/hardware`.
    fn new(tmp: &Path) -> anyhow::Result<Machine> {
        let dir = tmp.join("hardware");
        let dp = dir.join("device-plugins");
        let host = dir.join("host");
        std::fs::create_dir_all(&dp)?;
        std::fs::create_dir_all(host.join("dev"))?;
        std::fs::write(host.join("dev/kvm"), "")?;
        let control = dir.join("nvml-control.jsonl");
        std::fs::write(&control, "")?;
        let lib =
            nvml_mock::isolated_library(&dir, &nvml_mock::machine_path("dgx-a100"), Some(&control))
                .context("the NVML stand-in library (cargo build -p kubedev-nvml-mock)")?;
        let config_path = dir.join("kubedev.yaml");
        Ok(Machine {
            dir,
            dp,
            host,
            control,
            lib,
            config_path,
        })
    }

    /// The daemon's configuration: the GPUs as nvidia.com/gpu, and with `kvm` a resource for
    /// the kvm slots too.
    fn config(&self, kvm: bool) -> String {
        let kvm_resource = if kvm {
            "    - name: devices.kubevirt.io/kvm\n      selector:\n        cel: '\"name\" in device.attributes[\"host.kubedev.io\"] && device.attributes[\"host.kubedev.io\"].name == \"kvm\"'\n"
        } else {
            ""
        };
        format!(
            "nodeName: {NODE}\nhostRoot: {host}\nstateDir: {d}/state\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: nvidia.com/gpu\n      selector:\n        cel: '\"type\" in device.attributes[\"gpu.nvidia.com\"] && device.attributes[\"gpu.nvidia.com\"].type == \"gpu\"'\n{kvm_resource}backends:\n  nvidia:\n    libraryPath: {lib}\n    healthRecheckSeconds: 2\n    healthPollMillis: 200\n  host:\n    characterDevices:\n      - {{name: kvm, path: /dev/kvm, slots: 4}}\n",
            host = self.host.display(),
            d = self.dir.display(),
            dp = self.dp.display(),
            lib = self.lib.display(),
        )
    }
}

/// `kubedev discover` on the configuration: what the hardware backends find.
fn discover(step: &mut u32, bin: &Path, config_path: &Path) -> anyhow::Result<()> {
    say(
        step,
        "Hardware backends: a DGX A100 (through the NVML stand-in library) and /dev/kvm slots. \
         `kubedev discover` shows what they find:",
    );
    let out = Command::new(bin)
        .args(["discover", "--config"])
        .arg(config_path)
        .env("RUST_LOG", "error")
        .output()?;
    ensure!(
        out.status.success(),
        "discover failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // The attribute column is long; the first columns tell the story.
        let short: String = line.chars().take(96).collect();
        println!("    {short}");
    }
    Ok(())
}

/// GPU 5 reports Xid 79 through the stand-in's `control` file: the kubelet sees it Unhealthy,
/// then Healthy again.
async fn xid_and_recovery(
    step: &mut u32,
    kubelet: &KubeletEmulator,
    control: &Path,
) -> anyhow::Result<()> {
    say(
        step,
        "GPU 5 reports Xid 79 (fallen off the bus): Unhealthy, then it recovers.",
    );
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().append(true).open(control)?;
        writeln!(f, "{{\"xid\": 79, \"gpu\": 5}}")?;
    }
    let health = |s: &'static str| {
        move |r: &ResourceState| r.devices.get("gpu-5").is_some_and(|d| d.health == s)
    };
    kubelet
        .wait_for("nvidia.com/gpu", WAIT, health("Unhealthy"))
        .await
        .context("gpu-5 never became Unhealthy")?;
    println!("    gpu-5 Unhealthy (allocatable 7)");
    kubelet
        .wait_for("nvidia.com/gpu", WAIT, health("Healthy"))
        .await
        .context("gpu-5 never recovered")?;
    println!("    gpu-5 Healthy again once NVML answers and no new Xid arrives");
    Ok(())
}

/// A resource for the kvm slots is added to the configuration file: it starts, and the GPU
/// server keeps its socket.
async fn live_configuration(
    step: &mut u32,
    kubelet: &KubeletEmulator,
    machine: &Machine,
) -> anyhow::Result<()> {
    say(
        step,
        "Live configuration: a resource for the kvm slots is added to the file; the GPU server \
         keeps running.",
    );
    let gpu_endpoint = kubelet.resource("nvidia.com/gpu").map(|r| r.endpoint);
    std::fs::write(&machine.config_path, machine.config(true))?;
    let st = kubelet
        .wait_for("devices.kubevirt.io/kvm", WAIT, |r| {
            r.connected && r.capacity == 4
        })
        .await
        .context("the kvm resource did not start")?;
    println!("    devices.kubevirt.io/kvm: {}", show(&st));
    ensure!(
        kubelet.resource("nvidia.com/gpu").map(|r| r.endpoint) == gpu_endpoint,
        "the GPU server was restarted"
    );
    println!("    nvidia.com/gpu still on its first socket");
    Ok(())
}
