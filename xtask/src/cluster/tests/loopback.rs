//! Every socket the cluster makes stays on loopback.

use super::*;

/// TCP connections and listeners: (local, remote, state) from /proc/net/tcp and tcp6.
pub(crate) type Connections = BTreeSet<(String, String, String)>;

/// Every TCP socket of the machine now.
pub(crate) fn connections() -> Connections {
    let mut all = Connections::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 {
                all.insert((f[1].to_string(), f[2].to_string(), f[3].to_string()));
            }
        }
    }
    all
}

/// Whether a /proc/net/tcp address (`0100007F:1F90`, or 32 hex digits for IPv6) is loopback.
pub(super) fn is_loopback(addr: &str) -> bool {
    let ip = addr.split(':').next().unwrap_or("");
    match ip.len() {
        // Little-endian IPv4: 127.x.x.x has 7F as its last byte.
        8 => ip.ends_with("7F"),
        // ::1, and IPv4-mapped 127.x.x.x.
        32 => {
            ip == "00000000000000000000000001000000"
                || (ip.starts_with("0000000000000000FFFF0000") && ip.ends_with("7F"))
        }
        _ => false,
    }
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

/// No socket seen since `before` reaches beyond loopback: every new connection's both ends
/// and every new listener's address are loopback.
pub(super) fn only_loopback(before: &Connections, seen: &Connections) -> anyhow::Result<()> {
    const LISTEN: &str = "0A";
    let now = seen;
    let offending: Vec<String> = now
        .difference(before)
        .filter(|(local, remote, state)| {
            if state == LISTEN {
                !is_loopback(local)
            } else {
                !is_loopback(local) || !is_loopback(remote)
            }
        })
        .map(|(l, r, s)| format!("{l} -> {r} (state {s})"))
        .collect();
    let total = now.difference(before).count();
    eprintln!(
        "  {total} sockets made since the cluster started, all on loopback: {}",
        offending.is_empty()
    );
    ensure!(
        offending.is_empty(),
        "sockets beyond loopback: {}",
        offending.join("; ")
    );
    Ok(())
}
