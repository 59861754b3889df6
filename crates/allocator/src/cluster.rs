//! A whole cluster as `kubectl get resourceslices,deviceclasses,resourceclaims,nodes,pods -o
//! yaml` prints it, and the question users ask of it: which nodes can take a pod's (or a
//! claim's) device claims, and why every other node cannot.
//!
//! Input is read as the API machinery reads objects: `List` objects or single objects, YAML
//! (several documents) or JSON, fields this allocator does not know ignored (a dump carries
//! `status`, `managedFields` and fields of newer releases). Devices other claims hold
//! (`status.allocation`) are in use, except for devices that allow multiple allocations: of
//! those, the capacity the allocations consumed is taken.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::api::{
    DeviceClass, Node, ObjectMeta, RawQuantity, ResourceClaim, ResourceClaimSpec, ResourceSlice,
};
use crate::{AllocateOptions, Allocator, ConsumedCapacity};

/// The objects read from one or more dumps.
#[derive(Debug, Default)]
pub struct Cluster {
    /// ResourceSlices.
    pub slices: Vec<ResourceSlice>,
    /// DeviceClasses.
    pub classes: Vec<DeviceClass>,
    /// ResourceClaims, with their `status.allocation` results (`driver/pool/device`).
    pub claims: Vec<(ResourceClaim, Vec<String>)>,
    /// Capacity the claims' allocations took from devices that allow multiple allocations.
    pub consumed: Vec<ConsumedCapacity>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Pods, as read.
    pub pods: Vec<Value>,
}

/// The top of a JSON dump: its kind, and its items left as text.
#[derive(Deserialize)]
struct ListHead<'a> {
    kind: Option<String>,
    #[serde(borrow)]
    items: Option<Vec<&'a RawValue>>,
}

/// The kind of one object (the rest is skipped).
#[derive(Deserialize)]
struct KindHead<'a> {
    #[serde(borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// A ResourceClaim as a dump has it: the allocator's (strict) metadata and spec, and from
/// `status` only the allocation results.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimDoc {
    #[serde(default, rename = "apiVersion")]
    _api_version: IgnoredAny,
    #[serde(default, rename = "kind")]
    _kind: IgnoredAny,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: ResourceClaimSpec,
    status: Option<ClaimStatusDoc>,
}

#[derive(Deserialize, Default)]
struct ClaimStatusDoc {
    allocation: Option<AllocationDoc>,
}

impl ClaimStatusDoc {
    /// The devices the claim holds (`driver/pool/device`) and the capacity it consumed from
    /// them; an amount that does not parse is an error naming its field.
    fn allocation(self) -> Result<(Vec<String>, Vec<ConsumedCapacity>), String> {
        let results = self
            .allocation
            .and_then(|a| a.devices)
            .map(|d| d.results)
            .unwrap_or_default();
        let mut allocated = Vec::with_capacity(results.len());
        let mut consumed = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            let device = format!("{}/{}/{}", r.driver, r.pool, r.device);
            if let Some(caps) = r.consumed_capacity {
                let mut capacity = Vec::with_capacity(caps.len());
                for (name, q) in caps {
                    let q = kubedev_core::Quantity::parse(q.as_str()).map_err(|e| {
                        format!(
                            "status.allocation.devices.results[{i}].consumedCapacity.{name}: {e}"
                        )
                    })?;
                    capacity.push((name, q));
                }
                consumed.push(ConsumedCapacity {
                    device: device.clone(),
                    capacity,
                });
            }
            allocated.push(device);
        }
        Ok((allocated, consumed))
    }
}

#[derive(Deserialize)]
struct AllocationDoc {
    devices: Option<AllocationDevicesDoc>,
}

#[derive(Deserialize)]
struct AllocationDevicesDoc {
    #[serde(default)]
    results: Vec<ResultDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultDoc {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    pool: String,
    #[serde(default)]
    device: String,
    consumed_capacity: Option<std::collections::BTreeMap<String, RawQuantity>>,
}

/// A Node: its name and labels.
#[derive(Deserialize)]
struct NodeDoc {
    #[serde(default)]
    metadata: NodeMetaDoc,
}

#[derive(Deserialize, Default)]
struct NodeMetaDoc {
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
}

/// What to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// The claims of a pod, `namespace/name`.
    Pod(String),
    /// One claim, `namespace/name`.
    Claim(String),
}

