//! Device metadata for containers (KEP-5304, alpha in Kubernetes 1.36, beta in 1.37): for each
//! request of a prepared claim, a file holding a `DeviceMetadata` object that names the claim
//! and, per device, its driver, pool, name, attributes and network data, so a workload (or
//! KubeVirt, which needs a VFIO function's PCI address) can read what it got.
//!
//! The file has the Kubernetes 1.37 form: a stream of JSON objects, the same `DeviceMetadata`
//! once per API version kubedev writes, newest first ([`API_VERSIONS`]: `v1beta1`, then
//! `v1alpha1`), each pretty-printed and followed by a newline. A reader takes the first object
//! whose version it knows, so readers built for either release understand it.
//! `metadata.generation` starts at 1 and grows by one each time the file is rewritten because
//! its device data changed ([`MetadataWriter::ensure_claim`]).
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
    NetworkData, PoolName, PreparedDevice, atomic_file, safefs,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cdi::{CdiError, CdiWriter};

/// The API versions each file holds, in the order written (newest first).
pub const API_VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];
/// The newest API version written, the first object of each file.
pub const API_VERSION: &str = API_VERSIONS[0];
/// The kind of the objects written.
pub const KIND: &str = "DeviceMetadata";
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
/// The largest existing file read back.
const MAX_FILE: u64 = 1 << 20;

/// Writes, checks and removes the metadata files of one driver's claims, and their CDI specs.
#[derive(Debug, Clone)]
pub struct MetadataWriter {
    dir: PathBuf,
    driver: DriverName,
    cdi: CdiWriter,
}

/// One request's file: its main request, where it is on the host and where containers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFile {
    /// The main request.
    pub request: String,
    /// The host path.
    pub host_path: PathBuf,
    /// The path in containers.
    pub container_path: String,
}

/// What [`MetadataWriter::update_file`] did to one request's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileUpdate {
    /// The file already held this content and was left alone.
    Unchanged {
        /// Its `metadata.generation`.
        generation: i64,
    },
    /// The file was missing, unreadable or another claim's, and was written with generation 1.
    Created,
    /// The device data were the same but the file was not in the form written now (one from an
    /// earlier kubedev, or damaged after its first object); it was written again with its
    /// generation.
    Rewritten {
        /// Its `metadata.generation`, as before.
        generation: i64,
    },
    /// The device data changed; the file was written with the generation after the one it had.
    Updated {
        /// The new `metadata.generation`.
        generation: i64,
    },
}

impl FileUpdate {
    /// The file's `metadata.generation` now.
    pub fn generation(&self) -> i64 {
        match *self {
            FileUpdate::Created => 1,
            FileUpdate::Unchanged { generation }
            | FileUpdate::Rewritten { generation }
            | FileUpdate::Updated { generation } => generation,
        }
    }
}

/// One `DeviceMetadata` object, its fields in the order upstream writes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    kind: String,
    api_version: String,
    metadata: DocumentMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<String>,
    #[serde(default)]
    requests: Vec<RequestEntry>,
}

/// The claim a [`Document`] describes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct DocumentMeta {
    name: String,
    namespace: String,
    uid: String,
    #[serde(default)]
    generation: i64,
}

/// One request of a [`Document`] (the full name, `gpu/large` for a subrequest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RequestEntry {
    name: String,
    #[serde(default)]
    devices: Vec<DeviceEntry>,
}

/// One device of a [`RequestEntry`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceEntry {
    driver: String,
    pool: String,
    name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attributes: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    network_data: Option<NetworkData>,
}

impl Document {
    /// Whether `self` and `other` say the same about the same claim, whatever their API
    /// versions and generations.
    fn same_data(&self, other: &Document) -> bool {
        self.kind == other.kind
            && self.metadata.name == other.metadata.name
            && self.metadata.namespace == other.metadata.namespace
            && self.metadata.uid == other.metadata.uid
            && self.pod_claim_name == other.pod_claim_name
            && self.requests == other.requests
    }

