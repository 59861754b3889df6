//! The numbers of the contract the host and a policy share.

/// The ABI version this SDK speaks.
pub const ABI_VERSION: u32 = 1;
/// Longest rejection reason the host accepts, bytes; longer reasons are cut.
pub const MAX_REASON_BYTES: usize = 256;