/// The answer for one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAnswer {
    /// The node.
    pub node: String,
    /// Whether the claims fit.
    pub fits: bool,
    /// Why not (one line per request), or the error that stopped the allocator.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// The answer for the whole cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAnswer {
    /// The claims explained, `namespace/name`.
    pub claims: Vec<String>,
    /// Claims already allocated (they are not allocated again), `namespace/name`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub already_allocated: Vec<String>,
    /// Every node, those that fit first.
    pub nodes: Vec<NodeAnswer>,
}

/// Why a dump cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct ClusterError {
    /// The file (or `stdin`), and the object when known.
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

/// Decodes `value` as a `T`, dropping fields `T` does not know (as the API machinery ignores
/// unknown fields) and naming the first real problem.
fn lenient<T: DeserializeOwned>(mut value: Value) -> Result<T, String> {
    if let Ok(t) = T::deserialize(&value) {
        return Ok(t);
    }
    for _ in 0..256 {
        let err = match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let path: Vec<String> = err
            .path()
            .iter()
            .map(|s| match s {
                serde_path_to_error::Segment::Seq { index } => format!("#{index}"),
                serde_path_to_error::Segment::Map { key } => key.clone(),
                serde_path_to_error::Segment::Enum { variant } => variant.clone(),
                serde_path_to_error::Segment::Unknown => "?".to_string(),
            })
            .collect();
        let message = err.inner().to_string();
        let Some(field) = message
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
            .map(str::to_string)
        else {
            return Err(format!("{}: {message}", path.join(".")));
        };
        let parent = match path.last() {
            Some(last) if *last == field => &path[..path.len() - 1],
            _ => &path[..],
        };
        let mut at = &mut value;
        for seg in parent {
            at = match seg.strip_prefix('#').and_then(|i| i.parse::<usize>().ok()) {
                Some(i) => match at.get_mut(i) {
                    Some(v) => v,
                    None => return Err(format!("{}: {message}", path.join("."))),
                },
                None => match at.get_mut(seg.as_str()) {
                    Some(v) => v,
                    None => return Err(format!("{}: {message}", path.join("."))),
                },
            };
        }
        match at.as_object_mut().and_then(|m| m.remove(&field)) {
            Some(_) => {}
            None => return Err(format!("{}: {message}", path.join("."))),
        }
    }
    Err("too many unknown fields".into())
}

fn name_of(v: &Value) -> String {
    let m = &v["metadata"];
    match m["namespace"].as_str().filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{}", m["name"].as_str().unwrap_or("?")),
        None => m["name"].as_str().unwrap_or("?").to_string(),
    }
}

impl Cluster {
    /// Adds the objects of one dump (`origin` names it in errors): YAML documents or JSON,
    /// each a `List` (its `items`) or one object. Kinds other than the five read are skipped.
    pub fn add_text(&mut self, text: &str, origin: &str) -> Result<(), ClusterError> {
        let error = |message: String| ClusterError {
            origin: origin.to_string(),
            message,
        };
        if text.trim_start().starts_with(['{', '[']) {
            return self.add_json(text).map_err(error);
        }
        let (options, budget) = crate::yaml::large_input(1 << 30);
        let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
            .map_err(|e| error(crate::yaml::describe_error(&e, &budget)))?;
        for doc in docs {
            let items = match doc {
                Value::Object(mut m)
                    if m.get("kind")
                        .and_then(Value::as_str)
                        .is_some_and(|k| k.ends_with("List")) =>
                {
                    match m.remove("items") {
                        Some(Value::Array(items)) => items,
                        _ => Vec::new(),
                    }
                }
                Value::Null => Vec::new(),
                doc => vec![doc],
            };
            for item in items {
                self.add_object(item).map_err(&error)?;
            }
        }
        Ok(())
    }

