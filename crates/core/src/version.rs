//! Semantic versions (semver.org 2.0.0), the type of DRA `version` attributes.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a semantic version. It names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// The string breaks the Semantic Versioning 2.0.0 grammar, or a number does not fit 64 bits.
    #[error("invalid semantic version {0}: {reason}", crate::echo::echo(.input))]
    Invalid {
        /// The rejected input.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One dot-separated pre-release identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PreRelease {
    Numeric(u64),
    Alphanumeric(String),
}

impl PreRelease {
    /// SemVer §11.4: numbers compare numerically and sort before alphanumerics, which compare
    /// in ASCII order.
    fn cmp_precedence(&self, other: &PreRelease) -> Ordering {
        match (self, other) {
            (PreRelease::Numeric(a), PreRelease::Numeric(b)) => a.cmp(b),
            (PreRelease::Numeric(_), PreRelease::Alphanumeric(_)) => Ordering::Less,
            (PreRelease::Alphanumeric(_), PreRelease::Numeric(_)) => Ordering::Greater,
            (PreRelease::Alphanumeric(a), PreRelease::Alphanumeric(b)) => {
                a.as_bytes().cmp(b.as_bytes())
            }
        }
    }
}

/// A version as Semantic Versioning 2.0.0 defines it: `MAJOR.MINOR.PATCH[-PRE][+BUILD]`.
///
/// Parsing checks the full grammar: three numeric core parts without leading zeros; non-empty,
/// dot-separated pre-release and build identifiers of `[0-9A-Za-z-]`; no leading zeros in
/// numeric pre-release identifiers. Numbers (the core parts and numeric pre-release
/// identifiers) must fit 64 bits: Kubernetes' API validation allows longer ones, but its CEL
/// `semver` functions cannot evaluate them, so they are rejected here up front.
///
/// Equality and hashing are exact: `1.0.0+a` and `1.0.0+b` differ, as Kubernetes'
/// `matchAttribute` and `distinctAttribute` constraints compare version strings. Ordering is
/// SemVer precedence (§11), with build metadata used only to break ties between versions of
/// equal precedence, so that it agrees with equality. For precedence alone, as Kubernetes' CEL
/// `semver` library compares, use [`cmp_precedence`](Version::cmp_precedence).
///
/// [`Display`](fmt::Display) and [`as_str`](Version::as_str) give back the parsed text.
///
/// ```
/// use kubedev_core::Version;
///
/// let rc: Version = "1.0.0-rc.1".parse()?;
/// let release: Version = "1.0.0".parse()?;
/// assert!(rc < release);
/// assert_eq!((release.major(), release.minor(), release.patch()), (1, 0, 0));
/// # Ok::<(), kubedev_core::VersionError>(())
/// ```
#[derive(Clone)]
pub struct Version {
    text: String,
    major: u64,
    minor: u64,
    patch: u64,
    pre_release: Vec<PreRelease>,
    /// Byte ranges of the pre-release part (after `-`) and build part (after `+`) in `text`.
    pre_release_range: Option<(usize, usize)>,
    build_start: Option<usize>,
}

impl Version {
    /// Parses a Semantic Versioning 2.0.0 version.
    pub fn parse(input: &str) -> Result<Version, VersionError> {
        let invalid = |reason: String| VersionError::Invalid {
            input: input.to_owned(),
            reason,
        };
        if input.is_empty() {
            return Err(invalid("it is empty".to_owned()));
        }
        let (rest, build) = match input.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (input, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };

        let parts: Vec<&str> = core.split('.').collect();
        if parts.len() != 3 {
            return Err(invalid(format!(
                "the version core {} must be MAJOR.MINOR.PATCH",
                crate::echo::echo(core)
            )));
        }
        let mut numbers = [0u64; 3];
        for ((slot, part), name) in numbers
            .iter_mut()
            .zip(&parts)
            .zip(["major", "minor", "patch"])
        {
            *slot =
                parse_number(part).map_err(|why| invalid(format!("the {name} version {why}")))?;
        }

        let mut pre_release = Vec::new();
        if let Some(pre) = pre {
            for (index, identifier) in pre.split('.').enumerate() {
                check_identifier(identifier).map_err(|why| {
                    invalid(format!("pre-release identifier {} {why}", index + 1))
                })?;
                if identifier.bytes().all(|b| b.is_ascii_digit()) {
                    let number = parse_number(identifier).map_err(|why| {
                        invalid(format!("pre-release identifier {} {why}", index + 1))
                    })?;
                    pre_release.push(PreRelease::Numeric(number));
                } else {
                    pre_release.push(PreRelease::Alphanumeric(identifier.to_owned()));
                }
            }
        }
        if let Some(build) = build {
            for (index, identifier) in build.split('.').enumerate() {
                check_identifier(identifier)
                    .map_err(|why| invalid(format!("build identifier {} {why}", index + 1)))?;
            }
        }

        let pre_release_range = pre.map(|pre| (core.len() + 1, core.len() + 1 + pre.len()));
        let build_start = build.map(|_| rest.len() + 1);
        let [major, minor, patch] = numbers;
        Ok(Version {
            text: input.to_owned(),
            major,
            minor,
            patch,
            pre_release,
            pre_release_range,
            build_start,
        })
    }

