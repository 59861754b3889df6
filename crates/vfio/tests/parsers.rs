//! Property tests: the parsers never panic, and what they accept round-trips.
#![allow(clippy::unwrap_used)]

use kubedev_vfio::{PciAddress, VendorDevice, is_mdev_uuid, mdev_device_name, resource_env_name};
use proptest::prelude::*;

proptest! {
    #[test]
    fn pci_address_parse_never_panics(s in "\\PC{0,24}") {
        if let Some(a) = PciAddress::parse(&s) {
            prop_assert_eq!(a.to_string(), s);
            prop_assert!(a.device_name().is_some());
        }
    }

    #[test]
    fn pci_addresses_round_trip(domain in prop_oneof![0u32..=0xffff, 0x10000u32..=0xffff_ffff], bus: u8, device in 0u8..32, function in 0u8..8) {
        let a = PciAddress { domain, bus, device, function };
        let s = a.to_string();
        prop_assert_eq!(PciAddress::parse(&s), Some(a));
        let name = a.device_name().unwrap();
        prop_assert!(kubedev_core::check_dns_label(name.as_str()).is_ok());
    }

    #[test]
    fn near_addresses_do_not_panic(s in "[0-9a-fA-F:.x]{0,16}") {
        if let Some(a) = PciAddress::parse(&s) {
            prop_assert_eq!(a.to_string(), s.clone());
        }
        let _ = VendorDevice::parse(&s);
    }

    #[test]
    fn vendor_device_parse_never_panics(s in "\\PC{0,16}") {
        if let Some(v) = VendorDevice::parse(&s) {
            prop_assert_eq!(VendorDevice::parse(&v.to_string()), Some(v));
        }
    }

    #[test]
    fn uuids_and_env_names_never_panic(s in "\\PC{0,48}") {
        if is_mdev_uuid(&s) {
            prop_assert!(mdev_device_name(&s).is_some());
        }
        let env = resource_env_name("PCI_RESOURCE", &s);
        prop_assert!(!env.contains('/') && !env.contains('.'));
    }
}
