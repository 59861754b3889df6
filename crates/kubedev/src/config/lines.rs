//! Where each field of a configuration file is written, so that errors can name the line.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser};

/// The line (1-based) of every key and sequence item of a YAML text, by field path as errors
/// name it: `devicePlugin.resources[0].selector.cel`.
#[derive(Debug, Default)]
pub(super) struct FieldLines(HashMap<String, usize>);

/// A collection being read, with the path of the collection itself.
enum Frame {
    /// A mapping; `key` is the path of the key whose value comes next, if one does.
    Map { path: String, key: Option<String> },
    /// A sequence; `next` is the index of its next item.
    Seq { path: String, next: usize },
}

/// Where a node sits in its parent.
enum Place {
    /// A mapping key, with the path it names.
    Key(String),
    /// A value or a sequence item, with its path.
    Value(String),
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

impl FieldLines {
    /// The fields of the first document of `text`; text that does not parse yields what could be
    /// read before the error.
    pub(super) fn new(text: &str) -> Self {
        let mut lines = HashMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            let line = span.start.line();
            let (scalar, opens) = match &event {
                Event::Scalar(value, ..) => (Some(value.to_string()), None),
                Event::Alias(_) | Event::UnresolvedAlias(_) => (None, None),
                Event::MappingStart(..) => (None, Some(true)),
                Event::SequenceStart(..) => (None, Some(false)),
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    continue;
                }
                Event::DocumentEnd => break,
                _ => continue,
            };
            let place = match stack.last_mut() {
                None => Place::Value(String::new()),
                Some(Frame::Map { path, key }) => match key.take() {
                    Some(value) => Place::Value(value),
                    None => {
                        let named = join(path, scalar.as_deref().unwrap_or("?"));
                        *key = Some(named.clone());
                        Place::Key(named)
                    }
                },
                Some(Frame::Seq { path, next }) => {
                    let item = format!("{path}[{next}]");
                    *next += 1;
                    lines.entry(item.clone()).or_insert(line);
                    Place::Value(item)
                }
            };
            let path = match place {
                Place::Key(named) => {
                    lines.entry(named.clone()).or_insert(line);
                    named
                }
                Place::Value(path) => path,
            };
            match opens {
                Some(true) => stack.push(Frame::Map { path, key: None }),
                Some(false) => stack.push(Frame::Seq { path, next: 0 }),
                None => {}
            }
        }
        FieldLines(lines)
    }

    /// The line of `field` as [`FieldLines::line`] finds it; for a field the file leaves out
    /// but needs, the line of what needs it (`dra.enabled` needs `nodeName`).
    pub(super) fn line_or_cause(&self, field: &str) -> Option<usize> {
        let causes: &[&str] = match field {
            "nodeName" => &["dra.enabled"],
            "backends" => &["dra.enabled", "devicePlugin.resources", "devicePlugin"],
            _ => &[],
        };
        self.line(field)
            .or_else(|| causes.iter().find_map(|c| self.line(c)))
    }

    /// The line of `field`, or else of the nearest field around it that the text writes (a field
    /// left at its default is not written).
    pub(super) fn line(&self, field: &str) -> Option<usize> {
        let mut field = field;
        loop {
            if let Some(line) = self.0.get(field) {
                return Some(*line);
            }
            let cut = field.rfind(['.', '['])?;
            field = &field[..cut];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# a comment
nodeName: n
devicePlugin:
  resources:
    - name: example.com/a
    - name: example.com/b
      selector:
        cel: >-
          device.driver == \"x\"
backends:
  static: {pool: p, devices: [{name: a}, {name: b}]}
";

    #[test]
    fn keys_and_items_have_their_lines() {
        let lines = FieldLines::new(TEXT);
        assert_eq!(lines.line("nodeName"), Some(2));
        assert_eq!(lines.line("devicePlugin"), Some(3));
        assert_eq!(lines.line("devicePlugin.resources[0]"), Some(5));
        assert_eq!(lines.line("devicePlugin.resources[1].name"), Some(6));
        assert_eq!(
            lines.line("devicePlugin.resources[1].selector.cel"),
            Some(8)
        );
        assert_eq!(lines.line("backends.static.devices[1].name"), Some(11));
    }

    #[test]
    fn a_field_not_written_takes_the_line_around_it() {
        let lines = FieldLines::new(TEXT);
        assert_eq!(lines.line("devicePlugin.directory"), Some(3));
        assert_eq!(lines.line("devicePlugin.resources[1].replicas"), Some(6));
        assert_eq!(lines.line("metrics.address"), None);
        assert_eq!(FieldLines::new("a: [").line("a"), Some(1));
    }

    #[test]
    fn a_required_field_left_out_takes_the_line_of_what_requires_it() {
        let lines = FieldLines::new("dra:\n  driverName: d\n  enabled: true\n");
        assert_eq!(lines.line_or_cause("nodeName"), Some(3));
        assert_eq!(lines.line_or_cause("backends"), Some(3));
        assert_eq!(lines.line_or_cause("metrics.address"), None);
        let lines = FieldLines::new(TEXT);
        assert_eq!(
            lines.line_or_cause("nodeName"),
            Some(2),
            "written: its own line"
        );
    }
}
