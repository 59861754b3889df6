//! Every rendering's RBAC judged by the real authorizer: the chart is rendered with its default
//! values and with each values file under `ci/`, as its own release in a namespace of its own;
//! its ServiceAccount, roles and bindings are applied; and the API server lists every rule it
//! grants the daemon's account (`kubectl auth can-i --list`, as the account, with its token's
//! groups) in `default`, in the release's namespace and in another one. Beyond what an account
//! without bindings gets, the list must hold exactly what the daemon does with the API server
//! ([`DAEMON_USES`], DeviceClasses by the names it applies, claims' device status for its own
//! driver): every required use in DRA mode, nothing in device-plugin mode. Mutations of the
//! rendering of `ci/vfio-values.yaml` (DRA with DeviceClasses: a wildcard, secrets, events across the cluster, every DeviceClass, a
//! non-resource URL, a verb taken away) must each be caught.

use serde_json::json;

use super::*;
use crate::deploy::access::{DAEMON_USES, DEVICE_CLASS_VERBS, Use};

/// One rule as the authorizer lists it: resource (with `.group` and `/subresource`) or
/// non-resource URL, resource name (empty: every name), verb.
type Rule = (String, String, String);

/// The namespaces the rules are listed in, besides the release's own.
const ASKED: &[&str] = &["default", "kubedev-rbac-elsewhere"];

/// The resource of `u` as the authorizer names it (`resourceclaims.resource.k8s.io/status`).
pub(super) fn use_resource(u: &Use) -> String {
    let (resource, sub) = match u.resource.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (u.resource, None),
    };
    let mut name = resource.to_string();
    if !u.group.is_empty() {
        name.push('.');
        name.push_str(u.group);
    }
    if let Some(sub) = sub {
        name.push('/');
        name.push_str(sub);
    }
    name
}

/// The rules of `kubectl auth can-i --list`'s table.
fn parse_rules(table: &str) -> BTreeSet<Rule> {
    let mut rules = BTreeSet::new();
    for line in table.lines().skip(1) {
        let Some(open) = line.find('[') else {
            continue;
        };
        let resource = line[..open].trim();
        let groups: Vec<Vec<&str>> = line[open..]
            .split(']')
            .filter_map(|g| g.trim().strip_prefix('['))
            .map(|g| g.split_whitespace().collect())
            .collect();
        let [urls, names, verbs] = &groups[..] else {
            continue;
        };
        for verb in verbs {
            if !urls.is_empty() {
                for url in urls {
                    rules.insert((url.to_string(), String::new(), verb.to_string()));
                }
            } else if names.is_empty() {
                rules.insert((resource.to_string(), String::new(), verb.to_string()));
            } else {
                for name in names {
                    rules.insert((resource.to_string(), name.to_string(), verb.to_string()));
                }
            }
        }
    }
    rules
}

/// The rules the authorizer grants service account `sa` of `namespace` (with the groups its
/// token carries) in namespace `asked`.
fn granted(node: &Node, namespace: &str, sa: &str, asked: &str) -> anyhow::Result<BTreeSet<Rule>> {
    let table = node.kubectl_out(&[
        "auth",
        "can-i",
        "--list",
        &format!("--as=system:serviceaccount:{namespace}:{sa}"),
        "--as-group=system:serviceaccounts",
        &format!("--as-group=system:serviceaccounts:{namespace}"),
        "--as-group=system:authenticated",
        "-n",
        asked,
    ])?;
    Ok(parse_rules(&table))
}

/// What the daemon of a rendering is: DRA mode or not, its driver, the DeviceClasses it
/// applies, its ServiceAccount.
struct Daemon {
    dra: bool,
    driver: String,
    classes: BTreeSet<String>,
    sa: String,
}