    /// JSON input: each object is decoded straight from its text into the allocator's types;
    /// only an object those strict types refuse (a field of a newer release, a real error)
    /// goes through the lenient path, which drops unknown fields and names real errors.
    fn add_json(&mut self, text: &str) -> Result<(), String> {
        let items: Vec<&RawValue> = if text.trim_start().starts_with('[') {
            serde_json::from_str(text).map_err(|e| kubedev_core::echo::chain(&e))?
        } else {
            let head: ListHead<'_> =
                serde_json::from_str(text).map_err(|e| kubedev_core::echo::chain(&e))?;
            match head.items {
                Some(items) if head.kind.as_deref().is_some_and(|k| k.ends_with("List")) => items,
                _ => vec![serde_json::from_str(text).map_err(|e| kubedev_core::echo::chain(&e))?],
            }
        };
        for raw in items {
            if !self.add_typed(raw.get()) {
                let v: Value =
                    serde_json::from_str(raw.get()).map_err(|e| kubedev_core::echo::chain(&e))?;
                self.add_object(v)?;
            }
        }
        Ok(())
    }

    /// Adds one JSON object if the strict types read it as is; `false` leaves it to the
    /// lenient path (which also reports errors).
    fn add_typed(&mut self, text: &str) -> bool {
        let Ok(head) = serde_json::from_str::<KindHead<'_>>(text) else {
            return false;
        };
        match head.kind.as_deref() {
            Some("ResourceSlice") => match serde_json::from_str(text) {
                Ok(s) => self.slices.push(s),
                Err(_) => return false,
            },
            Some("DeviceClass") => match serde_json::from_str(text) {
                Ok(c) => self.classes.push(c),
                Err(_) => return false,
            },
            Some("ResourceClaim") => {
                let Ok(doc) = serde_json::from_str::<ClaimDoc>(text) else {
                    return false;
                };
                // An amount that does not parse: the lenient path names it.
                let Ok((allocated, consumed)) = doc.status.unwrap_or_default().allocation() else {
                    return false;
                };
                self.consumed.extend(consumed);
                self.claims.push((
                    ResourceClaim {
                        metadata: doc.metadata,
                        spec: doc.spec,
                    },
                    allocated,
                ));
            }
            Some("Node") => {
                let Ok(doc) = serde_json::from_str::<NodeDoc>(text) else {
                    return false;
                };
                self.nodes.push(Node {
                    name: doc.metadata.name,
                    labels: doc.metadata.labels,
                });
            }
            Some("Pod") => match serde_json::from_str(text) {
                Ok(v) => self.pods.push(v),
                Err(_) => return false,
            },
            _ => {}
        }
        true
    }

    fn add_object(&mut self, v: Value) -> Result<(), String> {
        let kind = v["kind"].as_str().unwrap_or("?").to_string();
        let label = format!("{kind} {}", name_of(&v));
        let what = |e: String| format!("{label}: {e}");
        match kind.as_str() {
            "ResourceSlice" => self.slices.push(lenient(v).map_err(what)?),
            "DeviceClass" => self.classes.push(lenient(v).map_err(what)?),
            "ResourceClaim" => {
                // The claim type has no `status`: it is read here, on its own.
                let mut v = v;
                let status = v.as_object_mut().and_then(|m| m.remove("status"));
                let status: ClaimStatusDoc = match status {
                    None | Some(Value::Null) => ClaimStatusDoc::default(),
                    Some(status) => serde_json::from_value(status)
                        .map_err(|e| what(format!("status: {}", kubedev_core::echo::chain(&e))))?,
                };
                let (allocated, consumed) = status.allocation().map_err(what)?;
                self.consumed.extend(consumed);
                self.claims.push((lenient(v).map_err(what)?, allocated));
            }
            "Node" => self.nodes.push(Node {
                name: v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                labels: serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default(),
            }),
            "Pod" => self.pods.push(v),
            _ => {}
        }
        Ok(())
    }

    fn claim_index(&self, key: &str) -> Option<usize> {
        self.claims.iter().position(|(c, _)| {
            let ns = &c.metadata.namespace;
            key == format!("{ns}/{}", c.metadata.name) || (ns.is_empty() && key == c.metadata.name)
        })
    }

    /// The claims `subject` needs, `namespace/name`.
    fn subject_claims(&self, subject: &Subject) -> Result<Vec<String>, String> {
        match subject {
            Subject::Claim(c) => Ok(vec![c.clone()]),
            Subject::Pod(p) => {
                let pod = self
                    .pods
                    .iter()
                    .find(|v| name_of(v) == *p)
                    .ok_or_else(|| format!("pod {p} is not in the input"))?;
                let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
                let statuses = pod["status"]["resourceClaimStatuses"].as_array();
                let mut out = Vec::new();
                for rc in pod["spec"]["resourceClaims"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let entry = rc["name"].as_str().unwrap_or_default();
                    let name = match rc["resourceClaimName"].as_str() {
                        Some(n) => n.to_string(),
                        None => statuses
                            .into_iter()
                            .flatten()
                            .find(|s| s["name"] == entry)
                            .and_then(|s| s["resourceClaimName"].as_str())
                            .ok_or_else(|| {
                                format!(
                                    "pod {p}: the claim of its entry {entry:?} (from a template) \
                                     is not created yet (no status.resourceClaimStatuses)"
                                )
                            })?
                            .to_string(),
                    };
                    out.push(format!("{ns}/{name}"));
                }
                if out.is_empty() {
                    return Err(format!("pod {p} has no resource claims"));
                }
                Ok(out)
            }
        }
    }

    /// Which nodes can take `subject`'s claims, and why each other node cannot.
    pub fn explain(&self, subject: &Subject) -> Result<ClusterAnswer, String> {
        let wanted = self.subject_claims(subject)?;
        let mut claims = Vec::new();
        let mut already = Vec::new();
        for key in &wanted {
            let i = self
                .claim_index(key)
                .ok_or_else(|| format!("claim {key} is not in the input"))?;
            if self.claims[i].1.is_empty() {
                claims.push(self.claims[i].0.clone());
            } else {
                already.push(key.clone());
            }
        }
        // Devices other claims hold; shareable ones stay available to others.
        let shareable: BTreeSet<String> = self
            .slices
            .iter()
            .flat_map(|s| {
                s.spec
                    .devices
                    .iter()
                    .filter(|d| d.allow_multiple_allocations.unwrap_or(false))
                    .map(move |d| format!("{}/{}/{}", s.spec.driver, s.spec.pool.name, d.name))
            })
            .collect();
        let in_use: Vec<String> = self
            .claims
            .iter()
            .flat_map(|(_, a)| a.iter().cloned())
            .filter(|d| !shareable.contains(d))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut nodes: Vec<Node> = self.nodes.clone();
        if nodes.is_empty() {
            let names: BTreeSet<&str> = self
                .slices
                .iter()
                .filter_map(|s| s.spec.node_name.as_deref())
                .collect();
            nodes = names
                .into_iter()
                .map(|n| Node {
                    name: n.to_string(),
                    labels: Default::default(),
                })
                .collect();
        }
        let options = AllocateOptions::default();
        // The API server keeps list-type attributes only with DRAListTypeAttributes on, so
        // a slice that has one says the gate is on.
        let lists = self.slices.iter().any(|s| {
            s.spec.devices.iter().any(|d| {
                d.attributes.values().any(|a| {
                    a.ints.is_some()
                        || a.bools.is_some()
                        || a.strings.is_some()
                        || a.versions.is_some()
                })
            })
        });
        let mut allocator = Allocator::new(&self.slices, &self.classes, &in_use)
            .with_consumed_capacity(&self.consumed)
            .with_features(crate::Features::default().with_list_type_attributes(lists));
        let mut answers = Vec::with_capacity(nodes.len());
        for node in &nodes {
            if claims.is_empty() {
                answers.push(NodeAnswer {
                    node: node.name.clone(),
                    fits: true,
                    reasons: Vec::new(),
                });
                continue;
            }
            let answer = match allocator.allocate(node, &claims, &options) {
                Ok(Some(_)) => NodeAnswer {
                    node: node.name.clone(),
                    fits: true,
                    reasons: Vec::new(),
                },
                Ok(None) => {
                    let reasons = match allocator.explain_with(node, &claims, &options) {
                        Ok(e) => e.pools.iter().cloned().chain(e.summary).collect(),
                        Err(e) => vec![kubedev_core::echo::chain(&e)],
                    };
                    NodeAnswer {
                        node: node.name.clone(),
                        fits: false,
                        reasons,
                    }
                }
                Err(e) => NodeAnswer {
                    node: node.name.clone(),
                    fits: false,
                    reasons: vec![kubedev_core::echo::chain(&e)],
                },
            };
            answers.push(answer);
        }
        answers.sort_by_key(|a| !a.fits);
        Ok(ClusterAnswer {
            claims: wanted
                .into_iter()
                .filter(|w| !already.contains(w))
                .collect(),
            already_allocated: already,
            nodes: answers,
        })
    }
}

