//! deploy-check's observability checks: the chart's Grafana dashboard and Prometheus alerting
//! rules ask only for metrics the daemon exports.
//!
//! The dashboard ConfigMap and the PrometheusRule are taken out of each rendering (the other
//! checks look at the daemon's objects) and checked here:
//!
//! - every rule expression and every dashboard query (panel targets, and the `label_values`
//!   queries of template variables) parses as PromQL, and every metric it names, as a selector's
//!   name or a `__name__` matcher, is one the daemon exports;
//! - the exported names are read from the `/metrics` endpoint of the daemon deploy-check started
//!   (the `start` module): a counter family `x` is queried as `x_total`, a histogram as
//!   `x_bucket`, `x_sum` and `x_count`;
//! - the dashboard is valid JSON, and every panel and query takes its data source from a
//!   dashboard variable of type `datasource`, never a fixed one;
//! - every alert has a `for`, and `summary`, `description` and `runbook_url` annotations; the
//!   dashboard ConfigMap is a ConfigMap.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::label::{METRIC_NAME, MatchOp, Matcher};
use promql_parser::parser::{self, Expr};
use serde_json::Value;

use super::{Object, parse_objects, round_trip};

/// The templates whose objects are checked here rather than with the daemon's.
const TEMPLATES: &[&str] = &[
    "templates/grafana-dashboard.yaml",
    "templates/prometheusrule.yaml",
];

/// Annotations every alert needs.
const ALERT_ANNOTATIONS: &[&str] = &["summary", "description", "runbook_url"];

/// Grafana's interval variables, replaced by a duration before a query is parsed.
const GRAFANA_INTERVALS: &[&str] = &[
    "$__rate_interval",
    "${__rate_interval}",
    "$__interval",
    "${__interval}",
    "$__range",
    "${__range}",
];

/// The observability objects of every rendering, and the daemon's exported metrics.
#[derive(Default)]
pub(super) struct Observability {
    /// Each rendering's label and its dashboard and rule objects (as YAML documents).
    renderings: Vec<(String, String)>,
    /// The label of the rendering whose daemon was scraped, and what `/metrics` said.
    scraped: Option<(String, String)>,
}

impl Observability {
    /// Takes the dashboard and rule documents out of `rendered` (keeping them for [`check`]) and
    /// returns the rest, unchanged when there are none.
    ///
    /// [`check`]: Observability::check
    pub(super) fn take(&mut self, label: &str, rendered: String) -> String {
        let (rest, taken) = split(&rendered);
        if taken.is_empty() {
            return rendered;
        }
        self.renderings.push((label.to_string(), taken));
        rest
    }

    /// Keeps the first daemon's `/metrics` text, scraped on `label`'s configuration.
    pub(super) fn exported(&mut self, label: &str, text: String) {
        if self.scraped.is_none() {
            self.scraped = Some((label.to_string(), text));
        }
    }

    /// Checks every kept rendering against the scraped metrics; returns the problems.
    pub(super) fn check(&self) -> Vec<String> {
        if self.renderings.is_empty() {
            return vec![format!(
                "no values file in ci/ enables the dashboard and the alerting rules ({}), so \
                 they are not checked",
                TEMPLATES.join(", ")
            )];
        }
        let exported = match &self.scraped {
            None => {
                return vec![
                    "the dashboard and alerting rules are not checked: no daemon's \
                             /metrics was read"
                        .into(),
                ];
            }
            Some((from, text)) => match Exported::parse(text) {
                Ok(e) => e,
                Err(e) => return vec![format!("{from}: the daemon's /metrics: {e}")],
            },
        };
        let mut problems = Vec::new();
        for (label, docs) in &self.renderings {
            let objects = match parse_objects(docs) {
                Ok(o) => o,
                Err(e) => {
                    problems.push(format!("{label}: {e:#}"));
                    continue;
                }
            };
            for o in &objects {
                let at = format!("{label}: {}: {}", o.source, o.id);
                problems.extend(
                    check_object(o, &exported)
                        .into_iter()
                        .map(|p| format!("{at}: {p}")),
                );
            }
        }
        problems
    }
}

/// Splits helm's output into the documents of [`TEMPLATES`] and the rest, each document kept
/// with its `---` line.
fn split(rendered: &str) -> (String, String) {
    let (mut rest, mut taken) = (String::new(), String::new());
    let mut doc = String::new();
    let mut flush = |doc: &mut String| {
        let ours = doc.lines().any(|l| {
            l.strip_prefix("# Source: ")
                .is_some_and(|s| TEMPLATES.iter().any(|t| s.ends_with(t)))
        });
        if ours { &mut taken } else { &mut rest }.push_str(doc);
        doc.clear();
    };
    for line in rendered.split_inclusive('\n') {
        if line.trim_end_matches('\n') == "---" {
            flush(&mut doc);
        }
        doc.push_str(line);
    }
    flush(&mut doc);
    (rest, taken)
}

