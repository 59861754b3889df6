//! Configuration of the host backend.

use kubedev_core::factory::InvalidValue;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::HostError;

/// Slots offered for a device when the configuration does not say: the kubelet's default
/// `maxPods`, so every pod of a default node can get one. KubeVirt offers 1000 (its
/// `maxDevices`); raise `slots` or `permanentSlots` on nodes that run more pods.
pub const DEFAULT_SLOTS: u32 = 110;

/// The most slots one device may be offered as (each slot is a published device).
pub const MAX_SLOTS: u32 = 4096;

/// The longest device entry name: its slots are named `<name>-<slot>` and must stay DNS labels.
pub const MAX_NAME_LEN: usize = 57;

/// The SELinux context sockets and their directories are given when SELinux is enabled and the
/// device does not name one: the type containers may use.
pub const DEFAULT_SELINUX_CONTEXT: &str = "system_u:object_r:container_file_t:s0";

/// Configuration of the host backend.
///
/// ```yaml
/// permanentDevices: true          # kvm, tun, vhost-net with permanentSlots slots each
/// characterDevices:
///   - name: vhost-vsock
///     path: /dev/vhost-vsock
///     slots: 50
///     preOpen: true
/// socketDevices:
///   - name: tdx-qgs
///     path: /var/run/tdx-qgs/qgs.socket
///     slotsFrom: {miscCapacity: tdx}
///     owner: {uid: 107, gid: 107}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostConfig {
    /// Offer `/dev/kvm` (`kvm`), `/dev/net/tun` (`tun`) and `/dev/vhost-net` (`vhost-net`), as
    /// virtualization platforms expect; the daemon pre-opens tun and vhost-net so their modules
    /// load.
    /// A character device configured with one of these names replaces the built-in one.
    #[serde(default)]
    pub permanent_devices: bool,
    /// Slots of each permanent device (default [`DEFAULT_SLOTS`]).
    #[serde(default = "default_slots")]
    pub permanent_slots: u32,
    /// Character devices.
    #[serde(default)]
    pub character_devices: Vec<CharDevice>,
    /// Unix-socket devices.
    #[serde(default)]
    pub socket_devices: Vec<SocketDevice>,
    /// Seconds between presence checks when no inotify event arrives; default 30, at least 1.
    #[serde(default = "default_resync_seconds")]
    pub resync_seconds: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            permanent_devices: false,
            permanent_slots: DEFAULT_SLOTS,
            character_devices: Vec::new(),
            socket_devices: Vec::new(),
            resync_seconds: default_resync_seconds(),
        }
    }
}

fn default_slots() -> u32 {
    DEFAULT_SLOTS
}

fn default_resync_seconds() -> u64 {
    30
}

/// A character device offered as slots that all share its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CharDevice {
    /// The entry name, a DNS label of at most [`MAX_NAME_LEN`] characters; slots are named
    /// `<name>-0`, `<name>-1`, ….
    pub name: String,
    /// The node's host path, e.g. `/dev/kvm`.
    pub path: PathBuf,
    /// How many slots (default [`DEFAULT_SLOTS`] unless `slotsFrom` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// Take the slot count from the kernel instead of `slots`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_from: Option<SlotsFrom>,
    /// Open the node once when the backend starts, so the kernel loads its module; a failure is
    /// logged, not fatal.
    #[serde(default)]
    pub pre_open: bool,
    /// Offer the entry as one device that several claims share at once (DRA consumable
    /// capacity, Kubernetes 1.36 and later), instead of one device per slot: it allows multiple
    /// allocations and has the capacity `slots`, of which each claim takes 1 unless its
    /// request asks for more (up to all of them).
    #[serde(default)]
    pub consumable_capacity: bool,
}

