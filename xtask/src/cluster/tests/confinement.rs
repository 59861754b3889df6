//! The daemon's confinement as the kernel applies it: what the running process has of
//! privilege, seccomp and the host, against what the DaemonSet the API server stored asks
//! for, with a mutation (the chart's `privileged`) the check must catch.

use super::scale::daemon_pid;
use super::*;

/// Linux capability names by bit number (`include/uapi/linux/capability.h`).
const CAPABILITIES: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The capability names of a `/proc/PID/status` mask (`CapEff: 00000000a80425fb`); bits
/// without a name as `bit N`.
fn capability_names(mask: u64) -> BTreeSet<String> {
    (0..64)
        .filter(|bit| mask & (1 << bit) != 0)
        .map(|bit| {
            CAPABILITIES
                .get(bit)
                .map_or_else(|| format!("bit {bit}"), |n| (*n).to_string())
        })
        .collect()
}

/// What the kernel says of one process.
#[derive(Debug)]
struct Process {
    /// `Seccomp:` 0 none, 1 strict, 2 filter.
    seccomp: String,
    no_new_privs: String,
    effective: BTreeSet<String>,
    bounding: BTreeSet<String>,
    /// Namespaces (`net`, `pid`, `ipc`) it shares with the host (with this process, which runs
    /// the cluster).
    host_namespaces: Vec<&'static str>,
    /// Its root file system is mounted read-only.
    root_read_only: bool,
}

impl Process {
    fn of(pid: u32) -> anyhow::Result<Process> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
                .with_context(|| format!("/proc/{pid}/status has no {name}"))
        };
        let mask = |name: &str| -> anyhow::Result<BTreeSet<String>> {
            let hex = field(name)?;
            Ok(capability_names(
                u64::from_str_radix(&hex, 16).with_context(|| format!("{name}: {hex}"))?,
            ))
        };
        let ns = |p: &str, kind: &str| std::fs::read_link(format!("/proc/{p}/ns/{kind}")).ok();
        let host_namespaces = ["net", "pid", "ipc"]
            .into_iter()
            .filter(|kind| ns(&pid.to_string(), kind).is_some_and(|l| Some(l) == ns("self", kind)))
            .collect();
        // mountinfo: ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS ...
        let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
        let root_read_only = mountinfo
            .lines()
            .rev()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(4) == Some(&"/")).then(|| f.get(5).copied().unwrap_or_default())
            })
            .is_some_and(|options| options.split(',').any(|o| o == "ro"));
        Ok(Process {
            seccomp: field("Seccomp")?,
            no_new_privs: field("NoNewPrivs")?,
            effective: mask("CapEff")?,
            bounding: mask("CapBnd")?,
            host_namespaces,
            root_read_only,
        })
    }
}

/// What the daemon's container asks for in the DaemonSet the API server stored: privileged, and
/// the capabilities it adds.
fn asked(node: &Node) -> anyhow::Result<(bool, BTreeSet<String>)> {
    let ds = get_json(node, &["daemonset", "kubedev", "-n", KUBEDEV_NAMESPACE])?;
    let context = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    let added = context["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect();
    Ok((context["privileged"] == true, added))
}

/// What is wrong with the running daemon's confinement: it must not be privileged, keep the
/// runtime's seccomp filter, gain no privileges, hold no capability but those its container
/// adds, share no namespace with the host and have a read-only root file system.
fn problems(node: &Node) -> anyhow::Result<Vec<String>> {
    let (privileged, added) = asked(node)?;
    let process = Process::of(daemon_pid()?)?;
    eprintln!("  the daemon as the kernel runs it: {process:?}; its container adds {added:?}");
    let mut problems = Vec::new();
    if privileged {
        problems.push("the DaemonSet's container is privileged".to_string());
    }
    if process.seccomp != "2" {
        problems.push(format!(
            "the daemon runs without a seccomp filter (Seccomp: {})",
            process.seccomp
        ));
    }
    if process.no_new_privs != "1" {
        problems.push("the daemon may gain privileges (NoNewPrivs: 0)".to_string());
    }
    for (set, caps) in [
        ("effective", &process.effective),
        ("bounding", &process.bounding),
    ] {
        let extra: Vec<&String> = caps.difference(&added).collect();
        if !extra.is_empty() {
            problems.push(format!(
                "the daemon's {set} capabilities hold {extra:?}, which its container does not add"
            ));
        }
    }
    if !process.host_namespaces.is_empty() {
        problems.push(format!(
            "the daemon shares the host's {} namespaces",
            process.host_namespaces.join(", ")
        ));
    }
    if !process.root_read_only {
        problems.push("the daemon's root file system is writable".to_string());
    }
    Ok(problems)
}

/// Waits until one daemon process runs (a rollout's old one gone).
fn one_daemon() -> anyhow::Result<()> {
    wait_for("one kubedev process", Duration::from_secs(60), || {
        Ok(daemon_pid().is_ok())
    })
}

/// The daemon runs confined as its chart asks; and a chart that makes it privileged is caught.
pub(super) fn confinement(node: &Node, root: &Path) -> anyhow::Result<()> {
    one_daemon()?;
    let found = problems(node)?;
    ensure!(
        found.is_empty(),
        "the daemon's confinement:\n{}",
        found.join("\n")
    );
    upgrade_kubedev(root, node, &["privileged=true"])?;
    let mutated = daemon_ready(node)
        .and_then(|()| one_daemon())
        .and_then(|()| problems(node));
    let restored = upgrade_kubedev(root, node, &["privileged=false"])
        .and_then(|()| daemon_ready(node))
        .and_then(|()| one_daemon());
    let mutated = mutated?;
    ensure!(
        !mutated.is_empty(),
        "a privileged daemon passed the confinement check"
    );
    eprintln!(
        "  mutation: privileged=true is caught: {}",
        mutated.join("; ")
    );
    restored?;
    ensure!(
        problems(node)?.is_empty(),
        "the daemon is not confined again after privileged=false"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_masks_read_as_names() {
        assert!(capability_names(0).is_empty());
        assert_eq!(
            capability_names(0x9),
            BTreeSet::from(["CHOWN".to_string(), "FOWNER".to_string()])
        );
        // A privileged container's bounding set on a 6.x kernel: 41 capabilities.
        assert_eq!(capability_names(0x1ff_ffff_ffff).len(), 41);
        assert!(capability_names(1 << 50).contains("bit 50"));
    }
}