    /// The attributes `self` gives the device `driver`/`pool`/`name` of `request`.
    fn attributes_of(
        &self,
        request: &str,
        driver: &str,
        pool: &str,
        name: &str,
    ) -> Option<&BTreeMap<String, Value>> {
        self.requests
            .iter()
            .filter(|r| r.name == request)
            .flat_map(|r| &r.devices)
            .find(|d| d.driver == driver && d.pool == pool && d.name == name)
            .map(|d| &d.attributes)
    }
}

/// The file's bytes: `doc` once per version of [`API_VERSIONS`], in that order, each
/// pretty-printed and followed by a newline.
fn encode(doc: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    for version in API_VERSIONS {
        let mut d = doc.clone();
        d.api_version = version.to_owned();
        // Plain structs with string keys: serializing them into memory does not fail.
        if serde_json::to_writer_pretty(&mut out, &d).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// The first object of a file's stream whose version is one of [`API_VERSIONS`]; `None` when
/// the stream holds none, or breaks (bad JSON, an object without `apiVersion` or `kind`) before
/// one. Objects of other versions are skipped.
fn decode_first_known(bytes: &[u8]) -> Option<Document> {
    for item in serde_json::Deserializer::from_slice(bytes).into_iter::<Value>() {
        let value = item.ok()?;
        let api_version = value.get("apiVersion")?.as_str()?;
        let kind = value.get("kind")?.as_str()?;
        if api_version.is_empty() || kind.is_empty() {
            return None;
        }
        if API_VERSIONS.contains(&api_version) {
            if kind != KIND {
                return None;
            }
            return serde_json::from_value(value).ok();
        }
    }
    None
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
                    format!(
                        "claim {claim}: {part} {e}",
                        part = kubedev_core::echo::echo(part)
                    ),
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
            let request = kubedev_core::base_request(&p.device.request).to_string();
            if request.is_empty() || out.iter().any(|f| f.request == request) {
                continue;
            }
            kubedev_core::check_dns_label(&request).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "claim {claim}: request {request} {e}",
                        request = kubedev_core::echo::echo(&request)
                    ),
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

    /// The content of a newly written `file` (generation 1): the stream of `DeviceMetadata`
    /// objects, one per version of [`API_VERSIONS`], for its request's devices of `prepared`,
    /// attributes taken from `inventory`.
    pub fn content(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        file: &RequestFile,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
    ) -> Vec<u8> {
        encode(&self.document(claim, pod_claim_name, file, prepared, inventory, None))
    }

    /// The `DeviceMetadata` of `file` at generation 1. A device `inventory` does not hold
    /// keeps the attributes `previous` gives it, and without `pod_claim_name` the one of
    /// `previous` is kept.
    fn document(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        file: &RequestFile,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
        previous: Option<&Document>,
    ) -> Document {
        let mut requests: Vec<RequestEntry> = Vec::new();
        for p in prepared
            .iter()
            .filter(|p| kubedev_core::base_request(&p.device.request) == file.request)
        {
            let d = &p.device.device;
            let (driver, pool, name) = (self.driver.as_str(), d.pool.as_str(), d.device.as_str());
            let attributes = match inventory.and_then(|i| i.device(d)) {
                Some(dev) => dev
                    .attributes
                    .iter()
                    .filter_map(|(k, v)| Some((k.to_string(), serde_json::to_value(v).ok()?)))
                    .collect(),
                None => previous
                    .and_then(|prev| prev.attributes_of(&p.device.request, driver, pool, name))
                    .cloned()
                    .unwrap_or_default(),
            };
            let device = DeviceEntry {
                driver: driver.to_owned(),
                pool: pool.to_owned(),
                name: name.to_owned(),
                attributes,
                network_data: p.network.clone(),
            };
            match requests.iter_mut().find(|r| r.name == p.device.request) {
                Some(r) => r.devices.push(device),
                None => requests.push(RequestEntry {
                    name: p.device.request.clone(),
                    devices: vec![device],
                }),
            }
        }
        Document {
            kind: KIND.to_owned(),
            api_version: API_VERSION.to_owned(),
            metadata: DocumentMeta {
                name: claim.name.clone(),
                namespace: claim.namespace.clone(),
                uid: claim.uid.as_str().to_owned(),
                generation: 1,
            },
            pod_claim_name: pod_claim_name
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .or_else(|| previous.and_then(|p| p.pod_claim_name.clone())),
            requests,
        }
    }

    /// Brings one request's file up to date with `prepared` and `inventory`: a missing or
    /// unreadable file (or one of another claim with the same name) is written with generation
    /// 1; a file whose device data changed is written with its generation plus one; a file
    /// with the same device data is left alone (or, when not in the current form, written
    /// again with its generation). The generation comes from the first object of the file's
    /// stream whose version is one of [`API_VERSIONS`]. A device the inventory does not hold
    /// keeps the attributes the file gave it, and the file keeps its `podClaimName` when
    /// `pod_claim_name` is `None`; pass the pod claim name the claim was prepared with, as
    /// `file` (from [`MetadataWriter::files`]) depends on it.
    pub fn update_file(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        file: &RequestFile,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
    ) -> io::Result<FileUpdate> {
        let existing = safefs::read_regular(&file.host_path, MAX_FILE)
            .ok()
            .flatten();
        let previous = existing
            .as_deref()
            .and_then(decode_first_known)
            .filter(|d| d.metadata.uid == claim.uid.as_str() && d.metadata.generation >= 1);
        let mut doc = self.document(
            claim,
            pod_claim_name,
            file,
            prepared,
            inventory,
            previous.as_ref(),
        );
        let update = match &previous {
            None => FileUpdate::Created,
            Some(prev) if doc.same_data(prev) => FileUpdate::Rewritten {
                generation: prev.metadata.generation,
            },
            Some(prev) => FileUpdate::Updated {
                generation: prev.metadata.generation.saturating_add(1),
            },
        };
        doc.metadata.generation = update.generation();
        let bytes = encode(&doc);
        if let FileUpdate::Rewritten { generation } = update
            && existing.as_deref() == Some(bytes.as_slice())
        {
            return Ok(FileUpdate::Unchanged { generation });
        }
        put(&file.host_path, &bytes)?;
        Ok(update)
    }

    /// Writes `claim`'s files and its CDI spec for a prepare; returns the CDI device ID for
    /// each main request. A file the claim already has is treated as by
    /// [`MetadataWriter::update_file`], so its generation never goes back.
    pub fn write_claim(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
    ) -> Result<BTreeMap<String, String>, String> {
        self.put_claim(claim, pod_claim_name, prepared, inventory, false)
    }

    /// Brings `claim`'s files and CDI spec up to date, as on start-up recovery, a repeated
    /// prepare or after a prepared device's attributes changed: each file as by
    /// [`MetadataWriter::update_file`] (a missing or unreadable file is written again with
    /// generation 1, a file whose device data changed gets the next generation, an unchanged
    /// file is left alone), and a missing or damaged spec is written again. Returns the CDI
    /// device ID for each main request.
    pub fn ensure_claim(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        prepared: &[PreparedDevice],
        inventory: Option<&Inventory>,
    ) -> Result<BTreeMap<String, String>, String> {
        self.put_claim(claim, pod_claim_name, prepared, inventory, true)
    }

    /// Updates the files and writes (`ensure`: checks and repairs) the spec.
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
            .map_err(|e| kubedev_core::echo::chain(&e))?;
        for f in &files {
            let update = self
                .update_file(claim, pod_claim_name, f, prepared, inventory)
                .map_err(|e| format!("writing {}: {e}", f.host_path.display()))?;
            let file = f.host_path.display();
            match update {
                FileUpdate::Created if ensure => {
                    tracing::warn!(claim = %claim, file = %file, "rewrote a missing or damaged device metadata file");
                }
                FileUpdate::Rewritten { generation } => {
                    tracing::info!(claim = %claim, file = %file, generation, "rewrote a device metadata file in the current form");
                }
                FileUpdate::Updated { generation } => {
                    tracing::info!(claim = %claim, file = %file, generation, "device metadata changed; rewrote the file");
                }
                FileUpdate::Created | FileUpdate::Unchanged { .. } => {}
            }
        }
        self.write_spec(claim, &files, ensure)
    }

    fn write_spec(
        &self,
        claim: &ClaimRef,
        files: &[RequestFile],
        ensure: bool,
    ) -> Result<BTreeMap<String, String>, String> {
        let devices = spec_devices(claim, files).map_err(|e| kubedev_core::echo::chain(&e))?;
        let uid = &claim.uid;
        let ids = if ensure {
            self.cdi.ensure_claim_ids(uid, &devices).map(|(_, ids)| ids)
        } else {
            self.cdi.write_claim(uid, &devices).map(|w| w.device_ids)
        }
        .map_err(|e| {
            format!(
                "writing the device metadata CDI spec: {}",
                kubedev_core::echo::chain(&e)
            )
        })?;
        Ok(files
            .iter()
            .zip(ids)
            .filter_map(|(f, id)| Some((f.request.clone(), id?)))
            .collect())
    }

    /// Removes `claim`'s files and CDI spec; a claim without them is success.
    pub fn remove_claim(&self, claim: &ClaimRef) -> Result<(), String> {
        self.cdi
            .remove_claim(&claim.uid)
            .map_err(|e| kubedev_core::echo::chain(&e))?;
        let dir = self
            .claim_dir(claim)
            .map_err(|e| kubedev_core::echo::chain(&e))?;
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
            reason: kubedev_core::echo::chain(&e),
        })?;
        let pool = PoolName::new(claim.namespace.clone()).map_err(|e| CdiError::InvalidName {
            what: "namespace",
            value: claim.namespace.clone(),
            reason: kubedev_core::echo::chain(&e),
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

    fn writer(root: &Path) -> MetadataWriter {
        MetadataWriter::new(
            &root.join("plugins"),
            &root.join("cdi"),
            &DriverName::new("gpu.example.com").unwrap(),
        )
    }

    fn inventory(model: &str) -> Inventory {
        let gpu = |name: &str| {
            kubedev_core::Device::new(DeviceName::new(name).unwrap()).with_attribute(
                "model".parse().unwrap(),
                kubedev_core::AttributeValue::String(model.to_owned()),
            )
        };
        Inventory::new(vec![kubedev_core::Pool::new(
            PoolName::new("node-a").unwrap(),
            vec![gpu("gpu-0"), gpu("gpu-1")],
        )])
    }

    /// The objects of a file's stream.
    fn objects(path: &Path) -> Vec<Value> {
        let bytes = std::fs::read(path).unwrap();
        serde_json::Deserializer::from_slice(&bytes)
            .into_iter::<Value>()
            .map(Result::unwrap)
            .collect()
    }

    fn inode(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn container_paths_of_plain_and_template_claims() {
        let w = writer(Path::new("/p"));
        let claim = ClaimRef::new("u1".parse().unwrap(), "ns", "train-gpus-x7k2q");
        let devices = [prepared("gpu/big", "gpu-0")];
        let plain = w.files(&claim, None, &devices).unwrap();
        assert_eq!(
            plain[0].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train-gpus-x7k2q/gpu/gpu.example.com-metadata.json"
        );
        let template = w.files(&claim, Some("gpus"), &devices).unwrap();
        assert_eq!(
            template[0].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json"
        );
        assert_eq!(
            plain[0].host_path, template[0].host_path,
            "the host path names the claim either way"
        );
        assert_eq!(
            w.files(&claim, Some(""), &devices).unwrap(),
            plain,
            "an empty pod claim name is no template"
        );
    }

    #[test]
    fn each_file_holds_the_claim_once_per_version_newest_first() {
        let w = writer(Path::new("/p"));
        let claim = ClaimRef::new("u1".parse().unwrap(), "ns", "train");
        let devices = [
            prepared("gpu/large", "gpu-0").with_network(
                kubedev_core::NetworkData::interface("eth1")
                    .with_ips(vec!["10.0.0.5/24".into()])
                    .with_hardware_address("00:11:22:33:44:55"),
            ),
            prepared("nic", "eth-0"),
        ];
        let files = w.files(&claim, Some("gpus"), &devices).unwrap();
        let got = w.content(&claim, Some("gpus"), &files[0], &devices, None);
        const OBJECT: &str = r#"{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/VERSION",
  "metadata": {
    "name": "train",
    "namespace": "ns",
    "uid": "u1",
    "generation": 1
  },
  "podClaimName": "gpus",
  "requests": [
    {
      "name": "gpu/large",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "node-a",
          "name": "gpu-0",
          "networkData": {
            "interfaceName": "eth1",
            "ips": [
              "10.0.0.5/24"
            ],
            "hardwareAddress": "00:11:22:33:44:55"
          }
        }
      ]
    }
  ]
}
"#;
        let want = OBJECT.replace("VERSION", "v1beta1") + &OBJECT.replace("VERSION", "v1alpha1");
        assert_eq!(String::from_utf8(got).unwrap(), want);

        // A plain claim has no podClaimName; attributes come from the inventory.
        let inv = inventory("x1");
        let got = w.content(&claim, None, &files[0], &devices, Some(&inv));
        let objects: Vec<Value> = serde_json::Deserializer::from_slice(&got)
            .into_iter::<Value>()
            .map(Result::unwrap)
            .collect();
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0]["apiVersion"], API_VERSIONS[0]);
        assert_eq!(objects[1]["apiVersion"], API_VERSIONS[1]);
        assert!(objects[0].get("podClaimName").is_none(), "{}", objects[0]);
        assert_eq!(
            objects[0]["requests"][0]["devices"][0]["attributes"],
            serde_json::json!({"model": {"string": "x1"}})
        );
        let mut alpha = objects[1].clone();
        alpha["apiVersion"] = objects[0]["apiVersion"].clone();
        assert_eq!(alpha, objects[0], "both versions say the same");
    }

    #[test]
    fn a_changed_file_gets_the_next_generation_and_an_unchanged_one_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let w = writer(root.path());
        let claim = ClaimRef::new("u1".parse().unwrap(), "ns", "train");
        let devices = [prepared("gpu/large", "gpu-0"), prepared("nic", "gpu-1")];
        let files = w.files(&claim, Some("gpus"), &devices).unwrap();
        let (gpu, nic) = (&files[0].host_path, &files[1].host_path);
        let generation = |path: &Path| {
            let o = objects(path);
            assert_eq!(o.len(), 2, "{o:?}");
            assert_eq!(
                o[0]["metadata"]["generation"], o[1]["metadata"]["generation"],
                "{o:?}"
            );
            o[0]["metadata"]["generation"].as_i64().unwrap()
        };

        let ids = w
            .write_claim(&claim, Some("gpus"), &devices, Some(&inventory("x1")))
            .unwrap();
        assert_eq!(ids.len(), 2, "{ids:?}");
        assert_eq!((generation(gpu), generation(nic)), (1, 1));
        let (gpu_inode, nic_inode) = (inode(gpu), inode(nic));

        // Nothing changed: nothing is written.
        let again = w
            .ensure_claim(&claim, Some("gpus"), &devices, Some(&inventory("x1")))
            .unwrap();
        assert_eq!(again, ids);
        assert_eq!((inode(gpu), inode(nic)), (gpu_inode, nic_inode));
        let file = &files[0];
        assert_eq!(
            w.update_file(&claim, Some("gpus"), file, &devices, Some(&inventory("x1")))
                .unwrap(),
            FileUpdate::Unchanged { generation: 1 }
        );

        // The devices' attributes changed: both files get generation 2, and keep podClaimName.
        let changed = w
            .ensure_claim(&claim, Some("gpus"), &devices, Some(&inventory("x2")))
            .unwrap();
        assert_eq!(changed, ids);
        assert_eq!((generation(gpu), generation(nic)), (2, 2));
        let o = objects(gpu);
        assert_eq!(o[0]["podClaimName"], "gpus");
        assert_eq!(
            o[1]["requests"][0]["devices"][0]["attributes"]["model"]["string"],
            "x2"
        );
        assert_eq!(
            w.update_file(&claim, Some("gpus"), file, &devices, Some(&inventory("x3")))
                .unwrap(),
            FileUpdate::Updated { generation: 3 }
        );

        // A device the inventory no longer holds keeps the attributes the file gave it.
        assert_eq!(
            w.update_file(&claim, Some("gpus"), file, &devices, None)
                .unwrap(),
            FileUpdate::Unchanged { generation: 3 }
        );
        // Another device in the request is a change.
        let more = [
            prepared("gpu/large", "gpu-0"),
            prepared("gpu/large", "gpu-1"),
            prepared("nic", "gpu-1"),
        ];
        assert_eq!(
            w.update_file(&claim, Some("gpus"), file, &more, Some(&inventory("x3")))
                .unwrap(),
            FileUpdate::Updated { generation: 4 }
        );
        assert_eq!(
            objects(gpu)[0]["requests"][0]["devices"][1]["name"],
            "gpu-1"
        );

        // Without a pod claim name the file keeps the one it has.
        assert_eq!(
            w.update_file(&claim, None, file, &more, Some(&inventory("x3")))
                .unwrap(),
            FileUpdate::Unchanged { generation: 4 }
        );

        // A damaged file starts again at 1; so does a lost one.
        std::fs::write(gpu, b"{\"kind\": \"DeviceMeta").unwrap();
        w.ensure_claim(&claim, Some("gpus"), &more, Some(&inventory("x3")))
            .unwrap();
        assert_eq!(generation(gpu), 1);
        std::fs::remove_file(nic).unwrap();
        w.ensure_claim(&claim, Some("gpus"), &more, Some(&inventory("x3")))
            .unwrap();
        assert_eq!(generation(nic), 1);

        // A file of an earlier claim with the same name starts at 1.
        let other = ClaimRef::new("u2".parse().unwrap(), "ns", "train");
        assert_eq!(
            w.update_file(&other, Some("gpus"), file, &more, Some(&inventory("x3")))
                .unwrap(),
            FileUpdate::Created
        );
        assert_eq!(objects(gpu)[0]["metadata"]["uid"], "u2");
    }

    #[test]
    fn a_file_in_an_earlier_form_is_rewritten_with_its_generation() {
        let root = tempfile::tempdir().unwrap();
        let w = writer(root.path());
        let claim = ClaimRef::new("u1".parse().unwrap(), "ns", "train");
        let devices = [prepared("gpu", "gpu-0")];
        let file = &w.files(&claim, None, &devices).unwrap()[0];
        // One v1alpha1 object, as kubedev wrote for Kubernetes 1.36.
        let old = serde_json::json!({
            "apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata",
            "metadata": {"name": "train", "namespace": "ns", "uid": "u1", "generation": 3},
            "requests": [{"name": "gpu", "devices": [
                {"driver": "gpu.example.com", "pool": "node-a", "name": "gpu-0",
                 "attributes": {"model": {"string": "x1"}}}
            ]}]
        });
        put(&file.host_path, &serde_json::to_vec_pretty(&old).unwrap()).unwrap();
        assert_eq!(
            w.update_file(&claim, None, file, &devices, Some(&inventory("x1")))
                .unwrap(),
            FileUpdate::Rewritten { generation: 3 }
        );
        let o = objects(&file.host_path);
        assert_eq!(o[0]["apiVersion"], API_VERSIONS[0]);
        assert_eq!(o[1], old);
        assert_eq!(
            w.update_file(&claim, None, file, &devices, Some(&inventory("x1")))
                .unwrap(),
            FileUpdate::Unchanged { generation: 3 }
        );
    }

    #[test]
    fn the_first_object_of_a_known_version_is_read() {
        let meta =
            serde_json::json!({"name": "c", "namespace": "ns", "uid": "u1", "generation": 7});
        let object = |version: &str| {
            serde_json::json!({"kind": "DeviceMetadata", "apiVersion": version, "metadata": meta})
                .to_string()
        };
        let future = object("metadata.resource.k8s.io/v2");
        let beta = object("metadata.resource.k8s.io/v1beta1");
        let alpha = object("metadata.resource.k8s.io/v1alpha1");
        let generation =
            |s: String| decode_first_known(s.as_bytes()).map(|d| d.metadata.generation);
        assert_eq!(generation(format!("{future}\n{beta}\n{alpha}\n")), Some(7));
        assert_eq!(generation(format!("{alpha}\n")), Some(7));
        assert_eq!(generation(format!("{beta}\n{{ trailing")), Some(7));
        assert_eq!(generation(String::new()), None);
        assert_eq!(generation(format!("{future}\n")), None);
        assert_eq!(
            generation(format!("{{\"kind\": \"DeviceMetadata\"}}\n{beta}")),
            None
        );
    }
}
