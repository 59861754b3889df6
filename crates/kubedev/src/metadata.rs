//! Device metadata for containers (KEP-5304, alpha in Kubernetes 1.36, beta in 1.37): for each
//! request of a prepared claim, a `metadata.resource.k8s.io/v1alpha1` `DeviceMetadata` file
//! naming the claim and, per device, its driver, pool, name, attributes and network data, so a
//! workload (or KubeVirt, which needs a VFIO function's PCI address) can read what it got.
//!
//! Layout, as upstream's helper library writes it:
//! - host: `<plugin dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`
//!   (directories 0755, files 0644: the container runtime bind-mounts them);
//! - container: `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/
//!   <driver>-metadata.json`, or `…/resourceclaimtemplates/<pod claim name>/<request>/…` for a
//!   claim made from a template (its `resource.kubernetes.io/pod-claim-name` annotation);
//! - one CDI device per request (kind `k8s.<driver>/metadata`, name `<claim UID>-<request>`)
//!   holding a read-only bind mount of the file; its ID is added to the first device of the
//!   request in the kubelet's answer, so every container that uses the request gets the file.
//!
//! `<request>` is the main request (`gpu` for the subrequest `gpu/large`); the file's
//! `requests[].name` keeps the full name.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use kubedev_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceName, DeviceRef, DriverName, Inventory, Mount,
    PoolName, PreparedDevice, atomic_file, safefs,
};
use serde_json::{Value, json};

use crate::cdi::{CdiError, CdiWriter};

/// The API version of the files written.
pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// Where containers find the files.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The directory under the driver's plugin directory that holds the files.
pub const HOST_SUBDIR: &str = "dra-device-metadata";
/// The CDI class of the metadata specs.
pub const CDI_CLASS: &str = "metadata";
/// The annotation naming the pod's claim entry of a claim made from a template.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;

/// Writes, checks and removes the metadata files of one driver's claims, and their CDI specs.
#[derive(Debug, Clone)]
pub struct MetadataWriter {
    dir: PathBuf,
    driver: DriverName,
    cdi: CdiWriter,
}

/// One request's file: where it is on the host, where containers see it, and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFile {
    /// The main request.
    pub request: String,
    /// The host path.
    pub host_path: PathBuf,
    /// The path in containers.
    pub container_path: String,
}

impl MetadataWriter {
    /// A writer for `driver`'s files under `<plugin_dir>/dra-device-metadata` and their CDI
    /// specs in `cdi_dir`.
    pub fn new(plugin_dir: &Path, cdi_dir: &Path, driver: &DriverName) -> Self {
        MetadataWriter {
            dir: plugin_dir.join(HOST_SUBDIR),
            driver: driver.clone(),
            cdi: CdiWriter::with_class(cdi_dir, driver, CDI_CLASS),
        }
    }

    /// The directory holding every claim's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CDI writer of the metadata specs.
    pub fn cdi(&self) -> &CdiWriter {
        &self.cdi
    }

