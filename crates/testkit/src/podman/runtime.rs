//! [`Podman`]: podman's private store and busybox root filesystem, and running one container
//! in a private mount namespace with its fake device nodes, under a timeout, with its cgroups
//! removed afterwards.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::check::Check;
use super::container::{Container, RunOutput};
use super::expect::SpecExpectations;
use super::tools::{RUN_PATH, Tools};
use super::{PodmanError, VERBOSE_ENV, io_err};

/// Numbers the runs of this process (cgroup parents and namespace directories).
static NEXT_RUN: AtomicU32 = AtomicU32::new(0);

/// podman with a private store and a busybox root filesystem, both removed when dropped.
#[derive(Debug)]
pub struct Podman {
    pub(super) tools: Tools,
    work: tempfile::TempDir,
    rootfs: PathBuf,
}

impl Podman {
    /// Checks the tools ([`Tools::find`]) and builds the root filesystem: busybox and its
    /// applets as relative links in `/bin`.
    pub fn new() -> Result<Podman, PodmanError> {
        let tools = Tools::find()?;
        let work = tempfile::Builder::new()
            .prefix("kubedev-podman")
            .tempdir()
            .map_err(io_err("creating the podman work directory"))?;
        let w = work.path();
        let rootfs = w.join("rootfs");
        for d in ["bin", "etc", "proc", "sys", "dev", "tmp", "run"] {
            std::fs::create_dir_all(rootfs.join(d))
                .map_err(io_err(format!("creating {}", rootfs.join(d).display())))?;
        }
        for d in ["storage", "run", "tmp", "home"] {
            std::fs::create_dir_all(w.join(d))
                .map_err(io_err(format!("creating {}", w.join(d).display())))?;
        }
        // Files of its own, so the host's configuration changes nothing.
        std::fs::write(w.join("containers.conf"), "").map_err(io_err("writing containers.conf"))?;
        std::fs::write(
            w.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n",
                w.join("run").display(),
                w.join("storage").display()
            ),
        )
        .map_err(io_err("writing storage.conf"))?;
        let bin = rootfs.join("bin");
        std::fs::copy(&tools.busybox, bin.join("busybox")).map_err(io_err(format!(
            "copying {} into the root filesystem",
            tools.busybox.display()
        )))?;
        let list = Command::new(&tools.busybox)
            .arg("--list")
            .output()
            .map_err(io_err("running busybox --list"))?;
        for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            if applet != "busybox" && !applet.contains('/') {
                // Relative links: absolute ones would point into the host's directory.
                std::os::unix::fs::symlink("busybox", bin.join(applet))
                    .map_err(io_err(format!("linking the applet {applet}")))?;
            }
        }
        if !bin.join("sh").exists() {
            return Err(PodmanError::Missing {
                missing: format!("a busybox with sh ({})", tools.busybox.display()),
            });
        }
        Ok(Podman {
            tools,
            work,
            rootfs,
        })
    }

    /// The tools in use.
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// Runs a container with no devices that prints a line: Ok when podman can run containers
    /// here, else an error with podman's output.
    pub fn smoke_test(&self) -> Result<(), PodmanError> {
        let out = self.run(Container::new("echo kubedev-podman-ok"))?;
        if out.success() && out.stdout.contains("kubedev-podman-ok") {
            Ok(())
        } else {
            Err(PodmanError::Io {
                context: format!("podman cannot run a container here:\n{}", out.report()),
                source: std::io::Error::other("podman run failed"),
            })
        }
    }

    /// Runs `container` to its end (`podman run --rm`) in a private mount namespace with its
    /// fake nodes, then removes its cgroups; the exit status is the script's (or podman's
    /// 125–127). Errors are for runs that could not start or did not end in time.
    pub fn run(&self, container: Container) -> Result<RunOutput, PodmanError> {
        for node in &container.nodes {
            node.validate()?;
        }
        let checks = container
            .checks
            .iter()
            .map(|(spec, devices)| SpecExpectations::new(spec, devices, &container.nodes))
            .collect::<Result<Vec<_>, _>>()?;
        let check = Check::merge(checks);
        let script = format!("{}\n{}", check.script(), container.script);

        let n = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
        let cgroup = format!("kubedev-test-{}-{n}", std::process::id());
        let ns = self.work.path().join(format!("ns-{n}"));
        std::fs::create_dir_all(&ns).map_err(io_err(format!("creating {}", ns.display())))?;

        let cmd = self.command(&container, &script, &cgroup, &ns);
        let result = run_with_timeout(cmd, container.timeout);
        remove_cgroups(&cgroup);
        let _ = std::fs::remove_dir_all(&ns);
        let (status, stdout, stderr) = result?;
        let failures = check.failures(&stdout);
        let out = RunOutput {
            status,
            stdout,
            stderr,
            failures,
        };
        if std::env::var_os(VERBOSE_ENV).is_some() {
            eprintln!(
                "podman run with devices {:?} and {} fake node(s):\n{}",
                container.devices,
                container.nodes.len(),
                out.report()
            );
        }
        Ok(out)
    }

    /// `unshare` running [`NAMESPACE_SCRIPT`] in a new mount namespace (its tmpfs on `ns`),
    /// which creates the container's fake nodes and then runs `podman run` with the private
    /// store, the container's devices, the cgroup parent `/<cgroup>` and `sh -c script`; podman
    /// gets its own configuration files and nothing of this process's environment.
    fn command(&self, container: &Container, script: &str, cgroup: &str, ns: &Path) -> Command {
        let w = self.work.path();
        let mut cmd = Command::new(&self.tools.unshare);
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-euc"])
            .arg(NAMESPACE_SCRIPT)
            .arg("kubedev-podman-ns")
            .arg(ns);
        for node in &container.nodes {
            cmd.arg(if node.char_device { "c" } else { "b" })
                .arg(node.major.to_string())
                .arg(node.minor.to_string())
                .arg(&node.path);
        }
        cmd.arg("--").arg(&self.tools.podman);
        cmd.arg("--root")
            .arg(w.join("storage"))
            .arg("--runroot")
            .arg(w.join("run"))
            .arg("--tmpdir")
            .arg(w.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--events-backend",
                "none",
                "--cgroup-manager",
                "cgroupfs",
                "--runtime",
                "runc",
                "run",
                "--rm",
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1000:1000",
            ])
            .arg("--cgroup-parent")
            .arg(format!("/{cgroup}"));
        for d in &container.devices {
            cmd.arg("--device").arg(d);
        }
        // `--rootfs` is a flag: the first argument after it is the root filesystem, the rest the
        // command, so every option comes before it.
        cmd.arg("--rootfs")
            .arg(format!("{}:O", self.rootfs.display()))
            .args(["/bin/sh", "-c"])
            .arg(script);
        cmd.env_clear()
            .env("PATH", RUN_PATH)
            .env("HOME", w.join("home"))
            .env("TMPDIR", w.join("tmp"))
            .env("CONTAINERS_CONF", w.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", w.join("storage.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// Run by `sh` in the new mount namespace: `$1` is an empty directory for a private tmpfs, then
/// `type major minor path` per fake node, then `--` and podman's command line. `/dev` and
/// `/run` become overlays (upper layers on the tmpfs) with their submounts bound back on top.
const NAMESPACE_SCRIPT: &str = r#"
ns=$1; shift
mount -t tmpfs -o mode=0700 kubedev-test "$ns"
for d in /dev /run; do
  [ -d "$d" ] || continue
  n=$(echo "$d" | tr / _)
  mkdir "$ns/upper$n" "$ns/work$n" "$ns/keep$n"
  subs=$(awk -v d="$d/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -u)
  mount --rbind "$d" "$ns/keep$n"
  mount -t overlay kubedev-test -o "lowerdir=$d,upperdir=$ns/upper$n,workdir=$ns/work$n" "$d"
  last=/nonexistent/kubedev
  for s in $subs; do
    case "$s" in "$last"/*) continue ;; esac
    mount --rbind "$ns/keep$n${s#"$d"}" "$s"
    last=$s
  done
done
while [ "$1" != "--" ]; do
  mkdir -p "$(dirname "$4")"
  rm -rf "$4"
  mknod -m 0600 "$4" "$1" "$2" "$3"
  shift 4
done
shift
exec "$@"
"#;

/// Runs `cmd`, reading its output, killing it after `timeout`.
fn run_with_timeout(
    mut cmd: Command,
    timeout: Duration,
) -> Result<(ExitStatus, String, String), PodmanError> {
    let mut child = cmd.spawn().map_err(io_err("starting unshare and podman"))?;
    let reader = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as _));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait().map_err(io_err("waiting for podman"))? {
            Some(s) => break Some(s),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        Some(s) => Ok((s, stdout, stderr)),
        None => Err(PodmanError::Timeout { timeout, stderr }),
    }
}

/// Removes the cgroup `name` (and the cgroups below it: conmon's, the container's) from every
/// hierarchy: `/sys/fs/cgroup/<name>` (v2) and `/sys/fs/cgroup/<controller>/<name>` (v1).
fn remove_cgroups(name: &str) {
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join(name)];
    if let Ok(entries) = std::fs::read_dir(root) {
        dirs.extend(entries.filter_map(|e| e.ok()).map(|e| e.path().join(name)));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for dir in dirs.into_iter().filter(|d| d.is_dir()) {
        // conmon may still be leaving: retry while the cgroup is busy.
        while rmdir_tree(&dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Removes the cgroup directory `dir` and its child cgroups, deepest first (only `rmdir`:
/// cgroup directories cannot be emptied otherwise).
fn rmdir_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.filter_map(|e| e.ok()) {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rmdir_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}
