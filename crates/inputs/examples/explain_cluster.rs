//! `kubedev explain` at cluster scale: generates a `kubectl get … -o json` dump of N nodes (8 GPUs
//! and one ResourceSlice each, with the metadata, `managedFields` and `status` kubectl prints,
//! four fifths of the nodes fully taken by allocated claims) and a pending pod asking for 4 GPUs,
//! then reads the dump and answers for every node.
//!
//! - `explain_cluster [NODES [json|yaml]]`: generates the dump in memory (NODES defaults to
//!   5,000; `yaml` prints it as `kubectl get … -o yaml` does), reads it and answers. Prints the
//!   dump's size, the CPU time (all threads) and wall time of reading and of answering, and
//!   the peak resident memory (which includes generating the dump).
//! - `explain_cluster write NODES json|yaml FILE`: writes the dump to FILE.
//! - `explain_cluster read FILE`: reads FILE as `kubedev explain -f FILE` does and answers for
//!   pod `default/trainer`; prints the same figures, the wall time from start to answer, and a
//!   last line of `key=value` figures (`nodes`, `bytes`, `read_ms`, `answer_ms` (CPU),
//!   `read_wall_ms`, `answer_wall_ms`, `wall_ms`, `peak_rss_kib`) for `cargo xtask bench`.
//!
//! `cargo run --release -p kubedev-inputs --example explain_cluster [-- ARGS]`

use std::fmt::Write as _;

use kubedev_inputs::cluster::{Subject, read_cluster};

fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// Peak resident memory of this process (`VmHWM`), in KiB (0 where /proc does not say).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse().ok())
        })
        .unwrap_or(0)
}

fn meta(name: &str, namespace: Option<&str>, extra: &str) -> String {
    let ns = namespace.map_or(String::new(), |n| format!(r#""namespace":"{n}","#));
    format!(
        r#"{{"name":"{name}",{ns}"uid":"uid-{name}","resourceVersion":"12345","generation":1,"creationTimestamp":"2026-11-20T10:00:00Z","managedFields":[{{"manager":"kubedev","operation":"Apply","apiVersion":"resource.k8s.io/v1","time":"2026-11-20T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{{"f:spec":{{"f:devices":{{}},"f:driver":{{}},"f:pool":{{}}}}}}}}]{extra}}}"#
    )
}

fn dump(nodes: usize) -> String {
    let mut items: Vec<String> = Vec::new();
    for n in 0..nodes {
        let labels = format!(
            r#","labels":{{"kubernetes.io/hostname":"node-{n}","topology.kubernetes.io/zone":"zone-{}"}},"annotations":{{"node.alpha.kubernetes.io/ttl":"0"}}"#,
            n % 3
        );
        items.push(format!(
            r#"{{"apiVersion":"v1","kind":"Node","metadata":{},"spec":{{"providerID":"kind://docker/kind/node-{n}"}},"status":{{"capacity":{{"cpu":"64","memory":"512Gi","pods":"110"}},"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status"}}],"nodeInfo":{{"kubeletVersion":"v1.36.0","osImage":"Debian GNU/Linux 12","architecture":"amd64"}}}}}}"#,
            meta(&format!("node-{n}"), None, &labels)
        ));
    }
    for n in 0..nodes {
        let mut devices = String::new();
        for g in 0..8 {
            if g > 0 {
                devices.push(',');
            }
            let _ = write!(
                devices,
                r#"{{"name":"gpu-{g}","attributes":{{"model":{{"string":"H100"}},"index":{{"int":{g}}},"numa":{{"int":{}}},"uuid":{{"string":"GPU-{n:05}-{g}"}},"driverVersion":{{"version":"560.35.3"}}}},"capacity":{{"memory":{{"value":"80Gi"}}}}}}"#,
                g / 4
            );
        }
        let owner = format!(
            r#","ownerReferences":[{{"apiVersion":"v1","kind":"Node","name":"node-{n}","uid":"uid-node-{n}"}}]"#
        );
        items.push(format!(
            r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{},"spec":{{"driver":"gpu.example.com","nodeName":"node-{n}","pool":{{"name":"node-{n}","generation":1,"resourceSliceCount":1}},"devices":[{devices}]}}}}"#,
            meta(&format!("node-{n}-gpu.example.com"), None, &owner)
        ));
    }
    items.push(format!(
        r#"{{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{},"spec":{{"selectors":[{{"cel":{{"expression":"device.driver == \"gpu.example.com\""}}}}]}}}}"#,
        meta("gpu", None, "")
    ));
    for c in 0..nodes * 4 / 5 {
        let results: Vec<String> = (0..8)
            .map(|g| {
                format!(
                    r#"{{"request":"gpu","driver":"gpu.example.com","pool":"node-{c}","device":"gpu-{g}"}}"#
                )
            })
            .collect();
        items.push(format!(
            r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{},"spec":{{"devices":{{"requests":[{{"name":"gpu","exactly":{{"deviceClassName":"gpu","allocationMode":"ExactCount","count":8}}}}]}}}},"status":{{"allocation":{{"devices":{{"results":[{}]}},"nodeSelector":{{"nodeSelectorTerms":[{{"matchFields":[{{"key":"metadata.name","operator":"In","values":["node-{c}"]}}]}}]}}}},"reservedFor":[{{"resource":"pods","name":"job-{c}","uid":"uid-pod-{c}"}}]}}}}"#,
            meta(&format!("job-{c}-gpu"), Some("default"), ""),
            results.join(",")
        ));
    }
    items.push(format!(
        r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{},"spec":{{"devices":{{"requests":[{{"name":"gpu","exactly":{{"deviceClassName":"gpu","count":4}}}}]}}}}}}"#,
        meta("train", Some("default"), "")
    ));
    items.push(format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{},"spec":{{"containers":[{{"name":"c","image":"x"}}],"resourceClaims":[{{"name":"gpu","resourceClaimName":"train"}}]}},"status":{{"phase":"Pending"}}}}"#,
        meta("trainer", Some("default"), "")
    ));
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
        items.join(",")
    )
}

