//! The PrometheusRule: each alert complete, each expression the daemon's metrics.

use serde_json::Value;

use super::{ALERT_ANNOTATIONS, Exported, check_query};

/// The fields of a rule the Prometheus Operator's CRD knows.
const RULE_FIELDS: &[&str] = &[
    "alert",
    "record",
    "expr",
    "for",
    "keep_firing_for",
    "labels",
    "annotations",
];

/// Problems of a PrometheusRule object.
pub(super) fn check_rules(rule: &Value, exported: &Exported) -> Vec<String> {
    let mut problems = Vec::new();
    if rule.get("apiVersion").and_then(Value::as_str) != Some("monitoring.coreos.com/v1") {
        problems.push("apiVersion is not monitoring.coreos.com/v1".into());
    }
    let groups = rule
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if groups.is_empty() {
        problems.push("has no rule groups".into());
    }
    for group in groups {
        let group_name = group.get("name").and_then(Value::as_str).unwrap_or("?");
        let rules = group
            .get("rules")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if rules.is_empty() {
            problems.push(format!("group {group_name:?} has no rules"));
        }
        for r in rules {
            problems.extend(check_rule(r, exported));
        }
    }
    problems
}

/// Problems of one alerting or recording rule.
fn check_rule(r: &Value, exported: &Exported) -> Vec<String> {
    let name = r
        .get("alert")
        .or_else(|| r.get("record"))
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)");
    let what = if r.get("alert").is_some() {
        format!("alert {name}")
    } else {
        format!("rule {name}")
    };
    let mut problems = Vec::new();
    for field in r.as_object().into_iter().flatten().map(|(k, _)| k) {
        if !RULE_FIELDS.contains(&field.as_str()) {
            problems.push(format!("{what}: {field} is not a field of a rule"));
        }
    }
    match r.get("expr").and_then(Value::as_str) {
        Some(expr) => problems.extend(check_query(&what, expr, exported)),
        None => problems.push(format!("{what} has no expr")),
    }
    if r.get("alert").is_none() {
        return problems;
    }
    match r.get("for").and_then(Value::as_str) {
        Some(d) => {
            // Prometheus takes a zero `for` (fire at once); the PromQL parser wants a range.
            let zero = d.starts_with('0')
                && ["", "ms", "s", "m", "h", "d", "w", "y"].contains(&d.trim_start_matches('0'));
            if let Err(e) = promql_parser::util::parse_duration(d)
                .map(|_| ())
                .or_else(|e| if zero { Ok(()) } else { Err(e) })
            {
                problems.push(format!("{what}: for {d:?} is not a duration: {e}"));
            }
        }
        None => problems.push(format!("{what} has no `for`")),
    }
    for key in ALERT_ANNOTATIONS {
        let value = r
            .pointer(&format!("/annotations/{key}"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if value.trim().is_empty() {
            problems.push(format!("{what} has no {key} annotation"));
        }
    }
    problems
}
