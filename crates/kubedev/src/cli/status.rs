//! `kubedev status`: one DRA driver's state across the cluster, per node: the pools it
//! publishes, their devices and device taints, and the claims allocated its devices.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::Value;

use super::args::{StatusArgs, StatusOutput};
use super::output::write_stdout;
use crate::config::Config;
use crate::registry::Registry;

/// The node key of slices that are not for one node (`allNodes` or a node selector).
const NO_NODE: &str = "(not node-local)";

/// A driver's state across the cluster.
#[derive(Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Status {
    driver: String,
    /// The namespace whose claims are shown; `None` for every namespace.
    namespace: Option<String>,
    nodes: Vec<NodeStatus>,
}

/// One node's share of the driver's state.
#[derive(Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct NodeStatus {
    node: String,
    pools: Vec<Pool>,
    devices: Vec<Device>,
    claims: Vec<Claim>,
}

/// A pool the driver publishes, with the slices seen of its generation.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Pool {
    name: String,
    generation: i64,
    slices: Vec<String>,
    resource_slice_count: i64,
}

/// A published device and its taints.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Device {
    pool: String,
    name: String,
    taints: Vec<Taint>,
    /// The claim holding it, `namespace/name`, when one of the shown claims does.
    claim: Option<String>,
}

/// A device taint.
#[derive(Debug, Serialize, PartialEq)]
struct Taint {
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    effect: String,
}

/// A claim allocated devices of the driver.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Claim {
    namespace: String,
    name: String,
    /// `pool/device` of each of the driver's devices it holds.
    devices: Vec<String>,
    /// The pods it is reserved for, `namespace/name`.
    reserved_for: Vec<String>,
    /// The device conditions the driver reported, `pool/device: Type=Status`.
    conditions: Vec<String>,
}

