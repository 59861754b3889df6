//! The selection-policy hook: what the allocator tells a policy, how it applies an answer
//! (order, rejected devices left out), and what a failure does (fail-open, fail-closed).

use parking_lot::Mutex;

use kubedev_allocator::{
    AllocateOptions, AllocationError, Allocator, PolicyConstraint, PolicyConstraintKind,
    PolicyDevice, PolicyFailure, PolicyOutcome, PolicyRequest, Reason, Scenario, SelectionPolicy,
    SimulateOptions, simulate,
};

/// Four GPUs on two NUMA nodes, `gpu-3` already allocated; one claim of `count` GPUs with a
/// matchAttribute on the NUMA node and a distinctAttribute on the index.
fn scenario(count: usize) -> Scenario {
    let devices: Vec<String> = (0..4)
        .map(|i| {
            format!(
                "{{name: gpu-{i}, attributes: {{numa: {{int: {}}}, index: {{int: {i}}}}}}}",
                i / 2
            )
        })
        .collect();
    kubedev_inputs::scenario_from_text(&format!(
        r#"
node: {{name: node-1}}
deviceClasses:
- metadata: {{name: gpu}}
  spec: {{selectors: [{{cel: {{expression: 'device.driver == "gpu.example.com"'}}}}]}}
resourceSlices:
- metadata: {{name: node-1-gpus}}
  spec:
    driver: gpu.example.com
    nodeName: node-1
    pool: {{name: node-1, generation: 1, resourceSliceCount: 1}}
    devices: [{}]
allocatedDevices: [gpu.example.com/node-1/gpu-3]
claims:
- metadata: {{name: job, namespace: default}}
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: gpu, count: {count}}}
      constraints:
      - matchAttribute: gpu.example.com/numa
      - distinctAttribute: gpu.example.com/index
        requests: [gpus]
"#,
        devices.join(", ")
    ))
    .expect("scenario")
}

/// What a test policy saw in its last call.
#[derive(Debug, Default, Clone, PartialEq)]
struct Seen {
    claim: String,
    request: String,
    count: usize,
    constraints: Vec<(PolicyConstraintKind, String)>,
    devices: Vec<(String, bool)>,
}

/// A policy with a scripted answer that records what it was told.
#[derive(Debug)]
struct Scripted {
    answer: Result<PolicyOutcome, PolicyFailure>,
    seen: Mutex<Vec<Seen>>,
}

impl Scripted {
    fn new(answer: Result<PolicyOutcome, PolicyFailure>) -> Self {
        Scripted {
            answer,
            seen: Mutex::new(Vec::new()),
        }
    }

    fn calls(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }
}

