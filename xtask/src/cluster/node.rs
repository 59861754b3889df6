//! One node's processes: etcd, the control plane, containerd and the kubelet, started in the
//! background with their logs in files, and everything they leave behind removed again.
//!
//! Every address is loopback, but for the pods' bridge (the `network` module), whose host
//! address the API server listens on. The kubelet's pods live beneath the cgroup
//! `/kubedev-cluster` (its `cgroupRoot`), so teardown finds every container process there; the
//! directories the run creates outside its own are listed in a state file and removed with it,
//! and what the kubelet and containerd change on the host beyond them is put back (the `host`
//! module).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::build::Binaries;
use super::host;
use super::image;
use super::network;
use super::pki::{self, Pki};

/// Where a run keeps its data (PKI, etcd, containerd's content, configuration).
pub(crate) const STATE_DIR: &str = "/var/lib/kubedev-cluster";
/// Where a run keeps sockets, runtime state and the list of what it started and created.
pub(crate) const RUN_DIR: &str = "/run/kubedev-cluster";
/// The kubelet's root directory: where the chart's host paths point.
const KUBELET_DIR: &str = "/var/lib/kubelet";
/// The cgroup (in every v1 hierarchy) beneath which the kubelet puts every pod.
const CGROUP_ROOT: &str = "kubedev-cluster";
/// Directories outside the run's own that the node writes to; those that did not exist
/// before `up` are removed by `down`.
const HOST_DIRS: &[&str] = &[
    KUBELET_DIR,
    "/etc/cdi",
    "/var/run/cdi",
    "/var/lib/kubedev",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/kubernetes",
    // Paths containerd's shims and libcni use whatever containerd's configuration says.
    "/run/containerd",
    "/var/lib/cni",
];

/// containerd's socket.
pub(crate) fn containerd_socket() -> PathBuf {
    Path::new(RUN_DIR).join("containerd/containerd.sock")
}

/// A running (or to be started) cluster's paths and tools.
pub(crate) struct Node {
    pub(crate) bins: Binaries,
    pub(crate) pki: Pki,
    pub(crate) logs: PathBuf,
    state: PathBuf,
}

impl Node {
    /// The admin kubeconfig.
    pub(crate) fn kubeconfig(&self) -> &Path {
        &self.pki.admin
    }

    /// `program` as a client of the cluster: the admin kubeconfig, and the cache of the API
    /// server's discovery that kubectl and Helm keep in the run directory rather than in the
    /// user's home (`down` removes it).
    pub(crate) fn client(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("KUBECONFIG", self.kubeconfig())
            .env("KUBECACHEDIR", Path::new(RUN_DIR).join("kube-cache"));
        cmd
    }

    /// `kubectl` with the admin kubeconfig.
    pub(crate) fn kubectl(&self) -> Command {
        self.client(self.bins.kube("kubectl"))
    }

