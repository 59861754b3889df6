//! Reading dumps: JSON decoded straight into the allocator's strict types where they take
//! an object, YAML and everything else read leniently (fields the types do not know
//! dropped, real errors named with their path), and from a claim's `status` only the
//! allocation results and the capacity they consumed. A YAML `List` is read item by item, so
//! only one object is held as a tree at a time. Block-style YAML, as kubectl prints it, is
//! first rewritten as JSON (`block_yaml.rs`) and read as JSON is; other YAML, and YAML with a
//! problem, goes to the YAML reader, which names the problem. A large JSON List's items are
//! read on every core, a block at a time (`par.rs`), and kept in the dump's order.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use super::{Cluster, ClusterError};
use kubedev_allocator::ConsumedCapacity;
use kubedev_allocator::api::{
    DeviceClass, DeviceTaintRule, Node, ObjectMeta, RawQuantity, ResourceClaim, ResourceClaimSpec,
    ResourceSlice,
};

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
    kind: Option<Cow<'a, str>>,
}

/// The documents of a YAML text as JSON texts that the JSON reading reads as the YAML
/// reading reads the YAML; `None` for text outside the block-style subset rewritten, or with
/// a document of an unusual shape.
pub(super) fn fast_yaml(text: &str) -> Option<super::block_yaml::JsonDocuments<'_>> {
    super::block_yaml::to_json(text).filter(|docs| docs.iter().all(|d| reads_as_yaml(&d)))
}

/// Whether one YAML document, as JSON, gives what the YAML reading gives: a mapping whose
/// `kind` is a string (or null) and whose `items` is a list (or null). Other documents are
/// left to the YAML reading.
fn reads_as_yaml(doc: &super::block_yaml::JsonDocument<'_>) -> bool {
    doc.json.starts_with('{')
        && doc.value("kind").is_none_or(|k| k.starts_with(['"', 'n']))
        && doc.value("items").is_none_or(|i| i.starts_with(['[', 'n']))
}

/// A ResourceClaim as a dump has it: the allocator's (strict) metadata and spec, and from
/// `status` only the allocation results.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimDoc<'a> {
    #[serde(default, rename = "apiVersion")]
    _api_version: IgnoredAny,
    #[serde(default, rename = "kind")]
    _kind: IgnoredAny,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: ResourceClaimSpec,
    #[serde(borrow)]
    status: Option<ClaimStatusDoc<'a>>,
}

#[derive(Deserialize, Default)]
struct ClaimStatusDoc<'a> {
    #[serde(borrow)]
    allocation: Option<AllocationDoc<'a>>,
}

/// What one claim's allocation holds.
pub(super) struct Held {
    /// Every result's device, `driver/pool/device`.
    pub(super) devices: Vec<String>,
    /// The devices it holds as the scheduler counts them allocated: results neither with
    /// admin access (never in use) nor with a `shareID` (a share).
    pub(super) exclusive: Vec<String>,
    /// Its shares (results with a `shareID`, without admin access) and the capacity each
    /// consumed.
    pub(super) shares: Vec<ConsumedCapacity>,
}

impl ClaimStatusDoc<'_> {
    /// What the claim's allocation holds; an amount that does not parse is an error naming
    /// its field.
    fn allocation(self) -> Result<Held, String> {
        let results = self
            .allocation
            .and_then(|a| a.devices)
            .map(|d| d.results)
            .unwrap_or_default();
        let mut held = Held {
            devices: Vec::with_capacity(results.len()),
            exclusive: Vec::with_capacity(results.len()),
            shares: Vec::new(),
        };
        for (i, r) in results.into_iter().enumerate() {
            let (driver, pool, name) = (&*r.driver, &*r.pool, &*r.device);
            let mut device = String::with_capacity(driver.len() + pool.len() + name.len() + 2);
            for part in [driver, "/", pool, "/", name] {
                device.push_str(part);
            }
            if r.admin_access == Some(true) {
                // Admin access leaves the device to others.
            } else if r.share_id.is_some() {
                let mut capacity = Vec::new();
                for (name, q) in r.consumed_capacity.unwrap_or_default() {
                    let q = kubedev_core::Quantity::parse(q.as_str()).map_err(|e| {
                        format!(
                            "status.allocation.devices.results[{i}].consumedCapacity.{name}: {e}"
                        )
                    })?;
                    capacity.push((name, q));
                }
                held.shares.push(ConsumedCapacity {
                    device: device.clone(),
                    capacity,
                });
            } else {
                held.exclusive.push(device.clone());
            }
            held.devices.push(device);
        }
        Ok(held)
    }
}

