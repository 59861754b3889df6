//! A resolved attribute or capacity name, looked up per candidate by its driver.

use alloc::vec::Vec;

/// The driver of a [`Key`] entry for a qualified name: it holds for every candidate.
pub(crate) const ANY_DRIVER: u32 = u32::MAX;
/// The id of a name the message does not carry.
pub(crate) const NO_NAME: u32 = u32::MAX;

/// A resolved attribute or capacity name; see `Input::key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// (driver name id or [`ANY_DRIVER`], name id or [`NO_NAME`]).
    pub(crate) ids: Vec<(u32, u32)>,
}

impl Key {
    /// False when no candidate has an attribute or capacity of this name (the message
    /// carries only the names it uses), so a policy can skip its work at once.
    pub fn is_known(&self) -> bool {
        self.ids.iter().any(|&(_, id)| id != NO_NAME)
    }

    /// The id of this name for a candidate of `driver`.
    #[inline(always)]
    pub(crate) fn id_for(&self, driver: u32) -> Option<u32> {
        // Nearly always one entry: one driver, or a qualified name.
        let id = match self.ids.as_slice() {
            [(d, id)] if *d == driver || *d == ANY_DRIVER => *id,
            ids => ids
                .iter()
                .find(|&&(d, _)| d == driver || d == ANY_DRIVER)
                .map_or(NO_NAME, |&(_, id)| id),
        };
        (id != NO_NAME).then_some(id)
    }
}
