//! The parts of a stored object the server reads and writes: metadata fields, type meta,
//! the spec part whose change bumps the generation, generated name suffixes and timestamps.

use serde_json::{Map, Value, json};

use crate::apiserver::resource::Resource;
use crate::apiserver::status::ApiError;

pub(super) const NAME_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
pub(super) const GENERATED_NAME_PREFIX_MAX: usize = 63 - 5;

pub(super) fn random_suffix() -> String {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes[..5]
        .iter()
        .map(|b| NAME_SUFFIX_ALPHABET[usize::from(*b) % NAME_SUFFIX_ALPHABET.len()] as char)
        .collect()
}

pub(crate) fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .map(|t| t.to_string())
        .unwrap_or_else(|_| now.to_string())
}

pub(super) fn meta(object: &Value) -> &Value {
    object.get("metadata").unwrap_or(&Value::Null)
}

pub(super) fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    meta(object)
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(super) fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    let map = object.as_object_mut().expect("made an object above");
    let m = map.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("made an object above")
}

pub(super) fn set_meta(object: &mut Value, field: &str, value: Value) {
    meta_mut(object).insert(field.to_owned(), value);
}

/// The object without metadata and status: what a change of bumps `metadata.generation`.
pub(super) fn spec_part(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
        map.remove("apiVersion");
        map.remove("kind");
    }
    copy
}

/// The object without the fields the server rewrites on every write, for no-op detection.
pub(super) fn comparable(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(m) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    copy
}

pub(super) fn has_finalizers(object: &Value) -> bool {
    meta(object)
        .get("finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

pub(super) fn check_type_meta(resource: Resource, object: &Value) -> Result<(), ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    if (!api_version.is_empty() && api_version != resource.api_version())
        || (!kind.is_empty() && kind != resource.kind())
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) and the kind ({kind}) do not match the expected {}, Kind={}",
            resource.api_version(),
            resource.kind()
        )));
    }
    Ok(())
}

pub(super) fn set_type_meta(resource: Resource, object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), Value::from(resource.api_version()));
        map.insert("kind".into(), Value::from(resource.kind()));
    }
}
