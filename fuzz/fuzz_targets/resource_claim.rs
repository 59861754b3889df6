//! A ResourceClaim as the API server might send it, with arbitrary content: reading this
//! driver's part of it never panics, and what is accepted belongs to the claim the kubelet named.
#![no_main]

use kubedev_core::{ClaimRef, ClaimUid, DriverName};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let driver = DriverName::new("gpu.example.com").expect("driver");
    let expected = ClaimRef::new(ClaimUid::new("uid-1").expect("uid"), "default".parse().unwrap(), "train".parse().unwrap());
    if let Ok(claim) =
        kubedev_apiserver::fuzzing::allocated_claim_from_json(&driver, &expected, data)
    {
        assert_eq!(claim.claim, expected);
        for r in claim.devices() {
            assert!(!r.device.device.as_str().is_empty());
        }
    }
});
