//! Tests of the running mock: handles, placement accounting, bundled machines, MIG UUIDs.

use super::mig::derived_mig_uuid;
use super::*;

#[test]
fn handles_round_trip() {
    for h in [
        Handle::Gpu(0),
        Handle::Gpu(4095),
        Handle::Mig {
            gpu: 3,
            gi: 13,
            ci: 2,
        },
        Handle::Gi { gpu: 7, gi: 0 },
        Handle::Ci {
            gpu: 1,
            gi: 1,
            ci: 0,
        },
        Handle::EventSet(9),
    ] {
        assert_ne!(h.encode(), 0);
        assert_eq!(Handle::decode(h.encode()), Some(h));
    }
    assert_eq!(Handle::decode(0), None);
    assert_eq!(Handle::decode(0x1234), None);
}

#[test]
fn ci_placements_follow_alignment() {
    assert_eq!(ci_placements(7, 1), vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(ci_placements(7, 2), vec![0, 2, 4]);
    assert_eq!(ci_placements(7, 3), vec![0, 4]);
    assert_eq!(ci_placements(7, 4), vec![0]);
    assert_eq!(ci_placements(7, 7), vec![0]);
    assert_eq!(ci_placements(3, 2), vec![0]);
}

fn load(name: &str) -> Mock {
    let machine = Machine::load(&crate::machine_path(name)).unwrap();
    Mock::new(machine, None).unwrap()
}

#[test]
fn bundled_machines_build() {
    let dgx = load("dgx-a100");
    assert_eq!(dgx.gpus.len(), 8);
    let mig7 = dgx.gpus[7].mig.as_ref().unwrap();
    assert_eq!(mig7.gis.keys().copied().collect::<Vec<_>>(), vec![1, 5, 13]);
    assert_eq!(mig7.mig_devices(), vec![(1, 0), (5, 0), (5, 1), (13, 0)]);
    assert_eq!(dgx.gpus[0].links.len(), 12);
    assert!(dgx.nvlinked(0, 7));
    assert_eq!(dgx.topology(0, 1), TopologyLevel::Multiple);
    assert_eq!(dgx.topology(0, 2), TopologyLevel::Node);
    assert_eq!(dgx.topology(0, 4), TopologyLevel::System);
    let h100 = load("h100-mig");
    let mig = h100.gpus[0].mig.as_ref().unwrap();
    assert_eq!(
        mig.gis.keys().copied().collect::<Vec<_>>(),
        (7..14).collect::<Vec<_>>()
    );
    assert_eq!(mig.mig_devices().len(), 7);
    let ws = load("workstation");
    assert!(
        ws.gpus
            .iter()
            .all(|g| g.mig.is_none() && g.links.is_empty())
    );
    assert!(!ws.nvlinked(0, 1));
}

#[test]
fn a100_placement_accounting() {
    let mut dgx = load("dgx-a100");
    let (_, mig) = dgx.mig_mut(6).unwrap();
    // 3g.20gb (id 9) at 0 and 4 → GI ids 1 and 2; a third does not fit.
    assert_eq!(mig.create_gi(9, None, None), Ok(1));
    assert_eq!(mig.remaining(9), Ok(1));
    assert_eq!(mig.create_gi(9, Some((4, 4)), None), Ok(2));
    assert_eq!(
        mig.create_gi(9, None, None),
        Err(ERROR_INSUFFICIENT_RESOURCES)
    );
    // Memory full: no 1g.5gb (id 19) anywhere.
    assert_eq!(mig.remaining(19), Ok(0));
    // A placement not in the table.
    assert_eq!(
        mig.create_gi(19, Some((7, 1)), None),
        Err(ERROR_INVALID_ARGUMENT)
    );
    mig.gis.remove(&2);
    // 4g.20gb (id 5) only at 0, which is taken.
    assert_eq!(
        mig.create_gi(5, None, None),
        Err(ERROR_INSUFFICIENT_RESOURCES)
    );
    // 2g.10gb (id 14) at 4 → GI 5, then 1g.5gb at 6 → GI 13; compute slices 3+2+1 = 6.
    assert_eq!(mig.create_gi(14, Some((4, 2)), None), Ok(5));
    assert_eq!(mig.create_gi(19, None, None), Ok(13));
    assert_eq!(mig.remaining(19), Ok(0));
    // Compute instances inside the 3g: 1c x3, then no more.
    let uuid = "GPU-x";
    assert_eq!(mig.create_ci(uuid, 1, 0, None, None, None), Ok(0));
    assert_eq!(
        mig.create_ci(uuid, 1, 1, None, None, None),
        Err(ERROR_INSUFFICIENT_RESOURCES)
    );
    assert_eq!(mig.create_ci(uuid, 1, 0, None, None, None), Ok(1));
    assert_eq!(mig.create_ci(uuid, 1, 0, None, None, None), Ok(2));
    assert_eq!(
        mig.create_ci(uuid, 1, 0, None, None, None),
        Err(ERROR_INSUFFICIENT_RESOURCES)
    );
    // 7-slice compute profile does not exist in a 3-slice GPU instance.
    assert_eq!(mig.ci_profile(1, 4), Err(ERROR_NOT_SUPPORTED));
}

#[test]
fn impossible_layouts_are_refused_at_load() {
    let text = std::fs::read_to_string(crate::machine_path("h100-mig")).unwrap();
    let text = text.replace("start: 6", "start: 5");
    let machine = Machine::from_yaml(&text).unwrap();
    let err = Mock::new(machine, None).unwrap_err();
    assert!(
        err.contains("instances[6]") && err.contains("Insufficient resources"),
        "{err}"
    );
}

#[test]
fn mig_uuids_are_stable_and_distinct() {
    let a = derived_mig_uuid("GPU-1", 7, 0);
    assert_eq!(a, derived_mig_uuid("GPU-1", 7, 0));
    assert_ne!(a, derived_mig_uuid("GPU-1", 8, 0));
    assert!(a.starts_with("MIG-") && a.len() == 40, "{a}");
}
