//! Every socket the cluster makes stays on the machine: on loopback, or between addresses of
//! the pods' bridge (the host's and the pods'), in the host's network namespace and in each
//! pod's.

use super::*;

/// The state of a listening socket in /proc/net/tcp.
const LISTEN: &str = "0A";

/// TCP connections and listeners: (local, remote, state) from /proc/net/tcp and tcp6.
pub(crate) type Connections = BTreeSet<(String, String, String)>;

/// Every TCP socket of the machine now: the host's network namespace's, and those of every
/// pod with a namespace of its own.
pub(crate) fn connections() -> Connections {
    let mut all = Connections::new();
    read_tables("/proc/net", true, &mut all);
    // A pod's listeners are left out: its namespace has loopback and its bridge address only,
    // so even one on every address (the daemon's metrics port) is reached from nowhere else.
    for pid in pod_namespaces() {
        read_tables(&format!("/proc/{pid}/net"), false, &mut all);
    }
    all
}

/// Adds the sockets of the tables in `dir` (`tcp` and `tcp6`) to `all`, listeners only when
/// `listeners`.
fn read_tables(dir: &str, listeners: bool, all: &mut Connections) {
    for file in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 && (listeners || f[3] != LISTEN) {
                all.insert((f[1].to_string(), f[2].to_string(), f[3].to_string()));
            }
        }
    }
}

/// One process of each network namespace other than this process's whose processes run in a
/// pod (beneath a `kubepods` cgroup).
fn pod_namespaces() -> Vec<u32> {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let host = ns("self");
    let mut seen = BTreeSet::new();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Some(link) = ns(&pid.to_string()) else {
            continue;
        };
        if Some(&link) == host.as_ref() || seen.contains(&link) {
            continue;
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cgroup.contains("kubepods") {
            seen.insert(link);
            pids.push(pid);
        }
    }
    pids
}

/// The IPv4 address of a /proc/net/tcp address (`0100007F:1F90`: little-endian hex), also
/// when IPv4-mapped in an IPv6 one; `None` for another IPv6 address.
fn ipv4(addr: &str) -> Option<std::net::Ipv4Addr> {
    let ip = addr.split(':').next().unwrap_or("");
    let hex = match ip.len() {
        8 => ip,
        32 if ip.starts_with("0000000000000000FFFF0000") => &ip[24..],
        _ => return None,
    };
    u32::from_str_radix(hex, 16)
        .ok()
        .map(|n| std::net::Ipv4Addr::from(n.swap_bytes()))
}

/// Whether a /proc/net/tcp address (`0100007F:1F90`, or 32 hex digits for IPv6) is loopback.
pub(super) fn is_loopback(addr: &str) -> bool {
    let ip = addr.split(':').next().unwrap_or("");
    ip == "00000000000000000000000001000000" || ipv4(addr).is_some_and(|a| a.is_loopback())
}

/// Whether a /proc/net/tcp address stays on the machine: loopback, or on the pods' bridge.
pub(super) fn is_local(addr: &str) -> bool {
    is_loopback(addr) || ipv4(addr).is_some_and(network::on_pod_network)
}

/// A thread that reads the machine's TCP sockets every 100 ms while the tests run, so a
/// connection that comes and goes between two tests is seen too.
pub(crate) struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Connections>,
}

impl Sampler {
    pub(crate) fn start() -> Sampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Connections::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                seen.extend(connections());
                std::thread::sleep(Duration::from_millis(100));
            }
            seen.extend(connections());
            seen
        });
        Sampler { stop, thread }
    }

    /// Every socket seen while it ran.
    pub(super) fn stop(self) -> Connections {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// No socket seen since `before` leaves the machine: every new connection's both ends and
/// every new listener's address are loopback or on the pods' bridge.
pub(super) fn only_loopback(before: &Connections, seen: &Connections) -> anyhow::Result<()> {
    let now = seen;
    let offending: Vec<String> = now
        .difference(before)
        .filter(|(local, remote, state)| {
            if state == LISTEN {
                !is_local(local)
            } else {
                !is_local(local) || !is_local(remote)
            }
        })
        .map(|(l, r, s)| format!("{l} -> {r} (state {s})"))
        .collect();
    let total = now.difference(before).count();
    eprintln!(
        "  {total} sockets made since the cluster started, all on loopback or the pods' bridge: {}",
        offending.is_empty()
    );
    ensure!(
        offending.is_empty(),
        "sockets beyond loopback and the pods' bridge: {}",
        offending.join("; ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_on_the_machine_are_told_from_the_rest() {
        assert!(is_loopback("0100007F:1F90"));
        assert!(is_loopback("00000000000000000000000001000000:1F90"));
        assert!(is_loopback("0000000000000000FFFF00000100007F:1F90"));
        // 10.244.0.1, the host on the bridge; 10.244.0.23, a pod.
        assert!(!is_loopback("0100F40A:192B"));
        assert!(is_local("0100F40A:192B"));
        assert!(is_local("1700F40A:24F8"));
        // 10.244.1.1, 192.168.1.5, 0.0.0.0: beyond.
        assert!(!is_local("0101F40A:192B"));
        assert!(!is_local("0501A8C0:0050"));
        assert!(!is_local("00000000:1F90"));
    }
}
