//! Fake pci machines.
