//! Quantities as written in objects, kept as text until the allocator parses them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A Kubernetes quantity as written in an object (`"80Gi"`, `7`, `"1.5"`), parsed later.
///
/// Deserializes from a string or a number, as the API server accepts both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawQuantity(pub String);

impl RawQuantity {
    /// The quantity text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RawQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for RawQuantity {
    fn from(s: &str) -> Self {
        RawQuantity(s.to_string())
    }
}

impl Serialize for RawQuantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RawQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawQuantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity string or number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}
