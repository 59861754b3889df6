//! Reading a scenario of `kubedev simulate` from a file or text: YAML or JSON, every unknown key
//! an error naming it and its line.

use std::path::Path;

use kubedev_allocator::Scenario;

/// Why a scenario could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("read scenario file {path}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not a valid JSON scenario.
    #[error("{origin}: {message}")]
    Json {
        /// The file name (`scenario text` for [`scenario_from_text`]).
        origin: String,
        /// What is wrong, starting with the line (`line N: ...`).
        message: String,
    },
    /// The text is not a valid YAML scenario.
    #[error("{origin}: {message}")]
    Yaml {
        /// The file name (`scenario text` for [`scenario_from_text`]).
        origin: String,
        /// What is wrong, starting with the line (`line N: ...`).
        message: String,
    },
    /// An `allocatedDevices` entry or `allocatedShares` device is not `driver/pool/device`.
    #[error("{origin}: allocatedDevices or allocatedShares device {0} is not driver/pool/device", kubedev_core::echo::echo(.entry))]
    AllocatedDevice {
        /// The file name (`scenario text` for [`scenario_from_text`]).
        origin: String,
        /// The entry as written.
        entry: String,
    },
}

/// What errors call text given to [`scenario_from_text`].
const TEXT_ORIGIN: &str = "scenario text";

/// Reads a scenario from a YAML or JSON file (JSON when the first non-blank character is `{`).
/// Errors name the file.
pub fn read_scenario(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Reads a scenario from YAML or JSON text. Errors call it `scenario text`.
pub fn scenario_from_text(text: &str) -> Result<Scenario, ScenarioError> {
    parse(text, TEXT_ORIGIN)
}

fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
    let scenario: Scenario = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| ScenarioError::Json {
            origin: origin.to_string(),
            message: json_message(&e),
        })?
    } else {
        let (options, budget) = crate::yaml::large_input(256 << 20);
        serde_saphyr::from_str_with_options(text, options).map_err(|e| ScenarioError::Yaml {
            origin: origin.to_string(),
            message: crate::yaml::describe_error(&e, &budget),
        })?
    };
    if let Some(entry) = scenario.malformed_allocated_device() {
        return Err(ScenarioError::AllocatedDevice {
            origin: origin.to_string(),
            entry: entry.to_string(),
        });
    }
    Ok(scenario)
}

/// `line N: ...` for a JSON error, in the words used for YAML.
fn json_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let text = full.strip_suffix(&suffix).unwrap_or(&full);
    let text = match text.strip_prefix("unknown field `") {
        Some(rest) => match rest.split_once("`, expected ") {
            Some((key, expected)) => format!(
                "unknown key `{key}`; the keys allowed here are {}",
                expected.replace("one of ", "").replace('`', "")
            ),
            None => text.to_string(),
        },
        None => text.to_string(),
    };
    if e.line() > 0 {
        format!("line {}: {text}", e.line())
    } else {
        text
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GOOD: &str = "node:\n  name: node-1\nclaims:\n- metadata:\n    name: c\n  spec:\n    devices:\n      requests:\n      - name: r\n        exactly:\n          deviceClassName: gpu\n";

    #[test]
    fn an_unknown_top_level_key_is_an_error_naming_it_and_its_line() {
        let text = GOOD.replace("claims:", "claim:");
        let err = parse(&text, "s.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with("s.yaml: line 3: unknown key `claim`; the keys allowed here are "),
            "{err}"
        );
        assert!(err.contains("claims"), "{err}");
    }

    #[test]
    fn an_unknown_key_inside_an_object_is_an_error() {
        let text = GOOD.replace("deviceClassName", "deviceClass");
        let err = parse(&text, "s.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with("s.yaml: line 11: unknown key `deviceClass`"),
            "{err}"
        );
        let text = GOOD.replace("  name: node-1\n", "  name: node-1\n  label: {a: b}\n");
        let err = parse(&text, "s.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with("s.yaml: line 3: unknown key `label`"),
            "{err}"
        );
    }

    #[test]
    fn kubernetes_fields_allocation_does_not_use_are_accepted() {
        let text = format!(
            "description: a claim read from a cluster\nexpect: {{allocatable: true}}\nfeatures: [DRAPartitionableDevices]\n{}",
            GOOD.replace(
                "- metadata:\n    name: c\n",
                "- apiVersion: resource.k8s.io/v1\n  kind: ResourceClaim\n  metadata:\n    name: c\n    resourceVersion: \"7\"\n    creationTimestamp: \"2025-01-01T00:00:00Z\"\n    annotations: {a: b}\n  status: {reservedFor: []}\n",
            )
        );
        let s = parse(&text, "s.yaml").unwrap();
        assert_eq!(s.claims[0].metadata.name, "c");
    }

    #[test]
    fn a_duplicate_key_names_the_file_and_line() {
        let text = format!("{GOOD}node:\n  name: node-2\n");
        let err = parse(&text, "s.yaml").unwrap_err().to_string();
        assert_eq!(err, "s.yaml: line 12: key `node` appears twice");
    }

    #[test]
    fn json_errors_use_the_same_words() {
        let err = parse("{\"node\": {\"name\": \"n\"},\n \"claim\": []}", "s.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("s.json: line 2: unknown key `claim`; the keys allowed here are node,"),
            "{err}"
        );
    }

    #[test]
    fn text_is_called_scenario_text() {
        let err = scenario_from_text("node: {name: n}\nclaim: []\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("scenario text: line 2: "), "{err}");
        assert!(!err.contains("<input>"), "{err}");
    }
}