/// A Unix socket offered as slots; a container gets the socket's directory mounted, so a socket
/// that its server re-creates stays reachable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SocketDevice {
    /// The entry name, as for [`CharDevice::name`].
    pub name: String,
    /// The socket's host path, e.g. `/var/run/tdx-qgs/qgs.socket`.
    pub path: PathBuf,
    /// How many slots (default [`DEFAULT_SLOTS`] unless `slotsFrom` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// Take the slot count from the kernel instead of `slots`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_from: Option<SlotsFrom>,
    /// Where the socket's directory appears in the container (default: its host path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_dir: Option<PathBuf>,
    /// Healthy even while the socket is missing (its server may start later).
    #[serde(default)]
    pub optional: bool,
    /// Give the socket and its directory to this user and group on prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// The SELinux context set on the socket and its directory on prepare when SELinux is
    /// enabled on the host (default [`DEFAULT_SELINUX_CONTEXT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selinux_context: Option<String>,
    /// Offer the socket as one shared device with the capacity `slots`, as for
    /// [`CharDevice::consumable_capacity`].
    #[serde(default)]
    pub consumable_capacity: bool,
}

/// A numeric owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Owner {
    /// User ID.
    pub uid: u32,
    /// Group ID.
    pub gid: u32,
}

/// Where a slot count comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum SlotsFrom {
    /// The count of a resource in the root cgroup's `misc.capacity` (`tdx`, `sev`, `sev_es`),
    /// e.g. `{miscCapacity: tdx}`. A resource the file does not list gives no slots.
    MiscCapacity(String),
}

/// How many slots an entry has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Slots {
    Fixed(u32),
    From(SlotsFrom),
}

/// What kind of device an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Char { pre_open: bool },
    Socket(SocketDevice),
}

/// One configured device after defaults and permanent devices are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) slots: Slots,
    pub(crate) kind: Kind,
    /// One device with consumable capacity instead of one device per slot.
    pub(crate) shared: bool,
}

impl Entry {
    /// The directory holding the node or socket (host path).
    pub(crate) fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }
}

fn slots_of(field: &str, slots: Option<u32>, from: &Option<SlotsFrom>) -> Result<Slots, HostError> {
    match (slots, from) {
        (Some(n), None) => Ok(Slots::Fixed(n)),
        (None, Some(f)) => Ok(Slots::From(f.clone())),
        (None, None) => Ok(Slots::Fixed(DEFAULT_SLOTS)),
        (Some(n), Some(_)) => Err(HostError::Config(InvalidValue {
            field: field.to_string(),
            value: n.to_string(),
            reason: "give either slots or slotsFrom, not both".into(),
        })),
    }
}

fn check_path(field: &str, path: &Path, what: &str) -> Result<(), HostError> {
    let bad = |reason: &str| {
        HostError::Config(InvalidValue {
            field: field.to_string(),
            value: path.display().to_string(),
            reason: reason.to_string(),
        })
    };
    if !path.is_absolute() {
        return Err(bad("must be an absolute path"));
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(bad("must not contain '.' or '..' components"));
    }
    if path.file_name().is_none() || (what == "socket" && path.parent() == Some(Path::new("/"))) {
        return Err(bad(&format!("must name a {what} inside a directory")));
    }
    if path.to_str().is_none() {
        return Err(bad("must be UTF-8"));
    }
    Ok(())
}

impl HostConfig {
    /// Checks everything serde cannot (names, paths, slot counts, owners, SELinux contexts);
    /// errors name the field and the value. [`HostBackend::new`](crate::HostBackend::new)
    /// checks the same.
    pub fn validate(&self) -> Result<(), HostError> {
        self.entries().map(|_| ())
    }

    /// The configured devices with defaults applied, after checking everything serde cannot.
    /// Errors name the field and the value.
    pub(crate) fn entries(&self) -> Result<Vec<Entry>, HostError> {
        if self.resync_seconds == 0 {
            return Err(HostError::Config(InvalidValue {
                field: "resyncSeconds".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            }));
        }
        // Each entry with the field its name is checked as.
        let mut out: Vec<(String, Entry)> = self.permanent_entries();
        for (i, c) in self.character_devices.iter().enumerate() {
            out.push(character_entry(i, c)?);
        }
        for (i, s) in self.socket_devices.iter().enumerate() {
            out.push(socket_entry(i, s)?);
        }
        for (i, (field, e)) in out.iter().enumerate() {
            check_entry(field, e, &out[..i])?;
        }
        Ok(out.into_iter().map(|(_, e)| e).collect())
    }