    /// The major version.
    pub fn major(&self) -> u64 {
        self.major
    }

    /// The minor version.
    pub fn minor(&self) -> u64 {
        self.minor
    }

    /// The patch version.
    pub fn patch(&self) -> u64 {
        self.patch
    }

    /// The pre-release part without its `-` (`rc.1` in `1.0.0-rc.1+b5`), if any.
    pub fn pre_release(&self) -> Option<&str> {
        self.pre_release_range
            .and_then(|(start, end)| self.text.get(start..end))
    }

    /// The build metadata without its `+` (`b5` in `1.0.0-rc.1+b5`), if any.
    pub fn build_metadata(&self) -> Option<&str> {
        self.build_start.and_then(|start| self.text.get(start..))
    }

    /// The version as it was parsed.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// SemVer precedence (§11): core numbers, then pre-release (a pre-release sorts before its
    /// release), ignoring build metadata. This is how Kubernetes' CEL `semver` library compares.
    pub fn cmp_precedence(&self, other: &Version) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(
                || match (self.pre_release.is_empty(), other.pre_release.is_empty()) {
                    (true, true) => Ordering::Equal,
                    (true, false) => Ordering::Greater,
                    (false, true) => Ordering::Less,
                    (false, false) => {
                        for (a, b) in self.pre_release.iter().zip(&other.pre_release) {
                            let order = a.cmp_precedence(b);
                            if order != Ordering::Equal {
                                return order;
                            }
                        }
                        self.pre_release.len().cmp(&other.pre_release.len())
                    }
                },
            )
    }
}

/// A numeric identifier: digits only, no leading zero, fits 64 bits.
fn parse_number(text: &str) -> Result<u64, &'static str> {
    if text.is_empty() {
        return Err("is empty");
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("must be a number");
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err("has a leading zero");
    }
    text.parse().map_err(|_| "does not fit 64 bits")
}

/// A pre-release or build identifier: non-empty, `[0-9A-Za-z-]` only.
fn check_identifier(identifier: &str) -> Result<(), String> {
    if identifier.is_empty() {
        return Err("is empty".to_owned());
    }
    match identifier
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        Some(c) => Err(format!("has the character {c:?} (allowed: 0-9 A-Z a-z -)")),
        None => Ok(()),
    }
}

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::parse(s)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.text)
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Version").field(&self.text).finish()
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Version {}

impl Hash for Version {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl Ord for Version {
    /// Precedence, then build metadata (absent first, then in ASCII order) to break ties.
    fn cmp(&self, other: &Self) -> Ordering {
        self.cmp_precedence(other).then_with(|| {
            self.build_metadata()
                .map(str::as_bytes)
                .cmp(&other.build_metadata().map(str::as_bytes))
        })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for Version {
    /// Serialises as the version string.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Version {
    /// Deserialises from a version string, with an error naming it when it is invalid.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct VersionVisitor;

        impl Visitor<'_> for VersionVisitor {
            type Value = Version;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a semantic version string such as \"1.2.3\"")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Version, E> {
                Version::parse(v).map_err(E::custom)
            }
        }

