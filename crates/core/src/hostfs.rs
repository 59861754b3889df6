//! Host paths seen through a host root, and what every backend is given to find its devices.
//!
//! The daemon usually runs in a container with the host's `/` mounted somewhere (or reaches it
//! through `/proc/1/root`). A [`HostFs`] reads host paths beneath that root and resolves symbolic
//! links the way the host would — but an absolute link target or a `..` never leaves the root, so
//! a hostile or broken tree cannot make a backend read the container's own files. Every error
//! names the host path it is about.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

/// How many symbolic links one resolution may follow (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Reading or resolving a host path failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostFsError {
    /// The path could not be read, resolved or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The host path (as on the host, not under the root).
        path: PathBuf,
        /// What kind of failure it was.
        kind: io::ErrorKind,
        /// The operating system's message.
        error: String,
    },
    /// The file was read but does not hold what was expected.
    #[error("{}: {1} is not {expected}", path.display(), crate::echo::echo(.value))]
    Parse {
        /// The host path.
        path: PathBuf,
        /// What the file held (trimmed, cut to 64 characters).
        value: String,
        /// What it should have held, e.g. "a hexadecimal number".
        expected: &'static str,
    },
    /// Resolving the path followed too many symbolic links (a loop).
    #[error("{}: too many levels of symbolic links", path.display())]
    Loop {
        /// The host path.
        path: PathBuf,
    },
}

/// The PCIe root complex of a canonical sysfs device path: the first component below
/// `/sys/devices` when it is named `pci<domain>:<bus>`, as Kubernetes' standard
/// `resource.kubernetes.io/pcieRoot` attribute defines it
/// (`/sys/devices/pci0000:00/0000:00:01.0/0000:07:00.0` → `pci0000:00`).
pub fn pcie_root_of(canonical: &Path) -> Option<String> {
    let rest = canonical.strip_prefix("/sys/devices").ok()?;
    let first = rest.components().next()?.as_os_str().to_str()?;
    let (domain, bus) = first.strip_prefix("pci")?.split_once(':')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(domain) && domain.len() >= 4 && bus.len() == 2 && hex(bus)).then(|| first.to_owned())
}

/// The nearest PCI function at or above a canonical sysfs device path: the longest prefix
/// whose last component is a PCI address (`/sys/devices/pci0000:00/0000:00:14.0/usb1/1-1` →
/// `/sys/devices/pci0000:00/0000:00:14.0`, the USB controller).
pub fn pci_function_of(canonical: &Path) -> Option<PathBuf> {
    // dddd:bb:dd.f, with a domain of at least four hex digits.
    let is_bdf = |name: &str| {
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_hexdigit());
        let Some((addr, func)) = name.rsplit_once('.') else {
            return false;
        };
        let mut parts = addr.split(':');
        let (Some(domain), Some(bus), Some(slot), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        domain.len() >= 4
            && hex(domain)
            && bus.len() == 2
            && hex(bus)
            && slot.len() == 2
            && hex(slot)
            && matches!(func.as_bytes(), [b'0'..=b'7'])
    };
    let mut found = None;
    let mut prefix = PathBuf::new();
    for c in canonical.components() {
        prefix.push(c);
        if c.as_os_str().to_str().is_some_and(is_bdf) {
            found = Some(prefix.clone());
        }
    }
    found
}

impl HostFsError {
    /// Whether the path (or a component of it) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, HostFsError::Io { kind, .. } if *kind == io::ErrorKind::NotFound)
    }

    /// Whether the path is absent: it does not exist, or a component on its way is not a
    /// directory.
    fn is_absent(&self) -> bool {
        matches!(self, HostFsError::Io { kind, .. }
            if matches!(kind, io::ErrorKind::NotFound | io::ErrorKind::NotADirectory))
    }

    fn io(path: &Path, e: &io::Error) -> Self {
        HostFsError::Io {
            path: path.to_path_buf(),
            kind: e.kind(),
            error: e.to_string(),
        }
    }

    fn parse(path: &Path, value: &str, expected: &'static str) -> Self {
        HostFsError::Parse {
            path: path.to_path_buf(),
            value: value.chars().take(64).collect(),
            expected,
        }
    }
}

