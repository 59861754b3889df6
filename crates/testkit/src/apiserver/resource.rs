//! The resources the emulator serves and the verbs it counts.

use std::fmt;

use serde_json::Value;

use super::status::Kindish;

/// A resource type the emulator serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Resource {
    /// `resource.k8s.io/v1` `resourceslices` (cluster-scoped).
    ResourceSlices,
    /// `resource.k8s.io/v1` `resourceclaims` (namespaced, with a `status` subresource).
    ResourceClaims,
    /// `resource.k8s.io/v1` `deviceclasses` (cluster-scoped).
    DeviceClasses,
    /// core `v1` `nodes` (cluster-scoped, with a `status` subresource).
    Nodes,
    /// `events.k8s.io/v1` `events` (namespaced).
    Events,
    /// core `v1` `pods` (namespaced, with a `status` subresource), stored as written: what
    /// `kubedev explain` reads of a pod (its claims and claim statuses).
    Pods,
}

impl Resource {
    /// Every served resource.
    pub const ALL: [Resource; 6] = [
        Resource::ResourceSlices,
        Resource::ResourceClaims,
        Resource::DeviceClasses,
        Resource::Nodes,
        Resource::Events,
        Resource::Pods,
    ];

    /// The plural name used in URLs, e.g. `resourceslices`.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::ResourceSlices => "resourceslices",
            Resource::ResourceClaims => "resourceclaims",
            Resource::DeviceClasses => "deviceclasses",
            Resource::Nodes => "nodes",
            Resource::Events => "events",
            Resource::Pods => "pods",
        }
    }

    /// The API group, empty for the core group.
    pub fn group(self) -> &'static str {
        match self {
            Resource::Nodes | Resource::Pods => "",
            Resource::Events => "events.k8s.io",
            _ => "resource.k8s.io",
        }
    }

    /// The `apiVersion` of objects of this resource, e.g. `resource.k8s.io/v1`.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Nodes | Resource::Pods => "v1",
            Resource::Events => "events.k8s.io/v1",
            _ => "resource.k8s.io/v1",
        }
    }

    /// The `kind` of objects of this resource, e.g. `ResourceSlice`.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::ResourceSlices => "ResourceSlice",
            Resource::ResourceClaims => "ResourceClaim",
            Resource::DeviceClasses => "DeviceClass",
            Resource::Nodes => "Node",
            Resource::Events => "Event",
            Resource::Pods => "Pod",
        }
    }

    /// Whether objects live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Resource::ResourceClaims | Resource::Events | Resource::Pods
        )
    }

    /// Whether the resource has a `status` subresource (then the main resource ignores status
    /// changes and the subresource changes only the status).
    pub fn has_status(self) -> bool {
        matches!(
            self,
            Resource::ResourceClaims | Resource::Nodes | Resource::Pods
        )
    }

    pub(crate) fn list_kind(self) -> String {
        format!("{}List", self.kind())
    }

    pub(crate) fn from_path(group_version: &str, plural: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|r| r.plural() == plural && r.api_version() == group_version)
    }

    /// Field names accepted in `fieldSelector`.
    pub(crate) fn field_selectors(self) -> &'static [&'static str] {
        // As the API server's field label conversions for these types accept them.
        match self {
            Resource::ResourceSlices => &["metadata.name", "spec.driver", "spec.nodeName"],
            Resource::ResourceClaims | Resource::DeviceClasses => {
                &["metadata.name", "metadata.namespace"]
            }
            Resource::Nodes => &["metadata.name", "spec.unschedulable"],
            Resource::Events => &["metadata.name", "metadata.namespace", "reason", "type"],
            Resource::Pods => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "status.phase",
            ],
        }
    }

    /// The value of a selectable field, as the API server renders it for field selectors.
    pub(crate) fn field_value(self, object: &Value, field: &str) -> String {
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        match field {
            "metadata.name" => text("/metadata/name"),
            "metadata.namespace" => text("/metadata/namespace"),
            "spec.driver" => text("/spec/driver"),
            "spec.nodeName" => text("/spec/nodeName"),
            "reason" => text("/reason"),
            "status.phase" => text("/status/phase"),
            "type" => text("/type"),
            "spec.unschedulable" => {
                let b = object
                    .pointer("/spec/unschedulable")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                b.to_string()
            }
            _ => String::new(),
        }
    }

    pub(crate) fn kindish(self) -> Kindish {
        let (qualified, kind_qualified) = if self.group().is_empty() {
            (self.plural().to_owned(), self.kind().to_owned())
        } else {
            (
                format!("{}.{}", self.plural(), self.group()),
                format!("{}.{}", self.kind(), self.group()),
            )
        };
        Kindish {
            plural_qualified: qualified.clone(),
            qualified,
            kind_qualified,
            group: self.group(),
            plural: self.plural(),
            kind: self.kind(),
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.plural())
    }
}

/// A request verb, as counted and matched by fault injection. Requests to a `status`
/// subresource have their own verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST of a new object.
    Create,
    /// PUT of an object.
    Update,
    /// PATCH of an object (merge, strategic merge, JSON patch or apply).
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
    /// GET of `.../{name}/status`.
    GetStatus,
    /// PUT of `.../{name}/status`.
    UpdateStatus,
    /// PATCH of `.../{name}/status`.
    PatchStatus,
}

impl Verb {
    /// The lowercase name, as in audit logs (`update`, `patch`; status verbs add `-status`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::GetStatus => "get-status",
            Verb::UpdateStatus => "update-status",
            Verb::PatchStatus => "patch-status",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
