//! Node selection: `nodeName`, `allNodes` and `core/v1` node selectors, as the scheduler's
//! node-affinity helper evaluates them.

use crate::api::{Node, NodeSelector, NodeSelectorRequirement};

/// Whether a node matches a node name, "all nodes", or a node selector (checked in that
/// order; none set means no match). A malformed selector is an error naming the problem.
pub(crate) fn node_matches(
    node: &Node,
    node_name: Option<&str>,
    all_nodes: bool,
    selector: Option<&NodeSelector>,
) -> Result<bool, String> {
    match (node_name.filter(|n| !n.is_empty()), all_nodes, selector) {
        (Some(name), _, _) => Ok(node.name == name),
        (None, true, _) => Ok(true),
        (None, false, Some(sel)) => selector_matches(node, sel),
        (None, false, None) => Ok(false),
    }
}

/// Terms are ORed; a selector without terms matches nothing.
pub(crate) fn selector_matches(node: &Node, sel: &NodeSelector) -> Result<bool, String> {
    let mut any = false;
    for term in &sel.node_selector_terms {
        let mut term_ok = true;
        for req in &term.match_expressions {
            if !label_requirement(node, req)? {
                term_ok = false;
            }
        }
        for req in &term.match_fields {
            if !field_requirement(node, req)? {
                term_ok = false;
            }
        }
        // An empty term matches nothing.
        if term.match_expressions.is_empty() && term.match_fields.is_empty() {
            term_ok = false;
        }
        any |= term_ok;
    }
    Ok(any)
}

fn label_requirement(node: &Node, req: &NodeSelectorRequirement) -> Result<bool, String> {
    let value = node.labels.get(req.key.as_str());
    let bad = |why: &str| {
        format!(
            "failed to parse node selector requirement {}={}({:?}): {why}",
            req.key, req.operator, req.values
        )
    };
    if req.key.is_empty() {
        return Err(bad("empty key"));
    }
    match req.operator.as_str() {
        "In" | "NotIn" => {
            if req.values.is_empty() {
                return Err(bad("values must be non-empty"));
            }
            let contained = value.is_some_and(|v| req.values.iter().any(|x| x == v));
            Ok(if req.operator == "In" {
                contained
            } else {
                !contained
            })
        }
        "Exists" | "DoesNotExist" => {
            if !req.values.is_empty() {
                return Err(bad("values must be empty"));
            }
            Ok(value.is_some() == (req.operator == "Exists"))
        }
        "Gt" | "Lt" => {
            if req.values.len() != 1 {
                return Err(bad("exactly one value is required"));
            }
            let bound: i64 = req.values[0]
                .parse()
                .map_err(|_| bad("the value must be an integer"))?;
            let Some(v) = value else {
                return Ok(false);
            };
            let Ok(v) = v.parse::<i64>() else {
                return Ok(false);
            };
            Ok(if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            })
        }
        other => Err(bad(&format!("unknown operator {other:?}"))),
    }
}

fn field_requirement(node: &Node, req: &NodeSelectorRequirement) -> Result<bool, String> {
    let bad = |why: &str| {
        format!(
            "failed to parse node selector field requirement {}={}({:?}): {why}",
            req.key, req.operator, req.values
        )
    };
    if req.key != "metadata.name" {
        return Err(bad("only metadata.name is supported"));
    }
    if req.values.len() != 1 {
        return Err(bad("exactly one value is required"));
    }
    match req.operator.as_str() {
        "In" => Ok(node.name == req.values[0]),
        "NotIn" => Ok(node.name != req.values[0]),
        other => Err(bad(&format!("unsupported operator {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::api::NodeSelectorTerm;

    fn node() -> Node {
        Node {
            name: "node-1".into(),
            labels: [
                ("region".to_string(), "r1".to_string()),
                ("gen".into(), "5".into()),
            ]
            .into_iter()
            .collect(),
            ..Node::default()
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|s| (*s).into()).collect(),
        }
    }

    fn sel(
        exprs: Vec<NodeSelectorRequirement>,
        fields: Vec<NodeSelectorRequirement>,
    ) -> NodeSelector {
        NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: exprs,
                match_fields: fields,
            }],
        }
    }

    #[test]
    fn operators() {
        let n = node();
        let m = |s: NodeSelector| selector_matches(&n, &s);
        assert_eq!(m(sel(vec![req("region", "In", &["r1"])], vec![])), Ok(true));
        assert_eq!(
            m(sel(vec![req("region", "NotIn", &["r1"])], vec![])),
            Ok(false)
        );
        assert_eq!(
            m(sel(vec![req("zone", "DoesNotExist", &[])], vec![])),
            Ok(true)
        );
        assert_eq!(m(sel(vec![req("gen", "Gt", &["4"])], vec![])), Ok(true));
        assert_eq!(m(sel(vec![req("gen", "Lt", &["4"])], vec![])), Ok(false));
        assert_eq!(
            m(sel(vec![], vec![req("metadata.name", "In", &["node-1"])])),
            Ok(true)
        );
        assert!(m(sel(vec![req("gen", "Bogus", &[])], vec![])).is_err());
        assert_eq!(node_matches(&n, Some("node-2"), true, None), Ok(false));
        assert_eq!(node_matches(&n, None, true, None), Ok(true));
        assert_eq!(node_matches(&n, None, false, None), Ok(false));
    }
}