    /// The permanent devices a character device of the same name does not replace, when
    /// `permanentDevices` is on.
    fn permanent_entries(&self) -> Vec<(String, Entry)> {
        let mut out = Vec::new();
        if self.permanent_devices {
            for (name, path, pre_open) in [
                ("kvm", "/dev/kvm", false),
                ("tun", "/dev/net/tun", true),
                ("vhost-net", "/dev/vhost-net", true),
            ] {
                let overridden = self.character_devices.iter().any(|c| c.name == name);
                if !overridden {
                    out.push((
                        "permanentSlots".into(),
                        Entry {
                            name: name.into(),
                            path: path.into(),
                            slots: Slots::Fixed(self.permanent_slots),
                            kind: Kind::Char { pre_open },
                            shared: false,
                        },
                    ));
                }
            }
        }
        out
    }
}

/// Character device `i` as an entry, with the field its name is checked as.
fn character_entry(i: usize, c: &CharDevice) -> Result<(String, Entry), HostError> {
    let field = |f: &str| format!("characterDevices[{i}].{f}");
    check_path(&field("path"), &c.path, "device node")?;
    Ok((
        field("name"),
        Entry {
            name: c.name.clone(),
            path: c.path.clone(),
            slots: slots_of(&field("slots"), c.slots, &c.slots_from)?,
            kind: Kind::Char {
                pre_open: c.pre_open,
            },
            shared: c.consumable_capacity,
        },
    ))
}

/// Socket device `i` as an entry, with the field its name is checked as, after checking its
/// paths, owner and SELinux context.
fn socket_entry(i: usize, s: &SocketDevice) -> Result<(String, Entry), HostError> {
    let field = |f: &str| format!("socketDevices[{i}].{f}");
    check_path(&field("path"), &s.path, "socket")?;
    if let Some(dir) = &s.container_dir {
        check_path(&field("containerDir"), dir, "directory")?;
    }
    if let Some(o) = s.owner
        && (o.uid == u32::MAX || o.gid == u32::MAX)
    {
        return Err(HostError::Config(InvalidValue {
            field: field("owner"),
            value: format!("{}:{}", o.uid, o.gid),
            reason: "4294967295 (-1) is not an ID".into(),
        }));
    }
    if let Some(ctx) = &s.selinux_context
        && (ctx.is_empty() || ctx.len() > 255 || ctx.contains('\0'))
    {
        return Err(HostError::Config(InvalidValue {
            field: field("selinuxContext"),
            value: ctx.clone(),
            reason: "must be 1 to 255 bytes without NUL".into(),
        }));
    }
    Ok((
        field("name"),
        Entry {
            name: s.name.clone(),
            path: s.path.clone(),
            slots: slots_of(&field("slots"), s.slots, &s.slots_from)?,
            kind: Kind::Socket(s.clone()),
            shared: s.consumable_capacity,
        },
    ))
}

/// Checks entry `e`, whose name is checked as `field`: its name (a DNS label, short enough,
/// not one of the `earlier` entries'), its slot count and where the count comes from.
fn check_entry(field: &str, e: &Entry, earlier: &[(String, Entry)]) -> Result<(), HostError> {
    let bad = |reason: String| {
        HostError::Config(InvalidValue {
            field: field.to_owned(),
            value: e.name.clone(),
            reason,
        })
    };
    kubedev_core::check_dns_label(&e.name).map_err(bad)?;
    if e.name.len() > MAX_NAME_LEN {
        return Err(bad(format!(
            "must be at most {MAX_NAME_LEN} characters (slots add \"-<n>\")"
        )));
    }
    if let Some((other, _)) = earlier.iter().find(|(_, o)| o.name == e.name) {
        return Err(bad(format!("the name is also used by {other}")));
    }
    match &e.slots {
        Slots::Fixed(n) if *n > MAX_SLOTS => Err(HostError::Config(InvalidValue {
            field: field.replace(".name", ".slots"),
            value: n.to_string(),
            reason: format!("at most {MAX_SLOTS} slots"),
        })),
        Slots::From(SlotsFrom::MiscCapacity(key))
            if key.is_empty()
                || !key
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') =>
        {
            Err(HostError::Config(InvalidValue {
                field: field.replace(".name", ".slotsFrom.miscCapacity"),
                value: key.clone(),
                reason: "a misc cgroup resource name such as tdx, sev or sev_es".into(),
            }))
        }
        _ => Ok(()),
    }
}