#[derive(Deserialize)]
struct AllocationDoc<'a> {
    #[serde(borrow)]
    devices: Option<AllocationDevicesDoc<'a>>,
}

#[derive(Deserialize)]
struct AllocationDevicesDoc<'a> {
    #[serde(default, borrow)]
    results: Vec<ResultDoc<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultDoc<'a> {
    #[serde(default, borrow)]
    driver: Cow<'a, str>,
    #[serde(default, borrow)]
    pool: Cow<'a, str>,
    #[serde(default, borrow)]
    device: Cow<'a, str>,
    consumed_capacity: Option<std::collections::BTreeMap<String, RawQuantity>>,
    #[serde(default, borrow, rename = "shareID")]
    share_id: Option<Cow<'a, str>>,
    admin_access: Option<bool>,
}

/// A Node: its name and labels.
#[derive(Deserialize)]
struct NodeDoc {
    #[serde(default)]
    metadata: NodeMetaDoc,
    #[serde(default)]
    status: NodeStatusDoc,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NodeStatusDoc {
    #[serde(default)]
    declared_features: Vec<String>,
}

#[derive(Deserialize, Default)]
struct NodeMetaDoc {
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
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

/// An object's name as errors and subjects give it: `namespace/name`, or `name` for an
/// object without a namespace.
pub(super) fn name_of(v: &Value) -> String {
    let m = &v["metadata"];
    match m["namespace"].as_str().filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{}", m["name"].as_str().unwrap_or("?")),
        None => m["name"].as_str().unwrap_or("?").to_string(),
    }
}

/// One YAML document, its objects read as they stream past: a `List`'s items one at a time,
/// or the document itself when it is one object. `None`: a document that carries `items`
/// without being a `List`, left to the reading of whole trees.
struct YamlDoc(Option<Cluster>);

impl<'de> Deserialize<'de> for YamlDoc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = YamlDoc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object or List")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<YamlDoc, E> {
        Ok(YamlDoc(Some(Cluster::default())))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<YamlDoc, E> {
        self.visit_unit()
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<YamlDoc, A::Error> {
        let is_list = |fields: &serde_json::Map<String, Value>| {
            fields
                .get("kind")
                .and_then(Value::as_str)
                .map(|k| k.ends_with("List"))
        };
        let mut part = Cluster::default();
        let mut fields = serde_json::Map::new();
        let mut streamed = false;
        while let Some(key) = map.next_key::<String>()? {
            // kubectl prints keys sorted, so a List's `items` come before its `kind`.
            if key == "items" && is_list(&fields) != Some(false) {
                map.next_value_seed(ItemsSeed(&mut part))?;
                streamed = true;
            } else {
                let value: Value = map.next_value()?;
                fields.insert(key, value);
            }
        }
        match (is_list(&fields) == Some(true), streamed) {
            (true, _) => {}
            (false, true) => return Ok(YamlDoc(None)),
            (false, false) => part
                .add_object(Value::Object(fields))
                .map_err(serde::de::Error::custom)?,
        }
        Ok(YamlDoc(Some(part)))
    }
}

/// A `List`'s `items`, each added to the cluster as soon as it is read.
struct ItemsSeed<'c>(&'c mut Cluster);

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of Kubernetes objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<Value>()? {
            self.0.add_object(item).map_err(serde::de::Error::custom)?;
        }
        Ok(())
    }
}

/// Items of a JSON List read by one thread at a time (see `par.rs`).
const ITEMS_PER_BLOCK: usize = 256;

/// JSON texts from this size on are read as they stream past when they are a List (see
/// [`Cluster::add_json_list_streamed`]).
const STREAMED_LIST_BYTES: usize = 1 << 20;

/// The top of a JSON dump as it streams past: its kind, and whether it has a list of items.
struct ListTop {
    kind: Option<String>,
    items: bool,
}

/// Reads the top of a JSON dump as [`ListHead`] reads it, handing out the items of its
/// `items` list a block at a time as they are found. Repeated fields are an error (the dump
/// is then read as a whole, which names the problem).
struct ListTopVisitor<'e, 't> {
    emit: &'e mut dyn FnMut(Vec<&'t str>),
}

