//! Quantities and semantic versions from ResourceSlices, claims and configuration, as arbitrary
//! text: parsing never panics, errors stay short, and what parses prints back to an equal value.
#![no_main]

use kubedev_core::{Quantity, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Quantity::parse(text) {
        Ok(q) => {
            let again = Quantity::parse(&q.to_string())
                .unwrap_or_else(|e| panic!("{q} does not parse back: {e}"));
            assert_eq!(again, q);
        }
        Err(e) => assert!(
            e.to_string().len() < 1024,
            "{} byte error",
            e.to_string().len()
        ),
    }
    match Version::parse(text) {
        Ok(v) => assert_eq!(Version::parse(&v.to_string()).ok(), Some(v)),
        Err(e) => assert!(
            e.to_string().len() < 1024,
            "{} byte error",
            e.to_string().len()
        ),
    }
});