/// The host's file system beneath a root directory (`/`, `/proc/1/root`, or a test's fake root).
///
/// All methods take host paths written as on the host (`/sys/bus/pci/devices`); a relative path
/// is taken relative to the host's `/`.
#[derive(Clone, PartialEq, Eq)]
pub struct HostFs {
    root: PathBuf,
}

impl fmt::Debug for HostFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostFs({})", self.root.display())
    }
}

impl HostFs {
    /// The host file system under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostFs { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path on this machine of `host_path`, without resolving any symbolic link; `..`
    /// components are dropped so the result stays under the root.
    pub fn join(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut out = self.root.clone();
        for c in host_path.as_ref().components() {
            if let Component::Normal(n) = c {
                out.push(n);
            }
        }
        out
    }

    /// The canonical host path of `host_path`: every symbolic link followed, with absolute link
    /// targets and `..` resolved inside the root. The path must exist.
    pub fn canonicalize(&self, host_path: impl AsRef<Path>) -> Result<PathBuf, HostFsError> {
        let host_path = host_path.as_ref();
        let mut resolved = PathBuf::from("/");
        let mut rest: VecDeque<OsString> = VecDeque::new();
        push_front_components(&mut rest, host_path);
        let mut links = 0usize;
        while let Some(name) = rest.pop_front() {
            if name == ".." {
                resolved.pop();
                continue;
            }
            let candidate = resolved.join(&name);
            let real = self.join(&candidate);
            let meta = std::fs::symlink_metadata(&real).map_err(|e| {
                let mut p = candidate.clone();
                p.extend(rest.iter());
                HostFsError::io(&p, &e)
            })?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_LINKS {
                    return Err(HostFsError::Loop {
                        path: host_path.to_path_buf(),
                    });
                }
                let target =
                    std::fs::read_link(&real).map_err(|e| HostFsError::io(&candidate, &e))?;
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                push_front_components(&mut rest, &target);
            } else {
                resolved = candidate;
            }
        }
        Ok(resolved)
    }

    /// The path on this machine to open for `host_path`, symbolic links resolved inside the root.
    pub fn resolve(&self, host_path: impl AsRef<Path>) -> Result<PathBuf, HostFsError> {
        Ok(self.join(self.canonicalize(host_path)?))
    }

    /// Whether `host_path` exists (after resolving links inside the root).
    pub fn exists(&self, host_path: impl AsRef<Path>) -> bool {
        self.canonicalize(host_path).is_ok()
    }

    /// Whether `host_path` exists, telling "no" (it, or a directory on its way, is missing)
    /// from "cannot tell" (the error: permission denied, a link loop, an I/O error).
    pub fn presence(&self, host_path: impl AsRef<Path>) -> Result<bool, HostFsError> {
        match self.canonicalize(host_path) {
            Ok(_) => Ok(true),
            Err(e) if e.is_absent() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The whole content of a file.
    pub fn read_to_string(&self, host_path: impl AsRef<Path>) -> Result<String, HostFsError> {
        let host_path = host_path.as_ref();
        let real = self.resolve(host_path)?;
        std::fs::read_to_string(real).map_err(|e| HostFsError::io(host_path, &e))
    }

    /// A sysfs attribute: the file's content with surrounding white space removed.
    pub fn read_attr(&self, host_path: impl AsRef<Path>) -> Result<String, HostFsError> {
        Ok(self.read_to_string(host_path)?.trim().to_string())
    }

    /// A sysfs attribute that may be absent: `None` when the file does not exist.
    pub fn read_attr_opt(
        &self,
        host_path: impl AsRef<Path>,
    ) -> Result<Option<String>, HostFsError> {
        match self.read_attr(host_path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A hexadecimal attribute such as `vendor` (`0x10de`) or `idVendor` (`046d`).
    pub fn read_hex(&self, host_path: impl AsRef<Path>) -> Result<u64, HostFsError> {
        let host_path = host_path.as_ref();
        let v = self.read_attr(host_path)?;
        parse_hex(&v).ok_or_else(|| HostFsError::parse(host_path, &v, "a hexadecimal number"))
    }

    /// A decimal attribute such as `numa_node` (`-1`) or `busnum` (`3`).
    pub fn read_dec(&self, host_path: impl AsRef<Path>) -> Result<i64, HostFsError> {
        let host_path = host_path.as_ref();
        let v = self.read_attr(host_path)?;
        parse_dec(&v).ok_or_else(|| HostFsError::parse(host_path, &v, "a decimal number"))
    }

    /// The last component of a symbolic link's target, e.g. `vfio-pci` for a PCI function's
    /// `driver` link or `12` for its `iommu_group` link. The link itself is not followed.
    pub fn read_link_name(&self, host_path: impl AsRef<Path>) -> Result<String, HostFsError> {
        let host_path = host_path.as_ref();
        let (parent, name) = match (host_path.parent(), host_path.file_name()) {
            (Some(p), Some(n)) => (p, n),
            _ => {
                return Err(HostFsError::parse(
                    host_path,
                    &host_path.to_string_lossy(),
                    "a symbolic link",
                ));
            }
        };
        let real = self.resolve(parent)?.join(name);
        let target = std::fs::read_link(&real).map_err(|e| HostFsError::io(host_path, &e))?;
        target
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
            .ok_or_else(|| {
                HostFsError::parse(
                    host_path,
                    &target.to_string_lossy(),
                    "a link to a named entry",
                )
            })
    }

    /// The names of a directory's entries, sorted; names that are not UTF-8 are left out.
    pub fn list_dir(&self, host_path: impl AsRef<Path>) -> Result<Vec<String>, HostFsError> {
        let host_path = host_path.as_ref();
        let real = self.resolve(host_path)?;
        let rd = std::fs::read_dir(real).map_err(|e| HostFsError::io(host_path, &e))?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| HostFsError::io(host_path, &e))?;
            if let Ok(n) = entry.file_name().into_string() {
                names.push(n);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Writes `value` to an existing attribute (e.g. `driver_override`, `bind`, an mdev
    /// `create`); the file is never created.
    pub fn write_attr(&self, host_path: impl AsRef<Path>, value: &str) -> Result<(), HostFsError> {
        use std::io::Write;
        let host_path = host_path.as_ref();
        let real = self.resolve(host_path)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(real)
            .map_err(|e| HostFsError::io(host_path, &e))?;
        f.write_all(value.as_bytes())
            .map_err(|e| HostFsError::io(host_path, &e))
    }
}

fn push_front_components(rest: &mut VecDeque<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    for p in parts.into_iter().rev() {
        rest.push_front(p);
    }
}

/// Parses a hexadecimal number as sysfs writes them: optional `0x`, 1 to 16 digits, surrounding
/// white space ignored.
pub fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Parses a decimal number (optionally negative), surrounding white space ignored.
pub fn parse_dec(s: &str) -> Option<i64> {
    let s = s.trim();
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A `uevent` file that is not a list of `KEY=VALUE` lines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("uevent line {line}: {problem}")]
pub struct UeventError {
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// Parses a sysfs `uevent` file (`KEY=VALUE` per `\n`-terminated line, as the kernel writes it;
/// empty lines ignored; a key repeated keeps its last value).
pub fn parse_uevent(s: &str) -> Result<BTreeMap<String, String>, UeventError> {
    let mut out = BTreeMap::new();
    for (i, line) in s.split('\n').enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(UeventError {
                line: i + 1,
                problem: format!("{:?} has no '='", line.chars().take(64).collect::<String>()),
            });
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(UeventError {
                line: i + 1,
                problem: format!(
                    "{:?} is not a key (letters, digits and '_')",
                    key.chars().take(64).collect::<String>()
                ),
            });
        }
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

/// What the daemon gives every backend: the host file system, a directory for the backend's own
/// crash-safe records, and the node's name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendContext {
    /// The host's file system.
    pub host: HostFs,
    /// A directory only this backend writes (created by the daemon).
    pub state_dir: PathBuf,
    /// The Kubernetes node this daemon serves.
    pub node_name: String,
}

impl BackendContext {
    /// The context of a backend on node `node_name`, reading the host through `host`, keeping
    /// its own records in `state_dir` (which the daemon creates).
    pub fn new(host: HostFs, state_dir: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        BackendContext {
            host,
            state_dir: state_dir.into(),
            node_name: node_name.into(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> (tempfile::TempDir, HostFs) {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let dev = d
            .path()
            .join("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        std::fs::create_dir_all(d.path().join("sys/bus/pci/devices")).unwrap();
        std::fs::create_dir_all(d.path().join("sys/bus/pci/drivers/vfio-pci")).unwrap();
        std::fs::create_dir_all(d.path().join("sys/kernel/iommu_groups/12")).unwrap();
        symlink(
            "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
            d.path().join("sys/bus/pci/devices/0000:01:00.0"),
        )
        .unwrap();
        symlink("../../../../bus/pci/drivers/vfio-pci", dev.join("driver")).unwrap();
        symlink(
            "../../../../kernel/iommu_groups/12",
            dev.join("iommu_group"),
        )
        .unwrap();
        (d, fs)
    }

    #[test]
    fn pci_placement_of_sysfs_paths() {
        let usb = Path::new("/sys/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1.4");
        assert_eq!(pcie_root_of(usb).as_deref(), Some("pci0000:00"));
        assert_eq!(
            pci_function_of(usb),
            Some(PathBuf::from("/sys/devices/pci0000:00/0000:00:14.0"))
        );
        let gpu = Path::new("/sys/devices/pci10000:3a/10000:3a:00.0/10000:3b:00.0");
        assert_eq!(pcie_root_of(gpu).as_deref(), Some("pci10000:3a"));
        assert_eq!(pci_function_of(gpu), Some(gpu.to_path_buf()));
        let virt = Path::new("/sys/devices/platform/dummy_hcd.0/usb3/3-1");
        assert_eq!(pcie_root_of(virt), None);
        assert_eq!(pci_function_of(virt), None);
        assert_eq!(pcie_root_of(Path::new("/sys/devices/pcifoo")), None);
        assert_eq!(
            pci_function_of(Path::new("/sys/devices/pci0000:00/0000:00:14.8")),
            None
        );
    }

    #[test]
    fn presence_tells_missing_from_cannot_tell() {
        let (d, fs) = tree();
        assert_eq!(
            fs.presence("/sys/bus/pci/devices/0000:01:00.0/vendor").ok(),
            Some(true)
        );
        assert_eq!(
            fs.presence("/sys/bus/pci/devices/0000:02:00.0").ok(),
            Some(false)
        );
        // A file where a directory should be: absent too.
        assert_eq!(
            fs.presence("/sys/bus/pci/devices/0000:01:00.0/vendor/x")
                .ok(),
            Some(false)
        );
        // A link loop: nobody can tell.
        symlink("loop", d.path().join("loop")).unwrap();
        let err = fs.presence("/loop").unwrap_err();
        assert!(err.to_string().contains("symbolic links"), "{err}");
    }

    #[test]
    fn relative_links_resolve_like_sysfs() {
        let (_d, fs) = tree();
        assert_eq!(
            fs.canonicalize("/sys/bus/pci/devices/0000:01:00.0")
                .unwrap(),
            PathBuf::from("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0")
        );
        assert_eq!(
            fs.read_hex("/sys/bus/pci/devices/0000:01:00.0/vendor")
                .unwrap(),
            0x10de
        );
        assert_eq!(
            fs.read_dec("/sys/bus/pci/devices/0000:01:00.0/numa_node")
                .unwrap(),
            -1
        );
        assert_eq!(
            fs.read_link_name("/sys/bus/pci/devices/0000:01:00.0/driver")
                .unwrap(),
            "vfio-pci"
        );
        assert_eq!(
            fs.read_link_name("/sys/bus/pci/devices/0000:01:00.0/iommu_group")
                .unwrap(),
            "12"
        );
        assert_eq!(
            fs.canonicalize("/sys/bus/pci/devices/0000:01:00.0/iommu_group")
                .unwrap(),
            PathBuf::from("/sys/kernel/iommu_groups/12")
        );
    }

    #[test]
    fn absolute_links_and_dotdot_stay_inside_the_root() {
        let (d, fs) = tree();
        // A link to the machine's real /etc stays in the fake root's /etc.
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/hostname"), "fake\n").unwrap();
        symlink("/etc/hostname", d.path().join("sys/escape")).unwrap();
        assert_eq!(fs.read_attr("/sys/escape").unwrap(), "fake");
        symlink(
            "../../../../../../../../etc/hostname",
            d.path().join("sys/escape2"),
        )
        .unwrap();
        assert_eq!(fs.read_attr("/sys/escape2").unwrap(), "fake");
        assert_eq!(fs.read_attr("/../../etc/hostname").unwrap(), "fake");
        assert!(fs.join("/../x").starts_with(d.path()));
    }

    #[test]
    fn loops_and_missing_files_are_errors_naming_the_host_path() {
        let (d, fs) = tree();
        symlink("b", d.path().join("sys/a")).unwrap();
        symlink("a", d.path().join("sys/b")).unwrap();
        let e = fs.read_attr("/sys/a").unwrap_err();
        assert!(matches!(e, HostFsError::Loop { .. }), "{e}");
        assert!(e.to_string().contains("/sys/a"), "{e}");
        let e = fs
            .read_attr("/sys/bus/pci/devices/0000:01:00.0/missing")
            .unwrap_err();
        assert!(e.is_not_found());
        assert!(
            crate::echo::chain(&e)
                .starts_with("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/missing"),
            "{e}"
        );
        assert_eq!(fs.read_attr_opt("/sys/nothing/here").unwrap(), None);
        assert!(!fs.exists("/sys/nothing"));
        assert!(fs.exists("/sys/bus/pci/devices/0000:01:00.0"));
    }

    #[test]
    fn parse_errors_name_file_and_value() {
        let (d, fs) = tree();
        std::fs::write(d.path().join("sys/bad"), "zz\n").unwrap();
        let e = fs.read_hex("/sys/bad").unwrap_err();
        assert_eq!(
            crate::echo::chain(&e),
            "/sys/bad: \"zz\" is not a hexadecimal number"
        );
        let e = fs.read_dec("/sys/bad").unwrap_err();
        assert!(e.to_string().contains("decimal"), "{e}");
    }

    #[test]
    fn list_and_write() {
        let (d, fs) = tree();
        assert_eq!(
            fs.list_dir("/sys/bus/pci/devices").unwrap(),
            vec!["0000:01:00.0"]
        );
        let p = d
            .path()
            .join("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/driver_override");
        std::fs::write(&p, "(null)\n").unwrap();
        fs.write_attr(
            "/sys/bus/pci/devices/0000:01:00.0/driver_override",
            "vfio-pci",
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "vfio-pci");
        let e = fs
            .write_attr("/sys/bus/pci/devices/0000:01:00.0/nope", "x")
            .unwrap_err();
        assert!(e.is_not_found());
    }

    #[test]
    fn number_parsers() {
        assert_eq!(parse_hex("0x10DE\n"), Some(0x10de));
        assert_eq!(parse_hex("046d"), Some(0x046d));
        assert_eq!(parse_hex("0x"), None);
        assert_eq!(parse_hex(""), None);
        assert_eq!(parse_hex("+1"), None);
        assert_eq!(parse_hex("0x10000000000000000"), None);
        assert_eq!(parse_dec("-1\n"), Some(-1));
        assert_eq!(parse_dec("12"), Some(12));
        assert_eq!(parse_dec("-"), None);
        assert_eq!(parse_dec("+3"), None);
        assert_eq!(parse_dec("99999999999999999999"), None);
    }

    #[test]
    fn uevent() {
        let u = parse_uevent("MAJOR=189\nMINOR=1\nDEVNAME=bus/usb/001/002\nDEVTYPE=usb_device\n\nPRODUCT=46d/c52b/1201\n").unwrap();
        assert_eq!(u["DEVNAME"], "bus/usb/001/002");
        assert_eq!(u["PRODUCT"], "46d/c52b/1201");
        let e = parse_uevent("A=1\nnonsense\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(parse_uevent("=x").is_err());
        assert!(parse_uevent("A B=x").is_err());
        assert_eq!(parse_uevent("A=b=c").unwrap()["A"], "b=c");
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC*") {
            let _ = parse_hex(&s);
            let _ = parse_dec(&s);
            let _ = parse_uevent(&s);
        }
    }
}