impl ClusterAnswer {
    /// The `-o text` form: a summary first (how many nodes fit, which reasons keep the others
    /// out and how often), then with `details` each node that does not fit and why.
    pub fn to_text(&self, details: bool) -> String {
        let mut s = String::new();
        let fit: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.fits)
            .map(|n| n.node.as_str())
            .collect();
        if !self.already_allocated.is_empty() {
            let _ = writeln!(
                s,
                "already allocated: {}",
                self.already_allocated.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "{} of {} nodes can take {}",
            fit.len(),
            self.nodes.len(),
            if self.claims.is_empty() {
                "the claims (nothing left to allocate)".to_string()
            } else {
                self.claims.join(", ")
            }
        );
        if !fit.is_empty() {
            let shown: Vec<&str> = fit.iter().take(10).copied().collect();
            let more = fit.len().saturating_sub(shown.len());
            let _ = writeln!(
                s,
                "  fit: {}{}",
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        }
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for n in self.nodes.iter().filter(|n| !n.fits) {
            for r in &n.reasons {
                *counts.entry(r.as_str()).or_default() += 1;
            }
        }
        if !counts.is_empty() {
            let _ = writeln!(s, "why the other nodes do not fit (nodes: reason):");
            let mut by_count: Vec<(&str, usize)> = counts.into_iter().collect();
            by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            for (reason, n) in by_count {
                let _ = writeln!(s, "  {n}: {reason}");
            }
        }
        if details {
            for n in self.nodes.iter().filter(|n| !n.fits) {
                let _ = writeln!(s, "node {}:", n.node);
                for r in &n.reasons {
                    let _ = writeln!(s, "  {r}");
                }
            }
        }
        s
    }
}

/// Reads a dump into a fresh [`Cluster`] (for tests and callers with one text).
pub fn read_cluster(text: &str, origin: &str) -> Result<Cluster, ClusterError> {
    let mut c = Cluster::default();
    c.add_text(text, origin)?;
    Ok(c)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_newer_releases_are_ignored_and_real_errors_named() {
        let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: s1, resourceVersion: "7", managedFields: [{manager: x}]}
  spec:
    driver: d
    nodeName: n1
    pool: {name: p, generation: 1, resourceSliceCount: 1}
    someFutureField: {a: 1}
    devices:
    - name: g0
      futureDeviceField: true
      attributes: {model: {string: m}}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: ignored}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns}
