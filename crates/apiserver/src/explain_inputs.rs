//! What `kubedev explain` reads from a live cluster: every ResourceSlice, DeviceClass,
//! ResourceClaim, DeviceTaintRule (where the server has them) and Node, and the pod asked about, as the `List` JSON that `kubectl get -o
//! json` prints (each item with its `apiVersion` and `kind`). Lists are read in pages.

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::{Value, json};

use crate::error::Error;

/// Objects per page of a list.
const PAGE: u32 = 500;

/// Reads the cluster for `kubedev explain`: one JSON `List` text per resource, plus the pod
/// `namespace/name` when given. The DRA objects are read at `resource.k8s.io/v1`, or
/// `v1beta2` from servers without `v1` (the two have the same shape).
pub async fn read_explain_inputs(
    client: &kube::Client,
    pod: Option<(&str, &str)>,
) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    let mut dra_version = None;
    for version in ["v1", "v1beta2"] {
        match list(
            client,
            "resource.k8s.io",
            version,
            "ResourceSlice",
            "resourceslices",
        )
        .await
        {
            Ok(text) => {
                out.push(text);
                dra_version = Some(version);
                break;
            }
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    let Some(version) = dra_version else {
        return Err(Error::Explain {
            what: "ResourceSlices".into(),
            message: "the API server serves neither resource.k8s.io/v1 nor v1beta2".into(),
        });
    };
    out.push(
        list(
            client,
            "resource.k8s.io",
            version,
            "DeviceClass",
            "deviceclasses",
        )
        .await?,
    );
    out.push(
        list(
            client,
            "resource.k8s.io",
            version,
            "ResourceClaim",
            "resourceclaims",
        )
        .await?,
    );
    // DeviceTaintRules taint devices as the scheduler sees them; a server without them at
    // this version (before Kubernetes 1.37) has none in force.
    match list(
        client,
        "resource.k8s.io",
        version,
        "DeviceTaintRule",
        "devicetaintrules",
    )
    .await
    {
        Ok(text) => out.push(text),
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(e),
    }
    out.push(list(client, "", "v1", "Node", "nodes").await?);
    if let Some((namespace, name)) = pod {
        let ar = resource("", "v1", "Pod", "pods");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
        match api.get_opt(name).await {
            Ok(Some(p)) => out.push(typed(&ar, &p)?.to_string()),
            // Left to explain, which says the pod is not in its input.
            Ok(None) => {}
            Err(e) => {
                return Err(Error::ExplainRead {
                    what: format!("Pod {namespace}/{name}"),
                    error: Box::new(e),
                });
            }
        }
    }
    Ok(out)
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

/// An object as JSON with its `apiVersion` and `kind` (list items come without them).
fn typed(ar: &ApiResource, object: &DynamicObject) -> Result<Value, Error> {
    let mut v = serde_json::to_value(object).map_err(|e| Error::Explain {
        what: ar.kind.clone(),
        message: kubedev_core::echo::chain(&e),
    })?;
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(ar.api_version));
        m.insert("kind".into(), json!(ar.kind));
    }
    Ok(v)
}

/// Every object of a cluster-wide list, page by page, as one `List` text.
async fn list(
    client: &kube::Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Result<String, Error> {
    let ar = resource(group, version, kind, plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(|e| Error::ExplainRead {
            what: format!("{plural}.{}", ar.api_version),
            error: Box::new(e),
        })?;
        for object in &page.items {
            items.push(typed(&ar, object)?);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())
}

fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::ExplainRead { error, .. } if matches!(&**error, kube::Error::Api(s) if s.code == 404))
}
