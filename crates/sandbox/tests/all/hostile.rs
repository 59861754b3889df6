//! Hostile and broken modules are contained and reported with the right `PolicyError`.

use std::time::{Duration, Instant};

use kubedev_allocator::{AllocateOptions, AllocationError, Allocator, SimulateOptions, simulate};
use kubedev_sandbox::{Candidate, Limits, PolicyError, PolicyInput, Sandbox, WasmPolicy};
use serde_json::json;

use crate::common::*;

fn gpus(n: usize) -> Vec<kubedev_allocator::api::Device> {
    (0..n)
        .map(|i| kubedev_allocator::api::Device {
            name: format!("gpu-{i}"),
            ..Default::default()
        })
        .collect()
}

fn ask(policy: &WasmPolicy) -> Result<kubedev_sandbox::Evaluation, PolicyError> {
    let devices = gpus(4);
    let candidates = devices
        .iter()
        .map(|d| Candidate::published(DRIVER, "node-1", d))
        .collect();
    policy.evaluate(&PolicyInput::new("default/job", "gpus", 2, candidates))
}

fn load(sb: &Sandbox, wasm: &[u8]) -> WasmPolicy {
    sb.load("hostile", wasm)
        .expect("the module keeps the contract")
}

const INFINITE_LOOP: &str = "(loop $l (br $l)) (unreachable)";