/// The checks of one dashboard ConfigMap or PrometheusRule.
fn check_object(o: &Object, exported: &Exported) -> Vec<String> {
    match o.kind.as_str() {
        "ConfigMap" => {
            let mut problems = match round_trip::<k8s_openapi::api::core::v1::ConfigMap>(&o.value) {
                Ok(lost) => lost,
                Err(e) => vec![format!("does not parse as ConfigMap: {e}")],
            };
            let dashboards = o.value.get("data").and_then(Value::as_object);
            let Some(dashboards) = dashboards.filter(|d| !d.is_empty()) else {
                problems.push("holds no dashboard".into());
                return problems;
            };
            for (key, text) in dashboards {
                let text = text.as_str().unwrap_or_default();
                problems.extend(
                    check_dashboard(text, exported)
                        .into_iter()
                        .map(|p| format!("{key}: {p}")),
                );
            }
            problems
        }
        "PrometheusRule" => check_rules(&o.value, exported),
        kind => vec![format!("a {kind} is not a dashboard or a PrometheusRule")],
    }
}

/// The metric families a daemon's `/metrics` names, with their types.
#[derive(Debug)]
pub(super) struct Exported {
    families: BTreeMap<String, String>,
}

impl Exported {
    /// Reads the `# TYPE` lines of an OpenMetrics or Prometheus text exposition.
    pub(super) fn parse(text: &str) -> Result<Exported, String> {
        let families: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| {
                let (name, kind) = l.split_once(' ')?;
                Some((name.to_string(), kind.trim().to_string()))
            })
            .collect();
        if families.is_empty() {
            return Err("names no metric family (no `# TYPE` line)".into());
        }
        Ok(Exported { families })
    }

    /// The family a queried series name belongs to: `x_total` to the counter `x`, `x_bucket`,
    /// `x_sum` and `x_count` to the histogram `x`, a gauge's name to itself; `None` when the
    /// daemon exports no such series.
    pub(super) fn family_of(&self, name: &str) -> Option<&str> {
        let suffixed: &[(&str, &[&str])] = &[
            ("_total", &["counter"]),
            ("_created", &["counter", "histogram", "summary"]),
            ("_bucket", &["histogram", "gaugehistogram"]),
            ("_sum", &["histogram", "summary"]),
            ("_count", &["histogram", "summary"]),
            ("_info", &["info"]),
        ];
        for (suffix, kinds) in suffixed {
            if let Some(base) = name.strip_suffix(suffix)
                && let Some((family, kind)) = self.families.get_key_value(base)
                && kinds.contains(&kind.as_str())
            {
                return Some(family);
            }
        }
        match self.families.get_key_value(name) {
            Some((family, kind))
                if ["gauge", "unknown", "untyped", "stateset"].contains(&kind.as_str()) =>
            {
                Some(family)
            }
            Some((family, kind)) if kind == "summary" => Some(family),
            _ => None,
        }
    }
}

/// The metric names a PromQL expression selects: selectors' names and `__name__ = "..."`
/// matchers. A `__name__` matched by a regular expression, which names no metric, is an error.
pub(super) fn metric_names(query: &str) -> Result<BTreeSet<String>, String> {
    let mut text = query.to_string();
    for var in GRAFANA_INTERVALS {
        text = text.replace(var, "5m");
    }
    let expr = parser::parse(&text).map_err(|e| format!("does not parse as PromQL: {e}"))?;
    let mut names = BTreeSet::new();
    collect(&expr, &mut names)?;
    Ok(names)
}

fn collect(expr: &Expr, names: &mut BTreeSet<String>) -> Result<(), String> {
    match expr {
        Expr::Aggregate(a) => {
            if let Some(p) = &a.param {
                collect(p, names)?;
            }
            collect(&a.expr, names)
        }
        Expr::Unary(u) => collect(&u.expr, names),
        Expr::Binary(b) => {
            collect(&b.lhs, names)?;
            collect(&b.rhs, names)
        }
        Expr::Paren(p) => collect(&p.expr, names),
        Expr::Subquery(s) => collect(&s.expr, names),
        Expr::Call(c) => c.args.args.iter().try_for_each(|a| collect(a, names)),
        Expr::VectorSelector(vs) => selector_names(vs, names),
        Expr::MatrixSelector(ms) => selector_names(&ms.vs, names),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => Ok(()),
    }
}

fn selector_names(
    vs: &promql_parser::parser::VectorSelector,
    names: &mut BTreeSet<String>,
) -> Result<(), String> {
    names.extend(vs.name.iter().cloned());
    let all = vs
        .matchers
        .matchers
        .iter()
        .chain(vs.matchers.or_matchers.iter().flatten());
    for m in all.filter(|m: &&Matcher| m.name == METRIC_NAME) {
        match m.op {
            MatchOp::Equal => {
                names.insert(m.value.clone());
            }
            _ => {
                return Err(format!(
                    "selects metrics by `{}{}{:?}`; name each metric instead",
                    m.name, m.op, m.value
                ));
            }
        }
    }
    Ok(())
}

/// Problems of one query, named `what`: it does not parse, or names metrics the daemon does not
/// export.
pub(super) fn check_query(what: &str, query: &str, exported: &Exported) -> Vec<String> {
    match metric_names(query) {
        Err(e) => vec![format!("{what}: {e}: {query}")],
        Ok(names) => names
            .into_iter()
            .filter(|n| exported.family_of(n).is_none())
            .map(|n| format!("{what}: names {n}, which the daemon does not export"))
            .collect(),
    }
}

mod dashboard;
mod rules;

use dashboard::check_dashboard;
use rules::check_rules;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