impl<'de> Visitor<'de> for ListTopVisitor<'_, 'de> {
    type Value = ListTop;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes List")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListTop, A::Error> {
        let mut kind: Option<Option<String>> = None;
        let mut items: Option<bool> = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "kind" if kind.is_none() => kind = Some(map.next_value()?),
                "items" if items.is_none() => {
                    items = Some(map.next_value_seed(ItemBlocks {
                        emit: &mut *self.emit,
                    })?);
                }
                "kind" | "items" => return Err(serde::de::Error::custom("repeated field")),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ListTop {
            kind: kind.flatten(),
            items: items.unwrap_or(false),
        })
    }
}

/// A List's `items` (or null: `false`), handed out a block at a time as their texts are found.
struct ItemBlocks<'e, 't> {
    emit: &'e mut dyn FnMut(Vec<&'t str>),
}

impl<'de> DeserializeSeed<'de> for ItemBlocks<'_, 'de> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ItemBlocks<'_, 'de> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of Kubernetes objects")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut block = Vec::with_capacity(ITEMS_PER_BLOCK);
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            block.push(item.get());
            if block.len() == ITEMS_PER_BLOCK {
                (self.emit)(std::mem::replace(
                    &mut block,
                    Vec::with_capacity(ITEMS_PER_BLOCK),
                ));
            }
        }
        if !block.is_empty() {
            (self.emit)(block);
        }
        Ok(true)
    }
}

/// One object as the strict types read it.
enum Item<'t> {
    Slice(ResourceSlice),
    Class(DeviceClass),
    Claim(ClaimDoc<'t>),
    TaintRule(DeviceTaintRule),
    Node(NodeDoc),
    Pod(Value),
    /// A kind not read (or no kind).
    Other,
}

/// Reads one JSON object's kind, then the object as that kind's strict type (two passes);
/// `None` where the strict type refuses it.
fn typed_item(text: &str) -> Option<Item<'_>> {
    let head = serde_json::from_str::<KindHead<'_>>(text).ok()?;
    Some(match head.kind.as_deref() {
        Some("ResourceSlice") => Item::Slice(serde_json::from_str(text).ok()?),
        Some("DeviceClass") => Item::Class(serde_json::from_str(text).ok()?),
        Some("ResourceClaim") => Item::Claim(serde_json::from_str(text).ok()?),
        Some("DeviceTaintRule") => Item::TaintRule(serde_json::from_str(text).ok()?),
        Some("Node") => Item::Node(serde_json::from_str(text).ok()?),
        Some("Pod") => Item::Pod(serde_json::from_str(text).ok()?),
        _ => Item::Other,
    })
}

/// Marks a field as read, or refuses a second one (left to [`typed_item`]).
fn once<E: serde::de::Error>(seen: &mut bool) -> Result<(), E> {
    if std::mem::replace(seen, true) {
        Err(E::custom(NOT_ONE_PASS))
    } else {
        Ok(())
    }
}

/// The `metadata` and `spec` of an object whose `kind` was just read, and its `status` where
/// the kind has one (`status` given): each field at most once, `apiVersion` (already seen when
/// `api_version_seen`) checked but not kept, any other field refused.
fn fields_after_kind<'de, A, M, S, T>(
    map: &mut A,
    mut api_version_seen: bool,
    mut status: Option<&mut Option<T>>,
) -> Result<(M, S), A::Error>
where
    A: MapAccess<'de>,
    M: Deserialize<'de> + Default,
    S: Deserialize<'de> + Default,
    T: Deserialize<'de>,
{
    let (mut metadata, mut spec) = (M::default(), S::default());
    let (mut metadata_seen, mut spec_seen, mut status_seen) = (false, false, false);
    while let Some(key) = map.next_key::<&'de str>()? {
        match (key, status.as_deref_mut()) {
            ("apiVersion", _) => {
                once(&mut api_version_seen)?;
                map.next_value::<IgnoredAny>()?;
            }
            ("metadata", _) => {
                once(&mut metadata_seen)?;
                metadata = map.next_value()?;
            }
            ("spec", _) => {
                once(&mut spec_seen)?;
                spec = map.next_value()?;
            }
            ("status", Some(status)) => {
                once(&mut status_seen)?;
                *status = map.next_value()?;
            }
            _ => return Err(serde::de::Error::custom(NOT_ONE_PASS)),
        }
    }
    Ok((metadata, spec))
}

/// Reads one JSON object in one pass when its `kind` comes first (after `apiVersion`), as
/// kubectl prints objects: the fields after it are decoded as that kind's strict type reads
/// them. Anything else, or anything unusual (a repeated field, an escaped key), is an error,
/// and [`typed_item`] reads the object instead, so this reads exactly what it would.
struct ItemVisitor;

