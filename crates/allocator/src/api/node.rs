//! `core/v1` nodes and node selectors, as far as device reachability reads them.

use std::collections::BTreeMap;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// A node as the allocator sees it: its name and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Node {
    /// Node name (`metadata.name`).
    pub name: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// The features the node declares (`status.declaredFeatures`), such as
    /// `DRAOptionalNodeOperations`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub declared_features: Vec<String>,
}

/// `core/v1` NodeSelector: terms are ORed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeSelector {
    /// The terms; a node matches when any term matches.
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// One term of a node selector: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeSelectorTerm {
    /// Requirements on node labels.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    /// Requirements on node fields (`metadata.name`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

/// A key, an operator (`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`) and values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeSelectorRequirement {
    /// Label key or field name.
    pub key: CompactString,
    /// Operator.
    pub operator: CompactString,
    /// Values the operator compares with.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<CompactString>,
}
