//! Fake mdev machines.