/// Why [`ItemVisitor`] leaves an object to [`typed_item`].
const NOT_ONE_PASS: &str = "not read in one pass";

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item<'de>, A::Error> {
        let not_one_pass = || serde::de::Error::custom(NOT_ONE_PASS);
        let mut api_version: Option<&'de str> = None;
        let kind = loop {
            match map.next_key::<&'de str>()? {
                None => return Ok(Item::Other),
                Some("apiVersion") if api_version.is_none() => {
                    api_version = Some(map.next_value()?);
                }
                Some("kind") => break map.next_value::<Option<&'de str>>()?,
                Some(_) => return Err(not_one_pass()),
            }
        };
        let api_version_seen = api_version.is_some();
        match kind {
            Some("ResourceSlice") => {
                let mut s = ResourceSlice::default();
                (s.metadata, s.spec) =
                    fields_after_kind(&mut map, api_version_seen, None::<&mut Option<IgnoredAny>>)?;
                Ok(Item::Slice(s))
            }
            Some("DeviceClass") => {
                let mut c = DeviceClass::default();
                (c.metadata, c.spec) =
                    fields_after_kind(&mut map, api_version_seen, None::<&mut Option<IgnoredAny>>)?;
                Ok(Item::Class(c))
            }
            Some("DeviceTaintRule") => {
                let mut r = DeviceTaintRule::default();
                let mut status: Option<IgnoredAny> = None;
                (r.metadata, r.spec) =
                    fields_after_kind(&mut map, api_version_seen, Some(&mut status))?;
                Ok(Item::TaintRule(r))
            }
            Some("ResourceClaim") => {
                let mut status = None;
                let (metadata, spec) =
                    fields_after_kind(&mut map, api_version_seen, Some(&mut status))?;
                Ok(Item::Claim(ClaimDoc {
                    _api_version: IgnoredAny,
                    _kind: IgnoredAny,
                    metadata,
                    spec,
                    status,
                }))
            }
            Some("Node") => {
                let mut doc = NodeDoc {
                    metadata: NodeMetaDoc::default(),
                    status: NodeStatusDoc::default(),
                };
                let (mut metadata_seen, mut status_seen) = (false, false);
                while let Some(key) = map.next_key::<&'de str>()? {
                    match key {
                        "kind" => return Err(not_one_pass()),
                        "metadata" => {
                            once(&mut metadata_seen)?;
                            doc.metadata = map.next_value()?;
                        }
                        "status" => {
                            once(&mut status_seen)?;
                            doc.status = map.next_value()?;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Item::Node(doc))
            }
            Some("Pod") => {
                let mut fields = serde_json::Map::new();
                if let Some(v) = api_version {
                    fields.insert("apiVersion".into(), Value::String(v.into()));
                }
                fields.insert("kind".into(), Value::String("Pod".into()));
                while let Some(key) = map.next_key::<&'de str>()? {
                    let value: Value = map.next_value()?;
                    if fields.insert(key.into(), value).is_some() {
                        return Err(not_one_pass());
                    }
                }
                Ok(Item::Pod(Value::Object(fields)))
            }
            _ => {
                while let Some(key) = map.next_key::<&'de str>()? {
                    if key == "kind" {
                        return Err(not_one_pass());
                    }
                    map.next_value::<IgnoredAny>()?;
                }
                Ok(Item::Other)
            }
        }
    }
}

impl Cluster {
    /// Adds the objects of one dump (`origin` names it in errors): YAML documents or JSON,
    /// each a `List` (its `items`) or one object. Kinds other than the six read are skipped.
    pub fn add_text(&mut self, text: &str, origin: &str) -> Result<(), ClusterError> {
        let error = |message: String| ClusterError {
            origin: origin.to_string(),
            message,
        };
        if text.trim_start().starts_with(['{', '[']) {
            return self.add_json(text).map_err(error);
        }
        // Block-style YAML as kubectl prints it: rewritten as JSON and read as JSON is.
        if let Some(docs) = fast_yaml(text) {
            for doc in docs.iter() {
                // A List's items are read one by one, as `add_json` reads them.
                let list = doc
                    .value("kind")
                    .and_then(|k| serde_json::from_str::<&str>(k).ok())
                    .is_some_and(|k| k.ends_with("List"));
                match doc.elements("items") {
                    Some(items) if list => self.add_json_items(items).map_err(&error)?,
                    _ => self.add_json(doc.json).map_err(&error)?,
                }
            }
            return Ok(());
        }
        self.add_yaml(text).map_err(error)
    }

