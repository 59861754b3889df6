//! Tests of the kubelet's DRA service version choice.

use super::KUBELET_DRA_SERVICES;
use super::registration::choose_version;

#[test]
fn chooses_the_first_advertised_version_it_supports() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let kubelet = v(&KUBELET_DRA_SERVICES);
    assert_eq!(
        choose_version(&kubelet, &v(&["v1beta1.DRAPlugin", "v1.DRAPlugin"])).as_deref(),
        Some("v1beta1.DRAPlugin")
    );
    assert_eq!(
        choose_version(&kubelet, &v(&["v2.DRAPlugin", "v1.DRAPlugin"])).as_deref(),
        Some("v1.DRAPlugin")
    );
    assert_eq!(choose_version(&kubelet, &v(&["v1alpha4.DRAPlugin"])), None);
    let old = v(&["v1beta1.DRAPlugin"]);
    assert_eq!(
        choose_version(&old, &v(&["v1.DRAPlugin", "v1beta1.DRAPlugin"])).as_deref(),
        Some("v1beta1.DRAPlugin")
    );
}
