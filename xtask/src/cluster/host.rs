//! What the node changes on the host outside the directories it owns, recorded before it
//! starts and put back by `down`: the kernel settings the kubelet sets when it starts, the
//! iptables chains it makes, libcni's cached results of the pods' network attachments, and
//! the sockets containerd's shims leave at a fixed path when they are killed.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};

/// The kernel settings the kubelet sets when it starts (its configuration leaves
/// `protectKernelDefaults` off, as a default kubelet does), as paths under `/proc/sys`.
const SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The iptables commands the kubelet runs, one per address family.
const IPTABLES: &[&str] = &["iptables", "ip6tables"];
/// The tables it makes chains in.
const TABLES: &[&str] = &["filter", "mangle", "nat"];
/// The prefix of every chain the kubelet makes (KUBE-FIREWALL, KUBE-IPTABLES-HINT,
/// KUBE-KUBELET-CANARY).
const CHAIN_PREFIX: &str = "KUBE-";

/// Where libcni caches each network attachment's result, whatever containerd's
/// configuration says.
const CNI_RESULTS: &str = "/var/lib/cni/results";
/// Where containerd's shims make their sockets, whatever containerd's configuration says.
const SHIM_SOCKETS: &str = "/run/containerd/s";

/// The name of the record in the run directory.
const RECORD: &str = "host";

/// One of the kubelet's chains: iptables command, table, chain.
type ChainId = (String, String, String);

/// The host as it was before the node started.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Before {
    /// Each kernel setting and its value.
    sysctls: Vec<(String, String)>,
    /// The kubelet's chains that existed already (another kubelet's, or an earlier run's
    /// that was never torn down): left alone.
    chains: BTreeSet<ChainId>,
    /// When the record was made, in seconds since the epoch: shim sockets made since then
    /// are the run's.
    since: u64,
}

