//! Who reaches the daemon's metrics: a NetworkPolicy selects the pod, lets in no peer but named
//! ones and only on the metrics port, and lets a scraper in when a metrics Service is rendered.

use serde_json::{Map, Value};

use super::super::{NAMESPACE, Object};

/// The metrics port, by number (from `metrics.address`) and by the name the container gives it.
struct MetricsPort<'a> {
    number: Option<u64>,
    name: Option<&'a str>,
}

impl MetricsPort<'_> {
    /// Whether a NetworkPolicy port entry opens exactly the metrics port.
    fn is_opened_by(&self, port: &Value) -> bool {
        (match port.get("port") {
            Some(Value::Number(n)) => n.as_u64() == self.number,
            Some(Value::String(s)) => Some(s.as_str()) == self.name,
            _ => false,
        }) && port.get("endPort").is_none()
    }
}

/// The NetworkPolicy checks, when the daemon serves metrics; `template` is the DaemonSet's pod
/// template (metadata and spec).
pub(super) fn check_metrics_exposure(
    objects: &[Object],
    config: &Value,
    template: &Value,
) -> Vec<String> {
    let mut problems = Vec::new();
    if config.pointer("/metrics/address").is_none() {
        return problems;
    }
    let labels = template
        .pointer("/metadata/labels")
        .and_then(Value::as_object);
    let port = metrics_port(config, template);
    let policies = ingress_policies(objects, labels);
    if policies.is_empty() {
        problems.push(
            "no NetworkPolicy restricts ingress to the daemon's pods: every pod in the cluster \
             can reach /metrics (metrics.networkPolicy)"
                .to_string(),
        );
    }
    let mut admits_someone = false;
    for np in &policies {
        let at = format!("{}: {}", np.source, np.id);
        for (i, rule) in np
            .value
            .pointer("/spec/ingress")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            admits_someone |= check_ingress_rule(&at, i, rule, &port, &mut problems);
        }
    }
    if let Some(s) = objects.iter().find(|o| o.kind == "Service")
        && !policies.is_empty()
        && !admits_someone
    {
        problems.push(format!(
            "{}: {}: a metrics Service is rendered for scraping, but the NetworkPolicy lets no \
             scraper in (metrics.networkPolicy.from)",
            s.source, s.id
        ));
    }
    problems
}

/// The metrics port: the number in `metrics.address`, and the name the daemon container gives
/// the port of that number.
fn metrics_port<'a>(config: &Value, template: &'a Value) -> MetricsPort<'a> {
    let container = template.pointer("/spec/containers/0");
    let number = config
        .pointer("/metrics/address")
        .and_then(Value::as_str)
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u64>().ok());
    let name = container
        .and_then(|c| c.get("ports"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("containerPort").and_then(Value::as_u64) == number)
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str);
    MetricsPort { number, name }
}

/// The NetworkPolicies in the daemon's namespace whose pod selector takes pods with `labels`
/// (by labels only) and that restrict ingress.
fn ingress_policies<'o>(
    objects: &'o [Object],
    labels: Option<&Map<String, Value>>,
) -> Vec<&'o Object> {
    let selects_pod = |np: &Object| {
        let sel = np.value.pointer("/spec/podSelector");
        let exprs = sel
            .and_then(|s| s.get("matchExpressions"))
            .and_then(Value::as_array)
            .is_some_and(|e| !e.is_empty());
        let wanted = sel
            .and_then(|s| s.get("matchLabels"))
            .and_then(Value::as_object);
        let ns = np
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str);
        ns == Some(NAMESPACE)
            && !exprs
            && wanted
                .into_iter()
                .flatten()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    };
    objects
        .iter()
        .filter(|o| o.kind == "NetworkPolicy" && selects_pod(o))
        .filter(|o| {
            let types: Vec<&str> = o
                .value
                .pointer("/spec/policyTypes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            types.contains(&"Ingress") || types.is_empty()
        })
        .collect()
}

/// Checks ingress rule `i` of the policy `at`: named peers only, none that takes in every pod
/// or address, and only the metrics port. Returns whether it lets some peer in.
fn check_ingress_rule(
    at: &str,
    i: usize,
    rule: &Value,
    port: &MetricsPort<'_>,
    problems: &mut Vec<String>,
) -> bool {
    let from: Vec<&Value> = rule
        .get("from")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    if from.is_empty() {
        problems.push(format!(
            "{at}: ingress[{i}] names no peer, so it lets every pod in"
        ));
    }
    for peer in &from {
        // Every namespace's every pod, or every address.
        let all_pods = peer.get("podSelector").is_none()
            && peer
                .get("namespaceSelector")
                .is_some_and(|s| !narrows_selector(s));
        let all_addresses = peer
            .pointer("/ipBlock/cidr")
            .and_then(Value::as_str)
            .is_some_and(|c| c.ends_with("/0"));
        let everyone = all_pods || all_addresses;
        if everyone {
            problems.push(format!(
                "{at}: ingress[{i}] peer {peer} takes in every pod or address"
            ));
        }
    }
    let ports: Vec<&Value> = rule
        .get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    if ports.is_empty() {
        problems.push(format!(
            "{at}: ingress[{i}] opens every port; open only the metrics port"
        ));
    }
    for p in ports {
        if !port.is_opened_by(p) {
            problems.push(format!(
                "{at}: ingress[{i}] opens {p}, which is not the metrics port {}",
                port.number.map(|n| n.to_string()).unwrap_or_default()
            ));
        }
    }
    !from.is_empty()
}

/// Whether a label selector selects less than everything.
fn narrows_selector(s: &Value) -> bool {
    s.get("matchLabels")
        .and_then(Value::as_object)
        .is_some_and(|m| !m.is_empty())
        || s.get("matchExpressions")
            .and_then(Value::as_array)
            .is_some_and(|m| !m.is_empty())
}
