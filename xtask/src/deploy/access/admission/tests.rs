use super::*;
use serde_json::json;

fn policy() -> Value {
    json!({
        "failurePolicy": "Fail",
        "matchConditions": [{"name": "d", "expression":
            "request.userInfo.username == \"system:serviceaccount:kube-system:kubedev\""}],
        "variables": [
            {"name": "node", "expression":
                "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
            {"name": "slices", "expression":
                "request.operation == 'CREATE' ? [object] : (request.operation == 'DELETE' ? [oldObject] : [object, oldObject])"},
        ],
        "validations": [
            {"expression": "variables.node != ''"},
            {"expression": "variables.slices.all(s, s.spec.?nodeName.orValue('') == variables.node)"},
            {"expression": "variables.slices.all(s, s.spec.driver == \"d.example.com\")"},
        ],
    })
}

#[test]
fn the_policy_is_evaluated_on_every_request() {
    let user = "system:serviceaccount:kube-system:kubedev";
    for r in requests(user, "d.example.com") {
        let v = evaluate(&policy(), &r).unwrap();
        assert_eq!(
            !matches!(v, Verdict::Denied(_)),
            r.allowed,
            "{}: {v:?}",
            r.what
        );
    }
    // Without the driver test, another driver's slice on its node gets through.
    let mut loose = policy();
    loose["validations"].as_array_mut().unwrap().pop();
    let r = requests(user, "d.example.com")
        .into_iter()
        .find(|r| r.what.contains("of driver"))
        .unwrap();
    assert_eq!(evaluate(&loose, &r).unwrap(), Verdict::Allowed);
    // Another account is not matched at all.
    let other = requests(user, "d.example.com").pop().unwrap();
    assert_eq!(evaluate(&policy(), &other).unwrap(), Verdict::NotMatched);
    // A syntax error is reported, not taken as a denial.
    let mut broken = policy();
    broken["validations"][0]["expression"] = json!("variables.node !=");
    assert!(evaluate(&broken, &other).is_err());
}