        deserializer.deserialize_str(VersionVisitor)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Found by the `quantity_version` fuzz target: a long core without dots was echoed twice
    /// in full (the input, then the core in the reason).
    #[test]
    fn a_long_invalid_version_gives_a_short_error() {
        let input = format!("\0\n\n\n\x0e\n\x030G{}", "\x1c".repeat(4096));
        let err = Version::parse(&input).unwrap_err().to_string();
        assert!(err.len() < 1024, "{} bytes: {err}", err.len());
        assert!(!err.chars().any(char::is_control), "{err:?}");
        assert!(err.contains("MAJOR.MINOR.PATCH"), "{err}");
    }

    #[test]
    fn accepts_valid_versions_from_semver_org() {
        for input in [
            "0.0.4",
            "1.2.3",
            "10.20.30",
            "1.1.2-prerelease+meta",
            "1.1.2+meta",
            "1.1.2+meta-valid",
            "1.0.0-alpha",
            "1.0.0-beta",
            "1.0.0-alpha.beta",
            "1.0.0-alpha.beta.1",
            "1.0.0-alpha.1",
            "1.0.0-alpha0.valid",
            "1.0.0-alpha.0valid",
            "1.0.0-alpha-a.b-c-somethinglong+build.1-aef.1-its-okay",
            "1.0.0-rc.1+build.1",
            "2.0.0-rc.1+build.123",
            "1.2.3-beta",
            "10.2.3-DEV-SNAPSHOT",
            "1.2.3-SNAPSHOT-123",
            "1.0.0",
            "2.0.0",
            "1.1.7",
            "2.0.0+build.1848",
            "2.0.1-alpha.1227",
            "1.0.0-alpha+beta",
            "1.2.3----RC-SNAPSHOT.12.9.1--.12+788",
            "1.2.3----R-S.12.9.1--.12+meta",
            "1.2.3----RC-SNAPSHOT.12.9.1--.12",
            "1.0.0+0.build.1-rc.10000aaa-kk-0.1",
            "1.0.0-0A.is.legal",
            "1.0.0+001",
            "1.0.0-0",
            "18446744073709551615.0.0",
        ] {
            let parsed = v(input);
            assert_eq!(parsed.to_string(), input);
            assert_eq!(parsed.as_str(), input);
        }
    }

    #[test]
    fn rejects_invalid_versions_from_semver_org() {
        for input in [
            "",
            "1",
            "1.2",
            "1.2.3-0123",
            "1.2.3-0123.0123",
            "1.1.2+.123",
            "+invalid",
            "-invalid",
            "-invalid+invalid",
            "-invalid.01",
            "alpha",
            "alpha.beta",
            "alpha.beta.1",
            "alpha.1",
            "alpha+beta",
            "alpha_beta",
            "alpha.",
            "alpha..",
            "beta",
            "1.0.0-alpha_beta",
            "-alpha.",
            "1.0.0-alpha..",
            "1.0.0-alpha..1",
            "1.0.0-alpha...1",
            "01.1.1",
            "1.01.1",
            "1.1.01",
            "1.2.3.DEV",
            "1.2-SNAPSHOT",
            "1.2.31.2.3----RC-SNAPSHOT.12.09.1--..12+788",
            "1.2-RC-SNAPSHOT",
            "-1.0.3-gamma+b7718",
            "+justmeta",
            "9.8.7+meta+meta",
            "9.8.7-whatever+meta+meta",
            "99999999999999999999999.999999999999999999.99999999999999999----RC-SNAPSHOT.12.09.1--------------------------------..12",
            "v1.2.3",
            "1.2.3 ",
            " 1.2.3",
            "1.2.3-",
            "1.2.3+",
            "1.2.3-a.",
            "1.2.3+a..b",
            "1.2.3-é",
            "1..3",
            "1.2.-3",
            "18446744073709551616.0.0",
            "1.0.0-18446744073709551616",
        ] {
            let err = Version::parse(input).expect_err(input);
            assert!(
                crate::echo::chain(&err).contains(&format!("{input:?}")),
                "{err} does not name {input:?}"
            );
        }
    }

    #[test]
    fn accessors() {
        let version = v("1.20.3-rc.1+build.5");
        assert_eq!(
            (version.major(), version.minor(), version.patch()),
            (1, 20, 3)
        );
        assert_eq!(version.pre_release(), Some("rc.1"));
        assert_eq!(version.build_metadata(), Some("build.5"));
        let plain = v("0.0.0");
        assert_eq!((plain.pre_release(), plain.build_metadata()), (None, None));
        let hyphenated = v("1.0.0-x-y+z-w");
        assert_eq!(hyphenated.pre_release(), Some("x-y"));
        assert_eq!(hyphenated.build_metadata(), Some("z-w"));
        assert_eq!(v("1.0.0+x-y").pre_release(), None);
    }

