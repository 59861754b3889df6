//! Errors of the USB backend.

/// What can go wrong building the USB backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UsbError {
    /// A configuration value is wrong.
    #[error("usb configuration: {0}")]
    Config(#[source] kubedev_core::factory::InvalidValue),
    /// The pool name made from the node name is not a valid pool name.
    #[error("usb: pool name {0} made from the node name is invalid: {reason}", kubedev_core::echo::echo(.pool))]
    PoolName {
        /// The rejected pool name.
        pool: String,
        /// Why.
        reason: String,
    },
}
