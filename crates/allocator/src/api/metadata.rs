//! `metadata`: the part of an object's metadata the allocator uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Metadata of an object: only what the allocator uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "super::input::ObjectMeta")]
pub struct ObjectMeta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, empty for cluster-scoped objects.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `metadata.uid`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `metadata.labels`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}
