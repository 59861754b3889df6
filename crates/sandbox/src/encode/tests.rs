//! Tests of the input encoding: records, names and strings round trip, NUMA nodes, declared
//! inputs, quantities.

use std::collections::BTreeMap;

use kubedev_allocator::api::{self, DeviceAttribute, DeviceCapacity, RawQuantity};

use super::quantity::quantity_value;
use super::*;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn text(msg: &[u8], at: usize) -> &str {
    let base = u32_at(msg, 56) as usize;
    let (off, len) = (u32_at(msg, at) as usize, u32_at(msg, at + 4) as usize);
    std::str::from_utf8(&msg[base + off..base + off + len]).unwrap()
}

fn name(msg: &[u8], id: u32) -> &str {
    text(msg, u32_at(msg, 32) as usize + id as usize * NAME)
}

fn device(name: &str, numa: i64, extra: &str) -> api::Device {
    let mut attributes = BTreeMap::new();
    attributes.insert(
        "resource.kubernetes.io/numaNode".to_string(),
        DeviceAttribute {
            int: Some(numa),
            ..Default::default()
        },
    );
    attributes.insert(
        extra.to_string(),
        DeviceAttribute {
            string: Some("x".into()),
            ..Default::default()
        },
    );
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "memory".to_string(),
        DeviceCapacity {
            value: RawQuantity::from("40Gi"),
            request_policy: None,
        },
    );
    api::Device {
        name: name.into(),
        attributes,
        capacity,
        ..Default::default()
    }
}

#[test]
fn records_names_and_strings_round_trip() {
    let a = device("gpu-0", 1, "model");
    let b = device("gpu-1", 0, "gpu.example.com/model");
    let c = device("gpu-2", 0, "brand");
    let input = PolicyInput::new(
        "ns/claim",
        "req",
        2,
        vec![
            Candidate::published("gpu.example.com", "pool", &a).with_in_use(true),
            Candidate::published("gpu.example.com", "pool", &b),
            Candidate::published("gpu.example.com", "pool", &c),
        ],
    );
    let mut m = Message::default();
    encode_input(&input, &Inputs::default(), &mut m);
    let msg = [m.records.clone(), m.strings.clone()].concat();
    assert_eq!(&msg[0..4], b"KDPI");
    assert_eq!(u32_at(&msg, 8), 2);
    assert_eq!(text(&msg, 16), "ns/claim");
    assert_eq!(u32_at(&msg, 52), 3);
    assert_eq!(u32_at(&msg, 56) as usize, m.records.len());
    let cand = |i: usize| u32_at(&msg, 48) as usize + i * CANDIDATE;
    assert_eq!(text(&msg, cand(1)), "gpu-1");
    assert_eq!(name(&msg, u32_at(&msg, cand(0) + 8)), "gpu.example.com");
    assert_eq!(msg[cand(0) + 16], 0b11, "in use, NUMA known");
    assert_eq!(i64_at(&msg, cand(0) + 24), 1);
    // A bare name and its qualified form are one name.
    let attr = |i: usize, j: usize| u32_at(&msg, cand(i) + 32) as usize + j * ATTRIBUTE;
    let model_a = u32_at(&msg, attr(0, 0));
    let model_b = u32_at(&msg, attr(1, 0));
    assert_eq!(name(&msg, model_a), "gpu.example.com/model");
    assert_eq!(model_a, model_b);
    assert_eq!(
        name(&msg, u32_at(&msg, attr(2, 0))),
        "gpu.example.com/brand"
    );
    assert_eq!(text(&msg, attr(0, 0) + 8), "x");
    let cap = u32_at(&msg, cand(2) + 40) as usize;
    assert_eq!(name(&msg, u32_at(&msg, cap)), "gpu.example.com/memory");
    assert_eq!(i64_at(&msg, cap + 8), 40 << 30);
    assert_eq!(text(&msg, cap + 16), "40Gi");
    // Names are stored once.
    let names: Vec<&str> = (0..u32_at(&msg, 36)).map(|i| name(&msg, i)).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "{names:?}");
}