#[test]
fn an_infinite_loop_runs_out_of_fuel() {
    let sb = Sandbox::new(Limits::default().with_fuel(1_000_000)).expect("sandbox");
    let p = load(&sb, &wat_policy(INFINITE_LOOP));
    let started = Instant::now();
    match ask(&p) {
        Err(PolicyError::OutOfFuel { policy, fuel }) => {
            assert_eq!(policy, "hostile");
            assert_eq!(fuel, 1_000_000);
        }
        other => panic!("expected OutOfFuel, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    let stats = p.stats();
    assert_eq!((stats.calls, stats.failures), (1, 1));
    assert_eq!(stats.last_error.map(|e| e.kind()), Some("out-of-fuel"));
}

#[test]
fn the_wall_clock_stops_a_loop_that_fuel_would_not() {
    let sb = Sandbox::new(
        Limits::default()
            .with_fuel(u64::MAX / 2)
            .with_timeout(Duration::from_millis(50)),
    )
    .expect("sandbox");
    let p = load(&sb, &wat_policy(INFINITE_LOOP));
    let started = Instant::now();
    match ask(&p) {
        Err(PolicyError::Timeout { limit, .. }) => assert_eq!(limit, Duration::from_millis(50)),
        other => panic!("expected Timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(50), "stopped early: {took:?}");
    assert!(took < Duration::from_secs(2), "stopped late: {took:?}");
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    let sb = Sandbox::new(Limits::default().with_memory_bytes(4 << 20)).expect("sandbox");
    let bomb =
        "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) (i64.const 0)";
    let p = load(&sb, &wat_policy(bomb));
    match ask(&p) {
        Err(PolicyError::MemoryLimit {
            limit, requested, ..
        }) => {
            assert_eq!(limit, 4 << 20);
            assert!(requested > limit);
        }
        other => panic!("expected MemoryLimit, got {other:?}"),
    }
}

#[test]
fn a_module_asking_for_too_much_memory_up_front_is_refused_at_load() {
    let sb = Sandbox::new(Limits::default().with_memory_bytes(1 << 20)).expect("sandbox");
    let big = wat(r#"(module
      (memory (export "memory") 100)
      (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
      (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 0))
      (func (export "kubedev_select") (param i32 i32) (result i64) (i64.const 0)))"#);
    match sb.load("big", &big) {
        Err(PolicyError::BadModule { reason, .. }) => {
            assert!(reason.contains("minimum byte size of 6553600"), "{reason}")
        }
        other => panic!("expected BadModule, got {other:?}"),
    }
}

#[test]
fn traps_are_reported_as_traps() {
    let sb = sandbox();
    let cases = [
        ("(unreachable)", "unreachable"),
        (
            "(i64.extend_i32_u (i32.div_u (i32.const 1) (i32.const 0)))",
            "divide by zero",
        ),
        (
            "(i64.load (i32.const 0x7ffffff0))",
            "out of bounds memory access",
        ),
        ("(call $down) (i64.const 0)", "call stack exhausted"),
    ];
    for (body, want) in cases {
        let p = load(&sb, &wat_policy_with("", body, "(func $down (call $down))"));
        match ask(&p) {
            Err(PolicyError::Trap { message, .. }) => {
                assert!(message.contains(want), "{body}: {message:?} lacks {want:?}")
            }
            other => panic!("{body}: expected Trap, got {other:?}"),
        }
    }
}

#[test]
fn garbage_output_is_a_bad_output() {
    let sb = sandbox();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"hello, world".to_vec(), "does not start"),
        (out_order(&[0, 0], &[]), "twice"),
        (out_order(&[7], &[]), "candidate 7"),
        (out_scores(&[1, 2]), "2 scores for 4"),
        ([out_order(&[1], &[]), vec![0xff]].concat(), "after the end"),
        (
            out_order(&[1], &[(0, "\u{1F525}")])[..20].to_vec(),
            "output ends",
        ),
    ];
    for (output, want) in cases {
        let p = load(&sb, &fixed_output_policy(&output));
        match ask(&p) {
            Err(PolicyError::BadOutput { reason, .. }) => {
                assert!(reason.contains(want), "{reason:?} lacks {want:?}")
            }
            other => panic!("expected BadOutput ({want}), got {other:?}"),
        }
    }
}

#[test]
fn an_enormous_or_misplaced_output_is_a_bad_output() {
    let sb = sandbox();
    let cases = [
        // 4 GiB - 1 claimed at address 0.
        ("(i64.const 0xffffffff)", "over the limit"),
        // 2 MiB really written: over the 1 MiB output limit.
        (
            "(drop (memory.grow (i32.const 40))) (i64.const 0x200000)",
            "2097152 bytes is over the limit of 1048576",
        ),
        // In range of the size limit, outside memory.
        (
            "(i64.or (i64.shl (i64.const 0xfff00000) (i64.const 32)) (i64.const 16))",
            "outside the memory",
        ),
    ];
    for (body, want) in cases {
        let p = load(&sb, &wat_policy(body));
        match ask(&p) {
            Err(PolicyError::BadOutput { reason, .. }) => {
                assert!(reason.contains(want), "{reason:?} lacks {want:?}")
            }
            other => panic!("expected BadOutput ({want}), got {other:?}"),
        }
    }
}

#[test]
fn a_bad_input_buffer_is_a_bad_output() {
    let sb = sandbox();
    let module = wat(r#"(module
      (memory (export "memory") 1)
      (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
      (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 65530))
      (func (export "kubedev_select") (param i32 i32) (result i64) (i64.const 0)))"#);
    match ask(&load(&sb, &module)) {
        Err(PolicyError::BadOutput { reason, .. }) => {
            assert!(reason.contains("returned 65530"), "{reason}")
        }
        other => panic!("expected BadOutput, got {other:?}"),
    }
}

#[test]
fn forbidden_imports_and_broken_contracts_are_bad_modules() {
    let sb = sandbox();
    let exports = r#"
      (memory (export "memory") 1)
      (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
      (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 0))
      (func (export "kubedev_select") (param i32 i32) (result i64) (i64.const 0))"#;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            wat(&format!(
                r#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32))) {exports})"#
            )),
            "imports wasi_snapshot_preview1.fd_write",
        ),
        (
            wat(&format!(
                r#"(module (import "kubedev" "log" (func (param i64))) {exports})"#
            )),
            "imports kubedev.log (function (i64) -> ())",
        ),
        (
            wat(r#"(module (import "env" "mem" (memory 1)) (func (export "x")))"#),
            "imports env.mem (memory)",
        ),
        (
            wat(r#"(module (memory (export "memory") 1))"#),
            "does not export function \"kubedev_alloc\"",
        ),
        (
            wat(r#"(module
              (memory (export "memory") 1)
              (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
              (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 0))
              (func (export "kubedev_select") (param i32 i32) (result i32) (i32.const 0)))"#),
            "\"kubedev_select\" is a function (i32, i32) -> (i32)",
        ),
        (
            wat(r#"(module
              (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1)))"#),
            "does not export \"memory\"",
        ),
        (
            wat(r#"(module
              (memory (export "memory") 1)
              (func (export "kubedev_policy_abi_version") (result i32) (i32.const 2))
              (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 0))
              (func (export "kubedev_select") (param i32 i32) (result i64) (i64.const 0)))"#),
            "returned 2, this host speaks ABI version 1",
        ),
        (
            wat(&format!(
                r#"(module {exports} (func $spin (loop $l (br $l))) (start $spin))"#
            )),
            "ran out of fuel",
        ),
        (b"\0asm\x01\0\0\0garbage".to_vec(), "does not compile"),
        (
            b"not wasm at all".to_vec(),
            "it is not a WebAssembly module (it does not start with \\0asm)",
        ),
    ];
    for (module, want) in cases {
        match sb.load("broken", &module) {
            Err(PolicyError::BadModule { policy, reason }) => {
                assert_eq!(policy, "broken");
                assert!(reason.contains(want), "{reason:?} lacks {want:?}");
            }
            other => panic!("expected BadModule ({want}), got {other:?}"),
        }
    }
}