/// The dump of `nodes` nodes as text, JSON or (`yaml`) YAML.
fn dump_text(nodes: usize, yaml: bool) -> String {
    let text = dump(nodes);
    if !yaml {
        return text;
    }
    // The same dump as `kubectl get … -o yaml` prints it.
    let value: serde_json::Value = serde_json::from_str(&text).expect("the dump is JSON");
    drop(text);
    serde_saphyr::to_string(&value).expect("YAML")
}

/// Reads `text` (named `origin`), answers for the pending pod, checks the answer and prints
/// the figures; `started` is when the process started its work. The text is dropped once
/// read, as `kubedev explain` drops each file once read.
fn read_and_answer(text: String, origin: &str, started: std::time::Instant) {
    let bytes = text.len();
    let c0 = process_cpu_ns();
    let w0 = std::time::Instant::now();
    let cluster = match read_cluster(&text, origin) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    drop(text);
    let c1 = process_cpu_ns();
    let w1 = std::time::Instant::now();
    let answer = match cluster.explain(&Subject::Pod("default/trainer".into())) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let summary = answer.to_text(false);
    let c2 = process_cpu_ns();
    let w2 = std::time::Instant::now();
    let wall = started.elapsed();
    let nodes = answer.nodes.len();
    let fit = answer.nodes.iter().filter(|n| n.fits).count();
    assert_eq!(
        fit,
        nodes - nodes * 4 / 5,
        "the free nodes fit, the taken ones do not"
    );
    let peak = peak_rss_kib();
    println!(
        "{nodes} nodes, dump {:.1} MB: read {:.0} ms, answer {:.0} ms, total {:.0} ms CPU (read {:.0} ms, answer {:.0} ms, {:.0} ms wall); peak RSS {:.0} MiB; {fit} nodes fit",
        bytes as f64 / 1e6,
        (c1 - c0) as f64 / 1e6,
        (c2 - c1) as f64 / 1e6,
        (c2 - c0) as f64 / 1e6,
        (w1 - w0).as_secs_f64() * 1e3,
        (w2 - w1).as_secs_f64() * 1e3,
        wall.as_secs_f64() * 1e3,
        peak as f64 / 1024.0
    );
    println!(
        "nodes={nodes} bytes={} read_ms={:.0} answer_ms={:.0} read_wall_ms={:.0} answer_wall_ms={:.0} wall_ms={:.0} peak_rss_kib={peak}",
        bytes,
        (c1 - c0) as f64 / 1e6,
        (c2 - c1) as f64 / 1e6,
        (w1 - w0).as_secs_f64() * 1e3,
        (w2 - w1).as_secs_f64() * 1e3,
        wall.as_secs_f64() * 1e3,
    );
    drop(std::hint::black_box(summary));
    // The process exits next: freeing the cluster object by object would only add time (a
    // large dump's cluster is millions of allocations), so it is left to the exit.
    std::mem::forget(cluster);
    std::mem::forget(answer);
}

fn usage() -> ! {
    eprintln!(
        "usage: explain_cluster [NODES [json|yaml]] | write NODES json|yaml FILE | read FILE"
    );
    std::process::exit(2);
}

fn main() {
    let started = std::time::Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["write", nodes, format @ ("json" | "yaml"), file] => {
            let nodes: usize = nodes.parse().unwrap_or_else(|_| usage());
            let text = dump_text(nodes, *format == "yaml");
            if let Err(e) = std::fs::write(file, text) {
                eprintln!("writing {file}: {e}");
                std::process::exit(1);
            }
        }
        ["read", file] => {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("reading {file}: {e}");
                    std::process::exit(1);
                }
            };
            read_and_answer(text, file, started);
        }
        [] | [_] | [_, "json" | "yaml"] => {
            let nodes: usize = match args.first() {
                Some(n) => n.parse().unwrap_or_else(|_| usage()),
                None => 5_000,
            };
            let yaml = args.get(1) == Some(&"yaml");
            let text = dump_text(nodes, yaml);
            let origin = if yaml { "dump.yaml" } else { "dump.json" };
            read_and_answer(text, origin, std::time::Instant::now());
        }
        _ => usage(),
    }
}
