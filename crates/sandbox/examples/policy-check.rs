//! Checks policy modules as `kubedev policy check` will:
//! `cargo run -p kubedev-sandbox --example policy-check -- target/plugins/wasm/*.wasm`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut ok = true;
    for path in std::env::args().skip(1) {
        match kubedev_sandbox::check(&path) {
            Ok(report) => {
                println!("{report}\n");
                ok &= report.passed();
            }
            Err(e) => {
                println!("{path}: {e}\n");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
