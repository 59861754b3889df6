//! What the API server of a release does to an object between decoding a request and
//! validating it: fields the release's `v1` types do not have are unknown (dropped with a
//! warning, or refused), and the registry strategy clears the fields of disabled feature gates,
//! unless the stored object already uses them.

use serde_json::{Map, Value};

use super::release::{FeatureGates, KubeRelease, gate};
use super::resource::Resource;
use super::status::{ApiError, quote};

/// How the server treats unknown fields (the `fieldValidation` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them with a `Warning` header each (the default).
    #[default]
    Warn,
    /// Refuse the request.
    Strict,
}

impl FieldValidation {
    pub(crate) fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value.unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {}: supported values: \"Ignore\", \"Strict\", \"Warn\"",
                quote(other)
            ))),
        }
    }
}

/// The release's behaviour for writes.
#[derive(Debug, Clone)]
pub(crate) struct Strategy {
    pub(crate) release: KubeRelease,
    pub(crate) gates: FeatureGates,
}

/// List-valued attribute fields (`DRAListTypeAttributes`, from 1.36).
const LIST_VALUES: [&str; 4] = ["bools", "ints", "strings", "versions"];

fn present(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(|x| !x.is_null())
}

fn non_empty_list(v: &Value, key: &str) -> bool {
    v.get(key)
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

fn devices(spec: &Value) -> &[Value] {
    spec.get("devices")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn devices_mut(spec: &mut Value) -> impl Iterator<Item = &mut Map<String, Value>> {
    spec.get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn remove(v: &mut Value, keys: &[&str]) {
    if let Some(map) = v.as_object_mut() {
        for key in keys {
            map.remove(*key);
        }
    }
}

/// A feature of a ResourceSlice guarded by gates: whether an old slice uses it, and how to
/// clear it from a new one.
struct SliceFeature {
    gates: &'static [&'static str],
    since: KubeRelease,
    in_use: fn(&Value) -> bool,
    clear: fn(&mut Value),
}

const SLICE_FEATURES: [SliceFeature; 5] = [
    SliceFeature {
        gates: &[gate::DRA_DEVICE_TAINTS],
        since: KubeRelease::V1_34,
        in_use: |spec| devices(spec).iter().any(|d| non_empty_list(d, "taints")),
        clear: |spec| {
            for d in devices_mut(spec) {
                d.remove("taints");
            }
        },
    },
    SliceFeature {
        gates: &[gate::DRA_PARTITIONABLE_DEVICES],
        since: KubeRelease::V1_34,
        in_use: |spec| {
            non_empty_list(spec, "sharedCounters")
                || present(spec, "perDeviceNodeSelection")
                || devices(spec).iter().any(|d| {
                    non_empty_list(d, "consumesCounters")
                        || ["nodeName", "nodeSelector", "allNodes"]
                            .iter()
                            .any(|k| present(d, k))
                })
        },
        clear: |spec| {
            remove(spec, &["sharedCounters", "perDeviceNodeSelection"]);
            for d in devices_mut(spec) {
                for key in ["consumesCounters", "nodeName", "nodeSelector", "allNodes"] {
                    d.remove(key);
                }
            }
        },
    },
    SliceFeature {
        gates: &[
            gate::DRA_DEVICE_BINDING_CONDITIONS,
            gate::DRA_RESOURCE_CLAIM_DEVICE_STATUS,
        ],
        since: KubeRelease::V1_34,
        in_use: |spec| {
            devices(spec).iter().any(|d| {
                non_empty_list(d, "bindingConditions")
                    || non_empty_list(d, "bindingFailureConditions")
                    || present(d, "bindsToNode")
            })
        },
        clear: |spec| {
            for d in devices_mut(spec) {
                for key in [
                    "bindingConditions",
                    "bindingFailureConditions",
                    "bindsToNode",
                ] {
                    d.remove(key);
                }
            }
        },
    },
    SliceFeature {
        gates: &[gate::DRA_CONSUMABLE_CAPACITY],
        since: KubeRelease::V1_34,
        in_use: |spec| {
            devices(spec).iter().any(|d| {
                present(d, "allowMultipleAllocations")
                    || d.get("capacity")
                        .and_then(Value::as_object)
                        .is_some_and(|c| c.values().any(|cap| present(cap, "requestPolicy")))
            })
        },
        clear: |spec| {
            for d in devices_mut(spec) {
                d.remove("allowMultipleAllocations");
                if let Some(capacity) = d.get_mut("capacity").and_then(Value::as_object_mut) {
                    for cap in capacity.values_mut() {
                        remove(cap, &["requestPolicy"]);
                    }
                }
            }
        },
    },
    SliceFeature {
        gates: &[gate::DRA_LIST_TYPE_ATTRIBUTES],
        since: KubeRelease::V1_36,
        in_use: |spec| {
            devices(spec).iter().any(|d| {
                d.get("attributes")
                    .and_then(Value::as_object)
                    .is_some_and(|a| {
                        a.values()
                            .any(|v| LIST_VALUES.iter().any(|k| present(v, k)))
                    })
            })
        },
        clear: |spec| {
            for d in devices_mut(spec) {
                if let Some(attributes) = d.get_mut("attributes").and_then(Value::as_object_mut) {
                    for attribute in attributes.values_mut() {
                        remove(attribute, &LIST_VALUES);
                    }
                }
            }
        },
    },
];

/// The request bodies of a claim's spec: each request's `exactly` and each of its
/// `firstAvailable` subrequests.
fn request_bodies(spec: &Value) -> Vec<&Value> {
    let requests = spec
        .pointer("/devices/requests")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut out = Vec::new();
    for r in requests {
        out.extend(r.get("exactly"));
        out.extend(
            r.get("firstAvailable")
                .and_then(Value::as_array)
                .into_iter()
                .flatten(),
        );
    }
    out
}

/// [`request_bodies`], to change.
fn request_bodies_mut(spec: &mut Value) -> Vec<&mut Map<String, Value>> {
    let mut out = Vec::new();
    let Some(requests) = spec
        .pointer_mut("/devices/requests")
        .and_then(Value::as_array_mut)
    else {
        return out;
    };
    for r in requests.iter_mut().filter_map(Value::as_object_mut) {
        for (key, value) in r.iter_mut() {
            match (key.as_str(), value) {
                ("exactly", Value::Object(body)) => out.push(body),
                ("firstAvailable", Value::Array(subs)) => {
                    out.extend(subs.iter_mut().filter_map(Value::as_object_mut));
                }
                _ => {}
            }
        }
    }
    out
}

/// A feature of a ResourceClaim's spec guarded by gates (the registry's `dropDisabledFields`).
struct ClaimFeature {
    gate: &'static str,
    in_use: fn(&Value) -> bool,
    clear: fn(&mut Value),
}

const CLAIM_FEATURES: [ClaimFeature; 2] = [
    ClaimFeature {
        gate: gate::DRA_DEVICE_TAINTS,
        in_use: |spec| {
            request_bodies(spec)
                .iter()
                .any(|b| non_empty_list(b, "tolerations"))
        },
        clear: |spec| {
            for b in request_bodies_mut(spec) {
                b.remove("tolerations");
            }
        },
    },
    ClaimFeature {
        gate: gate::DRA_CONSUMABLE_CAPACITY,
        in_use: |spec| {
            request_bodies(spec).iter().any(|b| present(b, "capacity"))
                || spec
                    .pointer("/devices/constraints")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| cs.iter().any(|c| present(c, "distinctAttribute")))
        },
        clear: |spec| {
            for b in request_bodies_mut(spec) {
                b.remove("capacity");
            }
            if let Some(cs) = spec
                .pointer_mut("/devices/constraints")
                .and_then(Value::as_array_mut)
            {
                for c in cs {
                    remove(c, &["distinctAttribute"]);
                }
            }
        },
    },
];

impl Strategy {
    pub(crate) fn new(release: KubeRelease, gates: FeatureGates) -> Self {
        Self { release, gates }
    }

    /// Paths (as the JSON decoder names them) and JSON pointers of fields the release's types
    /// do not have.
    fn unknown_fields(&self, resource: Resource, object: &Value) -> Vec<(String, String)> {
        let mut found = Vec::new();
        if resource != Resource::ResourceSlices || self.release.at_least(KubeRelease::V1_36) {
            return found;
        }
        let spec = object.get("spec").unwrap_or(&Value::Null);
        for (i, device) in devices(spec).iter().enumerate() {
            let Some(attributes) = device.get("attributes").and_then(Value::as_object) else {
                continue;
            };
            for (name, attribute) in attributes {
                let Some(attribute) = attribute.as_object() else {
                    continue;
                };
                for key in LIST_VALUES {
                    if attribute.contains_key(key) {
                        let escaped = name.replace('~', "~0").replace('/', "~1");
                        found.push((
                            format!("spec.devices[{i}].attributes.{name}.{key}"),
                            format!("/spec/devices/{i}/attributes/{escaped}/{key}"),
                        ));
                    }
                }
            }
        }
        found
    }

    /// Decodes a request body into the release's types: unknown fields are dropped (with a
    /// warning under `Warn`), or refused under `Strict`. Returns the warnings.
    pub(crate) fn decode(
        &self,
        resource: Resource,
        object: &mut Value,
        validation: FieldValidation,
    ) -> Result<Vec<String>, ApiError> {
        let unknown = self.unknown_fields(resource, object);
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let messages: Vec<String> = unknown
            .iter()
            .map(|(path, _)| format!("unknown field {}", quote(path)))
            .collect();
        if validation == FieldValidation::Strict {
            return Err(ApiError::bad_request(format!(
                "{kind} in version \"v1\" cannot be handled as a {kind}: strict decoding error: {}",
                messages.join(", "),
                kind = resource.kind()
            )));
        }
        for (_, pointer) in &unknown {
            let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
            if let Some(map) = object.pointer_mut(parent).and_then(Value::as_object_mut) {
                map.remove(key);
            }
        }
        Ok(match validation {
            FieldValidation::Warn => messages,
            _ => Vec::new(),
        })
    }

    /// Server-side apply types the applied configuration with the release's schema: an unknown
    /// field fails the request (with a 500, as upstream does), whatever `fieldValidation` says.
    pub(crate) fn check_applied(
        &self,
        resource: Resource,
        name: &str,
        applied: &Value,
    ) -> Result<(), ApiError> {
        let unknown = self.unknown_fields(resource, applied);
        let Some((path, _)) = unknown.first() else {
            return Ok(());
        };
        Err(ApiError::new(
            500,
            "",
            format!(
                "failed to create typed patch object (/{name}; {}, Kind={}): .{path}: field not declared in schema",
                resource.api_version(),
                resource.kind()
            ),
        ))
    }

    /// Shapes a decoded object as the release serializes it: 1.34's `devices` has no
    /// `omitempty`, so a ResourceSlice without devices reads back with `devices: null`.
    pub(crate) fn canonicalize(&self, resource: Resource, object: &mut Value) {
        if resource == Resource::ResourceSlices
            && !self.release.at_least(KubeRelease::V1_35)
            && let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut)
        {
            spec.entry("devices").or_insert(Value::Null);
        }
    }

    fn enabled(&self, gates: &[&str]) -> bool {
        gates.iter().all(|g| self.gates.enabled(g))
    }

    /// The registry strategy before validation (`PrepareForCreate` / `PrepareForUpdate`):
    /// clears the fields of disabled gates unless `old` already uses them.
    pub(crate) fn prepare(&self, resource: Resource, object: &mut Value, old: Option<&Value>) {
        match resource {
            Resource::ResourceSlices => {
                let old_spec = old.and_then(|o| o.get("spec"));
                let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
                    return;
                };
                for feature in &SLICE_FEATURES {
                    if !self.release.at_least(feature.since)
                        || self.enabled(feature.gates)
                        || old_spec.is_some_and(feature.in_use)
                    {
                        continue;
                    }
                    (feature.clear)(spec);
                }
            }
            Resource::ResourceClaims => {
                let old_spec = old.and_then(|o| o.get("spec"));
                let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
                    return;
                };
                for feature in &CLAIM_FEATURES {
                    if self.gates.enabled(feature.gate) || old_spec.is_some_and(feature.in_use) {
                        continue;
                    }
                    (feature.clear)(spec);
                }
            }
            Resource::DeviceClasses => {
                let in_use = old
                    .and_then(|o| o.get("spec"))
                    .is_some_and(|s| present(s, "extendedResourceName"));
                if !self.gates.enabled(gate::DRA_EXTENDED_RESOURCE)
                    && !in_use
                    && let Some(spec) = object.get_mut("spec")
                {
                    remove(spec, &["extendedResourceName"]);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strategy(release: KubeRelease) -> Strategy {
        Strategy::new(release, release.default_feature_gates())
    }

    #[test]
    fn unknown_list_attributes_before_1_36() {
        let mut slice = json!({"spec": {"devices": [
            {"name": "a", "attributes": {"x": {"int": 1}, "dom.io/y": {"ints": [1, 2]}}},
        ]}});
        let warnings = strategy(KubeRelease::V1_35)
            .decode(Resource::ResourceSlices, &mut slice, FieldValidation::Warn)
            .expect("decodes");
        assert_eq!(
            warnings,
            ["unknown field \"spec.devices[0].attributes.dom.io/y.ints\""]
        );
        assert_eq!(
            slice["spec"]["devices"][0]["attributes"]["dom.io/y"],
            json!({})
        );
        let mut again =
            json!({"spec": {"devices": [{"name": "a", "attributes": {"y": {"strings": ["s"]}}}]}});
        let err = strategy(KubeRelease::V1_34)
            .decode(
                Resource::ResourceSlices,
                &mut again,
                FieldValidation::Strict,
            )
            .expect_err("strict");
        assert_eq!(err.code, 400);
        assert!(
            err.message.contains(
                "strict decoding error: unknown field \"spec.devices[0].attributes.y.strings\""
            ),
            "{}",
            err.message
        );
        let mut kept = again.clone();
        assert!(
            strategy(KubeRelease::V1_36)
                .decode(Resource::ResourceSlices, &mut kept, FieldValidation::Strict)
                .expect("a field in 1.36")
                .is_empty()
        );
        assert_eq!(kept, again);
    }
}
