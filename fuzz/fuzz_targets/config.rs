//! The daemon's configuration file with arbitrary content: parsing never panics, and errors
//! name the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = kubedev::config::Config::parse(text, Path::new("/etc/kubedev/fuzz.yaml")) {
        let message = e.to_string();
        assert!(message.contains("fuzz.yaml"), "{message}");
    }
});
