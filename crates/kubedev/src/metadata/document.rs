//! The `DeviceMetadata` object a request's file holds, made from a claim's prepared devices, and
//! the file's encoding: the object once per API version, newest first.

use std::collections::BTreeMap;

use kubedev_core::{ClaimRef, Inventory, NetworkData, PreparedDevice};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{API_VERSION, API_VERSIONS, KIND, MetadataWriter, RequestFile};

/// One `DeviceMetadata` object, its fields in the order upstream writes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Document {
    kind: String,
    api_version: String,
    pub(super) metadata: DocumentMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<String>,
    #[serde(default)]
    requests: Vec<RequestEntry>,
}

/// The claim a [`Document`] describes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct DocumentMeta {
    name: String,
    namespace: String,
    pub(super) uid: String,
    #[serde(default)]
    pub(super) generation: i64,
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
    pub(super) fn same_data(&self, other: &Document) -> bool {
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
pub(super) fn encode(doc: &Document) -> Vec<u8> {
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
pub(super) fn decode_first_known(bytes: &[u8]) -> Option<Document> {
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
    pub(super) fn document(
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
                name: claim.name.to_string(),
                namespace: claim.namespace.to_string(),
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
}