    /// Runs kubectl with `args`; its standard output, or an error with its standard error.
    pub(crate) fn kubectl_out(&self, args: &[&str]) -> anyhow::Result<String> {
        crate::commands::stdout_of(
            self.kubectl().args(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    /// Whether the Node's Ready condition is True.
    pub(crate) fn ready(&self) -> anyhow::Result<bool> {
        let ready = self.kubectl_out(&[
            "get",
            "node",
            pki::NODE,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        Ok(ready.trim() == "True")
    }

    /// Whether the API server answers `/readyz` with ok.
    pub(crate) fn api_ready(&self) -> anyhow::Result<bool> {
        Ok(self.kubectl_out(&["get", "--raw=/readyz"])?.trim() == "ok")
    }

    /// Waits until `ready` says yes, as [`wait_for`] does, but fails at once, with the end of
    /// its log, when component `name` (process `pid`) exits first: a component that refused
    /// its flags is not waited for.
    pub(crate) fn wait_while_running(
        &self,
        name: &str,
        pid: u32,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let mut exited = None;
        let waited = wait_for(what, timeout, || {
            if let Err(e) = still_running(&self.logs, name, pid) {
                exited = Some(e);
                return Ok(true);
            }
            ready()
        });
        match exited {
            Some(e) => Err(e.context(what.to_string())),
            None => waited,
        }
    }

    /// Waits until the API server started as process `pid` is ready (90 s at most), failing
    /// at once when it exits.
    pub(crate) fn wait_api_ready(&self, pid: u32) -> anyhow::Result<()> {
        self.wait_while_running(
            "kube-apiserver",
            pid,
            "the API server ready",
            Duration::from_secs(90),
            || self.api_ready(),
        )
    }

    /// `ctr` in containerd's `k8s.io` namespace.
    pub(crate) fn ctr(&self) -> Command {
        let mut cmd = Command::new(self.bins.containerd.join("ctr"));
        cmd.arg("--address")
            .arg(containerd_socket())
            .args(["--namespace", "k8s.io"]);
        cmd
    }

    /// Stops component `name` (SIGTERM, then SIGKILL after 10 s) and starts it again with the
    /// same command line and environment; returns the new process's id.
    pub(crate) fn restart(&self, name: &str) -> anyhow::Result<u32> {
        self.restart_with(name, |_| {})
    }

    /// Like [`Node::restart`], with the command's arguments changed by `edit` first.
    pub(crate) fn restart_with(
        &self,
        name: &str,
        edit: impl FnOnce(&mut Vec<String>),
    ) -> anyhow::Result<u32> {
        let list = std::fs::read_to_string(Path::new(RUN_DIR).join("processes"))?;
        let pid: u32 = list
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
            .with_context(|| format!("{name} was not started by this cluster"))?;
        let command: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(command_file(name))
                .with_context(|| format!("how {name} was started"))?,
        )?;
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect()
        };
        let program = command["program"]
            .as_str()
            .context("no program in the command")?
            .to_string();
        let mut args = strings(&command["args"]);
        edit(&mut args);
        signal(pid, "TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(pid) {
            signal(pid, "KILL");
        }
        let env: Vec<(String, String)> = command["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|kv| Some((kv[0].as_str()?.to_string(), kv[1].as_str()?.to_string())))
            .collect();
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        spawn(&self.logs, name, Path::new(&program), &args, &env)
    }

    /// The last `lines` lines of each component's log, for a failure report.
    pub(crate) fn log_tails(&self, lines: usize) -> String {
        let mut text = String::new();
        let Ok(entries) = std::fs::read_dir(&self.logs) else {
            return text;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            let content = std::fs::read_to_string(&file).unwrap_or_default();
            let all: Vec<&str> = content.lines().collect();
            let from = all.len().saturating_sub(lines);
            text.push_str(&format!("\n--- {} (last {lines} lines)\n", file.display()));
            for line in &all[from..] {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

/// Waits up to `timeout` for `ready` to hold, polling every 200 ms; the error names `what`
/// and the last failure.
pub(crate) fn wait_for(
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = String::from("not yet");
    loop {
        match ready() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(err) => last = format!("{err:#}"),
        }
        if started.elapsed() > timeout {
            bail!("{what}: not within {timeout:?} ({last})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts `program` in the background, in a process group of its own, its output appended
/// to `<logs>/<name>.log`, and records it in the run's process list.
fn spawn(
    logs: &Path,
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(&str, String)],
) -> anyhow::Result<u32> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs.join(format!("{name}.log")))?;
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pid = child.id();
    let mut list = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(Path::new(RUN_DIR).join("processes"))?;
    writeln!(list, "{name} {pid}")?;
    // How it was started, for a restart even after it exited (e.g. refused its flags).
    let command = serde_json::json!({
        "program": program,
        "args": args,
        "env": env.iter().map(|(k, v)| [*k, v.as_str()]).collect::<Vec<_>>(),
    });
    std::fs::write(command_file(name), command.to_string())?;
    eprintln!("started {name} (pid {pid})");
    Ok(pid)
}

/// Where the command that last started component `name` is kept.
fn command_file(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{name}.command.json"))
}

/// Whether process `pid` runs (and is no zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Fails naming `name` and its log when process `pid` is gone.
fn still_running(logs: &Path, name: &str, pid: u32) -> anyhow::Result<()> {
    if alive(pid) {
        return Ok(());
    }
    let log = std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    // The last error or fatal line (klog's `E`/`F`) says why, above the shutdown noise.
    let reason = tail
        .iter()
        .find(|l| l.starts_with('E') || l.starts_with('F'))
        .map_or_else(String::new, |l| format!(": {l}"));
    bail!(
        "{name} exited{reason}; the end of its log:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// What `up` checks before it changes anything: root, cgroup v1 controllers the kubelet needs,
/// Debian's runc, no cluster already running, no kubelet directory of someone else's.
fn preflight() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    if !rustix::process::geteuid().is_root() {
        missing.push("root (the kubelet and containerd run as root)".to_string());
    }
    for controller in [
        "cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer",
    ] {
        if !Path::new("/sys/fs/cgroup").join(controller).is_dir()
            && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        {
            missing.push(format!("the cgroup controller {controller}"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        bail!(
            "the cluster cannot start here; missing: {}",
            missing.join(", ")
        )
    }
}

/// Starts every component and waits until the node is Ready; `images` are imported into
/// containerd before the kubelet starts. A cluster already running is torn down first.
pub(crate) fn up(bins: Binaries, logs: PathBuf, images: &[PathBuf]) -> anyhow::Result<Node> {
    preflight()?;
    if Path::new(RUN_DIR).join("processes").exists() {
        eprintln!("a cluster is running: tearing it down first");
        down()?;
    }
    let kubelet_dir = Path::new(KUBELET_DIR);
    if kubelet_dir.exists() && !Path::new(STATE_DIR).join("owns-kubelet-dir").exists() {
        bail!(
            "{KUBELET_DIR} exists and this tool did not make it: another kubelet runs or ran on \
             this machine; the test cluster will not share its directory"
        );
    }
    let state = PathBuf::from(STATE_DIR);
    std::fs::create_dir_all(&state)?;
    std::fs::create_dir_all(RUN_DIR)?;
    // Host directories this run creates, removed by `down`.
    let mut created = Vec::new();
    for dir in HOST_DIRS {
        if !Path::new(dir).exists() {
            created.push(*dir);
            std::fs::create_dir_all(dir)?;
        }
    }
    std::fs::write(Path::new(RUN_DIR).join("created"), created.join("\n"))?;
    host::Before::record_once(Path::new(RUN_DIR))?;
    if created.contains(&KUBELET_DIR) {
        std::fs::write(state.join("owns-kubelet-dir"), b"")?;
    }
    if logs.exists() {
        std::fs::remove_dir_all(&logs)?;
    }
    std::fs::create_dir_all(&logs)?;
    for controller in cgroup_controllers() {
        std::fs::create_dir_all(controller.join(CGROUP_ROOT))?;
    }
    // cpuset: a new cgroup starts with no CPUs and no memory nodes; give it its parent's.
    let cpuset = Path::new("/sys/fs/cgroup/cpuset");
    for file in ["cpuset.cpus", "cpuset.mems"] {
        if let Ok(value) = std::fs::read_to_string(cpuset.join(file)) {
            std::fs::write(cpuset.join(CGROUP_ROOT).join(file), value.trim())?;
        }
    }

    network::create()?;
    let pki = pki::generate(&state.join("pki"))?;
    let node = Node {
        bins,
        pki,
        logs,
        state,
    };
    start_control_plane(&node)?;
    start_containerd(&node)?;
    for archive in images {
        let out = node
            .ctr()
            .args(["images", "import", "--platform", "linux/amd64"])
            .arg(archive)
            .output()
            .context("running ctr images import")?;
        if !out.status.success() {
            bail!(
                "importing {} into containerd failed: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    start_kubelet(&node)?;
    Ok(node)
}

/// etcd, the API server, the controller manager and the scheduler.
fn start_control_plane(node: &Node) -> anyhow::Result<()> {
    let pki = &node.pki;
    let p = |path: &Path| path.display().to_string();
    let etcd = spawn(
        &node.logs,
        "etcd",
        &node.bins.etcd.join("server"),
        &[
            "--name=kubedev".into(),
            format!("--data-dir={}", node.state.join("etcd").display()),
            "--listen-client-urls=http://127.0.0.1:2379".into(),
            "--advertise-client-urls=http://127.0.0.1:2379".into(),
            "--listen-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-cluster=kubedev=http://127.0.0.1:2380".into(),
            "--listen-metrics-urls=http://127.0.0.1:2381".into(),
            "--log-level=warn".into(),
        ],
        &[],
    )?;
    node.wait_while_running(
        "etcd",
        etcd,
        "etcd serving",
        Duration::from_secs(30),
        || Ok(std::net::TcpStream::connect("127.0.0.1:2379").is_ok()),
    )?;
    let apiserver = spawn(
        &node.logs,
        "kube-apiserver",
        &node.bins.kube("kube-apiserver"),
        &[
            "--etcd-servers=http://127.0.0.1:2379".into(),
            // Reached by pods on the bridge too (kubedev's daemon in its own network namespace).
            format!("--bind-address={}", network::HOST),
            format!("--advertise-address={}", network::HOST),
            "--secure-port=6443".into(),
            "--endpoint-reconciler-type=none".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--allow-privileged=true".into(),
            format!("--client-ca-file={}", p(&pki.ca.cert)),
            format!("--tls-cert-file={}", p(&pki.apiserver.cert)),
            format!("--tls-private-key-file={}", p(&pki.apiserver.key)),
            format!(
                "--kubelet-client-certificate={}",
                p(&pki.apiserver_kubelet_client.cert)
            ),
            format!(
                "--kubelet-client-key={}",
                p(&pki.apiserver_kubelet_client.key)
            ),
            format!("--kubelet-certificate-authority={}", p(&pki.ca.cert)),
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p(&pki.sa_pub)),
            format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--profiling=false".into(),
        ],
        &[],
    )?;
    node.wait_api_ready(apiserver)?;
    let controller_manager = spawn(
        &node.logs,
        "kube-controller-manager",
        &node.bins.kube("kube-controller-manager"),
        &[
            format!("--kubeconfig={}", p(&pki.controller_manager)),
            format!("--authentication-kubeconfig={}", p(&pki.controller_manager)),
            format!("--authorization-kubeconfig={}", p(&pki.controller_manager)),
            "--bind-address=127.0.0.1".into(),
            "--leader-elect=false".into(),
            "--controllers=*".into(),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", p(&pki.sa_key)),
            format!("--root-ca-file={}", p(&pki.ca.cert)),
            format!("--cluster-signing-cert-file={}", p(&pki.ca.cert)),
            format!("--cluster-signing-key-file={}", p(&pki.ca.key)),
            "--allocate-node-cidrs=false".into(),
        ],
        &[],
    )?;
    let scheduler = spawn(
        &node.logs,
        "kube-scheduler",
        &node.bins.kube("kube-scheduler"),
        &[
            format!("--kubeconfig={}", p(&pki.scheduler)),
            format!("--authentication-kubeconfig={}", p(&pki.scheduler)),
            format!("--authorization-kubeconfig={}", p(&pki.scheduler)),
            "--bind-address=127.0.0.1".into(),
            "--leader-elect=false".into(),
        ],
        &[],
    )?;
    std::thread::sleep(Duration::from_secs(1));
    still_running(&node.logs, "kube-controller-manager", controller_manager)?;
    still_running(&node.logs, "kube-scheduler", scheduler)
}

/// containerd with runc, CDI on, the sandbox image pinned and pods on the run's bridge.
fn start_containerd(node: &Node) -> anyhow::Result<()> {
    let cni_conf = node.state.join("cni/net.d");
    std::fs::create_dir_all(&cni_conf)?;
    std::fs::write(
        cni_conf.join("10-kubedev-pods.conflist"),
        network::conflist(&node.state.join("cni/ipam")),
    )?;
    let runc = which("runc").context("runc is not installed (Debian package runc)")?;
    let config = format!(
        r#"version = 3
root = "{root}"
state = "{run}/containerd"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{run}/containerd/containerd.sock.ttrpc"

[plugins.'io.containerd.nri.v1.nri']
  # NRI's socket in the run directory rather than at its fixed /var/run/nri.
  socket_path = "{run}/nri.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.runtime']
  # No process here may lower an OOM score (the machine withholds CAP_SYS_RESOURCE): keep
  # every container's at or above containerd's own instead of failing to start it.
  restrict_oom_score_adj = true
  enable_cdi = true
  # Pods' network namespaces beneath the run directory, where teardown finds them.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        root = node.state.join("containerd").display(),
        run = RUN_DIR,
        socket = containerd_socket().display(),
        pause = image::PAUSE,
        runc = runc.display(),
        cni_bin = node.bins.cni.display(),
        cni_conf = cni_conf.display(),
    );
    let path = node.state.join("containerd.toml");
    std::fs::write(&path, config)?;
    let search_path = format!(
        "{}:{}",
        node.bins.containerd.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let pid = spawn(
        &node.logs,
        "containerd",
        &node.bins.containerd.join("containerd"),
        &["--config".into(), path.display().to_string()],
        &[("PATH", search_path)],
    )?;
    node.wait_while_running(
        "containerd",
        pid,
        "containerd serving",
        Duration::from_secs(30),
        || {
            Ok(node
                .ctr()
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success()))
        },
    )
}

/// The kubelet, and the node Ready.
fn start_kubelet(node: &Node) -> anyhow::Result<()> {
    let pki = &node.pki;
    let config = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
imageServiceEndpoint: unix://{socket}
staticPodPath: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
maxPods: 250
registerNode: true
"#,
        cert = pki.kubelet_serving.cert.display(),
        key = pki.kubelet_serving.key.display(),
        ca = pki.ca.cert.display(),
        socket = containerd_socket().display(),
    );
    let path = node.state.join("kubelet.yaml");
    std::fs::write(&path, config)?;
    let pid = spawn(
        &node.logs,
        "kubelet",
        &node.bins.kube("kubelet"),
        &[
            format!("--config={}", path.display()),
            format!("--kubeconfig={}", pki.kubelet.display()),
            format!("--hostname-override={}", pki::NODE),
            "--node-ip=127.0.0.1".into(),
            "--v=2".into(),
        ],
        &[],
    )?;
    node.wait_while_running(
        "kubelet",
        pid,
        "the node Ready",
        Duration::from_secs(120),
        || node.ready(),
    )
}

/// Finds `program` on PATH.
fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// The mounted cgroup v1 hierarchies (one directory each).
fn cgroup_controllers() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists() && !p.join("cgroup.controllers").exists())
        .collect()
}

/// Every process in `cgroup` and the cgroups beneath it.
fn cgroup_processes(cgroup: &Path, into: &mut BTreeSet<u32>) {
    if let Ok(procs) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
        into.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    for entry in std::fs::read_dir(cgroup).into_iter().flatten().flatten() {
        if entry.path().is_dir() {
            cgroup_processes(&entry.path(), into);
        }
    }
}

/// Removes `cgroup` and every cgroup beneath it, deepest first.
fn remove_cgroup(cgroup: &Path) {
    for entry in std::fs::read_dir(cgroup).into_iter().flatten().flatten() {
        if entry.path().is_dir() {
            remove_cgroup(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(cgroup);
}

/// Sends `signal` (a `kill` signal name) to `pid`.
fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Processes whose executable lies in `dir`.
fn processes_running_from(dir: &Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.starts_with(dir))
        })
        .collect()
}

/// Mount points beneath any of `prefixes`, deepest first.
fn mounts_beneath(prefixes: &[&str]) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| {
            prefixes
                .iter()
                .any(|pre| p == pre || p.starts_with(&format!("{pre}/")))
        })
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    points
}

/// Copies the containers' logs of the kubedev namespace (the daemon's) into `logs`, so they
/// outlive the teardown.
pub(crate) fn keep_pod_logs(logs: &Path) {
    for entry in std::fs::read_dir("/var/log/pods")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("kubedev_") {
            continue;
        }
        let _ = Command::new("cp")
            .arg("-rL")
            .arg(entry.path())
            .arg(logs.join(format!("pod-{name}")))
            .status();
    }
}

/// Stops every process the run started and every container, unmounts what they mounted,
/// removes the run's cgroups and directories; then checks that nothing is left and says what
/// is.
pub(crate) fn down() -> anyhow::Result<()> {
    let run = Path::new(RUN_DIR);
    let host = host::Before::load(run);
    let started: Vec<(String, u32)> = std::fs::read_to_string(run.join("processes"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, pid) = l.split_once(' ')?;
            Some((name.to_string(), pid.parse().ok()?))
        })
        .collect();
    // The kubelet first, so it restarts nothing; then every container and shim.
    for (name, pid) in &started {
        if name == "kubelet" && alive(*pid) {
            signal(*pid, "KILL");
        }
    }
    let mut shims_dirs = BTreeSet::new();
    for (name, pid) in &started {
        if name == "containerd"
            && let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe"))
            && let Some(dir) = exe.parent()
        {
            shims_dirs.insert(dir.to_path_buf());
        }
    }
    if let Ok(cache) = super::build::cache_root() {
        shims_dirs.insert(cache);
    }
    for _ in 0..3 {
        let mut pids = BTreeSet::new();
        for controller in cgroup_controllers() {
            cgroup_processes(&controller.join(CGROUP_ROOT), &mut pids);
        }
        for dir in &shims_dirs {
            pids.extend(
                processes_running_from(dir)
                    .into_iter()
                    .filter(|p| !started.iter().any(|(_, s)| s == p)),
            );
        }
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            signal(*pid, "KILL");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // The rest in reverse order of starting: gently, then not.
    for (_, pid) in started.iter().rev() {
        if alive(*pid) {
            signal(*pid, "TERM");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while started.iter().any(|(_, p)| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for (_, pid) in &started {
        if alive(*pid) {
            signal(*pid, "KILL");
        }
    }
    let created: Vec<String> = std::fs::read_to_string(run.join("created"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let mut roots: Vec<&str> = vec![RUN_DIR, STATE_DIR, KUBELET_DIR];
    roots.extend(created.iter().map(String::as_str));
    for point in mounts_beneath(&roots) {
        let _ = Command::new("umount")
            .args(["--lazy", &point])
            .stderr(Stdio::null())
            .status();
    }
    for controller in cgroup_controllers() {
        remove_cgroup(&controller.join(CGROUP_ROOT));
    }
    if let Some(host) = &host {
        for problem in host.restore(run) {
            eprintln!("putting the host back: {problem}");
        }
    }
    for dir in &created {
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_dir_all(STATE_DIR);
    let _ = std::fs::remove_dir_all(RUN_DIR);
    if let Err(e) = network::remove() {
        eprintln!("{e:#}");
    }
    left_behind(&started, &created, &shims_dirs, host.as_ref())
}

/// What a teardown left: processes, mounts, cgroups, directories, and what `host` says of
/// the host outside them (kernel settings, iptables chains, CNI results, shim sockets).
fn left_behind(
    started: &[(String, u32)],
    created: &[String],
    shim_dirs: &BTreeSet<PathBuf>,
    host: Option<&host::Before>,
) -> anyhow::Result<()> {
    let mut left = host.map(|h| h.left(Path::new(RUN_DIR))).unwrap_or_default();
    for (name, pid) in started {
        if alive(*pid) {
            left.push(format!("process {name} ({pid})"));
        }
    }
    for dir in shim_dirs {
        for pid in processes_running_from(dir) {
            left.push(format!("process {pid} running from {}", dir.display()));
        }
    }
    let mut roots: Vec<&str> = vec![RUN_DIR, STATE_DIR, KUBELET_DIR];
    roots.extend(created.iter().map(String::as_str));
    for point in mounts_beneath(&roots) {
        left.push(format!("mount {point}"));
    }
    for controller in cgroup_controllers() {
        if controller.join(CGROUP_ROOT).exists() {
            left.push(format!("cgroup {}", controller.join(CGROUP_ROOT).display()));
        }
    }
    if network::exists() {
        left.push(format!("network interface {}", network::BRIDGE));
    }
    for dir in created
        .iter()
        .map(String::as_str)
        .chain([STATE_DIR, RUN_DIR])
    {
        if Path::new(dir).exists() {
            left.push(format!("directory {dir}"));
        }
    }
    if left.is_empty() {
        eprintln!(
            "cluster torn down: no process, mount, cgroup or directory of it is left{}",
            if host.is_some() {
                ", and the kernel settings and iptables chains are as they were"
            } else {
                ""
            }
        );
        Ok(())
    } else {
        bail!("the cluster's teardown left: {}", left.join(", "))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_exited_component_is_reported_with_the_reason_from_its_log() {
        let logs = tempfile::tempdir().unwrap();
        std::fs::write(
            logs.path().join("kube-apiserver.log"),
            "I1206 22:12:02 13126 controller.go:93] \"Shutting down\"\n\
             E1206 22:12:12 14276 run.go:72] \"command failed\" err=\"emulation version 1.34 is not between [1.35, 1.38]\"\n\
             I1206 22:12:12 14276 options.go:261] leaving\n",
        )
        .unwrap();
        // No process has the largest pid.
        let err = still_running(logs.path(), "kube-apiserver", u32::MAX).unwrap_err();
        let first = err.to_string();
        let first = first.lines().next().unwrap();
        assert!(
            first.starts_with("kube-apiserver exited: E1206")
                && first.contains("emulation version 1.34 is not between"),
            "{first}"
        );
        assert!(still_running(logs.path(), "self", std::process::id()).is_ok());
    }
}