impl Before {
    /// Records the host in `run_dir`, unless a record is there already (a run that was never
    /// torn down: its record holds the host as it was before that run).
    pub(crate) fn record_once(run_dir: &Path) -> anyhow::Result<()> {
        let path = run_dir.join(RECORD);
        if path.exists() {
            return Ok(());
        }
        let before = Before {
            sysctls: SYSCTLS
                .iter()
                .filter_map(|key| Some((key.to_string(), read_sysctl(key)?)))
                .collect(),
            chains: kubelet_chains(),
            since: now(),
        };
        std::fs::write(&path, before.to_text())
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The record in `run_dir`, if there is one; a damaged one is reported and ignored.
    pub(crate) fn load(run_dir: &Path) -> Option<Before> {
        let path = run_dir.join(RECORD);
        let text = std::fs::read_to_string(&path).ok()?;
        match Before::parse(&text) {
            Ok(before) => Some(before),
            Err(e) => {
                eprintln!("{}: {e:#}; the host is not put back", path.display());
                None
            }
        }
    }

    fn to_text(&self) -> String {
        let mut text = format!("since {}\n", self.since);
        for (key, value) in &self.sysctls {
            text.push_str(&format!("sysctl {key} {value}\n"));
        }
        for (command, table, chain) in &self.chains {
            text.push_str(&format!("chain {command} {table} {chain}\n"));
        }
        text
    }

    fn parse(text: &str) -> anyhow::Result<Before> {
        let mut before = Before::default();
        for (n, line) in text.lines().enumerate() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                [] => {}
                ["since", secs] => {
                    before.since = secs
                        .parse()
                        .with_context(|| format!("line {}: since {secs:?}", n + 1))?;
                }
                ["sysctl", key, value] if SYSCTLS.contains(&key) => {
                    before.sysctls.push((key.to_string(), value.to_string()));
                }
                ["chain", command, table, chain]
                    if IPTABLES.contains(&command)
                        && TABLES.contains(&table)
                        && chain.starts_with(CHAIN_PREFIX) =>
                {
                    before.chains.insert((
                        command.to_string(),
                        table.to_string(),
                        chain.to_string(),
                    ));
                }
                _ => bail!("line {}: {line:?} is not a record of the host", n + 1),
            }
        }
        Ok(before)
    }

    /// Puts the host back once every process of the run is gone: the kernel settings as they
    /// were, the kubelet's chains that were not there removed (with the rules that jump to
    /// them), and the run's CNI results and shim sockets deleted. Returns what failed.
    pub(crate) fn restore(&self, run_dir: &Path) -> Vec<String> {
        let mut failed = Vec::new();
        for (key, value) in &self.sysctls {
            if read_sysctl(key).as_deref() != Some(value.as_str())
                && let Err(e) = std::fs::write(Path::new("/proc/sys").join(key), value)
            {
                failed.push(format!("setting {} back to {value}: {e}", sysctl_name(key)));
            }
        }
        for (command, table, chain) in self.new_chains() {
            if let Err(e) = remove_chain(&command, &table, &chain) {
                failed.push(format!("{e:#}"));
            }
        }
        for path in run_cni_results(run_dir)
            .into_iter()
            .chain(stale_shim_sockets(self.since))
        {
            if let Err(e) = std::fs::remove_file(&path) {
                failed.push(format!("removing {path}: {e}"));
            }
        }
        failed
    }

    /// What of the run is still on the host.
    pub(crate) fn left(&self, run_dir: &Path) -> Vec<String> {
        let mut left = Vec::new();
        for (key, value) in &self.sysctls {
            if let Some(now) = read_sysctl(key)
                && now != *value
            {
                left.push(format!("{} = {now} (was {value})", sysctl_name(key)));
            }
        }
        for (command, table, chain) in self.new_chains() {
            left.push(format!("{command} chain {chain} in table {table}"));
        }
        for path in run_cni_results(run_dir) {
            left.push(format!("CNI result {path}"));
        }
        for path in stale_shim_sockets(self.since) {
            left.push(format!("shim socket {path}"));
        }
        left
    }

    /// The kubelet's chains on the host now that were not there before.
    fn new_chains(&self) -> Vec<ChainId> {
        kubelet_chains()
            .into_iter()
            .filter(|c| !self.chains.contains(c))
            .collect()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `kernel/panic` as `sysctl` writes it: `kernel.panic`.
fn sysctl_name(key: &str) -> String {
    key.replace('/', ".")
}

fn read_sysctl(key: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(key))
        .ok()
        .map(|v| v.trim().to_string())
}

/// Runs an iptables command with `args`, waiting for the xtables lock; its output, or what
/// it said when it failed.
fn iptables(command: &str, args: &[&str]) -> anyhow::Result<String> {
    crate::commands::stdout_of(
        Command::new(command).args(["-w", "5"]).args(args),
        &format!("`{command} {}`", args.join(" ")),
    )
}

/// The rules of `table` as `iptables -S` prints them, or `None` when the command or the
/// table is not there (no iptables on the host: the kubelet makes no chains either).
fn listing(command: &str, table: &str) -> Option<String> {
    iptables(command, &["-t", table, "-S"]).ok()
}

/// The chains named like the kubelet's in a listing.
fn chains_in(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .map(str::trim)
        .filter(|c| c.starts_with(CHAIN_PREFIX))
        .collect()
}

/// The chains (in a listing) whose only rule part is a jump to `target`: `(chain)` for each
/// `-A chain -j target`, as the kubelet adds them to INPUT and OUTPUT.
fn plain_jumps_to<'l>(listing: &'l str, target: &str) -> Vec<&'l str> {
    listing
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words[..] {
                ["-A", chain, "-j", to] if to == target => Some(chain),
                _ => None,
            }
        })
        .collect()
}

/// Every chain named like the kubelet's on the host now.
fn kubelet_chains() -> BTreeSet<ChainId> {
    let mut chains = BTreeSet::new();
    for command in IPTABLES {
        for table in TABLES {
            if let Some(listing) = listing(command, table) {
                for chain in chains_in(&listing) {
                    chains.insert((command.to_string(), table.to_string(), chain.to_string()));
                }
            }
        }
    }
    chains
}

