//! Failures as the API server reports them: a `Status` object with an HTTP code, a machine
//! readable reason and a message, plus field-level causes for validation failures.

use serde_json::{Value, json};

/// One field-level problem found by validation, printed the way the API server prints it
/// (`spec.devices: Too many: 129: must have at most 128 items`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    /// The reason code of the cause (`FieldValueTooMany`, `FieldValueInvalid`, ...).
    pub(crate) kind: &'static str,
    /// The path of the offending field, for example `spec.devices[3].name`.
    pub(crate) field: String,
    /// The whole human-readable text, field path included.
    pub(crate) message: String,
}

impl FieldError {
    /// A required field is missing.
    pub(crate) fn required(field: &str, detail: &str) -> Self {
        Self::new("FieldValueRequired", field, "Required value", detail)
    }

    /// A field holds a value that is not allowed; `value` is already rendered (strings quoted).
    pub(crate) fn invalid(field: &str, value: &str, detail: &str) -> Self {
        let head = format!("Invalid value: {value}");
        Self::new("FieldValueInvalid", field, &head, detail)
    }

    /// A string field is longer than allowed.
    pub(crate) fn too_long(field: &str, max: usize) -> Self {
        Self::new(
            "FieldValueTooLong",
            field,
            "Too long",
            &format!("may not be more than {max} bytes"),
        )
    }

    /// A list or map has more entries than allowed.
    pub(crate) fn too_many(field: &str, actual: usize, max: usize) -> Self {
        Self::new(
            "FieldValueTooMany",
            field,
            &format!("Too many: {actual}"),
            &format!("must have at most {max} items"),
        )
    }

    /// The same key appears twice in a list that must hold unique keys.
    pub(crate) fn duplicate(field: &str, value: &str) -> Self {
        Self::new(
            "FieldValueDuplicate",
            field,
            &format!("Duplicate value: {}", quote(value)),
            "",
        )
    }

    /// The field may not be set or changed in this situation.
    pub(crate) fn forbidden(field: &str, detail: &str) -> Self {
        Self::new("FieldValueForbidden", field, "Forbidden", detail)
    }

    /// The value is not one of the supported values.
    pub(crate) fn not_supported(field: &str, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
        Self::new(
            "FieldValueNotSupported",
            field,
            &format!("Unsupported value: {}", quote(value)),
            &format!("supported values: {}", list.join(", ")),
        )
    }

    fn new(kind: &'static str, field: &str, head: &str, detail: &str) -> Self {
        let message = if detail.is_empty() {
            format!("{field}: {head}")
        } else {
            format!("{field}: {head}: {detail}")
        };
        Self {
            kind,
            field: field.to_owned(),
            message,
        }
    }
}

/// Renders a string value the way Go's `%q` does for plain text.
pub(crate) fn quote(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| format!("\"{value}\""))
}

/// A failed request: everything needed to answer with a Kubernetes `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn not_found(kind: &Kindish, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} {} not found", kind.qualified, quote(name)),
        );
        e.details = Some(kind.details(name));
        e
    }

    pub(crate) fn already_exists(kind: &Kindish, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} {} already exists", kind.qualified, quote(name)),
        );
        e.details = Some(kind.details(name));
        e
    }

    /// An optimistic-concurrency or precondition failure.
    pub(crate) fn conflict(kind: &Kindish, name: &str, why: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: {why}",
                kind.plural_qualified,
                quote(name)
            ),
        );
        e.details = Some(kind.details(name));
        e
    }

    /// A validation failure (HTTP 422) listing every field error.
    pub(crate) fn invalid(kind: &Kindish, name: &str, errors: &[FieldError]) -> Self {
        let joined = if errors.len() == 1 {
            errors[0].message.clone()
        } else {
            let all: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
            format!("[{}]", all.join(", "))
        };
        let mut details = kind.details(name);
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.kind, "message": e.message, "field": e.field}))
            .collect();
        details["kind"] = Value::from(kind.kind);
        details["causes"] = Value::Array(causes);
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{} {} is invalid: {joined}",
                kind.kind_qualified,
                quote(name)
            ),
        );
        e.details = Some(details);
        e
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The requested resourceVersion has been compacted away (what a watch from too far back
    /// receives).
    pub(crate) fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// The `Status` object sent as the response body or inside a watch `ERROR` event.
    pub(crate) fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty()
            && let Some(map) = v.as_object_mut()
        {
            // Errors the API server did not classify carry no reason.
            map.remove("reason");
        }
        if let Some(details) = &self.details {
            v["details"] = details.clone();
        }
        v
    }
}

/// The names a resource's error messages use.
#[derive(Debug, Clone)]
pub(crate) struct Kindish {
    /// `resourceslices.resource.k8s.io` or `nodes`.
    pub(crate) qualified: String,
    /// Same as `qualified`; the API server uses the plural in conflict messages.
    pub(crate) plural_qualified: String,
    /// `ResourceSlice.resource.k8s.io` or `Node`.
    pub(crate) kind_qualified: String,
    pub(crate) group: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) kind: &'static str,
}

impl Kindish {
    fn details(&self, name: &str) -> Value {
        json!({"name": name, "group": self.group, "kind": self.plural})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_errors_print_like_the_api_server() {
        assert_eq!(
            FieldError::too_many("spec.devices", 129, 128).message,
            "spec.devices: Too many: 129: must have at most 128 items"
        );
        assert_eq!(
            FieldError::required("spec.pool.name", "").message,
            "spec.pool.name: Required value"
        );
        assert_eq!(
            FieldError::invalid("spec.driver", &quote("A_B"), "must be lowercase").message,
            "spec.driver: Invalid value: \"A_B\": must be lowercase"
        );
    }
}
