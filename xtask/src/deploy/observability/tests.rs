use super::*;

/// What a daemon serves: a counter, a gauge and a histogram (with a unit), as prometheus-client
/// encodes them.
const EXPOSITION: &str = "\
# HELP kubedev_dra_recovery What DRA start-up recovery did.
# TYPE kubedev_dra_recovery counter
kubedev_dra_recovery_total{outcome=\"checkpoint_lost\"} 1
# HELP kubedev_devices Devices served.
# TYPE kubedev_devices gauge
# HELP kubedev_dra_operation_duration_seconds Time taken.
# TYPE kubedev_dra_operation_duration_seconds histogram
# UNIT kubedev_dra_operation_duration_seconds seconds
# HELP foo A histogram.
# TYPE foo histogram
# EOF
";

fn exported() -> Exported {
    Exported::parse(EXPOSITION).unwrap()
}

fn rule(alert: &str, expr: &str) -> Value {
    serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "spec": {"groups": [{"name": "g", "rules": [{
            "alert": alert, "expr": expr, "for": "5m",
            "annotations": {"summary": "s", "description": "d", "runbook_url": "u"},
        }]}]},
    })
}

fn dashboard(panel_ds: Value, expr: &str) -> String {
    serde_json::json!({
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": [{"type": "row", "title": "r", "panels": [{
            "type": "timeseries", "title": "Devices", "datasource": panel_ds,
            "targets": [{"refId": "A", "expr": expr}],
        }]}],
    })
    .to_string()
}

#[test]
fn a_histogram_quantile_over_a_bucket_names_the_histogram() {
    let names = metric_names(
        "histogram_quantile(0.9, sum by (le) (rate(foo_bucket{operation=\"prepare\"}[$__rate_interval])))",
    )
    .unwrap();
    assert_eq!(names.into_iter().collect::<Vec<_>>(), vec!["foo_bucket"]);
    let e = exported();
    assert_eq!(e.family_of("foo_bucket"), Some("foo"));
    assert_eq!(e.family_of("foo_sum"), Some("foo"));
    assert_eq!(
        e.family_of("kubedev_dra_operation_duration_seconds_count"),
        Some("kubedev_dra_operation_duration_seconds")
    );
    // A histogram's family name is no series of its own, nor a gauge's bucket.
    assert_eq!(e.family_of("foo"), None);
    assert_eq!(e.family_of("kubedev_devices_bucket"), None);
}

#[test]
fn counters_are_queried_with_total() {
    let e = exported();
    assert_eq!(
        e.family_of("kubedev_dra_recovery_total"),
        Some("kubedev_dra_recovery")
    );
    assert_eq!(e.family_of("kubedev_dra_recovery"), None);
    assert_eq!(e.family_of("kubedev_devices"), Some("kubedev_devices"));
}

#[test]
fn names_come_from_every_part_of_an_expression() {
    let names = metric_names(
        "increase(a_total[1h]) > 0 or (b{x=\"1\"} > 0 unless c offset 1h) \
         or topk(scalar(d), {__name__=\"e\"}) or max_over_time(f[10m:1m])",
    )
    .unwrap();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["a_total", "b", "c", "d", "e", "f"]
    );
    let err = metric_names("{__name__=~\"kubedev_.*\"}").unwrap_err();
    assert!(err.contains("name each metric"), "{err}");
    let err = metric_names("rate(kubedev_devices[5m]").unwrap_err();
    assert!(err.contains("does not parse as PromQL"), "{err}");
}

#[test]
fn a_rule_naming_an_unknown_metric_is_reported_with_its_name() {
    let e = exported();
    assert!(check_rules(&rule("Ok", "kubedev_devices{health=\"Unhealthy\"} > 0"), &e).is_empty());
    let problems = check_rules(
        &rule("KubedevGone", "rate(kubedev_dra_errors_total[5m]) > 0"),
        &e,
    );
    assert_eq!(
        problems,
        vec!["alert KubedevGone: names kubedev_dra_errors_total, which the daemon does not export"]
    );
}

#[test]
fn an_alert_without_runbook_or_for_is_reported() {
    let mut r = rule("A", "kubedev_devices > 0");
    let alert = r.pointer_mut("/spec/groups/0/rules/0").unwrap();
    alert.as_object_mut().unwrap().remove("for");
    alert["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("runbook_url");
    let problems = check_rules(&r, &exported());
    assert_eq!(
        problems,
        vec![
            "alert A has no `for`",
            "alert A has no runbook_url annotation"
        ]
    );
    let mut r = rule("A", "kubedev_devices > 0");
    r["spec"]["groups"][0]["rules"][0]["for"] = "0m".into();
    assert!(check_rules(&r, &exported()).is_empty());
    r["spec"]["groups"][0]["rules"][0]["for"] = "soon".into();
    assert_eq!(check_rules(&r, &exported()).len(), 1);
}

#[test]
fn a_panel_naming_an_unknown_metric_is_reported_with_its_title() {
    let e = exported();
    let ds = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    assert!(check_dashboard(&dashboard(ds.clone(), "sum(kubedev_devices)"), &e).is_empty());
    let problems = check_dashboard(&dashboard(ds, "sum(kubedev_device_count)"), &e);
    assert_eq!(
        problems,
        vec![
            "panel \"Devices\" query A: names kubedev_device_count, which the daemon does not \
             export"
        ]
    );
}

#[test]
fn a_fixed_data_source_or_bad_json_is_reported() {
    let e = exported();
    let fixed = serde_json::json!({"type": "prometheus", "uid": "P1809F7CD0C75ACF3"});
    let problems = check_dashboard(&dashboard(fixed, "kubedev_devices"), &e);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("not a data source variable"),
        "{problems:?}"
    );
    let problems = check_dashboard("{\"panels\": [", &e);
    assert!(problems[0].starts_with("not valid JSON"), "{problems:?}");
}

#[test]
fn the_observability_documents_are_split_off_and_the_rest_kept() {
    let rendered = "---\n# Source: kubedev/templates/configmap.yaml\nkind: ConfigMap\n\
                    ---\n# Source: kubedev/templates/prometheusrule.yaml\nkind: PrometheusRule\n\
                    ---\n# Source: kubedev/templates/daemonset.yaml\nkind: DaemonSet\n";
    let (rest, taken) = split(rendered);
    assert_eq!(
        rest,
        "---\n# Source: kubedev/templates/configmap.yaml\nkind: ConfigMap\n\
         ---\n# Source: kubedev/templates/daemonset.yaml\nkind: DaemonSet\n"
    );
    assert_eq!(
        taken,
        "---\n# Source: kubedev/templates/prometheusrule.yaml\nkind: PrometheusRule\n"
    );
    let mut o = Observability::default();
    assert_eq!(o.take("x", rest.clone()), rest);
    assert!(o.renderings.is_empty());
}

#[test]
fn metrics_not_read_from_a_daemon_are_a_problem() {
    let mut o = Observability::default();
    o.take(
        "ci/all-values.yaml",
        "---\n# Source: kubedev/templates/prometheusrule.yaml\nkind: PrometheusRule\n".into(),
    );
    assert_eq!(o.check().len(), 1);
    assert!(o.check()[0].contains("no daemon's /metrics was read"));
    o.exported("default", "no metrics here\n".into());
    assert!(
        o.check()[0].contains("names no metric family"),
        "{:?}",
        o.check()
    );
}
