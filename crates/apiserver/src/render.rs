//! The ResourceSlices an inventory becomes, without an API server: for `kubedev discover` and
//! for checking what would be published.

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubedev_core::{DriverName, Inventory};

use crate::convert::{UnhealthyDevices, desired_pools};
use crate::error::Error;
use crate::plan::{Identity, desired_spec, generate_name, index_len};

/// The ResourceSlices the publisher would create for `inventory` (generation 1, no owner), with
/// the `generateName` it would use, and unhealthy devices treated as `unhealthy` says.
pub fn render_slices(
    inventory: &Inventory,
    driver: &DriverName,
    node: &str,
    unhealthy: UnhealthyDevices,
) -> Result<Vec<res::ResourceSlice>, Error> {
    let id = Identity {
        driver: driver.to_string(),
        node: node.to_string(),
    };
    let pools = desired_pools(inventory, driver, unhealthy)?;
    let mut out = Vec::new();
    for pool in &pools {
        let len = index_len(pool.slices.len());
        for (i, slice) in pool.slices.iter().enumerate() {
            out.push(res::ResourceSlice {
                metadata: ObjectMeta {
                    generate_name: Some(generate_name(i, len, &id)),
                    ..Default::default()
                },
                spec: desired_spec(&id, pool, slice, 1),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kubedev_core::{Device, DeviceName, Pool, PoolName};

    #[test]
    fn one_slice_per_pool_with_every_device() {
        let pool = |name: &str, n: usize| {
            Pool::new(
                PoolName::new(name).unwrap(),
                (0..n)
                    .map(|i| Device::new(DeviceName::new(format!("dev-{i}")).unwrap()))
                    .collect(),
            )
        };
        let inv = Inventory::new(vec![pool("node-a-usb", 3), pool("node-a-vfio", 0)]);
        let driver = DriverName::new("devices.example.com").unwrap();
        let slices = render_slices(&inv, &driver, "node-a", UnhealthyDevices::Omit).unwrap();
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[0].spec.pool.name, "node-a-usb");
        assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 3);
        assert_eq!(slices[0].spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(slices[0].spec.driver, "devices.example.com");
        // An empty pool is still one slice: "empty" is not "gone".
        assert_eq!(slices[1].spec.devices, None);
        assert_eq!(slices[1].spec.pool.resource_slice_count, 1);
    }
}
