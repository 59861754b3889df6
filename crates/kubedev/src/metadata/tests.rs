//! Tests of device metadata: paths of plain and template claims, the files' content in both API
//! versions, generations across updates, files of an earlier form, and reading a stream.

use std::path::Path;

use kubedev_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceName, DeviceRef, DriverName, Inventory,
    PoolName, PreparedDevice,
};
use serde_json::Value;

use super::document::decode_first_known;
use super::write::put;
use super::*;

fn prepared(request: &str, device: &str) -> PreparedDevice {
    PreparedDevice::new(
        AllocatedDevice::new(DeviceRef::new(
            PoolName::new("node-a").unwrap(),
            DeviceName::new(device).unwrap(),
        ))
        .with_request(request),
        ContainerEdits::default(),
    )
}

#[test]
fn paths_follow_the_claim_and_its_main_requests() {
    let w = MetadataWriter::new(
        Path::new("/p"),
        Path::new("/cdi"),
        &DriverName::new("gpu.example.com").unwrap(),
    );
    let claim = ClaimRef::parse("u1", "ns", "train").unwrap();
    let devices = [
        prepared("gpu/large", "gpu-0"),
        prepared("gpu/large", "gpu-1"),
        prepared("nic", "eth-0"),
    ];
    let files = w.files(&claim, None, &devices).unwrap();
    let got: Vec<(&str, &Path, &str)> = files
        .iter()
        .map(|f| {
            (
                f.request.as_str(),
                f.host_path.as_path(),
                f.container_path.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "gpu",
                Path::new("/p/dra-device-metadata/ns_train/gpu/metadata.json"),
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/gpu/gpu.example.com-metadata.json"
            ),
            (
                "nic",
                Path::new("/p/dra-device-metadata/ns_train/nic/metadata.json"),
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/nic/gpu.example.com-metadata.json"
            )
        ]
    );
    // Never outside the directory: no claim reference can hold such a namespace or name.
    for bad in ["..", "a_b", "a/b"] {
        assert!(ClaimRef::parse("u1", bad, "train").is_err(), "{bad}");
        assert!(ClaimRef::parse("u1", "ns", bad).is_err(), "{bad}");
    }
}

fn writer(root: &Path) -> MetadataWriter {
    MetadataWriter::new(
        &root.join("plugins"),
        &root.join("cdi"),
        &DriverName::new("gpu.example.com").unwrap(),
    )
}

fn inventory(model: &str) -> Inventory {
    let gpu = |name: &str| {
        kubedev_core::Device::new(DeviceName::new(name).unwrap()).with_attribute(
            "model".parse().unwrap(),
            kubedev_core::AttributeValue::String(model.to_owned()),
        )
    };
    Inventory::new(vec![kubedev_core::Pool::new(
        PoolName::new("node-a").unwrap(),
        vec![gpu("gpu-0"), gpu("gpu-1")],
    )])
}

