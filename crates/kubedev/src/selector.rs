//! Which devices a device-plugin resource takes: typed attribute equality and, optionally, a CEL
//! expression in the DRA CEL environment (the same `device.attributes[...]`,
//! `device.capacity[...]` and `device.driver` a DeviceClass selector sees).

use std::sync::Arc;

use kubedev_allocator::cel::{DeviceContext, Program};
use kubedev_core::{AttributeMatch, Device, DeviceFilter, ModelError, Pool};

/// A compiled CEL device selector.
#[derive(Clone)]
pub struct CelSelector {
    expression: String,
    program: Arc<Program>,
    /// The domain bare attribute names belong to (the DRA driver, or the resource's domain).
    driver: String,
}

impl std::fmt::Debug for CelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CelSelector")
            .field("expression", &self.expression)
            .field("driver", &self.driver)
            .finish()
    }
}

impl CelSelector {
    /// Compiles `expression`; the error says what is wrong with it.
    pub fn new(expression: &str, driver: &str) -> Result<Self, String> {
        let program = kubedev_allocator::cel::compile(expression)
            .map_err(|e| kubedev_core::echo::chain(&e))?;
        Ok(CelSelector {
            expression: expression.to_string(),
            program,
            driver: driver.to_string(),
        })
    }
}

impl DeviceFilter for CelSelector {
    fn matches(&self, pool: &Pool, device: &Device) -> Result<bool, ModelError> {
        let ctx = DeviceContext::new(
            &self.driver,
            device
                .attributes
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone())),
            device
                .capacity
                .iter()
                .map(|(k, c)| (k.to_string(), c.value)),
            device.allow_multiple_allocations,
        );
        kubedev_allocator::cel::evaluate(&self.program, &ctx).map_err(|e| ModelError::Selector {
            device: format!("{}/{}", pool.name, device.name),
            message: format!("{}: {e}", self.expression),
        })
    }
}

/// A device-plugin resource's filter: every attribute must match and, when given, the CEL
/// expression must be true.
#[derive(Debug, Clone, Default)]
pub struct ResourceFilter {
    /// Attribute equality.
    pub attributes: AttributeMatch,
    /// The CEL expression.
    pub cel: Option<CelSelector>,
}

impl DeviceFilter for ResourceFilter {
    fn matches(&self, pool: &Pool, device: &Device) -> Result<bool, ModelError> {
        if !self.attributes.matches(pool, device)? {
            return Ok(false);
        }
        match &self.cel {
            Some(c) => c.matches(pool, device),
            None => Ok(true),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kubedev_core::{AttributeValue, DeviceName, PoolName, QualifiedName};

    fn gpu(name: &str, kind: &str, mem: &str) -> Device {
        let mut d = Device::new(DeviceName::new(name).unwrap());
        d.attributes.insert(
            QualifiedName::new("gpu.nvidia.com/type").unwrap(),
            AttributeValue::String(kind.into()),
        );
        d.capacity.insert(
            QualifiedName::new("gpu.nvidia.com/memory").unwrap(),
            kubedev_core::Capacity::new(kubedev_core::Quantity::parse(mem).unwrap()),
        );
        d
    }

    #[test]
    fn cel_selects_by_attribute_and_capacity() {
        let pool = Pool::new(PoolName::new("node-a").unwrap(), vec![]);
        let s = CelSelector::new(
            r#"device.attributes["gpu.nvidia.com"].type == "gpu" && device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
            "gpu.nvidia.com",
        )
        .unwrap();
        assert!(s.matches(&pool, &gpu("gpu-0", "gpu", "80Gi")).unwrap());
        assert!(!s.matches(&pool, &gpu("gpu-1", "gpu", "24Gi")).unwrap());
        assert!(!s.matches(&pool, &gpu("mig-0", "mig", "80Gi")).unwrap());
    }

    #[test]
    fn errors_name_the_expression_and_the_device() {
        assert!(CelSelector::new("device.attributes[", "x").is_err());
        let pool = Pool::new(PoolName::new("node-a").unwrap(), vec![]);
        let s = CelSelector::new(
            r#"device.attributes["gpu.nvidia.com"].profile == "1g""#,
            "d",
        )
        .unwrap();
        let e = s.matches(&pool, &gpu("gpu-0", "gpu", "1Gi")).unwrap_err();
        let msg = kubedev_core::echo::chain(&e);
        assert!(
            msg.contains("node-a/gpu-0") && msg.contains("profile"),
            "{msg}"
        );
    }
}
