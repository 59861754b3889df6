//! Tests of the type manager's plan.

use super::*;
use crate::config::VendorDevice;
use crate::mdev::MdevType;

fn parent(addr: &str, types: &[(&str, &str, usize)]) -> MdevParent {
    MdevParent {
        address: PciAddress::parse(addr).unwrap(),
        ids: VendorDevice {
            vendor: 0x10de,
            device: 0x1eb8,
        },
        numa_node: None,
        types: types
            .iter()
            .map(|(id, name, n)| MdevType {
                id: (*id).to_owned(),
                name: (*name).to_owned(),
                available_instances: 4,
                instances: (0..*n)
                    .map(|i| format!("00000000-0000-0000-0000-{addr:.4}{i:08x}"))
                    .collect(),
            })
            .collect(),
    }
}

fn rule(types: &[&str]) -> DesiredRule {
    DesiredRule {
        parents: vec![],
        types: types.iter().map(|t| (*t).to_owned()).collect(),
    }
}

fn chosen(p: &MdevPlan) -> Vec<Option<&str>> {
    p.parents.iter().map(|p| p.type_id.as_deref()).collect()
}

const AB: [(&str, &str, usize); 2] = [("t-a", "A", 0), ("t-b", "B", 0)];

#[test]
fn types_alternate_over_empty_parents() {
    let ps: Vec<_> = [
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:03:00.0",
        "0000:04:00.0",
    ]
    .iter()
    .map(|a| parent(a, &AB))
    .collect();
    let p = plan(&ps, &[rule(&["t-a", "B"])]);
    assert_eq!(
        chosen(&p),
        [Some("t-a"), Some("t-b"), Some("t-a"), Some("t-b")]
    );
    assert!(p.parents.iter().all(|p| p.remove.is_empty()));
}

#[test]
fn held_types_are_kept_and_counted() {
    let ps = vec![
        parent("0000:01:00.0", &AB),
        parent("0000:02:00.0", &[("t-a", "A", 0), ("t-b", "B", 2)]),
        parent("0000:03:00.0", &AB),
    ];
    let p = plan(&ps, &[rule(&["t-a", "t-b"])]);
    // The second parent keeps B; the first takes A (no holder yet); the third finds A and B
    // held once each, and the tie goes to the order in the rule.
    assert_eq!(chosen(&p), [Some("t-a"), Some("t-b"), Some("t-a")]);
}

#[test]
fn undesired_instances_are_removed_and_unsupported_parents_get_nothing() {
    let ps = vec![
        parent("0000:01:00.0", &[("t-a", "A", 1), ("t-c", "C", 3)]),
        parent("0000:02:00.0", &[("t-c", "C", 1)]),
    ];
    let p = plan(&ps, &[rule(&["t-a"])]);
    assert_eq!(chosen(&p), [Some("t-a"), None]);
    assert_eq!(p.parents[0].remove.len(), 3);
    assert_eq!(p.parents[1].remove.len(), 1);
}

#[test]
fn parents_no_rule_matches_are_left_alone() {
    let ps = vec![parent("0000:01:00.0", &[("t-c", "C", 2)])];
    let r = DesiredRule {
        parents: vec![VendorDevice {
            vendor: 0x8086,
            device: 1,
        }],
        types: vec!["t-a".into()],
    };
    assert!(plan(&ps, &[r]).parents.is_empty());
}
