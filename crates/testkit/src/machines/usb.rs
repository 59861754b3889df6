//! Fake usb machines.
