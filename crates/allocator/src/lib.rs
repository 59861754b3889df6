//! kubedev allocator (work in progress).
mod allocator;
pub mod api;
pub mod cel;
mod error;
mod explain;
mod model;
mod nodesel;
mod policy;
pub mod scenario;
mod simulate;

pub use allocator::{AllocateOptions, Allocator, MAX_CLAIMS, MAX_DEVICES_PER_CLAIM, SearchStats};
pub use error::{AllocationError, SelectorOwner};
pub use explain::{ClaimExplanation, Explanation, Reason, Rejection, RequestExplanation};
pub use policy::{PolicyDevice, PolicyRequest, SelectionPolicy};
pub use scenario::{Scenario, ScenarioError};
pub use simulate::{ClaimOutput, SimulateOptions, SimulateOutput, Timing, simulate, simulate_here};