/// The objects of a file's stream.
fn objects(path: &Path) -> Vec<Value> {
    let bytes = std::fs::read(path).unwrap();
    serde_json::Deserializer::from_slice(&bytes)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .collect()
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[test]
fn container_paths_of_plain_and_template_claims() {
    let w = writer(Path::new("/p"));
    let claim = ClaimRef::parse("u1", "ns", "train-gpus-x7k2q").unwrap();
    let devices = [prepared("gpu/big", "gpu-0")];
    let plain = w.files(&claim, None, &devices).unwrap();
    assert_eq!(
        plain[0].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train-gpus-x7k2q/gpu/gpu.example.com-metadata.json"
    );
    let template = w.files(&claim, Some("gpus"), &devices).unwrap();
    assert_eq!(
        template[0].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json"
    );
    assert_eq!(
        plain[0].host_path, template[0].host_path,
        "the host path names the claim either way"
    );
    assert_eq!(
        w.files(&claim, Some(""), &devices).unwrap(),
        plain,
        "an empty pod claim name is no template"
    );
}

#[test]
fn each_file_holds_the_claim_once_per_version_newest_first() {
    let w = writer(Path::new("/p"));
    let claim = ClaimRef::parse("u1", "ns", "train").unwrap();
    let devices = [
        prepared("gpu/large", "gpu-0").with_network(
            kubedev_core::NetworkData::interface("eth1")
                .with_ips(vec!["10.0.0.5/24".into()])
                .with_hardware_address("00:11:22:33:44:55"),
        ),
        prepared("nic", "eth-0"),
    ];
    let files = w.files(&claim, Some("gpus"), &devices).unwrap();
    let got = w.content(&claim, Some("gpus"), &files[0], &devices, None);
    const OBJECT: &str = r#"{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/VERSION",
  "metadata": {
    "name": "train",
    "namespace": "ns",
    "uid": "u1",
    "generation": 1
  },
  "podClaimName": "gpus",
  "requests": [
    {
      "name": "gpu/large",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "node-a",
          "name": "gpu-0",
          "networkData": {
            "interfaceName": "eth1",
            "ips": [
              "10.0.0.5/24"
            ],
            "hardwareAddress": "00:11:22:33:44:55"
          }
        }
      ]
    }
  ]
}
"#;
    let want = OBJECT.replace("VERSION", "v1beta1") + &OBJECT.replace("VERSION", "v1alpha1");
    assert_eq!(String::from_utf8(got).unwrap(), want);

    // A plain claim has no podClaimName; attributes come from the inventory.
    let inv = inventory("x1");
    let got = w.content(&claim, None, &files[0], &devices, Some(&inv));
    let objects: Vec<Value> = serde_json::Deserializer::from_slice(&got)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .collect();
    assert_eq!(objects.len(), 2);
    assert_eq!(objects[0]["apiVersion"], API_VERSIONS[0]);
    assert_eq!(objects[1]["apiVersion"], API_VERSIONS[1]);
    assert!(objects[0].get("podClaimName").is_none(), "{}", objects[0]);
    assert_eq!(
        objects[0]["requests"][0]["devices"][0]["attributes"],
        serde_json::json!({"model": {"string": "x1"}})
    );
    let mut alpha = objects[1].clone();
    alpha["apiVersion"] = objects[0]["apiVersion"].clone();
    assert_eq!(alpha, objects[0], "both versions say the same");
}

#[test]
fn a_changed_file_gets_the_next_generation_and_an_unchanged_one_is_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let w = writer(root.path());
    let claim = ClaimRef::parse("u1", "ns", "train").unwrap();
    let devices = [prepared("gpu/large", "gpu-0"), prepared("nic", "gpu-1")];
    let files = w.files(&claim, Some("gpus"), &devices).unwrap();
    let (gpu, nic) = (&files[0].host_path, &files[1].host_path);
    let generation = |path: &Path| {
        let o = objects(path);
        assert_eq!(o.len(), 2, "{o:?}");
        assert_eq!(
            o[0]["metadata"]["generation"], o[1]["metadata"]["generation"],
            "{o:?}"
        );
        o[0]["metadata"]["generation"].as_i64().unwrap()
    };

    let ids = w
        .write_claim(&claim, Some("gpus"), &devices, Some(&inventory("x1")))
        .unwrap();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!((generation(gpu), generation(nic)), (1, 1));
    let (gpu_inode, nic_inode) = (inode(gpu), inode(nic));

    // Nothing changed: nothing is written.
    let again = w
        .ensure_claim(&claim, Some("gpus"), &devices, Some(&inventory("x1")))
        .unwrap();
    assert_eq!(again, ids);
    assert_eq!((inode(gpu), inode(nic)), (gpu_inode, nic_inode));
    let file = &files[0];
    assert_eq!(
        w.update_file(&claim, Some("gpus"), file, &devices, Some(&inventory("x1")))
            .unwrap(),
        FileUpdate::Unchanged { generation: 1 }
    );

    // The devices' attributes changed: both files get generation 2, and keep podClaimName.
    let changed = w
        .ensure_claim(&claim, Some("gpus"), &devices, Some(&inventory("x2")))
        .unwrap();
    assert_eq!(changed, ids);
    assert_eq!((generation(gpu), generation(nic)), (2, 2));
    let o = objects(gpu);
    assert_eq!(o[0]["podClaimName"], "gpus");
    assert_eq!(
        o[1]["requests"][0]["devices"][0]["attributes"]["model"]["string"],
        "x2"
    );
    assert_eq!(
        w.update_file(&claim, Some("gpus"), file, &devices, Some(&inventory("x3")))
            .unwrap(),
        FileUpdate::Updated { generation: 3 }
    );

    // A device the inventory no longer holds keeps the attributes the file gave it.
    assert_eq!(
        w.update_file(&claim, Some("gpus"), file, &devices, None)
            .unwrap(),
        FileUpdate::Unchanged { generation: 3 }
    );
    // Another device in the request is a change.
    let more = [
        prepared("gpu/large", "gpu-0"),
        prepared("gpu/large", "gpu-1"),
        prepared("nic", "gpu-1"),
    ];
    assert_eq!(
        w.update_file(&claim, Some("gpus"), file, &more, Some(&inventory("x3")))
            .unwrap(),
        FileUpdate::Updated { generation: 4 }
    );
    assert_eq!(
        objects(gpu)[0]["requests"][0]["devices"][1]["name"],
        "gpu-1"
    );

    // Without a pod claim name the file keeps the one it has.
    assert_eq!(
        w.update_file(&claim, None, file, &more, Some(&inventory("x3")))
            .unwrap(),
        FileUpdate::Unchanged { generation: 4 }
    );

    // A damaged file starts again at 1; so does a lost one.
    std::fs::write(gpu, b"{\"kind\": \"DeviceMeta").unwrap();
    w.ensure_claim(&claim, Some("gpus"), &more, Some(&inventory("x3")))
        .unwrap();
    assert_eq!(generation(gpu), 1);
    std::fs::remove_file(nic).unwrap();
    w.ensure_claim(&claim, Some("gpus"), &more, Some(&inventory("x3")))
        .unwrap();
    assert_eq!(generation(nic), 1);

    // A file of an earlier claim with the same name starts at 1.
    let other = ClaimRef::parse("u2", "ns", "train").unwrap();
    assert_eq!(
        w.update_file(&other, Some("gpus"), file, &more, Some(&inventory("x3")))
            .unwrap(),
        FileUpdate::Created
    );
    assert_eq!(objects(gpu)[0]["metadata"]["uid"], "u2");
}