impl Daemon {
    fn of(rendered: &str) -> anyhow::Result<Daemon> {
        let (_, config) = crate::deploy::daemon_of(rendered)
            .context("the rendering has no daemon container and configuration")?;
        let objects = crate::deploy::parse_objects(rendered)?;
        let sa = objects
            .iter()
            .find(|o| o.kind == "DaemonSet")
            .and_then(|o| o.value.pointer("/spec/template/spec/serviceAccountName"))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        Ok(Daemon {
            dra: config.pointer("/dra/enabled") == Some(&Value::Bool(true)),
            driver: config
                .pointer("/dra/driverName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            classes: config
                .pointer("/dra/deviceClasses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .map(str::to_string)
                .collect(),
            sa,
        })
    }

    /// What the daemon may be granted in namespace `asked`, and what of it it must be granted.
    fn allowed(&self, asked: &str) -> (BTreeSet<Rule>, BTreeSet<Rule>) {
        let (mut allowed, mut required) = (BTreeSet::new(), BTreeSet::new());
        if !self.dra {
            return (allowed, required);
        }
        let rule = |r: &str, n: &str, v: &str| (r.to_string(), n.to_string(), v.to_string());
        for u in DAEMON_USES
            .iter()
            .filter(|u| u.namespace.is_none_or(|n| n == asked))
        {
            for verb in u.verbs {
                let r = rule(&use_resource(u), "", verb);
                if u.required {
                    required.insert(r.clone());
                }
                allowed.insert(r);
            }
        }
        for class in &self.classes {
            for verb in DEVICE_CLASS_VERBS {
                let r = rule("deviceclasses.resource.k8s.io", class, verb);
                required.insert(r.clone());
                allowed.insert(r);
            }
        }
        allowed.insert(rule(
            "resourceclaims.resource.k8s.io/driver",
            &self.driver,
            "associated-node:patch",
        ));
        (allowed, required)
    }
}

/// The ServiceAccount, roles and bindings of a rendering, as one `List`, changed by `mutate`.
fn access_objects(rendered: &str, mutate: &dyn Fn(&mut Vec<Value>)) -> anyhow::Result<Value> {
    const KINDS: &[&str] = &[
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let mut items: Vec<Value> = crate::deploy::parse_objects(rendered)?
        .into_iter()
        .filter(|o| KINDS.contains(&o.kind.as_str()))
        .map(|o| o.value)
        .collect();
    mutate(&mut items);
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

/// Applies the access objects of `rendered` (release and namespace `namespace`, changed by
/// `mutate`), reads what the authorizer grants its daemon's account in each namespace, removes
/// them again; returns what is wrong.
fn judge(
    node: &Node,
    namespace: &str,
    rendered: &str,
    mutate: &dyn Fn(&mut Vec<Value>),
) -> anyhow::Result<Vec<String>> {
    let daemon = Daemon::of(rendered)?;
    let objects = access_objects(rendered, mutate)?.to_string();
    node.kubectl_out(&["create", "namespace", namespace])?;
    let judged = apply(node, &objects).and_then(|()| {
        let asked: Vec<&str> = ASKED.iter().copied().chain([namespace]).collect();
        // An account without bindings: what every account gets.
        let baselines: Vec<BTreeSet<Rule>> = asked
            .iter()
            .map(|a| granted(node, namespace, "kubedev-rbac-nobody", a))
            .collect::<anyhow::Result<_>>()?;
        // The authorizer sees new roles through its informers: wait until what it lists holds
        // still and, in DRA mode, the roles show (or 20 s pass, and the lists are judged as
        // they are).
        let read = || -> anyhow::Result<Vec<BTreeSet<Rule>>> {
            asked
                .iter()
                .map(|a| granted(node, namespace, &daemon.sa, a))
                .collect()
        };
        let shows = |lists: &[BTreeSet<Rule>]| {
            !daemon.dra || lists.iter().zip(&baselines).any(|(l, b)| !l.is_subset(b))
        };
        let mut last = read()?;
        let began = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = read()?;
            let still = now == last && began.elapsed() > Duration::from_secs(2);
            let done = (still && shows(&now)) || began.elapsed() > Duration::from_secs(20);
            last = now;
            if done {
                break;
            }
        }
        let mut problems = Vec::new();
        for ((asked, granted), baseline) in asked.iter().zip(&last).zip(&baselines) {
            let (allowed, required) = daemon.allowed(asked);
            for (resource, name, verb) in granted.difference(baseline) {
                if !allowed.contains(&(resource.clone(), name.clone(), verb.clone())) {
                    let on = described(resource, name);
                    problems.push(format!(
                        "the daemon's account may {verb} {on} in namespace {asked}, which the \
                         daemon does not"
                    ));
                }
            }
            for (resource, name, verb) in required.difference(granted) {
                let on = described(resource, name);
                problems.push(format!(
                    "the daemon's account may not {verb} {on} in namespace {asked}, which the \
                     daemon does"
                ));
            }
        }
        Ok(problems)
    });
    let removed = kubectl_with_manifest(node, &["delete", "--ignore-not-found"], &objects)
        .and_then(|()| node.kubectl_out(&["delete", "namespace", namespace, "--wait=false"]));
    let judged = judged?;
    removed?;
    Ok(judged)
}

/// A rule's resource for messages: `resource`, or `resource named name`.
fn described(resource: &str, name: &str) -> String {
    if name.is_empty() {
        resource.to_string()
    } else {
        format!("{resource} named {name}")
    }
}

/// The rules of the first ClusterRole among `items`.
fn cluster_role_rules(items: &mut [Value]) -> Option<&mut Vec<Value>> {
    items
        .iter_mut()
        .find(|o| o["kind"] == "ClusterRole")?
        .get_mut("rules")?
        .as_array_mut()
}

/// The values file whose rendering is mutated.
const MUTATED: &str = "vfio-values.yaml";

/// A mutation of the rendering of [`MUTATED`] and a piece of what the check must then say.
type Mutation = (&'static str, fn(&mut Vec<Value>), &'static str);

const MUTATIONS: &[Mutation] = &[
    (
        "a wildcard verb",
        |items| {
            if let Some(rules) = cluster_role_rules(items) {
                rules[0]["verbs"] = json!(["*"]);
            }
        },
        "may * resourceslices.resource.k8s.io",
    ),
    (
        "secrets",
        |items| {
            if let Some(rules) = cluster_role_rules(items) {
                rules.push(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}));
            }
        },
        "may get secrets",
    ),
    (
        "events across the cluster",
        |items| {
            if let Some(rules) = cluster_role_rules(items) {
                rules.push(
                    json!({"apiGroups": ["events.k8s.io"], "resources": ["events"],
                    "verbs": ["create"]}),
                );
            }
        },
        "may create events.events.k8s.io in namespace kubedev-rbac-elsewhere",
    ),
    (
        "every DeviceClass",
        |items| {
            if let Some(rules) = cluster_role_rules(items)
                && let Some(r) = rules
                    .iter_mut()
                    .find(|r| r["resources"][0] == "deviceclasses")
                && let Some(r) = r.as_object_mut()
            {
                r.remove("resourceNames");
            }
        },
        "may create deviceclasses.resource.k8s.io in",
    ),
    (
        "a non-resource URL",
        |items| {
            if let Some(rules) = cluster_role_rules(items) {
                rules.push(json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}));
            }
        },
        "may get /metrics",
    ),
    (
        "a verb taken away",
        |items| {
            if let Some(rules) = cluster_role_rules(items)
                && let Some(r) = rules
                    .iter_mut()
                    .find(|r| r["resources"][0] == "resourceclaims")
            {
                r["verbs"] = json!(["get"]);
            }
        },
        "may not list resourceclaims.resource.k8s.io",
    ),
];