    /// The directory of `claim`'s files, `<dir>/<namespace>_<name>`; an error for names that
    /// could leave the directory (namespaces and names never hold `_` or `/`).
    pub fn claim_dir(&self, claim: &ClaimRef) -> io::Result<PathBuf> {
        for part in [&claim.namespace, &claim.name] {
            kubedev_core::check_dns_subdomain(part, 253).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("claim {claim}: {part:?} {e}"),
                )
            })?;
        }
        Ok(self.dir.join(format!("{}_{}", claim.namespace, claim.name)))
    }

    /// The files `prepared` gets, one per main request, in the order requests first appear.
    pub fn files(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        prepared: &[PreparedDevice],
    ) -> io::Result<Vec<RequestFile>> {
        let base = self.claim_dir(claim)?;
        let mut out: Vec<RequestFile> = Vec::new();
        for p in prepared {
            let request = crate::dra_driver::base_request(&p.device.request);
            if request.is_empty() || out.iter().any(|f| f.request == request) {
                continue;
            }
            kubedev_core::check_dns_label(&request).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("claim {claim}: request {request:?} {e}"),
                )
            })?;
            let scope = match pod_claim_name.filter(|n| !n.is_empty()) {
                Some(n) => format!("resourceclaimtemplates/{n}"),
                None => format!("resourceclaims/{}", claim.name),
            };
            out.push(RequestFile {
                host_path: base.join(&request).join("metadata.json"),
                container_path: format!(
                    "{CONTAINER_DIR}/{scope}/{request}/{}-metadata.json",
                    self.driver
                ),
                request,
            });
        }
        Ok(out)
    }

    /// The content of `file`: a `DeviceMetadata` object for its request's devices of
    /// `prepared`, attributes taken from `inventory`.
    pub fn content(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        file: &RequestFile,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
    ) -> Vec<u8> {
        let mut requests: Vec<(String, Vec<Value>)> = Vec::new();
        for p in prepared
            .iter()
            .filter(|p| crate::dra_driver::base_request(&p.device.request) == file.request)
        {
            let d = &p.device.device;
            let mut device = json!({
                "driver": self.driver.as_str(),
                "pool": d.pool.as_str(),
                "name": d.device.as_str(),
            });
            if let Some(dev) = inventory.and_then(|i| i.device(d))
                && !dev.attributes.is_empty()
            {
                let attributes: BTreeMap<String, Value> = dev
                    .attributes
                    .iter()
                    .filter_map(|(k, v)| Some((k.to_string(), serde_json::to_value(v).ok()?)))
                    .collect();
                device["attributes"] = json!(attributes);
            }
            if let Some(net) = &p.network {
                device["networkData"] = json!(net);
            }
            match requests.iter_mut().find(|(r, _)| *r == p.device.request) {
                Some((_, devices)) => devices.push(device),
                None => requests.push((p.device.request.clone(), vec![device])),
            }
        }
        let mut doc = json!({
            "apiVersion": API_VERSION,
            "kind": "DeviceMetadata",
            "metadata": {
                "name": claim.name,
                "namespace": claim.namespace,
                "uid": claim.uid.as_str(),
                "generation": 1,
            },
            "requests": requests
                .into_iter()
                .map(|(name, devices)| json!({"name": name, "devices": devices}))
                .collect::<Vec<_>>(),
        });
        if let Some(n) = pod_claim_name.filter(|n| !n.is_empty()) {
            doc["podClaimName"] = json!(n);
        }
        let mut bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Writes `claim`'s files (replacing earlier ones atomically) and its CDI spec; returns the
    /// CDI device ID for each main request.
    pub fn write_claim(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
    ) -> Result<BTreeMap<String, String>, String> {
        self.put_claim(claim, pod_claim_name, prepared, inventory, false)
    }

    /// Makes sure `claim`'s files and CDI spec are in place: a missing or unreadable file is
    /// written again (attributes from `inventory` as it is now), a file that is there is kept.
    /// Returns the CDI device ID for each main request.
    pub fn ensure_claim(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
    ) -> Result<BTreeMap<String, String>, String> {
        self.put_claim(claim, pod_claim_name, prepared, inventory, true)
    }

    /// Writes the files (`ensure`: only those missing or unreadable) and the spec.
    fn put_claim(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
        ensure: bool,
    ) -> Result<BTreeMap<String, String>, String> {
        let files = self
            .files(claim, pod_claim_name, prepared)
            .map_err(|e| e.to_string())?;
        for f in &files {
            if ensure {
                let intact = safefs::read_regular(&f.host_path, 1 << 20)
                    .ok()
                    .flatten()
                    .is_some_and(|b| serde_json::from_slice::<Value>(&b).is_ok());
                if intact {
                    continue;
                }
                tracing::warn!(claim = %claim, file = %f.host_path.display(), "rewrote a missing or damaged device metadata file");
            }
            let bytes = self.content(claim, pod_claim_name, f, prepared, inventory);
            put(&f.host_path, &bytes)
                .map_err(|e| format!("writing {}: {e}", f.host_path.display()))?;
        }
        self.write_spec(claim, &files, ensure)
    }

    fn write_spec(
        &self,
        claim: &ClaimRef,
        files: &[RequestFile],
        ensure: bool,
    ) -> Result<BTreeMap<String, String>, String> {
        let devices = spec_devices(claim, files).map_err(|e| e.to_string())?;
        let uid = claim.uid.as_str();
        let ids = if ensure {
            self.cdi.ensure_claim_ids(uid, &devices).map(|(_, ids)| ids)
        } else {
            self.cdi.write_claim(uid, &devices).map(|w| w.device_ids)
        }
        .map_err(|e| format!("writing the device metadata CDI spec: {e}"))?;
        Ok(files
            .iter()
            .zip(ids)
            .filter_map(|(f, id)| Some((f.request.clone(), id?)))
            .collect())
    }

    /// Removes `claim`'s files and CDI spec; a claim without them is success.
    pub fn remove_claim(&self, claim: &ClaimRef) -> Result<(), String> {
        self.cdi
            .remove_claim(claim.uid.as_str())
            .map_err(|e| e.to_string())?;
        let dir = self.claim_dir(claim).map_err(|e| e.to_string())?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("removing {}: {e}", dir.display())),
        }
    }

    /// The claim directories present, as `(namespace, name, path)`.
    pub fn list_claim_dirs(&self) -> io::Result<Vec<(String, String, PathBuf)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some((ns, claim)) = name.split_once('_') {
                out.push((ns.to_owned(), claim.to_owned(), entry.path()));
            }
        }
        Ok(out)
    }
}

