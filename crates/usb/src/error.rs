//! Errors of the USB backend.

/// What can go wrong building the USB backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UsbError {
    /// A configuration value is wrong.
    #[error("usb configuration: {field} = {0}: {reason}", kubedev_core::echo::echo(.value))]
    Config {
        /// The field, e.g. `resources[1].selectors`.
        field: String,
        /// The rejected value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The pool name made from the node name is not a valid pool name.
    #[error("usb: pool name {0} made from the node name is invalid: {reason}", kubedev_core::echo::echo(.pool))]
    PoolName {
        /// The rejected pool name.
        pool: String,
        /// Why.
        reason: String,
    },
}