    #[test]
    fn precedence_follows_semver_org() {
        // §11.4's example, and §11.2's.
        let ordered = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "2.0.0",
            "2.1.0",
            "2.1.1",
            "10.0.0",
        ];
        for (i, a) in ordered.iter().enumerate() {
            for (j, b) in ordered.iter().enumerate() {
                assert_eq!(v(a).cmp(&v(b)), i.cmp(&j), "{a} vs {b}");
                assert_eq!(v(a).cmp_precedence(&v(b)), i.cmp(&j), "{a} vs {b}");
            }
        }
        // Numeric identifiers sort before alphanumeric ones; ASCII order otherwise.
        assert!(v("1.0.0-999") < v("1.0.0-a"));
        assert!(v("1.0.0-B") < v("1.0.0-a"));
        assert!(v("1.0.0-1a") > v("1.0.0-19"));
    }

    #[test]
    fn build_metadata_is_ignored_by_precedence_only() {
        let (a, b) = (v("1.0.0+a"), v("1.0.0+b"));
        assert_eq!(a.cmp_precedence(&b), Ordering::Equal);
        assert_eq!(v("1.0.0").cmp_precedence(&a), Ordering::Equal);
        assert_ne!(a, b);
        assert!(v("1.0.0") < a && a < b);
        assert!(v("1.0.0-rc.1+zzz") < v("1.0.0+aaa"));
        assert_eq!(v("1.0.0+a"), v("1.0.0+a"));
    }

    #[test]
    fn serde_is_the_string() {
        let version: Version = serde_json::from_str("\"1.2.3-rc.1\"").unwrap();
        assert_eq!(version, v("1.2.3-rc.1"));
        assert_eq!(serde_json::to_string(&version).unwrap(), "\"1.2.3-rc.1\"");
        let err = serde_json::from_str::<Version>("\"1.2\"").unwrap_err();
        assert!(err.to_string().contains("\"1.2\""), "{err}");
        assert!(serde_json::from_str::<Version>("123").is_err());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn identifier() -> impl Strategy<Value = String> {
            prop_oneof![
                (0u64..30).prop_map(|n| n.to_string()),
                "[0-9A-Za-z-]{1,4}".prop_filter("numeric with leading zero", |s| {
                    !(s.len() > 1 && s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()))
                }),
            ]
        }

        fn version() -> impl Strategy<Value = String> {
            (
                0u64..3,
                0u64..3,
                0u64..3,
                prop::collection::vec(identifier(), 0..3),
                prop::collection::vec("[0-9A-Za-z-]{1,3}", 0..2),
            )
                .prop_map(|(major, minor, patch, pre, build)| {
                    let mut text = format!("{major}.{minor}.{patch}");
                    if !pre.is_empty() {
                        text.push('-');
                        text.push_str(&pre.join("."));
                    }
                    if !build.is_empty() {
                        text.push('+');
                        text.push_str(&build.join("."));
                    }
                    text
                })
        }

        proptest! {
            #[test]
            fn parses_and_displays_back(text in version()) {
                let version = Version::parse(&text)
                    .map_err(|e| TestCaseError::fail(crate::echo::chain(&e)))?;
                prop_assert_eq!(version.to_string(), text);
            }

            #[test]
            fn order_is_total_and_agrees_with_equality(
                a in version(),
                b in version(),
                c in version(),
            ) {
                let (a, b, c) = (v(&a), v(&b), v(&c));
                prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
                prop_assert_eq!(a.cmp(&b) == Ordering::Equal, a == b);
                if a <= b && b <= c {
                    prop_assert!(a <= c);
                }
                if a.cmp_precedence(&b) != Ordering::Equal {
                    prop_assert_eq!(a.cmp(&b), a.cmp_precedence(&b));
                }
            }

            #[test]
            fn arbitrary_text_never_panics(text in "\\PC{0,20}") {
                let _ = Version::parse(&text);
            }
        }
    }
}
