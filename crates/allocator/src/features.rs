//! The scheduler feature gates the allocator follows.

/// Scheduler feature gates that change what the allocator does. The default has every gate off:
/// the defaults of Kubernetes 1.36, 1.37 and the 1.38 candidate (v1.38.0-beta.0, where both are
/// still alpha).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Features {
    /// `DRAListTypeAttributes` (alpha in 1.36): list-valued attributes (`ints`, `bools`,
    /// `strings`, `versions`) reach selectors as CEL lists, `matchAttribute` asks for a
    /// non-empty intersection across the devices and `distinctAttribute` for pairwise
    /// disjoint values. Off, a constraint takes a list-valued attribute only from its first
    /// device (selectors read lists either way).
    pub list_type_attributes: bool,
    /// `DRAOptionalNodeOperations` (alpha in 1.37): devices of slices with
    /// `skipNodeOperations` are allocated only on nodes that declare the feature, and their
    /// results carry the list. Off, the list is not looked at.
    pub optional_node_operations: bool,
}

impl Features {
    /// The features named by their gate names (unknown names are ignored: they name gates
    /// the allocator does not need to know).
    pub fn from_gates<S: AsRef<str>>(gates: &[S]) -> Features {
        let on = |name: &str| gates.iter().any(|g| g.as_ref() == name);
        Features {
            list_type_attributes: on("DRAListTypeAttributes"),
            optional_node_operations: on("DRAOptionalNodeOperations"),
        }
    }

    /// With `DRAOptionalNodeOperations` on or off.
    pub fn with_optional_node_operations(mut self, on: bool) -> Features {
        self.optional_node_operations = on;
        self
    }

    /// With `DRAListTypeAttributes` on or off.
    pub fn with_list_type_attributes(mut self, on: bool) -> Features {
        self.list_type_attributes = on;
        self
    }
}
