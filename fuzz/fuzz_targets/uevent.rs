//! `parse_uevent` on arbitrary bytes: never panics; what it accepts round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(map) = kubedev_core::hostfs::parse_uevent(text) {
        // Printing the accepted keys and values back gives the same map.
        let printed: String = map.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        let again = kubedev_core::hostfs::parse_uevent(&printed).expect("printed uevent parses");
        assert_eq!(map, again);
    }
});
