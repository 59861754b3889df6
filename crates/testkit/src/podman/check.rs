//! The spec check run inside a container: [`Check`] turns the expectations of the specs into
//! the shell code that prints the facts (`@kubedev-check <key> <value>` lines), then compares
//! what it printed with the expectations, one readable failure per difference.

use std::collections::BTreeMap;

use super::CHECK_PREFIX;
use super::expect::{HostObject, MountExpect, NodeExpect, SpecExpectations};

/// Every spec's expectations for one container, with the script that gathers the facts and the
/// comparison of what it printed.
#[derive(Debug, Default)]
pub(super) struct Check {
    nodes: Vec<NodeExpect>,
    mounts: Vec<MountExpect>,
    env: BTreeMap<String, (String, String)>,
    active: bool,
}

impl Check {
    /// The expectations of all of `specs` (none: no check at all).
    pub(super) fn merge(specs: Vec<SpecExpectations>) -> Check {
        let mut c = Check {
            active: !specs.is_empty(),
            ..Check::default()
        };
        for s in specs {
            c.nodes.extend(s.nodes);
            c.mounts.extend(s.mounts);
            for (k, v, origin) in s.env {
                c.env.insert(k, (v, origin));
            }
        }
        c
    }

    /// The shell code printing `@kubedev-check <key> <one line>` per fact.
    pub(super) fn script(&self) -> String {
        if !self.active {
            return String::new();
        }
        let mut s = String::from(
            "kdv() { printf '@kubedev-check %s %s\\n' \"$1\" \"$(tr '\\n' ' ')\"; }\n",
        );
        for (i, n) in self.nodes.iter().enumerate() {
            let p = quote(&n.path);
            s.push_str(&format!(
                "stat -c '%F|%t|%T|%a|%u|%g' {p} 2>&1 | kdv n{i}.stat\n"
            ));
            if n.read {
                s.push_str(&format!("( : < {p} ) 2>&1 | kdv n{i}.read\n"));
            }
            if n.write {
                s.push_str(&format!("( : >> {p} ) 2>&1 | kdv n{i}.write\n"));
            }
        }
        for (i, m) in self.mounts.iter().enumerate() {
            let p = quote(&m.container_path);
            s.push_str(&format!("stat -c '%F|%d|%i' {p} 2>&1 | kdv m{i}.stat\n"));
            match &m.host {
                Ok((HostObject::File { .. }, _)) => {
                    s.push_str(&format!("sha256sum < {p} 2>&1 | kdv m{i}.sha\n"));
                }
                Ok((HostObject::Dir { .. }, _)) => {
                    s.push_str(&format!(
                        "ls -A1 {p} 2>&1 | sort | tr '\\n' '/' | kdv m{i}.ls\n"
                    ));
                }
                _ => {}
            }
            if m.read_only {
                s.push_str(&format!(
                    "{{ touch -c {p} 2>&1; echo \"rc=$?\"; }} | kdv m{i}.ro\n"
                ));
            }
        }
        s.push_str("od -An -v -tx1 /proc/$$/environ | tr -d ' \\n' | kdv env\n");
        s
    }

    /// What differs from the expectations in the facts printed (`stdout`).
    pub(super) fn failures(&self, stdout: &str) -> Vec<String> {
        if !self.active {
            return Vec::new();
        }
        let mut comparison = Comparison::new(stdout);
        for (i, n) in self.nodes.iter().enumerate() {
            comparison.node(i, n);
        }
        for (i, m) in self.mounts.iter().enumerate() {
            comparison.mount(i, m);
        }
        comparison.env(&self.env);
        comparison.failures
    }
}

/// The facts a container's check printed, compared with the expectations: the failures found
/// so far, in the order of the expectations.
struct Comparison<'a> {
    /// The value of each `@kubedev-check <key> <value>` line, by key.
    facts: BTreeMap<&'a str, &'a str>,
    failures: Vec<String>,
}

impl<'a> Comparison<'a> {
    fn new(stdout: &'a str) -> Self {
        let facts = stdout
            .lines()
            .filter_map(|l| l.strip_prefix(CHECK_PREFIX))
            .map(|l| {
                let (k, v) = l.split_once(' ').unwrap_or((l, ""));
                (k, v.trim_end())
            })
            .collect();
        Comparison {
            facts,
            failures: Vec::new(),
        }
    }

    /// The fact `key`; a failure when the check did not print it.
    fn fact(&mut self, key: &str) -> Option<String> {
        let v = self.facts.get(key).map(|v| v.to_string());
        if v.is_none() {
            self.failures.push(format!(
                "the check printed no {key} (did the container start? see stderr)"
            ));
        }
        v
    }

    /// Compares the device node `n`, the `i`th, with its facts `n<i>.*`.
    fn node(&mut self, i: usize, n: &NodeExpect) {
        let what = format!("{}: device node {}", n.origin, n.path);
        let Some(stat) = self.fact(&format!("n{i}.stat")) else {
            return;
        };
        let f: Vec<&str> = stat.split('|').collect();
        if f.len() != 6 {
            self.failures
                .push(format!("{what}: missing in the container ({stat})"));
            return;
        }
        self.node_id(&what, n, &f);
        self.node_owner_and_mode(&what, n, &f);
        for (on, access) in [(n.read, "read"), (n.write, "write")] {
            if !on {
                continue;
            }
            if let Some(err) = self.fact(&format!("n{i}.{access}"))
                && err.contains("Operation not permitted")
            {
                self.failures.push(format!(
                    "{what}: opening it to {access} is refused by the device cgroup ({err})"
                ));
            }
        }
    }