/// Every rendering judged, then each mutation of [`MUTATED`]'s caught.
pub(super) fn rbac_of_every_rendering(node: &Node, root: &Path) -> anyhow::Result<()> {
    let helm = crate::deploy::helm::binary(root)?;
    let chart = root.join(crate::deploy::CHART);
    let mut problems = Vec::new();
    for (i, values) in crate::deploy::values_files(&chart)?.iter().enumerate() {
        let label = values
            .as_deref()
            .and_then(Path::file_name)
            .map_or("default values".into(), |f| {
                f.to_string_lossy().into_owned()
            });
        let release = format!("kubedev-rbac-{i}");
        let rendered =
            crate::deploy::helm::render_as(&helm, &chart, values.as_deref(), &release, &release)?;
        let found = judge(node, &release, &rendered, &|_| {})?;
        eprintln!(
            "  {label}: {}",
            if found.is_empty() {
                "the authorizer grants the daemon's account what it does and nothing else"
            } else {
                "wrong"
            }
        );
        problems.extend(found.into_iter().map(|p| format!("{label}: {p}")));
    }
    ensure!(
        problems.is_empty(),
        "RBAC as the real authorizer grants it:\n{}",
        indent(&problems.join("\n"))
    );
    for (j, (what, mutate, expected)) in MUTATIONS.iter().enumerate() {
        let release = format!("kubedev-rbac-m{j}");
        let values = chart.join("ci").join(MUTATED);
        let rendered =
            crate::deploy::helm::render_as(&helm, &chart, Some(&values), &release, &release)?;
        let found = judge(node, &release, &rendered, mutate)?;
        ensure!(
            found.iter().any(|p| p.contains(expected)),
            "with {what}, the check did not say \"{expected}\"; it found: {found:?}"
        );
        eprintln!("  mutation: {what} is caught");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authorizers_rule_table_reads_as_rules() {
        let table = "\
Resources                                       Non-Resource URLs   Resource Names            Verbs
resourceclaims.resource.k8s.io/driver           []                  [devices.kubedev.io]      [associated-node:patch]
deviceclasses.resource.k8s.io                   []                  [a.x b.x]                 [create patch]
nodes                                           []                  []                        [get]
                                                [/api/*]            []                        [get]
";
        let rules = parse_rules(table);
        let r = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            rules,
            BTreeSet::from([
                r(
                    "resourceclaims.resource.k8s.io/driver",
                    "devices.kubedev.io",
                    "associated-node:patch"
                ),
                r("deviceclasses.resource.k8s.io", "a.x", "create"),
                r("deviceclasses.resource.k8s.io", "a.x", "patch"),
                r("deviceclasses.resource.k8s.io", "b.x", "create"),
                r("deviceclasses.resource.k8s.io", "b.x", "patch"),
                r("nodes", "", "get"),
                r("/api/*", "", "get"),
            ])
        );
    }

    #[test]
    fn uses_are_named_as_the_authorizer_names_them() {
        let names: Vec<String> = DAEMON_USES.iter().map(use_resource).collect();
        assert!(names.contains(&"resourceclaims.resource.k8s.io/status".to_string()));
        assert!(names.contains(&"nodes".to_string()));
        assert!(names.contains(&"events.events.k8s.io".to_string()));
    }
}