    /// YAML documents read by the YAML reader, which also words every error.
    pub(super) fn add_yaml(&mut self, text: &str) -> Result<(), String> {
        let (options, _) = crate::yaml::large_input(1 << 30);
        if let Ok(docs) = serde_saphyr::from_multiple_with_options::<YamlDoc>(text, options)
            && docs.iter().all(|d| d.0.is_some())
        {
            for part in docs.into_iter().filter_map(|d| d.0) {
                self.append(part);
            }
            return Ok(());
        }
        // Whole trees: an unusual document, or one with a problem, which this names.
        let (options, budget) = crate::yaml::large_input(1 << 30);
        let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
            .map_err(|e| crate::yaml::describe_error(&e, &budget))?;
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
                self.add_object(item)?;
            }
        }
        Ok(())
    }

    /// Moves the objects of `other` after those of `self`.
    fn append(&mut self, other: Cluster) {
        self.slices.extend(other.slices);
        self.classes.extend(other.classes);
        self.claims.extend(other.claims);
        self.taint_rules.extend(other.taint_rules);
        self.in_use.extend(other.in_use);
        self.consumed.extend(other.consumed);
        self.nodes.extend(other.nodes);
        self.pods.extend(other.pods);
    }

    /// JSON input: each object is decoded straight from its text into the allocator's types;
    /// only an object those strict types refuse (a field of a newer release, a real error)
    /// goes through the lenient path, which drops unknown fields and names real errors.
    fn add_json(&mut self, text: &str) -> Result<(), String> {
        if text.len() >= STREAMED_LIST_BYTES
            && let Some(result) = self.add_json_list_streamed(text)
        {
            return result;
        }
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
        self.add_json_items(items.into_iter().map(RawValue::get))
    }

    /// A large JSON List read while its items are found: the reading of the text hands out
    /// its items a block at a time to the other cores, which read them as
    /// [`Cluster::add_json_items`] does. `None` (nothing added): the text is not a List read
    /// this way (another object, a List of an unusual shape, an error in the text), and
    /// [`Cluster::add_json`] reads it as a whole, naming any error as before.
    fn add_json_list_streamed<'t>(&mut self, text: &'t str) -> Option<Result<(), String>> {
        if !text.trim_start().starts_with('{') {
            return None;
        }
        let produce = |emit: &mut dyn FnMut(Vec<&'t str>)| {
            let mut de = serde_json::Deserializer::from_str(text);
            let top = (&mut de).deserialize_map(ListTopVisitor { emit })?;
            de.end()?;
            Ok::<_, serde_json::Error>(top)
        };
        let work = |items: Vec<&'t str>| {
            let mut part = Cluster::default();
            let result = part.add_json_block(&items);
            (part, result)
        };
        let (top, parts) = super::par::map_produced(produce, work);
        let top = top.ok()?;
        if !(top.items && top.kind.as_deref().is_some_and(|k| k.ends_with("List"))) {
            return None;
        }
        self.reserve_for(parts.iter().map(|(p, _)| p));
        for (part, result) in parts {
            self.append(part);
            if let Err(e) = result {
                return Some(Err(e));
            }
        }
        Some(Ok(()))
    }

    /// The objects of a JSON List, each given as its JSON text. A large list is read on every
    /// core, a block of items at a time, and kept in the items' order; the first item that
    /// cannot be read (in that order) is the error, as when read one after the other.
    fn add_json_items<'t>(&mut self, items: impl Iterator<Item = &'t str>) -> Result<(), String> {
        let items: Vec<&str> = items.collect();
        if items.len() <= ITEMS_PER_BLOCK {
            return self.add_json_block(&items);
        }
        let threads = super::par::threads_for(items.len(), ITEMS_PER_BLOCK);
        let parts = super::par::map_blocks(
            items.len(),
            ITEMS_PER_BLOCK,
            vec![(); threads],
            |(), range| {
                let mut part = Cluster::default();
                let result = part.add_json_block(&items[range]);
                (part, result)
            },
            |(_, result)| result.is_err(),
        );
        self.reserve_for(parts.iter().map(|(p, _)| p));
        for (part, result) in parts {
            self.append(part);
            result?;
        }
        Ok(())
    }

    /// Room for the objects of `parts`, so that appending them moves each object once.
    fn reserve_for<'p>(&mut self, parts: impl Iterator<Item = &'p Cluster> + Clone) {
        let total = |f: fn(&Cluster) -> usize| parts.clone().map(f).sum::<usize>();
        self.slices.reserve(total(|p| p.slices.len()));
        self.classes.reserve(total(|p| p.classes.len()));
        self.claims.reserve(total(|p| p.claims.len()));
        self.taint_rules.reserve(total(|p| p.taint_rules.len()));
        self.in_use.reserve(total(|p| p.in_use.len()));
        self.consumed.reserve(total(|p| p.consumed.len()));
        self.nodes.reserve(total(|p| p.nodes.len()));
        self.pods.reserve(total(|p| p.pods.len()));
    }

    /// The objects of part of a JSON List, one after the other.
    fn add_json_block(&mut self, items: &[&str]) -> Result<(), String> {
        for item in items {
            if !self.add_typed(item) {
                let v: Value =
                    serde_json::from_str(item).map_err(|e| kubedev_core::echo::chain(&e))?;
                self.add_object(v)?;
            }
        }
        Ok(())
    }

    /// Adds one JSON object if the strict types read it as is; `false` leaves it to the
    /// lenient path (which also reports errors).
    fn add_typed(&mut self, text: &str) -> bool {
        // Most objects name their kind first: they are decoded in one pass.
        let mut de = serde_json::Deserializer::from_str(text);
        let item = match (&mut de).deserialize_map(ItemVisitor).and_then(|item| {
            de.end()?;
            Ok(item)
        }) {
            Ok(item) => item,
            Err(_) => match typed_item(text) {
                Some(item) => item,
                None => return false,
            },
        };
        self.add_item(item)
    }

    /// Adds an object the strict types read; `false` for a claim whose allocation does not
    /// read (the lenient path names the problem).
    fn add_item(&mut self, item: Item<'_>) -> bool {
        match item {
            Item::Slice(s) => self.slices.push(s),
            Item::Class(c) => self.classes.push(c),
            Item::Claim(doc) => {
                // An amount that does not parse: the lenient path names it.
                let Ok(held) = doc.status.unwrap_or_default().allocation() else {
                    return false;
                };
                self.in_use.extend(held.exclusive);
                self.consumed.extend(held.shares);
                self.claims.push((
                    ResourceClaim {
                        metadata: doc.metadata,
                        spec: doc.spec,
                    },
                    held.devices,
                ));
            }
            Item::TaintRule(r) => self.taint_rules.push(r),
            Item::Node(doc) => self.nodes.push(Node {
                name: doc.metadata.name,
                labels: doc.metadata.labels,
                declared_features: doc.status.declared_features,
            }),
            Item::Pod(v) => self.pods.push(v),
            Item::Other => {}
        }
        true
    }

    /// Adds one object read leniently; errors name it (`Kind namespace/name`).
    fn add_object(&mut self, v: Value) -> Result<(), String> {
        let kind = v["kind"].as_str().unwrap_or("?").to_string();
        let label = format!("{kind} {}", name_of(&v));
        let what = |e: String| format!("{label}: {e}");
        match kind.as_str() {
            "ResourceSlice" => self.slices.push(lenient(v).map_err(what)?),
            "DeviceClass" => self.classes.push(lenient(v).map_err(what)?),
            "DeviceTaintRule" => self.taint_rules.push(lenient(v).map_err(what)?),
            "ResourceClaim" => {
                // The claim type has no `status`: it is read here, on its own.
                let mut v = v;
                let status = v.as_object_mut().and_then(|m| m.remove("status"));
                let status: ClaimStatusDoc<'_> = match &status {
                    None | Some(Value::Null) => ClaimStatusDoc::default(),
                    Some(status) => ClaimStatusDoc::deserialize(status)
                        .map_err(|e| what(format!("status: {}", kubedev_core::echo::chain(&e))))?,
                };
                let held = status.allocation().map_err(what)?;
                self.claims.push((lenient(v).map_err(what)?, held.devices));
                self.in_use.extend(held.exclusive);
                self.consumed.extend(held.shares);
            }
            "Node" => self.nodes.push(Node {
                name: v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                labels: serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default(),
                declared_features: serde_json::from_value(v["status"]["declaredFeatures"].clone())
                    .unwrap_or_default(),
            }),
            "Pod" => self.pods.push(v),
            _ => {}
        }
        Ok(())
    }
}