/// Removes a chain: the plain jumps to it, its rules, then the chain.
fn remove_chain(command: &str, table: &str, chain: &str) -> anyhow::Result<()> {
    let listing = listing(command, table).unwrap_or_default();
    for from in plain_jumps_to(&listing, chain) {
        iptables(command, &["-t", table, "-D", from, "-j", chain])?;
    }
    iptables(command, &["-t", table, "-F", chain])?;
    iptables(command, &["-t", table, "-X", chain])?;
    Ok(())
}

/// libcni's cached results of attachments in the run's network namespaces (containerd keeps
/// them beneath the run directory).
fn run_cni_results(run_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(CNI_RESULTS) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read(e.path())
                .ok()
                .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
                .and_then(|v| {
                    v["netns"]
                        .as_str()
                        .map(|ns| Path::new(ns).starts_with(run_dir))
                })
                .unwrap_or(false)
        })
        .map(|e| e.path().display().to_string())
        .collect()
}

/// Paths of the Unix sockets some process has bound, from `/proc/net/unix`.
fn bound_sockets(proc_net_unix: &str) -> BTreeSet<&str> {
    proc_net_unix
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|p| p.starts_with('/'))
        .collect()
}

/// Shim sockets made since `since` that no process listens on any more: those of the run's
/// shims, killed by `down`.
fn stale_shim_sockets(since: u64) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt as _;
    let Ok(entries) = std::fs::read_dir(SHIM_SOCKETS) else {
        return Vec::new();
    };
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let bound = bound_sockets(&table);
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.metadata().is_ok_and(|m| {
                m.file_type().is_socket()
                    && m.modified()
                        .ok()
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                        .is_some_and(|t| t.as_secs() >= since)
            })
        })
        .map(|e| e.path().display().to_string())
        .filter(|p| !bound.contains(p.as_str()))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `iptables -t filter -S` after the kubelet started, on a host with a rule of its own.
    const FILTER: &str = "-P INPUT ACCEPT\n\
        -P FORWARD ACCEPT\n\
        -P OUTPUT ACCEPT\n\
        -N KUBE-FIREWALL\n\
        -N KUBE-KUBELET-CANARY\n\
        -N OWN\n\
        -A INPUT -j KUBE-FIREWALL\n\
        -A INPUT -s 10.0.0.0/8 -j KUBE-FIREWALL\n\
        -A OUTPUT -j KUBE-FIREWALL\n\
        -A OUTPUT -j OWN\n\
        -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n";

    #[test]
    fn the_kubelets_chains_and_their_plain_jumps_are_found_and_nothing_else() {
        assert_eq!(chains_in(FILTER), ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY"]);
        // The jump with a match is not the kubelet's: left for `-X` to refuse, and reported.
        assert_eq!(plain_jumps_to(FILTER, "KUBE-FIREWALL"), ["INPUT", "OUTPUT"]);
        assert!(plain_jumps_to(FILTER, "KUBE-KUBELET-CANARY").is_empty());
    }

    #[test]
    fn a_record_reads_back_as_written_and_a_damaged_one_names_its_line() {
        let before = Before {
            sysctls: vec![
                ("kernel/panic".into(), "0".into()),
                ("vm/overcommit_memory".into(), "0".into()),
            ],
            chains: [(
                "iptables".to_string(),
                "filter".to_string(),
                "KUBE-FIREWALL".to_string(),
            )]
            .into(),
            since: 1_796_600_000,
        };
        assert_eq!(Before::parse(&before.to_text()).unwrap(), before);
        let err = Before::parse("since 5\nsysctl net/ipv4/ip_forward 1\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        // Only the kubelet's chains are ever removed.
        assert!(Before::parse("chain iptables filter OWN\n").is_err());
        assert!(Before::parse("since soon\n").is_err());
    }

    #[test]
    fn only_sockets_with_a_path_count_as_bound() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 2001 /run/containerd/s/abc\n\
            0000000000000000: 00000002 00000000 00000000 0001 03 2002\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 2003 @/containerd-shim/x.sock\n";
        assert_eq!(
            bound_sockets(table).into_iter().collect::<Vec<_>>(),
            ["/run/containerd/s/abc"]
        );
    }
}