#[test]
fn logging_is_capped_per_call_and_bad_log_pointers_trap() {
    let sb = sandbox();
    let spam = wat_policy_with(
        r#"(import "kubedev" "log" (func $log (param i32 i32)))"#,
        r#"(local $i i32)
           (loop $l
             (call $log (i32.const 1024) (i32.const 5))
             (local.set $i (i32.add (local.get $i) (i32.const 1)))
             (br_if $l (i32.lt_u (local.get $i) (i32.const 1000))))
           (i64.or (i64.shl (i64.const 2048) (i64.const 32)) (i64.const 13))"#,
        r#"(data (i32.const 1024) "hello")
           (data (i32.const 2048) "KDPO\01\00\00\00\00\00\00\00\00")"#,
    );
    let p = load(&sb, &spam);
    assert!(p.imports_log());
    let eval = ask(&p).expect("a chatty policy still answers");
    assert_eq!(eval.log.len(), 16);
    assert!(eval.log.iter().all(|l| l == "hello"));
    // Each log call costs fuel: 1000 calls cost more than a million units.
    assert!(eval.fuel_used > 1_000_000, "{}", eval.fuel_used);

    let wild = wat_policy_with(
        r#"(import "kubedev" "log" (func $log (param i32 i32)))"#,
        "(call $log (i32.const 65000) (i32.const 1000)) (i64.const 0)",
        "",
    );
    match ask(&load(&sb, &wild)) {
        Err(PolicyError::Trap { message, .. }) => {
            assert!(message.contains("outside the memory"), "{message}")
        }
        other => panic!("expected Trap, got {other:?}"),
    }
}

#[test]
fn a_failing_policy_leaves_the_default_allocation_and_the_host_keeps_serving() {
    let sb = Sandbox::new(Limits::default().with_fuel(200_000)).expect("sandbox");
    let hostile = load(&sb, &wat_policy(INFINITE_LOOP));
    let gpus = (0..4)
        .map(|i| {
            device(
                &format!("gpu-{i}"),
                json!({ "resource.kubernetes.io/numaNode": { "int": i % 2 } }),
            )
        })
        .collect();
    let s = scenario(gpus, vec![], &[], 2);
    let default = allocate(&s, None).expect("fits");
    let session = hostile.session(&s.resource_slices, &s.allocated_devices);
    assert_eq!(allocate(&s, Some(&session)).expect("fits"), default);
    assert!(matches!(
        session.failure(),
        Some(PolicyError::OutOfFuel { .. })
    ));
    assert_eq!(allocate(&s, Some(&hostile)).expect("fits"), default);
    // The same sandbox still runs good policies.
    let good = plugin(&sb, "numa-pack");
    assert_eq!(
        sorted(allocate(&s, Some(&good)).expect("fits")),
        names(&["gpu-0", "gpu-2"])
    );
}

