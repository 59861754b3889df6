//! Cluster dumps for `kubedev explain` (a `kubectl get -o yaml|json` list or single objects)
//! with arbitrary content: reading never panics, and errors name the file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = kubedev_inputs::cluster::read_cluster(text, "dump.yaml") {
        assert!(e.to_string().contains("dump.yaml"), "{e}");
    }
});