#[test]
fn a_file_in_an_earlier_form_is_rewritten_with_its_generation() {
    let root = tempfile::tempdir().unwrap();
    let w = writer(root.path());
    let claim = ClaimRef::parse("u1", "ns", "train").unwrap();
    let devices = [prepared("gpu", "gpu-0")];
    let file = &w.files(&claim, None, &devices).unwrap()[0];
    // One v1alpha1 object, as kubedev wrote for Kubernetes 1.36.
    let old = serde_json::json!({
        "apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata",
        "metadata": {"name": "train", "namespace": "ns", "uid": "u1", "generation": 3},
        "requests": [{"name": "gpu", "devices": [
            {"driver": "gpu.example.com", "pool": "node-a", "name": "gpu-0",
             "attributes": {"model": {"string": "x1"}}}
        ]}]
    });
    put(&file.host_path, &serde_json::to_vec_pretty(&old).unwrap()).unwrap();
    assert_eq!(
        w.update_file(&claim, None, file, &devices, Some(&inventory("x1")))
            .unwrap(),
        FileUpdate::Rewritten { generation: 3 }
    );
    let o = objects(&file.host_path);
    assert_eq!(o[0]["apiVersion"], API_VERSIONS[0]);
    assert_eq!(o[1], old);
    assert_eq!(
        w.update_file(&claim, None, file, &devices, Some(&inventory("x1")))
            .unwrap(),
        FileUpdate::Unchanged { generation: 3 }
    );
}

#[test]
fn the_first_object_of_a_known_version_is_read() {
    let meta = serde_json::json!({"name": "c", "namespace": "ns", "uid": "u1", "generation": 7});
    let object = |version: &str| {
        serde_json::json!({"kind": "DeviceMetadata", "apiVersion": version, "metadata": meta})
            .to_string()
    };
    let future = object("metadata.resource.k8s.io/v2");
    let beta = object("metadata.resource.k8s.io/v1beta1");
    let alpha = object("metadata.resource.k8s.io/v1alpha1");
    let generation = |s: String| decode_first_known(s.as_bytes()).map(|d| d.metadata.generation);
    assert_eq!(generation(format!("{future}\n{beta}\n{alpha}\n")), Some(7));
    assert_eq!(generation(format!("{alpha}\n")), Some(7));
    assert_eq!(generation(format!("{beta}\n{{ trailing")), Some(7));
    assert_eq!(generation(String::new()), None);
    assert_eq!(generation(format!("{future}\n")), None);
    assert_eq!(
        generation(format!("{{\"kind\": \"DeviceMetadata\"}}\n{beta}")),
        None
    );
}