/// The CDI devices of a claim's metadata spec: per request, a device named after the request
/// whose only edit is the read-only bind mount of the file.
fn spec_devices(claim: &ClaimRef, files: &[RequestFile]) -> Result<Vec<PreparedDevice>, CdiError> {
    let mut out = Vec::new();
    for f in files {
        let name = DeviceName::new(f.request.clone()).map_err(|e| CdiError::InvalidName {
            what: "request",
            value: f.request.clone(),
            reason: e.to_string(),
        })?;
        let pool = PoolName::new(claim.namespace.clone()).map_err(|e| CdiError::InvalidName {
            what: "namespace",
            value: claim.namespace.clone(),
            reason: e.to_string(),
        })?;
        let mut edits = ContainerEdits::default();
        edits.mounts.push(Mount::bind(
            f.host_path.to_string_lossy(),
            f.container_path.clone(),
            true,
        ));
        out.push(PreparedDevice::new(
            AllocatedDevice::new(DeviceRef { pool, device: name }),
            edits,
        ));
    }
    Ok(out)
}

fn put(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        safefs::create_dir_all_mode(dir, DIR_MODE)?;
    }
    atomic_file::replace(path, FILE_MODE, |f| f.write_all(bytes)).map_err(|f| f.source)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn prepared(request: &str, device: &str) -> PreparedDevice {
        PreparedDevice::new(
            AllocatedDevice::new(DeviceRef {
                pool: PoolName::new("node-a").unwrap(),
                device: DeviceName::new(device).unwrap(),
            })
            .with_request(request),
            ContainerEdits::default(),
        )
    }

    #[test]
    fn paths_follow_the_claim_and_its_main_requests() {
        let w = MetadataWriter::new(
            Path::new("/p"),
            Path::new("/cdi"),
            &DriverName::new("gpu.example.com").unwrap(),
        );
        let claim = ClaimRef::new("u1".parse().unwrap(), "ns", "train");
        let devices = [
            prepared("gpu/large", "gpu-0"),
            prepared("gpu/large", "gpu-1"),
            prepared("nic", "eth-0"),
        ];
        let files = w.files(&claim, None, &devices).unwrap();
        let got: Vec<(&str, &Path, &str)> = files
            .iter()
            .map(|f| {
                (
                    f.request.as_str(),
                    f.host_path.as_path(),
                    f.container_path.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "gpu",
                    Path::new("/p/dra-device-metadata/ns_train/gpu/metadata.json"),
                    "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/gpu/gpu.example.com-metadata.json"
                ),
                (
                    "nic",
                    Path::new("/p/dra-device-metadata/ns_train/nic/metadata.json"),
                    "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/nic/gpu.example.com-metadata.json"
                )
            ]
        );
        let bad = ClaimRef::new("u1".parse().unwrap(), "..", "train");
        assert!(
            w.files(&bad, None, &devices).is_err(),
            "never outside the directory"
        );
    }
}
