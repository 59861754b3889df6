//! Tests of the node view: device variables read lazily, duplicate device names.

use super::device::parse_capacities;
use super::device_vars::device_context;
use super::pool::check_device_names;
use super::*;
use crate::api::{Device, DeviceAttribute, ResourceSlice};

fn slice(names: &[String]) -> ResourceSlice {
    let mut s = ResourceSlice::default();
    s.spec.devices = names
        .iter()
        .map(|n| Device {
            name: n.clone(),
            ..Default::default()
        })
        .collect();
    s
}

/// A selector reads an attribute or capacity from the slice exactly as from the whole
/// `device` variable: bare names in the driver's domain, qualified names, a name given
/// both ways (the first by name wins), names with more than one `/`, missing names. A
/// constraint's lookup of the same names prefers the name as written.
#[test]
fn device_entries_read_from_the_slice_equal_the_built_variable() {
    use crate::api::{DeviceCapacity, RawQuantity};
    let attr = |f: &dyn Fn(&mut DeviceAttribute)| {
        let mut a = DeviceAttribute::default();
        f(&mut a);
        a
    };
    let mut device = Device {
        name: "gpu-0".into(),
        ..Default::default()
    };
    let attrs = [
        ("model", attr(&|a| a.string = Some("bare".into()))),
        (
            "gpu.example.com/model",
            attr(&|a| a.string = Some("qualified".into())),
        ),
        ("gpu.example.com/numa", attr(&|a| a.int = Some(1))),
        ("alpha", attr(&|a| a.string = Some("bare".into()))),
        (
            "gpu.example.com/alpha",
            attr(&|a| a.string = Some("qualified".into())),
        ),
        ("zeta", attr(&|a| a.bool = Some(true))),
        ("other.org/zeta", attr(&|a| a.int = Some(7))),
        ("a/b/c", attr(&|a| a.version = Some("1.2.3".into()))),
        ("gpu.example.com.x/model", attr(&|a| a.int = Some(9))),
    ];
    for (k, v) in attrs {
        device.attributes.insert(k.to_string(), v);
    }
    for (k, v) in [("memory", "80Gi"), ("other.org/memory", "1Gi")] {
        device.capacity.insert(
            k.to_string(),
            DeviceCapacity {
                value: RawQuantity::from(v),
                ..Default::default()
            },
        );
    }
    let driver = "gpu.example.com";
    let capacities = parse_capacities(&device);
    let built = cel::with_interner(|i| device_context(&device, driver, &capacities.list, i))
        .expect("device variable");
    let dev = NodeDevice {
        pool: 0,
        slice: Box::leak(Box::new({
            let mut s = ResourceSlice::default();
            s.spec.driver = driver.to_string();
            s
        })),
        device: &device,
        allocated: false,
        node_selected: Ok(true),
        details: std::cell::OnceCell::new(),
        consumption: 0..0,
        allows_multiple: false,
        binds_to_node: false,
        shared_before: false,
        consumed_before: Box::default(),
        node_operations_ok: true,
        skip_node_operations: &[],
    };
    assert_eq!(dev.readable(), &Ok(()));
    let driver_value = Value::String(driver.into());
    let vars = LazyDeviceVars::new(&dev, &driver_value);
    let lookups = [
        (false, driver, "model"),
        (false, driver, "numa"),
        (false, driver, "alpha"),
        (false, driver, "zeta"),
        (false, "other.org", "zeta"),
        (false, "a", "b/c"),
        (false, "a/b", "c"),
        (false, driver, "missing"),
        (false, "gpu.example.com.x", "model"),
        (true, driver, "memory"),
        (true, "other.org", "memory"),
        (true, "other.org", "missing"),
    ];
    for (capacity, domain, id) in lookups {
        let lazy = cel::DeviceVars::entry(&vars, capacity, domain, id);
        let whole = built.entry(capacity, domain, id);
        match (&lazy, whole) {
            (Some(a), Some(b)) => assert!(a.equals(b), "{domain}/{id}: {a:?} vs {b:?}"),
            (None, None) => {}
            _ => panic!("{domain}/{id}: {lazy:?} vs {whole:?}"),
        }
        let by_ref = cel::DeviceVars::entry_ref(&vars, capacity, domain, id).map(|r| match r {
            cel::EntryRef::Str(s) => Value::str(s),
            cel::EntryRef::Quantity(q) => Value::Quantity(std::sync::Arc::new(q)),
            cel::EntryRef::Value(v) => v,
        });
        match (&by_ref, whole) {
            (Some(a), Some(b)) => assert!(a.equals(b), "{domain}/{id}: {a:?} vs {b:?}"),
            (None, None) => {}
            _ => panic!("{domain}/{id}: {by_ref:?} vs {whole:?}"),
        }
    }
    assert!(cel::DeviceVars::driver_is(&vars, driver));
    assert!(!cel::DeviceVars::driver_is(&vars, "other.org"));
    // A constraint names an attribute as the scheduler looks it up: the name as written,
    // else the bare id when the domain is the driver's (whatever the names' order).
    let constraint = [
        ("gpu.example.com/model", Some(AttrKey::Str("qualified"))),
        ("gpu.example.com/zeta", Some(AttrKey::Bool(true))),
        ("gpu.example.com/alpha", Some(AttrKey::Str("qualified"))),
        ("alpha", Some(AttrKey::Str("bare"))),
        ("gpu.example.com/numa", Some(AttrKey::Int(1))),
        ("other.org/zeta", Some(AttrKey::Int(7))),
        ("other.org/model", None),
        ("a/b/c", Some(AttrKey::Version("1.2.3"))),
        ("model", Some(AttrKey::Str("bare"))),
        ("gpu.example.com.x/model", Some(AttrKey::Int(9))),
        ("gpu.example.com/missing", None),
    ];
    for (name, want) in constraint {
        assert_eq!(dev.constraint_attr(name, 0), want, "{name}");
    }
}

/// Duplicate names across a pool's slices are found whether the pool has few devices
/// (compared pairwise) or many (hashed).
#[test]
fn duplicate_device_names_are_found_in_small_and_large_pools() {
    for n in [3, 16, 17, 200] {
        let names: Vec<String> = (0..n).map(|i| format!("gpu-{i}")).collect();
        let (a, b) = names.split_at(n / 2);
        let (a, b) = (slice(a), slice(b));
        assert_eq!(
            check_device_names([&a, &b].into_iter()),
            Ok(()),
            "{n} devices"
        );
        let again = slice(&names[n - 1..]);
        assert_eq!(
            check_device_names([&a, &b, &again].into_iter()),
            Err(format!("duplicate device name gpu-{}", n - 1)),
            "{n} devices"
        );
    }
}
