//! Unhealthy devices: omitted or tainted as the policy says, and health reasons as label
//! values.

use super::*;

#[test]
fn unhealthy_devices_are_omitted_or_tainted() {
    let mut sick = plain(1);
    sick.health = Health::unhealthy("fell off the bus");
    let mut unknown = plain(2);
    unknown.health = Health::unknown("no answer");
    let inventory = Inventory::new(vec![pool_of(vec![plain(0), sick, unknown])]);

    let omitted = desired_pools(&inventory, &driver(), UnhealthyDevices::Omit).unwrap();
    let names: Vec<&str> = omitted[0].slices[0]
        .devices
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, vec!["dev-0", "dev-2"]);

    let tainted = desired_pools(&inventory, &driver(), UnhealthyDevices::Taint).unwrap();
    let devices = &tainted[0].slices[0].devices;
    assert_eq!(devices.len(), 3);
    let taints = devices[1].taints.as_ref().unwrap();
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key, "gpu.example.com/unhealthy");
    assert_eq!(taints[0].effect, "NoSchedule");
    assert!(devices[0].taints.is_none());
    assert!(devices[2].taints.is_none());
}

#[test]
fn health_reasons_become_label_values() {
    use super::device::taint_value;
    assert_eq!(
        taint_value("Xid 79: GPU has fallen off the bus (GPU instance 3)"),
        "Xid-79-GPU-has-fallen-off-the-bus-GPU-instance-3"
    );
    assert_eq!(taint_value("  -- gone!"), "gone");
    assert_eq!(taint_value("état: perdu"), "tat-perdu");
    assert_eq!(taint_value(""), "");
    let long = taint_value(&"presence file missing ".repeat(10));
    assert_eq!(long.len(), 63, "{long}");
    assert!(long.starts_with("presence-file-missing-presence"), "{long}");
    // A cut that lands on a separator drops it: a label value ends with a letter or digit.
    assert_eq!(
        taint_value(&format!("{} b", "a".repeat(62))),
        "a".repeat(62)
    );
}

#[test]
fn unhealthy_devices_are_left_out_as_the_policy_says() {
    let mut sick = plain(1);
    sick.health = Health::unhealthy("gone");
    let mut held = plain(2);
    held.health = Health::unusable("Xid 79");
    let inventory = Inventory::new(vec![pool_of(vec![plain(0), sick, held])]);
    let in_use = |_: &str, d: &str| d == "dev-2";
    let names = |p: UnhealthyDevices| -> Vec<String> {
        unhealthy_left_out(&inventory, p, true, &in_use).0.pools[0]
            .devices
            .iter()
            .map(|d| d.name.to_string())
            .collect()
    };
    assert_eq!(names(UnhealthyDevices::Omit), ["dev-0"]);
    assert_eq!(names(UnhealthyDevices::Taint), ["dev-0", "dev-1", "dev-2"]);
    assert_eq!(names(UnhealthyDevices::TaintWhileInUse), ["dev-0", "dev-2"]);
    assert_eq!(
        UnhealthyDevices::Auto.resolve(true),
        UnhealthyDevices::Taint
    );
    assert_eq!(
        UnhealthyDevices::Auto.resolve(false),
        UnhealthyDevices::Omit
    );
    assert_eq!(
        UnhealthyDevices::TaintWhileInUse.resolve(false),
        UnhealthyDevices::TaintWhileInUse
    );
    // The held device is published NoExecute, with its reason.
    let pools = desired_pools(
        &unhealthy_left_out(&inventory, UnhealthyDevices::TaintWhileInUse, true, &in_use).0,
        &driver(),
        UnhealthyDevices::Taint,
    )
    .unwrap();
    let taint = &pools[0].slices[0].devices[1].taints.as_ref().unwrap()[0];
    assert_eq!(
        (
            taint.key.as_str(),
            taint.value.as_deref(),
            taint.effect.as_str()
        ),
        ("gpu.example.com/unhealthy", Some("Xid-79"), "NoExecute")
    );
}
