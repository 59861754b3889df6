//! What a WebAssembly selection policy answers, as arbitrary bytes: decoding never panics, and a
//! decision it accepts is a permutation of the candidates with each rejection naming one of
//! them once, with a bounded reason.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (candidates, bytes) = match data.split_first() {
        Some((n, rest)) => (usize::from(*n % 65), rest),
        None => return,
    };
    let Ok((order, rejections)) = kubedev_sandbox::decode_policy_output(bytes, candidates) else {
        return;
    };
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..candidates).collect::<Vec<_>>(), "{order:?}");
    let mut rejected: Vec<usize> = rejections.iter().map(|(i, _)| *i).collect();
    rejected.sort_unstable();
    rejected.dedup();
    assert_eq!(rejected.len(), rejections.len(), "{rejections:?}");
    for (i, reason) in &rejections {
        assert!(*i < candidates);
        assert!(reason.len() <= 256, "{} byte reason", reason.len());
    }
});