#[test]
fn fail_closed_refuses_the_allocation_naming_the_policy_and_the_failure() {
    let sb = Sandbox::new(
        Limits::default()
            .with_fuel(200_000)
            .with_memory_bytes(4 << 20),
    )
    .expect("sandbox");
    let gpus = (0..4)
        .map(|i| {
            device(
                &format!("gpu-{i}"),
                json!({ "resource.kubernetes.io/numaNode": { "int": i % 2 } }),
            )
        })
        .collect();
    let s = scenario(gpus, vec![], &[], 2);
    let default = allocate(&s, None).expect("fits");
    let bomb =
        "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) (i64.const 0)";
    let cases = [
        (wat_policy(INFINITE_LOOP), "out-of-fuel"),
        (wat_policy(bomb), "memory-limit"),
        (wat_policy("(unreachable)"), "trap"),
        (fixed_output_policy(b"garbage"), "bad-output"),
    ];
    for (module, kind) in cases {
        let hostile = load(&sb, &module);
        let session = hostile.session(&s.resource_slices, &s.allocated_devices);
        // Fail-open: the allocation succeeds in the default order, the failure is recorded.
        assert_eq!(
            allocate(&s, Some(&session)).expect("fits"),
            default,
            "{kind}"
        );
        assert_eq!(session.failure().map(|e| e.kind()), Some(kind));
        // Fail-closed: the allocation is refused with the policy's name and failure kind.
        let mut allocator =
            Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
        let options = AllocateOptions::default()
            .with_policy(&session)
            .with_fail_closed(true);
        match allocator.allocate(&s.node, &s.claims, &options) {
            Err(AllocationError::Policy {
                claim,
                request,
                failure,
            }) => {
                assert_eq!(failure.policy, "hostile");
                assert_eq!(failure.kind, kind);
                assert_eq!((claim.as_str(), request.as_str()), ("default/job", "gpus"));
                assert!(!failure.message.starts_with("policy hostile"), "{failure}");
            }
            other => panic!("{kind}: expected AllocationError::Policy, got {other:?}"),
        }
        let out = simulate(
            &s,
            &SimulateOptions::default()
                .with_policy(&hostile)
                .with_fail_closed(true),
        );
        let error = out.error.expect("simulate reports the failure");
        assert!(
            error.contains(&format!("selection policy hostile failed ({kind})")),
            "{error}"
        );
    }
    // The same sandbox still serves a good policy, fail-closed.
    let good = plugin(&sb, "numa-pack");
    let mut allocator = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
    let options = AllocateOptions::default()
        .with_policy(&good)
        .with_fail_closed(true);
    let results = allocator
        .allocate(&s.node, &s.claims, &options)
        .expect("no failure")
        .expect("fits");
    let got: Vec<String> = results[0]
        .devices
        .results
        .iter()
        .map(|r| r.device.to_string())
        .collect();
    assert_eq!(sorted(got), names(&["gpu-0", "gpu-2"]));
}

#[test]
fn a_bad_input_declaration_is_a_bad_module() {
    let sb = sandbox();
    let declare = |text: &str| {
        wat_policy_with(
            "",
            "(i64.const 0)",
            &format!(
                r#"(func (export "kubedev_policy_inputs") (result i64)
                     (i64.or (i64.shl (i64.const 1024) (i64.const 32)) (i64.const {})))
                   (data (i32.const 1024) "{text}")"#,
                text.len()
            ),
        )
    };
    let ok = sb.load("declares", &declare("counters")).expect("load");
    assert_eq!(ok.input_declaration(), Some("counters"));
    match sb.load("declares", &declare("attributes model")) {
        Err(PolicyError::BadModule { reason, .. }) => {
            assert!(reason.contains("line 1"), "{reason}")
        }
        other => panic!("expected BadModule, got {other:?}"),
    }
    let wild = wat_policy_with(
        "",
        "(i64.const 0)",
        r#"(func (export "kubedev_policy_inputs") (result i64) (i64.const 0x0000fff000001000))"#,
    );
    match sb.load("wild", &wild) {
        Err(PolicyError::BadModule { reason, .. }) => {
            assert!(reason.contains("outside the memory"), "{reason}")
        }
        other => panic!("expected BadModule, got {other:?}"),
    }
    let typed = wat_policy_with(
        "",
        "(i64.const 0)",
        r#"(func (export "kubedev_policy_inputs") (result i32) (i32.const 0))"#,
    );
    match sb.load("typed", &typed) {
        Err(PolicyError::BadModule { reason, .. }) => {
            assert!(reason.contains("kubedev_policy_inputs"), "{reason}")
        }
        other => panic!("expected BadModule, got {other:?}"),
    }
}

