//! The data-driven conformance suite: every `tests/conformance/*.yaml` file is a scenario in the
//! `kubedev simulate` format plus an `expect` section:
//!
//! - `error: TEXT` — allocation fails with a hard error containing TEXT;
//! - `allocatable: BOOL` — whether all claims fit;
//! - `devices: [[LINE, ...], ...]` — per claim, in order, `REQUEST DRIVER/POOL/DEVICE` followed
//!   by ` admin` (admin access), ` share` (a share ID was assigned) and
//!   ` capacity=NAME:QTY,...` (consumed capacity) where they apply;
//! - `nodeSelectors: [TEXT, ...]` — per claim, `KEY OP [VALUES] and ...` or `none`;
//! - `allocations: [...]` — per claim, the full `status.allocation`, compared exactly except
//!   that any share ID matches any other;
//! - `explain: [TEXT, ...]` — texts that must appear in the explanation's summary.
//!
//! The scenarios are taken from the documented behaviour and tests of the Kubernetes
//! structured allocator; SEMANTICS.md states the rules they pin.

use std::path::PathBuf;

use kubedev_allocator::api::AllocationResult;
use kubedev_allocator::{SimulateOptions, simulate_here};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct Expect {
    allocatable: Option<bool>,
    error: Option<String>,
    devices: Option<Vec<Vec<String>>>,
    node_selectors: Option<Vec<String>>,
    allocations: Option<serde_json::Value>,
    explain: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct File {
    expect: Expect,
}

fn device_line(r: &kubedev_allocator::api::DeviceRequestAllocationResult) -> String {
    let mut s = format!("{} {}/{}/{}", r.request, r.driver, r.pool, r.device);
    if r.admin_access == Some(true) {
        s.push_str(" admin");
    }
    if r.share_id.is_some() {
        s.push_str(" share");
    }
    if !r.consumed_capacity.is_empty() {
        let caps: Vec<String> = r
            .consumed_capacity
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        s.push_str(&format!(" capacity={}", caps.join(",")));
    }
    s
}

fn node_selector_text(a: &AllocationResult) -> String {
    match &a.node_selector {
        None => "none".to_string(),
        Some(ns) => ns
            .node_selector_terms
            .iter()
            .map(|t| {
                t.match_fields
                    .iter()
                    .chain(&t.match_expressions)
                    .map(|r| format!("{} {} [{}]", r.key, r.operator, r.values.join(",")))
                    .collect::<Vec<_>>()
                    .join(" and ")
            })
            .collect::<Vec<_>>()
            .join(" or "),
    }
}

fn normalize_share_ids(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "shareID" {
                    *x = serde_json::Value::String("<share>".into());
                } else {
                    normalize_share_ids(x);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(normalize_share_ids),
        _ => {}
    }
}

fn check(path: &PathBuf) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let scenario = kubedev_inputs::scenario_from_text(&text).map_err(|e| e.to_string())?;
    let file: File = serde_saphyr::from_str(&text).map_err(|e| format!("expect section: {e}"))?;
    let expect = file.expect;
    let options = SimulateOptions::default().with_explain(!expect.explain.is_empty());
    let out = simulate_here(&scenario, &options);
    match (&expect.error, &out.error) {
        (Some(want), Some(got)) => {
            if !got.contains(want.as_str()) {
                return Err(format!("error {got:?} does not contain {want:?}"));
            }
            return Ok(());
        }
        (Some(want), None) => {
            return Err(format!(
                "expected an error containing {want:?}, got allocatable={}",
                out.allocatable
            ));
        }
        (None, Some(got)) => return Err(format!("unexpected error: {got}")),
        (None, None) => {}
    }
    if let Some(want) = expect.allocatable
        && want != out.allocatable
    {
        return Err(format!(
            "allocatable: want {want}, got {}\n{}",
            out.allocatable,
            out.to_text()
        ));
    }
    let allocations: Vec<&AllocationResult> = out
        .claims
        .iter()
        .filter_map(|c| c.allocation.as_ref())
        .collect();
    if let Some(want) = &expect.devices {
        let got: Vec<Vec<String>> = allocations
            .iter()
            .map(|a| a.devices.results.iter().map(device_line).collect())
            .collect();
        if &got != want {
            return Err(format!("devices:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    if let Some(want) = &expect.node_selectors {
        let got: Vec<String> = allocations.iter().map(|a| node_selector_text(a)).collect();
        if &got != want {
            return Err(format!("node selectors:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    if let Some(want) = &expect.allocations {
        let mut want = want.clone();
        let mut got = serde_json::to_value(&allocations).map_err(|e| e.to_string())?;
        normalize_share_ids(&mut want);
        normalize_share_ids(&mut got);
        if got != want {
            return Err(format!(
                "allocations:\n  want {}\n  got  {}",
                serde_json::to_string(&want).unwrap_or_default(),
                serde_json::to_string(&got).unwrap_or_default()
            ));
        }
    }
    if !expect.explain.is_empty() {
        let summary = out
            .explanation
            .as_ref()
            .map(|e| e.summary.join("\n"))
            .unwrap_or_default();
        for want in &expect.explain {
            if !summary.contains(want.as_str()) {
                return Err(format!("explanation does not contain {want:?}:\n{summary}"));
            }
        }
    }
    Ok(())
}

#[test]
fn conformance() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("conformance directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 30,
        "only {} conformance scenarios",
        files.len()
    );
    let filter = std::env::var("CONFORMANCE_FILTER").unwrap_or_default();
    let mut failures = Vec::new();
    let mut ran = 0;
    for f in &files {
        let name = f
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if !name.contains(filter.as_str()) {
            continue;
        }
        ran += 1;
        if let Err(e) = check(f) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(ran > 0, "no scenario matches {filter:?}");
    assert!(
        failures.is_empty(),
        "{} of {ran} scenarios failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A share of a device allowing multiple allocations is printed as the API names it,
/// `shareID`, so results can be pasted into a ResourceClaim's status.
#[test]
fn share_ids_are_printed_as_the_api_spells_them() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance/capacity-valid-values.yaml");
    let scenario = kubedev_inputs::read_scenario(&path).expect("scenario");
    let out = simulate_here(&scenario, &SimulateOptions::default());
    let json = out.to_json();
    assert!(json.contains("\"shareID\""), "{json}");
    assert!(!json.contains("shareId"), "{json}");
    assert!(
        serde_saphyr::to_string(&out)
            .expect("yaml")
            .contains("shareID:")
    );
}
