//! Shares of devices that allow multiple allocations: the capacity each share consumes (the
//! request rounded by the device's policy, or its default) and the share IDs, which are
//! derived from the claim, the request, the device and the result's position, so the same
//! input always gets the same IDs.

use kubedev_allocator::{Scenario, SimulateOptions, simulate_here};

/// One shareable NIC: 100G of bandwidth in steps of 500M from 1G (default 1G), and 64 queues
/// taken in 1, 2, 4 or 8.
fn nic(i: usize) -> String {
    format!(
        "    - name: nic-{i}
      allowMultipleAllocations: true
      capacity:
        bandwidth:
          value: 100G
          requestPolicy:
            default: 1G
            validRange:
              min: 1G
              max: 100G
              step: 500M
        queues:
          value: \"64\"
          requestPolicy:
            validValues: [\"1\", \"2\", \"4\", \"8\"]
"
    )
}

/// Fourteen NICs; a namespaced claim asks for 12 shares of 1.2G and 3 queues, then for one
/// share of 200G (too much) or else one queue.
fn scenario() -> Scenario {
    let devices: String = (0..14).map(nic).collect();
    let text = format!(
        "node:
  name: node-1
deviceClasses:
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata:
    name: nic
  spec:
    selectors:
    - cel:
        expression: device.driver == \"nic.example.com\"
resourceSlices:
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata:
    name: nics
  spec:
    driver: nic.example.com
    nodeName: node-1
    pool:
      name: pool-a
      generation: 1
      resourceSliceCount: 1
    devices:
{devices}claims:
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata:
    name: web
    namespace: team-a
    uid: 0b6f8f5e-uid-web
  spec:
    devices:
      requests:
      - name: net
        exactly:
          deviceClassName: nic
          allocationMode: ExactCount
          count: 12
          capacity:
            requests:
              bandwidth: 1.2G
              queues: \"3\"
      - name: alt
        firstAvailable:
        - name: big
          deviceClassName: nic
          count: 1
          capacity:
            requests:
              bandwidth: 200G
        - name: small
          deviceClassName: nic
          count: 1
          capacity:
            requests:
              queues: \"1\"
"
    );
    kubedev_inputs::scenario_from_text(&text).expect("scenario")
}

/// Each share's request, device, share ID and consumed capacity, and the same again from a
/// second allocation.
#[test]
fn shares_consume_rounded_capacity_under_stable_ids() {
    let scenario = scenario();
    let out = simulate_here(&scenario, &SimulateOptions::default());
    assert!(out.allocatable, "{:?}", out.error);
    let allocation = out.claims[0].allocation.as_ref().expect("allocation");
    let got: Vec<String> = allocation
        .devices
        .results
        .iter()
        .map(|r| {
            let caps: Vec<String> = r
                .consumed_capacity
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!(
                "{} {} {} {}",
                r.request,
                r.device,
                r.share_id.as_deref().unwrap_or("-"),
                caps.join(",")
            )
        })
        .collect();
    let want = [
        "net nic-0 375ec2b4-5a1c-1432-87c6-fe2f62d37fca bandwidth=1500M,queues=4",
        "net nic-1 40087cb4-5f04-7dea-4547-20a36229363f bandwidth=1500M,queues=4",
        "net nic-2 260beeb4-504c-50a2-02c6-c317617e1314 bandwidth=1500M,queues=4",
        "net nic-3 2eb5a8b4-5534-ba5a-c046-e58b60d3c968 bandwidth=1500M,queues=4",
        "net nic-4 14b91ab4-467c-8d12-7dc7-87ff602a595d bandwidth=1500M,queues=4",
        "net nic-5 1d6254b4-4b64-1d4a-3b47-aa735f800fb2 bandwidth=1500M,queues=4",
        "net nic-6 036646b4-3cac-c982-f8c7-4ce75ed4ec86 bandwidth=1500M,queues=4",
        "net nic-7 0c0f80b4-4194-59ba-b647-6f5b5e2aa2fb bandwidth=1500M,queues=4",
        "net nic-8 7caa92b4-815b-fbf2-73c6-11cf5d7dccd0 bandwidth=1500M,queues=4",
        "net nic-9 85543cb4-8644-4a7a-3146-34435cd38325 bandwidth=1500M,queues=4",
        "net nic-10 83dc17a7-826a-945c-47ad-50d795935e33 bandwidth=1500M,queues=4",
        "net nic-11 e30e569f-2b81-2f0a-8729-6d7bcc85eaa8 bandwidth=1500M,queues=4",
        "alt/small nic-0 e3ad2b1f-74af-2615-6f8f-19cde67aad07 bandwidth=1G,queues=1",
    ];
    assert_eq!(got, want);
    let again = simulate_here(&scenario, &SimulateOptions::default());
    assert_eq!(again.claims, out.claims);
}
