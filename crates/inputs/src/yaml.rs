//! How kubedev words a YAML file it cannot read: the line and a sentence about the text, never
//! about the parser's settings or types. Callers put the file name in front.
//!
//! `kubedev simulate` (scenarios) and the daemon's configuration share this wording.

use std::borrow::Cow;

use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::{Budget, Error, MessageFormatter as _, UserMessageFormatter};

/// Options for cluster-sized YAML (thousands of slices), which exceeds the default event and
/// node budgets; the depth limit stays, it is what protects the stack. `max_scalar_bytes`
/// bounds all strings together. Returns the options and their budget (for error messages).
pub(crate) fn large_input(
    max_scalar_bytes: usize,
) -> (serde_saphyr::Options, serde_saphyr::Budget) {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 50_000_000;
    budget.max_nodes = 20_000_000;
    budget.max_total_scalar_bytes = max_scalar_bytes;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget.clone());
    (options, budget)
}

/// `line N: <what is wrong>` for an error of `serde_saphyr` reading a file with `budget` (the
/// limits the reader ran under, named when one is hit); the caller adds the file name.
///
/// A key that appears twice reads "key `x` appears twice", a key the format does not have reads
/// "unknown key `x`" with the keys allowed there, and a size limit names the limit and its
/// value.
pub fn describe_error(error: &Error, budget: &Budget) -> String {
    let inner = error.without_snippet();
    let message: Cow<'_, str> = match inner {
        Error::DuplicateMappingKey { key: Some(key), .. } => {
            format!("key `{key}` appears twice").into()
        }
        Error::DuplicateMappingKey { key: None, .. } => "a key appears twice".into(),
        Error::SerdeUnknownField {
            field, expected, ..
        } => unknown_key(field, expected).into(),
        Error::Budget { breach, .. } => limit_hit(breach, budget).into(),
        other => UserMessageFormatter.format_message(other),
    };
    match error.location() {
        Some(at) if at.line() > 0 => format!("line {}: {message}", at.line()),
        _ => message.into_owned(),
    }
}

/// The message for a key the format does not have.
pub(crate) fn unknown_key(key: &str, expected: &[&str]) -> String {
    if expected.is_empty() {
        format!("unknown key `{key}`: no keys are allowed here")
    } else {
        format!(
            "unknown key `{key}`; the keys allowed here are {}",
            expected.join(", ")
        )
    }
}

/// A sentence naming the limit the file went over and its value.
fn limit_hit(breach: &BudgetBreach, budget: &Budget) -> String {
    match breach {
        BudgetBreach::Nodes { .. } => format!(
            "the file holds more than {} values (each key, value, list and mapping counts), \
             the most kubedev reads from one file",
            budget.max_nodes
        ),
        BudgetBreach::Events { .. } => format!(
            "the file has more than {} YAML elements, the most kubedev reads from one file",
            budget.max_events
        ),
        BudgetBreach::Depth { .. } => format!(
            "lists and mappings are nested more than {} levels deep, the most kubedev reads",
            budget.max_depth
        ),
        BudgetBreach::ScalarBytes { .. } => format!(
            "the values in the file add up to more than {} bytes, the most kubedev reads from \
             one file",
            budget.max_total_scalar_bytes
        ),
        BudgetBreach::Documents { .. } => format!(
            "the file has more than {} YAML documents, the most kubedev reads",
            budget.max_documents
        ),
        BudgetBreach::Aliases { .. } => format!(
            "the file uses more than {} aliases (`*name`), the most kubedev reads",
            budget.max_aliases
        ),
        BudgetBreach::Anchors { .. } => format!(
            "the file defines more than {} anchors (`&name`), the most kubedev reads",
            budget.max_anchors
        ),
        BudgetBreach::MergeKeys { .. } => format!(
            "the file uses more than {} merge keys (`<<`), the most kubedev reads",
            budget.max_merge_keys
        ),
        BudgetBreach::AliasAnchorRatio { aliases, anchors } => format!(
            "the file uses its {anchors} anchors through {aliases} aliases, more than {} \
             aliases per anchor, which kubedev refuses as an alias bomb",
            budget.alias_anchor_ratio_multiplier
        ),
        BudgetBreach::InputBytes { .. } => match budget.max_reader_input_bytes {
            Some(limit) => format!(
                "the file is larger than {limit} bytes, the most kubedev reads from one file"
            ),
            None => "the file is too large for kubedev to read".to_string(),
        },
        BudgetBreach::SequenceUnbalanced => {
            "a list or mapping ends that never started: the file is cut short or malformed"
                .to_string()
        }
        _ => "the file is too large or too deeply aliased for kubedev to read".to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        name: String,
        #[serde(default)]
        items: Vec<BTreeMap<String, u32>>,
    }

    fn read(text: &str, budget: Budget) -> String {
        let mut options = serde_saphyr::Options::default();
        options.budget = Some(budget.clone());
        let err = serde_saphyr::from_str_with_options::<Doc>(text, options).unwrap_err();
        format!("doc.yaml: {}", describe_error(&err, &budget))
    }

    #[test]
    fn a_duplicate_key_is_named_with_its_line() {
        let msg = read("name: a\nitems: []\nname: b\n", Budget::default());
        assert_eq!(msg, "doc.yaml: line 3: key `name` appears twice");
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line_and_the_allowed_keys() {
        let msg = read("name: a\niterms: []\n", Budget::default());
        assert_eq!(
            msg,
            "doc.yaml: line 2: unknown key `iterms`; the keys allowed here are name, items"
        );
    }

    #[test]
    fn a_limit_is_named_with_its_value() {
        let mut budget = Budget::default();
        budget.max_nodes = 10;
        let items: String = (0..20).map(|i| format!("  - k{i}: {i}\n")).collect();
        let msg = read(&format!("name: a\nitems:\n{items}"), budget);
        assert!(
            msg.starts_with("doc.yaml: ")
                && msg.contains("more than 10 values")
                && !msg.contains("budget")
                && !msg.contains('{'),
            "{msg}"
        );
    }

    #[test]
    fn other_errors_keep_the_file_and_line_without_a_snippet() {
        let msg = read("name: a\nitems: 7\n", Budget::default());
        assert!(msg.starts_with("doc.yaml: line 2: "), "{msg}");
        assert!(!msg.contains("<input>") && !msg.contains('\n'), "{msg}");
    }
}