spec:
  resourceClaims: [{name: gpus, resourceClaimTemplateName: t}]
"#;
        let c = read_cluster(text, "dump.yaml").unwrap();
        assert_eq!(c.slices.len(), 1);
        assert_eq!(c.slices[0].spec.devices[0].name, "g0");
        let e = c.explain(&Subject::Pod("ns/p".into())).unwrap_err();
        assert!(e.contains("is not created yet"), "{e}");

        let bad = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s2}\nspec: {driver: d, pool: {name: p, generation: x}}\n";
        let e = read_cluster(bad, "dump.yaml").unwrap_err().to_string();
        assert!(
            e.starts_with("dump.yaml: ResourceSlice s2: spec.pool.generation"),
            "{e}"
        );
    }

    /// A YAML document: node `node`'s slice of driver nic.example.com with `devices` (YAML
    /// list items, indented for the slice's `devices:`).
    fn nic_slice(node: &str, devices: &str) -> String {
        format!(
            "---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {node}-nics}}
spec:
  driver: nic.example.com
  nodeName: {node}
  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
  devices:
{devices}"
        )
    }

    /// The fitting of every node, in the answer's order.
    fn fits(answer: &ClusterAnswer) -> Vec<(&str, bool)> {
        answer
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.fits))
            .collect()
    }

    fn shared_nic_cluster(taken: &str) -> String {
        let mut text = String::new();
        for n in ["n1", "n2"] {
            text.push_str(&nic_slice(
                n,
                "  - name: nic0
    allowMultipleAllocations: true
    capacity: {bandwidth: {value: 10G}}
",
            ));
        }
        text.push_str(&format!(
            "---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: nic}}
spec: {{selectors: [{{cel: {{expression: 'device.driver == \"nic.example.com\"'}}}}]}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: other, namespace: default}}
spec:
  devices:
    requests: [{{name: net, exactly: {{deviceClassName: nic, capacity: {{requests: {{bandwidth: {taken}}}}}}}}}]
status:
  allocation:
    devices:
      results:
      - {{request: net, driver: nic.example.com, pool: n1, device: nic0, shareID: 1a2b, consumedCapacity: {{bandwidth: {taken}}}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: mine, namespace: default}}
spec:
  devices:
    requests: [{{name: net, exactly: {{deviceClassName: nic, capacity: {{requests: {{bandwidth: 4G}}}}}}}}]
"
        ));
        text
    }

    /// Capacity other claims consumed from a shared device counts against new requests.
    #[test]
    fn capacity_consumed_by_other_claims_is_taken() {
        let mine = Subject::Claim("default/mine".into());
        let c = read_cluster(&shared_nic_cluster("8G"), "dump.yaml").unwrap();
        assert_eq!(c.consumed.len(), 1);
        let answer = c.explain(&mine).unwrap();
        assert_eq!(fits(&answer), [("n2", true), ("n1", false)], "{answer:?}");

        // With less taken, the shared device still has room on n1.
        let c = read_cluster(&shared_nic_cluster("6G"), "dump.yaml").unwrap();
        let answer = c.explain(&mine).unwrap();
        assert!(answer.nodes.iter().all(|n| n.fits), "{answer:?}");

        let e = read_cluster(&shared_nic_cluster("lots"), "dump.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ResourceClaim default/other: status.allocation.devices.results[0].consumedCapacity.bandwidth"),
            "{e}"
        );
    }

    /// A JSON List dump is read straight into the allocator's types, and gives exactly what
    /// the lenient path gives; objects the strict types refuse still go the lenient way.
    #[test]
    fn json_dumps_read_as_the_lenient_path_reads_them() {
        let yaml = shared_nic_cluster("8G")
            + "---
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {zone: a}, resourceVersion: '3'}
status: {conditions: [{type: Ready, status: 'True'}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: future}
spec:
  driver: nic.example.com
  nodeName: n3
  pool: {name: n3, generation: 1, resourceSliceCount: 1}
  someFutureField: 1
  devices: [{name: nic0}]
";
        let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
        let json = read_cluster(&list.to_string(), "dump.json").unwrap();
        let lenient = read_cluster(&yaml, "dump.yaml").unwrap();
        assert_eq!(format!("{json:?}"), format!("{lenient:?}"));
        assert_eq!(json.slices.len(), 3);
        assert_eq!(json.nodes[0].labels["zone"], "a");
        assert_eq!(json.consumed[0].device, "nic.example.com/n1/nic0");

        // A real error in JSON is named as in YAML.
        let bad = serde_json::json!({"kind": "List", "items": [{"apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice", "metadata": {"name": "s2"},
            "spec": {"driver": "d", "pool": {"name": "p", "generation": "x"}}}]});
        let e = read_cluster(&bad.to_string(), "dump.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("dump.json: ResourceSlice s2: spec.pool.generation"),
            "{e}"
        );
    }

    /// A dump whose slices carry list-type attributes comes from a server with
    /// DRAListTypeAttributes on, so explain compares them as sets.
    #[test]
    fn list_type_attributes_in_a_dump_are_compared_as_sets() {
        let mut text = String::new();
        for (node, a, b) in [("n1", "[v1, v2]", "[v3]"), ("n2", "[v1, v2]", "[v2, v3]")] {
            text.push_str(&nic_slice(
                node,
                &format!(
                    "  - {{name: nic0, attributes: {{networks: {{strings: {a}}}}}}}
  - {{name: nic1, attributes: {{networks: {{strings: {b}}}}}}}
"
                ),
            ));
        }
        text.push_str(
            "---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic}
spec: {selectors: [{cel: {expression: 'device.attributes[\"nic.example.com\"].networks.includes(\"v2\") || device.attributes[\"nic.example.com\"].networks.includes(\"v3\")'}}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: pair, namespace: default}
spec:
  devices:
    requests: [{name: nics, exactly: {deviceClassName: nic, count: 2}}]
    constraints: [{matchAttribute: nic.example.com/networks}]
",
        );
        let c = read_cluster(&text, "dump.yaml").unwrap();
        let answer = c.explain(&Subject::Claim("default/pair".into())).unwrap();
        assert_eq!(fits(&answer), [("n2", true), ("n1", false)], "{answer:?}");
    }
}
