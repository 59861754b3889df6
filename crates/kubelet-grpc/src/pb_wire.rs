//! Wire facts the kubelet depends on, checked against the generated code in
//! [`crate::pb`].
//!
//! The expected method paths and message bytes below are written out by hand
//! from the kubelet's API definitions (package, service and method names;
//! field numbers and wire types), not produced with our own types, so a
//! change to a `.proto` file that breaks compatibility with the kubelet makes
//! these tests fail.
//!
//! Protobuf encoding reminders used throughout: a field's key byte is
//! `field_number << 3 | wire_type`, with wire type 0 for varints (bool, enum,
//! int32, int64) and 2 for length-delimited values (string, message, map
//! entry); a map entry is a message with the key as field 1 and the value as
//! field 2; proto3 leaves fields holding their default value out, except
//! `optional` fields, which are written whenever they are set.
//!
//! `paths` checks service names and method paths, `messages` the bytes of each API's
//! messages.

#![allow(clippy::unwrap_used)]

mod messages;
mod paths;

use std::fmt::Debug;

use prost::Message;

/// Asserts that `msg` encodes to exactly `expected` and that `expected`
/// decodes back to `msg`.
fn assert_wire<M: Message + Default + PartialEq + Debug>(msg: &M, expected: &[u8]) {
    assert_eq!(msg.encode_to_vec(), expected, "encoding of {msg:?}");
    assert_eq!(
        &M::decode(expected).unwrap(),
        msg,
        "decoding of {expected:02x?}"
    );
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}
