//! `kubedev simulate` scenario files (YAML or JSON) with arbitrary content: reading never
//! panics, and errors say where the text came from.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = kubedev_inputs::scenario_from_text(text) {
        assert!(!e.to_string().is_empty());
    }
});