    /// Compares the node's kind and `major:minor` with the fields of its `stat` (`stat`:
    /// kind, major, minor in hex, mode, uid, gid).
    fn node_id(&mut self, what: &str, n: &NodeExpect, stat: &[&str]) {
        let got_char = stat[0] == "character special file";
        let got_block = stat[0] == "block special file";
        let got_id = (
            u64::from_str_radix(stat[1], 16).unwrap_or(u64::MAX),
            u64::from_str_radix(stat[2], 16).unwrap_or(u64::MAX),
        );
        match &n.id {
            Err(why) => self
                .failures
                .push(format!("{what}: cannot tell what it must be: {why}")),
            Ok((char_device, major, minor)) => {
                let want_kind = if *char_device { "character" } else { "block" };
                let kind_ok = if *char_device { got_char } else { got_block };
                if !kind_ok || got_id != (*major, *minor) {
                    self.failures.push(format!(
                        "{what}: expected a {want_kind} device {major}:{minor}, the container \
                         has a {} {}:{}",
                        stat[0], got_id.0, got_id.1
                    ));
                }
            }
        }
    }

    /// Compares the node's `fileMode`, `uid` and `gid`, where the spec sets them, with the
    /// fields of its `stat`.
    fn node_owner_and_mode(&mut self, what: &str, n: &NodeExpect, stat: &[&str]) {
        if let Some(mode) = n.mode
            && u32::from_str_radix(stat[3], 8).ok() != Some(mode & 0o7777)
        {
            self.failures.push(format!(
                "{what}: expected mode {:o} (fileMode {mode}), the container has {}",
                mode & 0o7777,
                stat[3]
            ));
        }
        if let Some(uid) = n.uid
            && stat[4] != uid.to_string()
        {
            self.failures.push(format!(
                "{what}: expected uid {uid}, the container has {}",
                stat[4]
            ));
        }
        if let Some(gid) = n.gid
            && stat[5] != gid.to_string()
        {
            self.failures.push(format!(
                "{what}: expected gid {gid}, the container has {}",
                stat[5]
            ));
        }
    }

    /// Compares the mount `m`, the `i`th, with its facts `m<i>.*`.
    fn mount(&mut self, i: usize, m: &MountExpect) {
        let what = format!(
            "{}: mount {} -> {}",
            m.origin, m.host_path, m.container_path
        );
        let (object, host_kind) = match &m.host {
            Ok(h) => h,
            Err(why) => {
                self.failures.push(format!("{what}: {why}"));
                return;
            }
        };
        let Some(stat) = self.fact(&format!("m{i}.stat")) else {
            return;
        };
        let f: Vec<&str> = stat.split('|').collect();
        if f.len() != 3 {
            self.failures
                .push(format!("{what}: missing in the container ({stat})"));
            return;
        }
        let got_kind = if f[0].starts_with("regular") {
            "regular file"
        } else {
            f[0]
        };
        if m.bind && got_kind != *host_kind {
            self.failures.push(format!(
                "{what}: the host has a {host_kind}, the container a {got_kind}"
            ));
        }
        if let Some((dev, ino)) = m.identity
            && (f[1] != dev.to_string() || f[2] != ino.to_string())
        {
            self.failures.push(format!(
                "{what}: not the host's {host_kind} (device:inode {dev}:{ino} on the host, \
                 {}:{} in the container)",
                f[1], f[2]
            ));
        }
        self.mount_content(&what, i, object);
        if m.read_only
            && let Some(ro) = self.fact(&format!("m{i}.ro"))
            && (ro.ends_with("rc=0") || !ro.contains("Read-only file system"))
        {
            self.failures.push(format!(
                "{what}: the options say ro, but a write (touch) was not refused as on a \
                 read-only file system: {ro}"
            ));
        }
    }

    /// Compares the content the `i`th mount shows in the container (a file's digest, a
    /// directory's names) with the host's `object`.
    fn mount_content(&mut self, what: &str, i: usize, object: &HostObject) {
        match object {
            HostObject::File { sha256 } => {
                if let Some(got) = self.fact(&format!("m{i}.sha")) {
                    let got = got.split_whitespace().next().unwrap_or_default();
                    if got != sha256 {
                        self.failures.push(format!(
                            "{what}: the content differs from the host file's (sha256 {sha256} \
                             on the host, {got} in the container)"
                        ));
                    }
                }
            }
            HostObject::Dir { names } => {
                if let Some(got) = self.fact(&format!("m{i}.ls")) {
                    let got: Vec<&str> = got.split('/').filter(|s| !s.is_empty()).collect();
                    if got != *names {
                        self.failures.push(format!(
                            "{what}: the directory lists {got:?} in the container, {names:?} on the host"
                        ));
                    }
                }
            }
            HostObject::Other => {}
        }
    }

    /// Compares the container's environment (the `env` fact: `/proc/self/environ` in hex) with
    /// `env` (key → value and origin).
    fn env(&mut self, env: &BTreeMap<String, (String, String)>) {
        let Some(hexed) = self.fact("env") else {
            return;
        };
        let bytes: Vec<u8> = (0..hexed.len() / 2)
            .filter_map(|i| u8::from_str_radix(hexed.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for entry in bytes.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            let entry = String::from_utf8_lossy(entry);
            let (k, v) = entry.split_once('=').unwrap_or((&entry, ""));
            seen.entry(k.to_string()).or_default().push(v.to_string());
        }
        for (k, (v, origin)) in env {
            match seen.get(k).map(Vec::as_slice) {
                None => self
                    .failures
                    .push(format!("{origin}: env {k} is not set in the container")),
                Some([got]) if got == v => {}
                Some(got) => self.failures.push(format!(
                    "{origin}: env {k} should be {v:?}, the container has {got:?}"
                )),
            }
        }
    }
}

/// `'text'` for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
