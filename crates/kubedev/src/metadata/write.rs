//! Writing a claim's files and their CDI spec: each request's file brought up to date with its
//! generation, and the spec that bind-mounts the files into containers.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

use kubedev_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceName, DeviceRef, Inventory, Mount, PoolName,
    PreparedDevice, atomic_file, safefs,
};

use super::document::{decode_first_known, encode};
use super::{FileUpdate, MetadataError, MetadataWriter, RequestFile};
use crate::cdi::CdiError;

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;
/// The largest existing file read back.
const MAX_FILE: u64 = 1 << 20;

impl MetadataWriter {
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
    ) -> Result<BTreeMap<String, String>, MetadataError> {
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
    ) -> Result<BTreeMap<String, String>, MetadataError> {
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
    ) -> Result<BTreeMap<String, String>, MetadataError> {
        let files = self.files(claim, pod_claim_name, prepared)?;
        for f in &files {
            let update = self
                .update_file(claim, pod_claim_name, f, prepared, inventory)
                .map_err(|source| MetadataError::File {
                    path: f.host_path.clone(),
                    source,
                })?;
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
    ) -> Result<BTreeMap<String, String>, MetadataError> {
        let devices = spec_devices(claim, files).map_err(MetadataError::Spec)?;
        let uid = &claim.uid;
        let ids = if ensure {
            self.cdi.ensure_claim_ids(uid, &devices).map(|(_, ids)| ids)
        } else {
            self.cdi.write_claim(uid, &devices).map(|w| w.device_ids)
        }
        .map_err(MetadataError::Spec)?;
        Ok(files
            .iter()
            .zip(ids)
            .filter_map(|(f, id)| Some((f.request.clone(), id?)))
            .collect())
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
        let pool = PoolName::new(claim.namespace.as_str()).map_err(|e| CdiError::InvalidName {
            what: "namespace",
            value: claim.namespace.to_string(),
            reason: kubedev_core::echo::chain(&e),
        })?;
        let mut edits = ContainerEdits::default();
        edits.mounts.push(Mount::bind(
            f.host_path.to_string_lossy(),
            f.container_path.clone(),
            true,
        ));
        out.push(PreparedDevice::new(
            AllocatedDevice::new(DeviceRef::new(pool, name)),
            edits,
        ));
    }
    Ok(out)
}

/// Writes `bytes` to `path` atomically (mode 0644), creating its directories (mode 0755).
pub(super) fn put(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        safefs::create_dir_all_mode(dir, DIR_MODE)?;
    }
    atomic_file::replace(path, FILE_MODE, |f| f.write_all(bytes)).map_err(|f| f.source)
}
