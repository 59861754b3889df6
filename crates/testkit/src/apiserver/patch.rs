//! JSON merge patch (RFC 7386) and JSON patch (RFC 6902) on `serde_json::Value`.

use serde_json::{Map, Value};

/// Applies an RFC 7386 merge patch: objects merge key by key, `null` removes a key, anything
/// else (arrays included) replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Decodes one JSON-pointer token (`~1` is `/`, `~0` is `~`).
fn decode_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Splits a JSON pointer into its parent pointer and last token.
fn split_pointer(path: &str) -> Result<(&str, String), String> {
    if path.is_empty() {
        return Err("the root cannot be the target of this operation".to_owned());
    }
    if !path.starts_with('/') {
        return Err(format!("invalid JSON pointer {path:?}"));
    }
    let at = path.rfind('/').unwrap_or(0);
    Ok((&path[..at], decode_token(&path[at + 1..])))
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let index: usize = token
        .parse()
        .map_err(|_| format!("invalid array index {token:?}"))?;
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if index > limit || (!allow_end && len == 0) {
        return Err(format!("array index {index} out of bounds"));
    }
    Ok(index)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    let target = doc
        .pointer_mut(parent)
        .ok_or_else(|| format!("path {parent:?} does not exist"))?;
    match target {
        Value::Object(map) => {
            map.insert(last, value);
            Ok(())
        }
        Value::Array(items) => {
            let index = array_index(&last, items.len(), true)?;
            items.insert(index, value);
            Ok(())
        }
        _ => Err(format!("path {parent:?} is neither an object nor an array")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let target = doc
        .pointer_mut(parent)
        .ok_or_else(|| format!("path {parent:?} does not exist"))?;
    match target {
        Value::Object(map) => map
            .remove(&last)
            .ok_or_else(|| format!("path {path:?} does not exist")),
        Value::Array(items) => {
            let index = array_index(&last, items.len(), false)?;
            Ok(items.remove(index))
        }
        _ => Err(format!("path {parent:?} is neither an object nor an array")),
    }
}

/// Applies an RFC 6902 JSON patch (add, remove, replace, move, copy, test). On error the
/// document may be partly changed; callers patch a copy.
pub(crate) fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), String> {
    let ops = patch
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for (i, op) in ops.iter().enumerate() {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or(format!("operation {i} has no \"op\""))?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or(format!("operation {i} has no \"path\""))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or(format!("operation {i} ({name}) has no \"value\""))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or(format!("operation {i} ({name}) has no \"from\""))
        };
        let result = match name {
            "add" => add(doc, path, value()?),
            "remove" => remove(doc, path).map(drop),
            "replace" => {
                if doc.pointer(path).is_none() {
                    Err(format!("path {path:?} does not exist"))
                } else if path.is_empty() {
                    *doc = value()?;
                    Ok(())
                } else {
                    let v = value()?;
                    remove(doc, path).and_then(|_| add(doc, path, v))
                }
            }
            "move" => {
                let from = from()?;
                remove(doc, from).and_then(|v| add(doc, path, v))
            }
            "copy" => {
                let from = from()?;
                let v = doc
                    .pointer(from)
                    .cloned()
                    .ok_or(format!("path {from:?} does not exist"))?;
                add(doc, path, v)
            }
            "test" => {
                let expected = value()?;
                if doc.pointer(path) == Some(&expected) {
                    Ok(())
                } else {
                    Err(format!("test failed at {path:?}"))
                }
            }
            other => Err(format!("unknown operation {other:?}")),
        };
        result.map_err(|e| format!("operation {i} ({name}): {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn json_patch_follows_rfc_6902() {
        let mut doc = json!({"status": {"conditions": [{"type": "A"}]}, "x": 1});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/status/conditions/-", "value": {"type": "B"}},
                {"op": "replace", "path": "/x", "value": 2},
                {"op": "test", "path": "/x", "value": 2},
                {"op": "copy", "from": "/x", "path": "/y"},
                {"op": "move", "from": "/y", "path": "/z"},
                {"op": "remove", "path": "/status/conditions/0"},
            ]),
        )
        .expect("patch applies");
        assert_eq!(
            doc,
            json!({"status": {"conditions": [{"type": "B"}]}, "x": 2, "z": 2})
        );
        let err = json_patch(&mut doc, &json!([{"op": "test", "path": "/x", "value": 3}]))
            .expect_err("test fails");
        assert!(err.contains("/x"), "{err}");
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert!(
            json_patch(
                &mut doc,
                &json!([{"op": "add", "path": "/status/conditions/9", "value": 1}])
            )
            .is_err()
        );
    }
}
