//! The Grafana dashboard: valid JSON, its data source a variable, its queries the daemon's
//! metrics.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{Exported, check_query};

/// Problems of one dashboard, given as its JSON text.
pub(super) fn check_dashboard(text: &str, exported: &Exported) -> Vec<String> {
    let dashboard: Value = match serde_json::from_str(text) {
        Ok(d) => d,
        Err(e) => return vec![format!("not valid JSON: {e}")],
    };
    let variables = dashboard
        .pointer("/templating/list")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sources: BTreeSet<String> = variables
        .iter()
        .filter(|v| v.get("type").and_then(Value::as_str) == Some("datasource"))
        .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    let mut problems = Vec::new();
    if sources.is_empty() {
        problems
            .push("has no data source variable (a template variable of type datasource)".into());
    }
    for v in &variables {
        problems.extend(check_variable(v, &sources, exported));
    }
    let panels = dashboard
        .get("panels")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if panels.is_empty() {
        problems.push("has no panels".into());
    }
    for panel in panels {
        check_panel(panel, &sources, exported, &mut problems);
    }
    problems
}

/// Whether `ds` (a panel's, query's or variable's `datasource`) names a data source variable.
fn is_variable(ds: &Value, sources: &BTreeSet<String>) -> bool {
    let reference = match ds {
        Value::String(s) => s.as_str(),
        Value::Object(o) => o.get("uid").and_then(Value::as_str).unwrap_or_default(),
        _ => return false,
    };
    let name = reference
        .strip_prefix("${")
        .and_then(|r| r.strip_suffix('}'))
        .or_else(|| reference.strip_prefix('$'));
    name.is_some_and(|n| sources.contains(n))
}

/// Checks a panel, and the panels of a row.
fn check_panel(
    panel: &Value,
    sources: &BTreeSet<String>,
    exported: &Exported,
    problems: &mut Vec<String>,
) {
    let title = panel
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or("(untitled)");
    if panel.get("type").and_then(Value::as_str) == Some("row") {
        for p in panel
            .get("panels")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            check_panel(p, sources, exported, problems);
        }
        return;
    }
    let targets = panel
        .get("targets")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if targets.is_empty() {
        problems.push(format!("panel {title:?} has no queries"));
        return;
    }
    if !panel
        .get("datasource")
        .is_some_and(|d| is_variable(d, sources))
    {
        problems.push(format!(
            "panel {title:?}: its datasource is not a data source variable ({})",
            panel.get("datasource").unwrap_or(&Value::Null)
        ));
    }
    for t in targets {
        let id = t.get("refId").and_then(Value::as_str).unwrap_or("?");
        let what = format!("panel {title:?} query {id}");
        if let Some(ds) = t.get("datasource")
            && !is_variable(ds, sources)
        {
            problems.push(format!(
                "{what}: its datasource is not a data source variable ({ds})"
            ));
        }
        match t.get("expr").and_then(Value::as_str) {
            Some(expr) => problems.extend(check_query(&what, expr, exported)),
            None => problems.push(format!("{what} has no PromQL expr")),
        }
    }
}

/// Checks a template variable: a query variable's data source and PromQL.
fn check_variable(v: &Value, sources: &BTreeSet<String>, exported: &Exported) -> Vec<String> {
    if v.get("type").and_then(Value::as_str) != Some("query") {
        return Vec::new();
    }
    let name = v.get("name").and_then(Value::as_str).unwrap_or("?");
    let what = format!("variable {name:?}");
    let mut problems = Vec::new();
    if !v.get("datasource").is_some_and(|d| is_variable(d, sources)) {
        problems.push(format!(
            "{what}: its datasource is not a data source variable"
        ));
    }
    let query = match v.get("query") {
        Some(Value::String(q)) => q.as_str(),
        Some(Value::Object(o)) => o.get("query").and_then(Value::as_str).unwrap_or_default(),
        _ => "",
    };
    match promql_of_variable(query) {
        Ok(Some(expr)) => problems.extend(check_query(&what, expr, exported)),
        Ok(None) => {}
        Err(e) => problems.push(format!("{what}: {e}")),
    }
    problems
}

/// The PromQL inside a Prometheus variable query: the series of `label_values(series, label)`
/// (none in `label_values(label)`) or the expression of `query_result(expr)`.
fn promql_of_variable(query: &str) -> Result<Option<&str>, String> {
    let query = query.trim();
    if let Some(inner) = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
    {
        return Ok(inner.rsplit_once(',').map(|(series, _)| series.trim()));
    }
    if let Some(inner) = query
        .strip_prefix("query_result(")
        .and_then(|q| q.strip_suffix(')'))
    {
        return Ok(Some(inner.trim()));
    }
    Err(format!(
        "query {query:?} is neither label_values(...) nor query_result(...)"
    ))
}
