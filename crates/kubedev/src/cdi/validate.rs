//! Checking a spec as a container runtime's CDI library would: a known `cdiVersion` high enough
//! for the content, valid kind and device names, unique devices with non-empty edits, valid
//! environment entries, device nodes, hooks, mounts and annotations.

use std::collections::{BTreeMap, BTreeSet};

use super::names::{check_vendor_or_class, validate_device_name};
use super::{CdiContainerEdits, CdiError, CdiSpec};

/// Kubernetes' limit on the total size of annotations, which CDI applies too.
pub(super) const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Hook names the CDI libraries accept.
const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// CDI spec versions a spec may declare, oldest first. Earlier versions exist but nothing valid
/// is older than 0.3.0.
const KNOWN_VERSIONS: [&str; 8] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

impl CdiSpec {
    /// Checks the spec as a container runtime's CDI library would: a known version no lower
    /// than [`minimum_version`](Self::minimum_version), valid vendor, class and device names,
    /// unique devices with non-empty edits, valid edits and annotations.
    pub fn validate(&self) -> Result<(), CdiError> {
        let version = parse_version(&self.cdi_version)
            .filter(|_| KNOWN_VERSIONS.contains(&self.cdi_version.as_str()))
            .ok_or_else(|| CdiError::InvalidContent {
                scope: "spec".into(),
                reason: format!(
                    "cdiVersion {:?} is not one of {}",
                    self.cdi_version,
                    KNOWN_VERSIONS.join(", ")
                ),
            })?;
        let minimum = self.minimum_version();
        if parse_version(minimum).is_some_and(|m| m > version) {
            return Err(CdiError::InvalidContent {
                scope: "spec".into(),
                reason: format!(
                    "cdiVersion {} is too low: the content needs {minimum}",
                    self.cdi_version
                ),
            });
        }
        let (vendor, class) = self
            .kind
            .split_once('/')
            .ok_or_else(|| CdiError::InvalidName {
                what: "kind",
                value: self.kind.clone(),
                reason: "must be <vendor>/<class>".into(),
            })?;
        check_vendor_or_class("vendor", vendor)?;
        check_vendor_or_class("class", class)?;
        check_annotations("spec", &self.annotations)?;
        self.container_edits.validate("spec")?;
        if self.devices.is_empty() {
            return Err(CdiError::InvalidContent {
                scope: "spec".into(),
                reason: "no devices".into(),
            });
        }
        let mut seen = BTreeSet::new();
        for d in &self.devices {
            validate_device_name(&d.name)?;
            if !seen.insert(d.name.as_str()) {
                return Err(CdiError::DuplicateDevice {
                    name: d.name.clone(),
                });
            }
            let scope = format!("device {}", d.name);
            check_annotations(&scope, &d.annotations)?;
            if d.container_edits.is_empty() {
                return Err(CdiError::InvalidContent {
                    scope,
                    reason: "empty container edits".into(),
                });
            }
            d.container_edits.validate(&scope)?;
        }
        Ok(())
    }
}

impl CdiContainerEdits {
    fn validate(&self, scope: &str) -> Result<(), CdiError> {
        let bad = |reason: String| CdiError::InvalidContent {
            scope: scope.to_owned(),
            reason,
        };
        for e in &self.env {
            check_env(e).map_err(|r| bad(format!("environment variable {e:?} {r}")))?;
        }
        for n in &self.device_nodes {
            if n.path.is_empty() {
                return Err(bad("device node with an empty path".into()));
            }
            if let Some(p) = &n.permissions
                && let Some(c) = p.chars().find(|c| !matches!(c, 'r' | 'w' | 'm'))
            {
                return Err(bad(format!(
                    "device node {:?}: permissions {p:?} contain {c:?}; only 'r', 'w' and 'm' are allowed",
                    n.path
                )));
            }
        }
        for h in &self.hooks {
            if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
                return Err(bad(format!(
                    "hook name {:?} is not one of {}",
                    h.hook_name,
                    HOOK_NAMES.join(", ")
                )));
            }
            if h.path.is_empty() {
                return Err(bad(format!("hook {:?} has an empty path", h.hook_name)));
            }
            for e in &h.env {
                check_env(e).map_err(|r| {
                    bad(format!(
                        "hook {:?}: environment entry {e:?} {r}",
                        h.hook_name
                    ))
                })?;
            }
        }
        for m in &self.mounts {
            if m.host_path.is_empty() {
                return Err(bad(format!(
                    "mount to {:?} has an empty host path",
                    m.container_path
                )));
            }
            if m.container_path.is_empty() {
                return Err(bad(format!(
                    "mount of {:?} has an empty container path",
                    m.host_path
                )));
            }
        }
        Ok(())
    }
}

fn check_env(entry: &str) -> Result<(), &'static str> {
    match entry.find('=') {
        Some(i) if i > 0 => Ok(()),
        Some(_) => Err("has an empty name"),
        None => Err("has no '='"),
    }
}

pub(super) fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// Checks annotations as Kubernetes does (CDI applies the same rules): keys are qualified names
/// (`[prefix/]name`, prefix a DNS subdomain, name at most 63 of letters, digits, '-', '_', '.'),
/// and keys and values together at most 256 KiB.
fn check_annotations(scope: &str, annotations: &BTreeMap<String, String>) -> Result<(), CdiError> {
    let bad = |reason: String| CdiError::InvalidContent {
        scope: scope.to_owned(),
        reason,
    };
    let mut total = 0usize;
    for (key, value) in annotations {
        check_annotation_key(key).map_err(|r| bad(format!("annotation key {key:?}: {r}")))?;
        total = total.saturating_add(key.len()).saturating_add(value.len());
    }
    if total > MAX_ANNOTATIONS_BYTES {
        return Err(bad(format!(
            "annotations are {total} bytes, more than {MAX_ANNOTATIONS_BYTES}"
        )));
    }
    Ok(())
}

pub(super) fn check_annotation_key(key: &str) -> Result<(), String> {
    let lower = key.to_ascii_lowercase();
    let name = match lower.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err("prefix must not be empty".into());
            }
            kubedev_core::check_dns_subdomain(prefix, 253).map_err(|e| format!("prefix {e}"))?;
            *name
        }
        _ => return Err("must be [prefix/]name with at most one '/'".into()),
    };
    if name.is_empty() {
        return Err("name must not be empty".into());
    }
    if name.len() > 63 {
        return Err("name must be no more than 63 characters".into());
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("name must start and end with a letter or digit".into());
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "name contains {c:?}; only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    Ok(())
}
