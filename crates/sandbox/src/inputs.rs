//! What a policy reads: the optional `kubedev_policy_inputs` export, parsed once at load.
//! The host then encodes only the attributes, capacities and counters a policy declared,
//! which makes every call cheaper. The format is documented in the crate docs.

/// A set of names from the declaration: every name, or the listed ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Names {
    All,
    /// Qualified names (`domain/id`) match as written; bare names match the id in each
    /// device's driver's domain.
    Listed(Vec<String>),
}

impl Names {
    fn is_none(&self) -> bool {
        matches!(self, Names::Listed(v) if v.is_empty())
    }

    /// Whether the qualified name `text` of a device of `driver` is in the set.
    pub(crate) fn wants(&self, text: &[u8], driver: &[u8]) -> bool {
        match self {
            Names::All => true,
            Names::Listed(names) => names.iter().any(|n| {
                let n = n.as_bytes();
                if n.contains(&b'/') {
                    n == text
                } else {
                    text.len() == driver.len() + 1 + n.len()
                        && text.starts_with(driver)
                        && text[driver.len()] == b'/'
                        && text.ends_with(n)
                }
            }),
        }
    }
}

/// The inputs a policy reads. Without a declaration it reads everything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inputs {
    pub(crate) attributes: Names,
    pub(crate) capacities: Names,
    pub(crate) counters: bool,
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs {
            attributes: Names::All,
            capacities: Names::All,
            counters: true,
        }
    }
}

/// Longest declaration, bytes.
pub(crate) const MAX_DECLARATION_BYTES: usize = 64 << 10;

impl Inputs {
    /// True when no attribute is sent (the NUMA node is still read from them by the host).
    pub(crate) fn no_attributes(&self) -> bool {
        self.attributes.is_none()
    }

    /// True when no capacity is sent.
    pub(crate) fn no_capacities(&self) -> bool {
        self.capacities.is_none()
    }

    /// Parses a declaration: one entry per line, `attribute NAME`, `capacity NAME` (`*` for
    /// every name) or `counters`; blank lines and lines starting with `#` are ignored.
    pub(crate) fn parse(text: &str) -> Result<Inputs, String> {
        let mut attributes = Names::Listed(Vec::new());
        let mut capacities = Names::Listed(Vec::new());
        let mut counters = false;
        for (no, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (keyword, name, extra) = (words.next(), words.next(), words.next());
            let at = || format!("line {}: {line:?}", no + 1);
            if extra.is_some() {
                return Err(format!("{}: one name per line", at()));
            }
            let target = match (keyword, name) {
                (Some("counters"), None) => {
                    counters = true;
                    continue;
                }
                (Some("attribute"), Some(n)) => (&mut attributes, n),
                (Some("capacity"), Some(n)) => (&mut capacities, n),
                _ => {
                    return Err(format!(
                        "{}: expected `attribute NAME`, `capacity NAME` or `counters`",
                        at()
                    ));
                }
            };
            let (set, name) = target;
            if name == "*" {
                *set = Names::All;
            } else if let Names::Listed(v) = set {
                if name.split('/').count() > 2 || name.starts_with('/') || name.ends_with('/') {
                    return Err(format!("{}: {name:?} is not an attribute name", at()));
                }
                v.push(name.to_string());
            }
        }
        Ok(Inputs {
            attributes,
            capacities,
            counters,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn declarations_parse_and_match_bare_and_qualified_names() {
        let i = Inputs::parse(
            "# spread\nattribute resource.kubernetes.io/pcieRoot\n\nattribute linkGroup\ncounters\n",
        )
        .unwrap();
        assert!(i.counters);
        assert!(i.no_capacities());
        assert!(!i.no_attributes());
        let d = b"gpu.example.com".as_slice();
        assert!(i.attributes.wants(b"resource.kubernetes.io/pcieRoot", d));
        assert!(i.attributes.wants(b"gpu.example.com/linkGroup", d));
        assert!(!i.attributes.wants(b"other.example.com/linkGroup", d));
        assert!(!i.attributes.wants(b"gpu.example.com/model", d));
        let all = Inputs::parse("capacity *").unwrap();
        assert!(all.capacities.wants(b"x.example.com/memory", d));
        assert!(!all.counters);
        assert_eq!(Inputs::parse("").unwrap().attributes, Names::Listed(vec![]));
    }

    #[test]
    fn bad_declarations_name_the_line() {
        for (text, want) in [
            ("attribute", "line 1"),
            ("attribute a b", "one name per line"),
            ("\nattributes x", "line 2"),
            ("attribute a/b/c", "not an attribute name"),
        ] {
            let e = Inputs::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