/// `kubedev status`.
pub(super) fn status(args: StatusArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let driver = match (&args.driver, &args.config) {
        (Some(d), _) => d.clone(),
        (None, Some(path)) => Config::load_with(path, registry)?
            .dra
            .driver_name
            .with_context(|| format!("{}: dra.driverName is not set", path.display()))?,
        (None, None) => anyhow::bail!("give --driver or --config"),
    };
    let rt = super::current_thread_runtime()?;
    let (texts, namespace) = rt.block_on(async {
        let client = kubedev_apiserver::connect_context(
            args.kube.kubeconfig.as_deref(),
            args.kube.context.as_deref(),
        )
        .await?;
        let namespace = (!args.all_namespaces).then(|| {
            args.kube
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string())
        });
        let texts = kubedev_apiserver::read_explain_inputs(&client, None).await?;
        anyhow::Ok((texts, namespace))
    })?;
    let mut objects = Vec::new();
    for text in &texts {
        let list: Value = serde_json::from_str(text).context("reading the API server's list")?;
        if let Some(items) = list["items"].as_array() {
            objects.extend(items.iter().cloned());
        }
    }
    let status = collect(&driver, namespace, &objects);
    let text = match args.output {
        StatusOutput::Table => table(&status, false),
        StatusOutput::Wide => table(&status, true),
        StatusOutput::Json => format!("{}\n", serde_json::to_string_pretty(&status)?),
        StatusOutput::Yaml => serde_saphyr::to_string(&status).context("encoding YAML")?,
    };
    write_stdout(&text).map(|()| ExitCode::SUCCESS)
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The driver's state from the cluster's `objects` (ResourceSlices, ResourceClaims and
/// others, which are skipped); claims of `namespace` only, when given.
fn collect(driver: &str, namespace: Option<String>, objects: &[Value]) -> Status {
    let mut nodes: BTreeMap<String, NodeStatus> = BTreeMap::new();
    let mut pool_nodes: BTreeMap<String, String> = BTreeMap::new();
    for slice in objects.iter().filter(|o| o["kind"] == "ResourceSlice") {
        let spec = &slice["spec"];
        if spec["driver"] != driver {
            continue;
        }
        let node = spec["nodeName"].as_str().unwrap_or(NO_NODE).to_string();
        let entry = nodes.entry(node.clone()).or_default();
        let pool_name = text(&spec["pool"]["name"]);
        let generation = spec["pool"]["generation"].as_i64().unwrap_or(0);
        pool_nodes.insert(pool_name.clone(), node);
        match entry.pools.iter_mut().find(|p| p.name == pool_name) {
            // Slices of an older generation are being replaced: only the newest counts.
            Some(p) if p.generation > generation => continue,
            Some(p) if p.generation == generation => {
                p.slices.push(text(&slice["metadata"]["name"]))
            }
            found => {
                if found.is_some() {
                    entry.pools.retain(|p| p.name != pool_name);
                    entry.devices.retain(|d| d.pool != pool_name);
                }
                entry.pools.push(Pool {
                    name: pool_name.clone(),
                    generation,
                    slices: vec![text(&slice["metadata"]["name"])],
                    resource_slice_count: spec["pool"]["resourceSliceCount"].as_i64().unwrap_or(0),
                });
            }
        }
        for device in spec["devices"].as_array().into_iter().flatten() {
            entry.devices.push(Device {
                pool: pool_name.clone(),
                name: text(&device["name"]),
                taints: taints(device),
                claim: None,
            });
        }
    }
    for claim in objects.iter().filter(|o| o["kind"] == "ResourceClaim") {
        let claim_ns = text(&claim["metadata"]["namespace"]);
        if namespace.as_ref().is_some_and(|ns| *ns != claim_ns) {
            continue;
        }
        let Some((node, found)) = claim_status(driver, claim, &pool_nodes) else {
            continue;
        };
        let entry = nodes.entry(node).or_default();
        let key = format!("{}/{}", found.namespace, found.name);
        for d in &mut entry.devices {
            if found.devices.contains(&format!("{}/{}", d.pool, d.name)) {
                d.claim = Some(key.clone());
            }
        }
        entry.claims.push(found);
    }
    Status {
        driver: driver.to_string(),
        namespace,
        nodes: nodes
            .into_iter()
            .map(|(node, mut s)| {
                s.node = node;
                s.pools.sort_by(|a, b| a.name.cmp(&b.name));
                s.devices
                    .sort_by(|a, b| (&a.pool, &a.name).cmp(&(&b.pool, &b.name)));
                s.claims
                    .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
                s
            })
            .collect(),
    }
}

fn taints(device: &Value) -> Vec<Taint> {
    device["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| Taint {
            key: text(&t["key"]),
            value: t["value"].as_str().map(str::to_string),
            effect: text(&t["effect"]),
        })
        .collect()
}

/// The node and the view of `claim` when its allocation holds devices of `driver`. The node
/// is the one the allocation's node selector names (`metadata.name`), else the node of the
/// first device's pool.
fn claim_status(
    driver: &str,
    claim: &Value,
    pool_nodes: &BTreeMap<String, String>,
) -> Option<(String, Claim)> {
    let allocation = &claim["status"]["allocation"];
    let results: Vec<&Value> = allocation["devices"]["results"]
        .as_array()?
        .iter()
        .filter(|r| r["driver"] == driver)
        .collect();
    if results.is_empty() {
        return None;
    }
    let namespace = text(&claim["metadata"]["namespace"]);
    let devices: Vec<String> = results
        .iter()
        .map(|r| format!("{}/{}", text(&r["pool"]), text(&r["device"])))
        .collect();
    let node = selected_node(&allocation["nodeSelector"])
        .or_else(|| pool_nodes.get(&text(&results[0]["pool"])).cloned())
        .unwrap_or_else(|| NO_NODE.to_string());
    let reserved_for = claim["status"]["reservedFor"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| match r["resource"].as_str() {
            Some("pods") | None => format!("{namespace}/{}", text(&r["name"])),
            Some(other) => format!("{other} {namespace}/{}", text(&r["name"])),
        })
        .collect();
    let mut conditions = Vec::new();
    for d in claim["status"]["devices"].as_array().into_iter().flatten() {
        if d["driver"] != driver {
            continue;
        }
        for c in d["conditions"].as_array().into_iter().flatten() {
            conditions.push(format!(
                "{}/{}: {}={}",
                text(&d["pool"]),
                text(&d["device"]),
                text(&c["type"]),
                text(&c["status"])
            ));
        }
    }
    let found = Claim {
        namespace,
        name: text(&claim["metadata"]["name"]),
        devices,
        reserved_for,
        conditions,
    };
    Some((node, found))
}

