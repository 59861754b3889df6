//! Runs `kubedev simulate` on scenario files: `cargo run -p kubedev-inputs --example simulate -- FILE... [--explain] [--repeat N] [-o json|yaml|text]`.

use kubedev_allocator::{SimulateOptions, simulate};

fn main() {
    let mut files = Vec::new();
    let mut options = SimulateOptions::default();
    let mut format = "text".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--explain" => options = options.with_explain(true),
            "--repeat" => {
                let n = args.next().and_then(|n| n.parse().ok()).unwrap_or(100);
                options = options.with_repeat(n);
            }
            "-o" => format = args.next().unwrap_or_default(),
            _ => files.push(a),
        }
    }
    let mut status = 0;
    for f in files {
        match kubedev_inputs::read_scenario(&f) {
            Ok(s) => {
                let out = simulate(&s, &options);
                println!("== {f}");
                match format.as_str() {
                    "json" => println!("{}", out.to_json()),
                    "yaml" => println!(
                        "{}",
                        serde_saphyr::to_string(&out).unwrap_or_else(|e| format!("error: {e}"))
                    ),
                    _ => print!("{}", out.to_text()),
                }
            }
            Err(e) => {
                eprintln!("{f}: {e}");
                status = 1;
            }
        }
    }
    std::process::exit(status);
}
