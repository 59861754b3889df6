//! Label and field selectors as the API server parses them from `labelSelector` and
//! `fieldSelector` query parameters.

use std::collections::BTreeSet;

use serde_json::Value;

use super::resource::Resource;
use super::status::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

/// Splits at commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_label_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl LabelSelector {
    /// Parses the `labelSelector` syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`,
    /// `a`, `!a`, joined by commas.
    pub(crate) fn parse(text: &str) -> Result<Self, ApiError> {
        let bad = |term: &str, why: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement {term:?} of labelSelector: {why}"
            ))
        };
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for raw in split_top_level(text) {
            let term = raw.trim();
            if term.is_empty() {
                return Err(bad(term, "empty requirement"));
            }
            let req = if let Some(key) = term.strip_prefix('!') {
                let key = key.trim();
                if !valid_label_key(key) {
                    return Err(bad(term, "invalid label key"));
                }
                LabelRequirement::NotExists(key.to_owned())
            } else if let Some(open) = term.find('(') {
                let Some(inner) = term[open + 1..].strip_suffix(')') else {
                    return Err(bad(term, "missing closing parenthesis"));
                };
                let head = term[..open].trim_end();
                let values: BTreeSet<String> = inner
                    .split(',')
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
                    .collect();
                if let Some(key) = head.strip_suffix(" notin") {
                    LabelRequirement::NotIn(key.trim().to_owned(), values)
                } else if let Some(key) = head.strip_suffix(" in") {
                    LabelRequirement::In(key.trim().to_owned(), values)
                } else {
                    return Err(bad(term, "expected 'in' or 'notin'"));
                }
            } else if let Some((k, v)) = term.split_once("!=") {
                LabelRequirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = term.split_once("==") {
                LabelRequirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = term.split_once('=') {
                LabelRequirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else {
                LabelRequirement::Exists(term.to_owned())
            };
            let key = match &req {
                LabelRequirement::Equals(k, _)
                | LabelRequirement::NotEquals(k, _)
                | LabelRequirement::In(k, _)
                | LabelRequirement::NotIn(k, _)
                | LabelRequirement::Exists(k)
                | LabelRequirement::NotExists(k) => k,
            };
            if !valid_label_key(key) {
                return Err(bad(term, "invalid label key"));
            }
            requirements.push(req);
        }
        Ok(Self { requirements })
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|req| match req {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            LabelRequirement::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, joined by commas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    /// (field, value, wanted equal)
    requirements: Vec<(String, String, bool)>,
}

/// Splits at commas not escaped with a backslash, and removes the escapes.
fn split_unescaped(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    current.push('\\');
                    current.push(next);
                }
            }
            ',' => parts.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts
}

fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Finds the first operator that is not escaped: returns (index, operator length, equal?).
fn find_operator(term: &str) -> Option<(usize, usize, bool)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'!' if bytes.get(i + 1) == Some(&b'=') => return Some((i, 2, false)),
            b'=' if bytes.get(i + 1) == Some(&b'=') => return Some((i, 2, true)),
            b'=' => return Some((i, 1, true)),
            _ => i += 1,
        }
    }
    None
}

impl FieldSelector {
    /// Parses a field selector and checks every field is one the resource supports.
    pub(crate) fn parse(text: &str, resource: Resource) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in split_unescaped(text) {
            let Some((at, len, equal)) = find_operator(&term) else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = unescape(term[..at].trim());
            let value = unescape(&term[at + len..]);
            if !resource.field_selectors().contains(&field.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: field label not supported: {field}"
                )));
            }
            requirements.push((field, value, equal));
        }
        Ok(Self { requirements })
    }

    /// Whether the object's selectable fields satisfy every requirement. A field that is not set
    /// reads as the empty string, as in the API server.
    pub(crate) fn matches(&self, resource: Resource, object: &Value) -> bool {
        self.requirements.iter().all(|(field, value, equal)| {
            let actual = resource.field_value(object, field);
            (actual == *value) == *equal
        })
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selectors {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Selectors {
    /// The `labelSelector` and `fieldSelector` of a request's query (empty when absent).
    pub(crate) fn from_query(
        resource: Resource,
        query: &std::collections::HashMap<String, String>,
    ) -> Result<Selectors, ApiError> {
        let param = |name: &str| query.get(name).map(String::as_str).unwrap_or("");
        Ok(Selectors {
            labels: LabelSelector::parse(param("labelSelector"))?,
            fields: FieldSelector::parse(param("fieldSelector"), resource)?,
        })
    }

    /// Whether the object passes both selectors.
    pub(crate) fn matches(&self, resource: Resource, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(resource, object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors_follow_the_api_grammar() {
        let obj = json!({"metadata": {"labels": {"app": "gpu", "tier": "a"}}});
        let yes = [
            "app=gpu",
            "app==gpu",
            "app!=cpu",
            "app in (gpu, x)",
            "zone notin (a)",
            "app",
            "!zone",
            "app=gpu,tier=a",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).expect(s).matches(&obj), "{s}");
        }
        let no = [
            "app=cpu",
            "app!=gpu",
            "app in (x)",
            "tier notin (a,b)",
            "zone",
            "!app",
            "app=gpu,tier=b",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).expect(s).matches(&obj), "{s}");
        }
        assert!(LabelSelector::parse("app in (x").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
    }

    #[test]
    fn field_selectors_check_supported_fields() {
        let slice = json!({"metadata": {"name": "s1"}, "spec": {"driver": "gpu.example.com", "nodeName": "n1"}});
        let sel = FieldSelector::parse(
            "spec.driver=gpu.example.com,spec.nodeName!=n2",
            Resource::ResourceSlices,
        )
        .expect("parse");
        assert!(sel.matches(Resource::ResourceSlices, &slice));
        let err = FieldSelector::parse("spec.pool.name=x", Resource::ResourceSlices)
            .expect_err("unsupported");
        assert_eq!(err.code, 400);
        assert!(err.message.contains("spec.pool.name"), "{}", err.message);
        let empty =
            FieldSelector::parse("spec.nodeName=", Resource::ResourceSlices).expect("parse");
        assert!(empty.matches(
            Resource::ResourceSlices,
            &json!({"spec": {"allNodes": true}})
        ));
    }
}