/// The one node a node selector names by `metadata.name`, as the scheduler writes it for a
/// node-local allocation.
fn selected_node(selector: &Value) -> Option<String> {
    selector["nodeSelectorTerms"]
        .as_array()?
        .iter()
        .flat_map(|t| t["matchFields"].as_array().into_iter().flatten())
        .find(|f| f["key"] == "metadata.name" && f["operator"] == "In")
        .and_then(|f| f["values"][0].as_str())
        .map(str::to_string)
}

/// The table: per node, then device taints, claims, and with `wide` every device.
fn table(status: &Status, wide: bool) -> String {
    let scope = match &status.namespace {
        Some(ns) => format!("claims in namespace {ns}"),
        None => "claims in every namespace".to_string(),
    };
    let mut out = format!("Driver {} ({scope})\n\n", status.driver);
    if status.nodes.is_empty() {
        out.push_str("No ResourceSlice of this driver and no claim allocated its devices.\n");
        return out;
    }
    out.push_str(&node_table(status));
    let taints = taint_table(status);
    if !taints.is_empty() {
        out.push_str("\nDevice taints\n");
        out.push_str(&taints);
    }
    let claims = claim_table(status);
    if claims.is_empty() {
        out.push_str("\nNo claim holds a device of this driver.\n");
    } else {
        out.push_str("\nClaims\n");
        out.push_str(&claims);
    }
    if wide {
        out.push_str("\nDevices\n");
        out.push_str(&device_table(status));
    }
    out
}

/// One row per node: its pools and their generations, slices, devices, tainted devices, claims.
fn node_table(status: &Status) -> String {
    let mut rows = vec![row([
        "NODE",
        "POOLS (GENERATION)",
        "SLICES",
        "DEVICES",
        "TAINTED",
        "CLAIMS",
    ])];
    for n in &status.nodes {
        let pools: Vec<String> = n
            .pools
            .iter()
            .map(|p| format!("{} ({})", p.name, p.generation))
            .collect();
        let slices: usize = n.pools.iter().map(|p| p.slices.len()).sum();
        let tainted = n.devices.iter().filter(|d| !d.taints.is_empty()).count();
        rows.push([
            n.node.clone(),
            none_if_empty(pools.join(", ")),
            slices.to_string(),
            n.devices.len().to_string(),
            tainted.to_string(),
            n.claims.len().to_string(),
        ]);
    }
    crate::table::columns(&rows)
}

/// One row per device taint; empty when no device is tainted.
fn taint_table(status: &Status) -> String {
    let mut rows = vec![row(["NODE", "DEVICE", "KEY", "VALUE", "EFFECT"])];
    for n in &status.nodes {
        for d in &n.devices {
            for t in &d.taints {
                rows.push([
                    n.node.clone(),
                    format!("{}/{}", d.pool, d.name),
                    t.key.clone(),
                    t.value.clone().unwrap_or_else(|| "-".into()),
                    t.effect.clone(),
                ]);
            }
        }
    }
    if rows.len() > 1 {
        crate::table::columns(&rows)
    } else {
        String::new()
    }
}

