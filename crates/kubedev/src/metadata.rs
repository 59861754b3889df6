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
//!
//! `metadata/document.rs` holds the `DeviceMetadata` object and its encoding, and
//! `metadata/write.rs` writes each request's file and the claim's CDI spec.

use std::io;
use std::path::{Path, PathBuf};

use kubedev_core::{ClaimRef, DriverName, PreparedDevice};

use crate::cdi::{CdiError, CdiWriter};

mod document;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
mod write;

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

/// Writing or removing a claim's device metadata failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// A request's name cannot name a file.
    #[error("claim {claim}: request {0} {reason}", kubedev_core::echo::echo(.request))]
    InvalidRequest {
        /// The claim.
        claim: ClaimRef,
        /// The main request's name.
        request: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A metadata file or a claim's directory could not be written or removed.
    #[error("{}: {source}", path.display())]
    File {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The CDI spec that mounts the files could not be written or removed.
    #[error("the device metadata CDI spec: {0}")]
    Spec(#[source] CdiError),
}

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

    /// The directory of `claim`'s files, `<dir>/<namespace>_<name>` (a namespace and a claim
    /// name never hold `_` or `/`, so it cannot leave the directory or meet another claim's).
    pub fn claim_dir(&self, claim: &ClaimRef) -> PathBuf {
        self.dir.join(format!("{}_{}", claim.namespace, claim.name))
    }

    /// The files `prepared` gets, one per main request, in the order requests first appear.
    pub fn files(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        prepared: &[PreparedDevice],
    ) -> Result<Vec<RequestFile>, MetadataError> {
        let base = self.claim_dir(claim);
        let mut out: Vec<RequestFile> = Vec::new();
        for p in prepared {
            let request = kubedev_core::base_request(&p.device.request).to_string();
            if request.is_empty() || out.iter().any(|f| f.request == request) {
                continue;
            }
            if let Err(reason) = kubedev_core::check_dns_label(&request) {
                return Err(MetadataError::InvalidRequest {
                    claim: claim.clone(),
                    request,
                    reason,
                });
            }
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

    /// Removes `claim`'s files and CDI spec; a claim without them is success.
    pub fn remove_claim(&self, claim: &ClaimRef) -> Result<(), MetadataError> {
        self.cdi
            .remove_claim(&claim.uid)
            .map_err(MetadataError::Spec)?;
        let dir = self.claim_dir(claim);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(MetadataError::File { path: dir, source }),
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
