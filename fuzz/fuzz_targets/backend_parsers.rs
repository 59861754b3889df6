//! The backends' own parsers of host files and configuration values on arbitrary text: the
//! cgroup `misc.capacity` file, PCI addresses, vendor:device and USB selectors. Never panic;
//! what they accept prints back to the same value.
#![no_main]

use std::str::FromStr;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(map) =
        kubedev_host::parse_misc_capacity(std::path::Path::new("/misc.capacity"), &text)
    {
        let printed: String = map.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        let again = kubedev_host::parse_misc_capacity(std::path::Path::new("/x"), &printed)
            .expect("printed misc.capacity parses");
        assert_eq!(map, again);
    }
    if let Some(a) = kubedev_vfio::PciAddress::parse(&text) {
        assert_eq!(kubedev_vfio::PciAddress::parse(&a.to_string()), Some(a));
    }
    if let Some(v) = kubedev_vfio::VendorDevice::parse(&text) {
        let printed = format!("{:04x}:{:04x}", v.vendor, v.device);
        assert_eq!(kubedev_vfio::VendorDevice::parse(&printed), Some(v));
    }
    if let Ok(s) = kubedev_usb::UsbSelector::from_str(&text) {
        assert_eq!(
            kubedev_usb::UsbSelector::from_str(&s.to_string()).ok(),
            Some(s)
        );
    }
});
