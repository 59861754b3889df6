//! Chunking: slices of 128 plain devices, 64 with a tainted one, order kept across slices, and
//! an empty pool as one empty slice.

use super::*;

#[test]
fn plain_devices_fill_slices_of_128() {
    assert_eq!(
        sizes(&one_pool(pool_of((0..128).map(plain).collect()))),
        vec![128]
    );
    assert_eq!(
        sizes(&one_pool(pool_of((0..129).map(plain).collect()))),
        vec![128, 1]
    );
    assert_eq!(
        sizes(&one_pool(pool_of((0..1000).map(plain).collect()))),
        vec![128, 128, 128, 128, 128, 128, 128, 104]
    );
}

#[test]
fn a_tainted_device_lowers_its_slice_to_64() {
    assert_eq!(
        sizes(&one_pool(pool_of((0..64).map(tainted).collect()))),
        vec![64]
    );
    assert_eq!(
        sizes(&one_pool(pool_of((0..65).map(tainted).collect()))),
        vec![64, 1]
    );
    // 100 plain devices then one tainted: the tainted one cannot join a slice of 100.
    let mut devices: Vec<Device> = (0..100).map(plain).collect();
    devices.push(tainted(100));
    assert_eq!(sizes(&one_pool(pool_of(devices))), vec![100, 1]);
    // A tainted device first: the slice closes at 64 even though the rest are plain.
    let mut devices = vec![tainted(0)];
    devices.extend((1..200).map(plain));
    assert_eq!(sizes(&one_pool(pool_of(devices))), vec![64, 128, 8]);
}

#[test]
fn order_is_kept_across_slices() {
    let pool = one_pool(pool_of((0..300).map(plain).collect()));
    let names: Vec<String> = pool
        .slices
        .iter()
        .flat_map(|s| s.devices.iter().map(|d| d.name.clone()))
        .collect();
    let expected: Vec<String> = (0..300).map(|i| format!("dev-{i}")).collect();
    assert_eq!(names, expected);
}

#[test]
fn an_empty_pool_is_one_empty_slice() {
    let pool = one_pool(pool_of(Vec::new()));
    assert_eq!(pool.slices, vec![DesiredSlice::default()]);
    assert_eq!(pool.name, "node-a");
}