/// One row per claim holding the driver's devices; empty when there is none.
fn claim_table(status: &Status) -> String {
    let mut rows = vec![row([
        "NODE",
        "NAMESPACE",
        "CLAIM",
        "DEVICES",
        "RESERVED FOR",
        "CONDITIONS",
    ])];
    for n in &status.nodes {
        for c in &n.claims {
            rows.push([
                n.node.clone(),
                c.namespace.clone(),
                c.name.clone(),
                c.devices.join(","),
                none_if_empty(c.reserved_for.join(",")),
                none_if_empty(c.conditions.join(",")),
            ]);
        }
    }
    if rows.len() > 1 {
        crate::table::columns(&rows)
    } else {
        String::new()
    }
}

/// One row per device: its taints and the claim holding it.
fn device_table(status: &Status) -> String {
    let mut rows = vec![row(["NODE", "DEVICE", "TAINTS", "CLAIM"])];
    for n in &status.nodes {
        for d in &n.devices {
            let taints: Vec<String> = d
                .taints
                .iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect();
            rows.push([
                n.node.clone(),
                format!("{}/{}", d.pool, d.name),
                none_if_empty(taints.join(",")),
                d.claim.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
    }
    crate::table::columns(&rows)
}

fn row<const N: usize>(cells: [&str; N]) -> [String; N] {
    cells.map(str::to_string)
}

fn none_if_empty(s: String) -> String {
    if s.is_empty() { "-".to_string() } else { s }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(name: &str, node: &str, generation: i64, devices: &[&str]) -> Value {
        let devices: Vec<Value> = devices.iter().map(|d| json!({"name": d})).collect();
        json!({"kind": "ResourceSlice", "metadata": {"name": name},
               "spec": {"driver": "d.example.com", "nodeName": node,
                        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                        "devices": devices}})
    }

    #[test]
    fn only_the_newest_generation_of_a_pool_counts() {
        let objects = [
            slice("old", "n1", 1, &["a", "b", "c"]),
            slice("new", "n1", 2, &["a"]),
            slice("older", "n1", 0, &["z"]),
        ];
        let status = collect("d.example.com", None, &objects);
        let node = &status.nodes[0];
        assert_eq!(node.pools[0].generation, 2);
        assert_eq!(node.pools[0].slices, ["new"]);
        let devices: Vec<&str> = node.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(devices, ["a"]);
    }

    #[test]
    fn a_claim_without_a_node_selector_is_placed_by_its_pool() {
        let objects = [
            slice("s", "n1", 1, &["a"]),
            json!({"kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ns"},
                   "status": {"allocation": {"devices": {"results": [
                       {"driver": "d.example.com", "pool": "n1", "device": "a"},
                       {"driver": "other.example.com", "pool": "x", "device": "y"}]}}}}),
            json!({"kind": "ResourceClaim", "metadata": {"name": "other", "namespace": "ns"},
                   "status": {"allocation": {"devices": {"results": [
                       {"driver": "other.example.com", "pool": "x", "device": "y"}]}}}}),
        ];
        let status = collect("d.example.com", Some("ns".into()), &objects);
        let node = &status.nodes[0];
        assert_eq!(node.node, "n1");
        assert_eq!(node.claims.len(), 1);
        assert_eq!(node.claims[0].devices, ["n1/a"]);
        assert_eq!(node.devices[0].claim.as_deref(), Some("ns/c"));
        assert!(!table(&status, false).contains("No ResourceSlice"));
    }

    #[test]
    fn slices_of_other_drivers_and_claims_of_other_namespaces_are_left_out() {
        let mut other = slice("s", "n2", 1, &["a"]);
        other["spec"]["driver"] = json!("other.example.com");
        let objects = [
            other,
            json!({"kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "elsewhere"},
                   "status": {"allocation": {"devices": {"results": [
                       {"driver": "d.example.com", "pool": "n1", "device": "a"}]}}}}),
        ];
        let status = collect("d.example.com", Some("ns".into()), &objects);
        assert!(status.nodes.is_empty());
        assert!(table(&status, true).contains("No ResourceSlice of this driver"));
    }
}