impl SelectionPolicy for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    fn order(
        &self,
        request: &PolicyRequest<'_>,
        candidates: &[PolicyDevice<'_>],
    ) -> Result<PolicyOutcome, PolicyFailure> {
        self.seen.lock().push(Seen {
            claim: request.claim.to_string(),
            request: request.request.to_string(),
            count: request.count,
            constraints: request
                .constraints
                .iter()
                .map(|c: &PolicyConstraint<'_>| (c.kind, c.attribute.to_string()))
                .collect(),
            devices: candidates
                .iter()
                .map(|d| (d.device.name.clone(), d.allocated))
                .collect(),
        });
        self.answer.clone()
    }
}

fn devices_with(
    s: &Scenario,
    options: &AllocateOptions<'_>,
) -> Result<Option<Vec<String>>, AllocationError> {
    let mut a = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
    Ok(a.allocate(&s.node, &s.claims, options)?.map(|r| {
        r[0].devices
            .results
            .iter()
            .map(|d| d.device.to_string())
            .collect()
    }))
}

#[test]
fn the_policy_is_told_the_request_its_constraints_and_which_devices_are_allocated() {
    let s = scenario(2);
    let p = Scripted::new(Ok(PolicyOutcome::keep()));
    let got = devices_with(&s, &AllocateOptions::default().with_policy(&p)).unwrap();
    assert_eq!(got, Some(vec!["gpu-0".to_string(), "gpu-1".to_string()]));
    let calls = p.calls();
    assert_eq!(calls.len(), 1);
    let seen = &calls[0];
    assert_eq!(
        (seen.claim.as_str(), seen.request.as_str(), seen.count),
        ("default/job", "gpus", 2)
    );
    assert_eq!(
        seen.constraints,
        vec![
            (
                PolicyConstraintKind::MatchAttribute,
                "gpu.example.com/numa".to_string()
            ),
            (
                PolicyConstraintKind::DistinctAttribute,
                "gpu.example.com/index".to_string()
            ),
        ]
    );
    assert_eq!(
        seen.devices,
        vec![
            ("gpu-0".to_string(), false),
            ("gpu-1".to_string(), false),
            ("gpu-2".to_string(), false),
            ("gpu-3".to_string(), true),
        ]
    );
}

#[test]
fn an_order_changes_the_first_valid_choice() {
    let s = scenario(1);
    let p = Scripted::new(Ok(PolicyOutcome::ordered(vec![2, 0, 1, 3])));
    let got = devices_with(&s, &AllocateOptions::default().with_policy(&p)).unwrap();
    assert_eq!(got, Some(vec!["gpu-2".to_string()]));
}

#[test]
fn a_rejected_device_is_left_out_and_another_is_chosen() {
    let s = scenario(1);
    assert_eq!(
        devices_with(&s, &AllocateOptions::default()).unwrap(),
        Some(vec!["gpu-0".to_string()])
    );
    let p = Scripted::new(Ok(PolicyOutcome::keep().with_rejection(0, "fan failing")));
    let got = devices_with(&s, &AllocateOptions::default().with_policy(&p)).unwrap();
    assert_eq!(got, Some(vec!["gpu-1".to_string()]));
    // Rejected, not merely last: with gpu-0 rejected and preferred first, it is still skipped.
    let p = Scripted::new(Ok(
        PolicyOutcome::ordered(vec![0, 2, 1, 3]).with_rejection(0, "fan failing")
    ));
    let got = devices_with(&s, &AllocateOptions::default().with_policy(&p)).unwrap();
    assert_eq!(got, Some(vec!["gpu-2".to_string()]));
}

#[test]
fn an_allocation_that_needs_a_rejected_device_does_not_fit_and_the_explanation_says_why() {
    // Two GPUs on NUMA node 0 (gpu-0, gpu-1) are the only pair that matches: gpu-2's partner
    // gpu-3 is allocated. Rejecting gpu-1 leaves no pair.
    let s = scenario(2);
    let p = Scripted::new(Ok(
        PolicyOutcome::keep().with_rejection(1, "ECC errors above threshold")
    ));
    let options = AllocateOptions::default().with_policy(&p);
    assert_eq!(devices_with(&s, &options).unwrap(), None);
    let mut a = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
    let e = a.explain_with(&s.node, &s.claims, &options).unwrap();
    let rejected = &e.claims[0].requests[0].rejected;
    let gpu1 = rejected
        .iter()
        .find(|r| r.device == "gpu.example.com/node-1/gpu-1")
        .expect("gpu-1 is listed as rejected");
    assert_eq!(
        gpu1.reason,
        Reason::PolicyRejected {
            policy: "scripted".into(),
            message: "ECC errors above threshold".into()
        }
    );
    assert!(
        e.summary[0].contains(
            "rejected by policy scripted (gpu.example.com/node-1/gpu-1: ECC errors above threshold)"
        ),
        "{}",
        e.summary[0]
    );
    // simulate --explain shows the same, and JSON names the reason.
    let out = simulate(
        &s,
        &SimulateOptions::default()
            .with_explain(true)
            .with_policy(&p),
    );
    assert!(!out.allocatable);
    assert!(
        out.to_text().contains("ECC errors above threshold"),
        "{}",
        out.to_text()
    );
    assert!(
        out.to_json().contains("\"reason\": \"policyRejected\""),
        "{}",
        out.to_json()
    );
    // Without the policy the same claim fits.
    assert!(
        devices_with(&s, &AllocateOptions::default())
            .unwrap()
            .is_some()
    );
}

#[test]
fn a_failing_policy_keeps_the_default_order_unless_fail_closed() {
    let s = scenario(1);
    let p = Scripted::new(Err(PolicyFailure::new(
        "scripted",
        "out-of-fuel",
        "ran out of fuel (limit 10 units)",
    )));
    let open = AllocateOptions::default().with_policy(&p);
    assert_eq!(
        devices_with(&s, &open).unwrap(),
        Some(vec!["gpu-0".to_string()])
    );
    let closed = open.with_fail_closed(true);
    match devices_with(&s, &closed) {
        Err(AllocationError::Policy {
            claim,
            request,
            failure,
        }) => {
            assert_eq!((claim.as_str(), request.as_str()), ("default/job", "gpus"));
            assert_eq!(failure.policy, "scripted");
            assert_eq!(failure.kind, "out-of-fuel");
            assert!(failure.message.contains("ran out of fuel"), "{failure}");
        }
        other => panic!("expected AllocationError::Policy, got {other:?}"),
    }
    let text = devices_with(&s, &closed).unwrap_err().to_string();
    assert!(
        text.contains("selection policy scripted failed (out-of-fuel)"),
        "{text}"
    );
    let out = simulate(
        &s,
        &SimulateOptions::default()
            .with_policy(&p)
            .with_fail_closed(true),
    );
    assert!(
        out.error.as_deref().is_some_and(|e| e.contains("scripted")),
        "{:?}",
        out.error
    );
}

#[test]
fn a_malformed_answer_is_a_failure() {
    let s = scenario(1);
    for (answer, want) in [
        (
            PolicyOutcome::ordered(vec![0, 0, 1, 2]),
            "not a permutation",
        ),
        (PolicyOutcome::ordered(vec![0, 1]), "not a permutation"),
        (
            PolicyOutcome::keep().with_rejection(9, "x"),
            "rejects candidate 9",
        ),
        (
            PolicyOutcome::keep()
                .with_rejection(1, "x")
                .with_rejection(1, "y"),
            "twice",
        ),
    ] {
        let p = Scripted::new(Ok(answer));
        let open = AllocateOptions::default().with_policy(&p);
        assert_eq!(
            devices_with(&s, &open).unwrap(),
            Some(vec!["gpu-0".to_string()]),
            "{want}"
        );
        match devices_with(&s, &open.with_fail_closed(true)) {
            Err(AllocationError::Policy { failure, .. }) => {
                assert_eq!(failure.kind, "bad-output");
                assert!(failure.message.contains(want), "{failure} lacks {want}");
            }
            other => panic!("expected AllocationError::Policy, got {other:?}"),
        }
    }
}