#[test]
fn numa_nodes_come_from_the_best_attribute_and_equal_values_are_shared() {
    let int = |v| DeviceAttribute {
        int: Some(v),
        ..Default::default()
    };
    let string = |v: &str| DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    };
    let mut bare = api::Device {
        name: "a".into(),
        ..Default::default()
    };
    bare.attributes.insert("numa".into(), int(3));
    bare.attributes.insert("model".into(), string("X100"));
    let mut both = bare.clone();
    both.name = "b".into();
    both.attributes.insert("numaNode".into(), int(5));
    let mut other_domain = bare.clone();
    other_domain.name = "c".into();
    other_domain.attributes.clear();
    other_domain
        .attributes
        .insert("other.example.com/numa".into(), int(7));
    other_domain
        .attributes
        .insert("model".into(), string("X100"));
    let input = PolicyInput::new(
        "",
        "",
        1,
        vec![
            Candidate::published("gpu.example.com", "p", &bare),
            Candidate::published("gpu.example.com", "p", &both),
            Candidate::published("gpu.example.com", "p", &other_domain),
        ],
    );
    let mut m = Message::default();
    encode_input(&input, &Inputs::default(), &mut m);
    let msg = [m.records.clone(), m.strings.clone()].concat();
    let cand = |i: usize| u32_at(&msg, 48) as usize + i * CANDIDATE;
    assert_eq!((msg[cand(0) + 16] & 2, i64_at(&msg, cand(0) + 24)), (2, 3));
    assert_eq!((msg[cand(1) + 16] & 2, i64_at(&msg, cand(1) + 24)), (2, 5));
    assert_eq!(
        msg[cand(2) + 16] & 2,
        0,
        "another domain's numa is not the NUMA node"
    );
    // "X100" is stored once for the two candidates that list it at the same position.
    let x100 = m.strings.windows(4).filter(|w| w == b"X100").count();
    assert_eq!(x100, 1);
    // A policy that reads no attribute still gets the same NUMA nodes.
    for declared in ["", "attribute model", "counters"] {
        encode_input(&input, &Inputs::parse(declared).unwrap(), &mut m);
        let msg = [m.records.clone(), m.strings.clone()].concat();
        let numa = |i: usize| (msg[cand(i) + 16] & 2, i64_at(&msg, cand(i) + 24));
        assert_eq!(
            [numa(0), numa(1), (numa(2).0, 0)],
            [(2, 3), (2, 5), (0, 0)],
            "{declared:?}"
        );
    }
}

#[test]
fn only_declared_inputs_and_constraint_attributes_are_sent() {
    use crate::input::Constraint;
    let a = device("gpu-0", 1, "model");
    let b = device("gpu-1", 0, "brand");
    let input = PolicyInput::new(
        "ns/claim",
        "req",
        1,
        vec![
            Candidate::published("gpu.example.com", "pool", &a),
            Candidate::published("gpu.example.com", "pool", &b),
        ],
    )
    .with_constraints(vec![Constraint {
        kind: ConstraintKind::MatchAttribute,
        attribute: "gpu.example.com/brand",
    }]);
    let inputs = Inputs::parse("attribute model").unwrap();
    let mut m = Message::default();
    encode_input(&input, &inputs, &mut m);
    let msg = [m.records.clone(), m.strings.clone()].concat();
    let cand = |i: usize| u32_at(&msg, 48) as usize + i * CANDIDATE;
    let attrs = |i: usize| -> Vec<&str> {
        let (off, n) = (
            u32_at(&msg, cand(i) + 32) as usize,
            u32_at(&msg, cand(i) + 36),
        );
        (0..n as usize)
            .map(|j| name(&msg, u32_at(&msg, off + j * ATTRIBUTE)))
            .collect()
    };
    // The declared attribute, and the constraint's attribute; not the NUMA attribute,
    // whose value is still in the record, and no capacity or counter.
    assert_eq!(attrs(0), vec!["gpu.example.com/model"]);
    assert_eq!(attrs(1), vec!["gpu.example.com/brand"]);
    assert_eq!((msg[cand(0) + 16] & 2, i64_at(&msg, cand(0) + 24)), (2, 1));
    assert_eq!(u32_at(&msg, cand(0) + 44), 0, "no capacities");
    let names: Vec<&str> = (0..u32_at(&msg, 36)).map(|i| name(&msg, i)).collect();
    assert!(
        !names.contains(&"resource.kubernetes.io/numaNode")
            && !names.contains(&"gpu.example.com/memory"),
        "{names:?}"
    );
    // Nothing declared: only the records themselves.
    encode_input(&input, &Inputs::parse("").unwrap(), &mut m);
    let small = m.len();
    encode_input(&input, &Inputs::default(), &mut m);
    assert!(small < m.len(), "{small} < {}", m.len());
}

#[test]
fn quantities_round_up_and_saturate() {
    assert_eq!(quantity_value("7"), 7);
    assert_eq!(quantity_value("40Gi"), 40 << 30);
    assert_eq!(quantity_value("1500m"), 2);
    assert_eq!(quantity_value("1e30"), i64::MAX);
    assert_eq!(quantity_value("3k"), 3000);
    assert_eq!(
        quantity_value("16Ei"),
        i64::MAX,
        "overflow falls back and saturates"
    );
    assert_eq!(quantity_value("0.5Gi"), 1 << 29);
    assert_eq!(quantity_value("not a quantity"), 0);
}