#[test]
fn policies_run_concurrently_and_a_full_pool_is_busy() {
    let sb = sandbox();
    let good = plugin(&sb, "numa-pack");
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let p = good.clone();
            std::thread::spawn(move || (0..20).all(|_| ask(&p).is_ok()))
        })
        .collect();
    for t in threads {
        assert!(t.join().expect("thread"));
    }

    let one = Sandbox::new(
        Limits::default()
            .with_max_concurrent_calls(1)
            .with_fuel(u64::MAX / 2)
            .with_timeout(Duration::from_secs(1)),
    )
    .expect("sandbox");
    let slow = load(&one, &wat_policy(INFINITE_LOOP));
    let s = slow.clone();
    let t = std::thread::spawn(move || ask(&s));
    // Wait until the first call has started, then give it time to take the only slot.
    while slow.stats().calls == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    match ask(&slow) {
        Err(PolicyError::Busy { limit, .. }) => assert_eq!(limit, 1),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(matches!(
        t.join().expect("thread"),
        Err(PolicyError::Timeout { .. })
    ));
}

#[test]
fn example_policies_fit_in_a_small_memory_limit() {
    let sb = Sandbox::new(Limits::default().with_memory_bytes(1 << 20)).expect("sandbox");
    for name in ["numa-pack", "nvlink-pack", "spread", "binpack"] {
        let p = plugin(&sb, name);
        let eval = ask(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            eval.memory_bytes <= 1 << 20,
            "{name}: {}",
            eval.memory_bytes
        );
    }
}

/// 100 000 nested blocks in 300 KB took minutes to compile, stalling start-up. The module's
/// shape is checked first: it is refused, naming the limit, without being compiled.
#[test]
fn deeply_nested_blocks_are_refused_before_compiling() {
    let sb = Sandbox::new(Limits::default()).expect("sandbox");
    let depth = 100_000;
    let body = format!("{}{}", "block ".repeat(depth), "end ".repeat(depth));
    let wasm = wat::parse_str(format!("(module (func {body}))")).expect("wat");
    assert!(wasm.len() > 200_000, "the module is {} bytes", wasm.len());
    match sb.load("nested", &wasm) {
        Err(e @ PolicyError::BadModule { .. }) => {
            let text = e.to_string();
            assert!(text.contains("nests blocks more than 1000 deep"), "{text}");
        }
        other => panic!("expected BadModule, got {:?}", other.map(|_| ())),
    }
    // A module within the limits is compiled as before.
    load(&sb, &wat_policy("(i32.const 0) (drop) (unreachable)"));
}

/// A module that compiles for longer than the compile timeout is refused; the caller does not
/// wait for the compiler.
#[test]
fn a_module_that_compiles_too_long_is_refused() {
    let sb = Sandbox::new(Limits::default().with_compile_timeout(Duration::from_nanos(1)))
        .expect("sandbox");
    match sb.load("slow", &wat_policy(INFINITE_LOOP)) {
        Err(e @ PolicyError::BadModule { .. }) => {
            assert!(e.to_string().contains("did not compile within"), "{e}");
        }
        other => panic!("expected BadModule, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn too_many_functions_are_refused_before_compiling() {
    let sb = Sandbox::new(Limits::default()).expect("sandbox");
    let funcs = "(func)".repeat(10_001);
    let wasm = wat::parse_str(format!("(module {funcs})")).expect("wat");
    match sb.load("many", &wasm) {
        Err(e @ PolicyError::BadModule { .. }) => {
            assert!(
                e.to_string()
                    .contains("defines 10001 functions, more than the 10000"),
                "{e}"
            );
        }
        other => panic!("expected BadModule, got {:?}", other.map(|_| ())),
    }
}
