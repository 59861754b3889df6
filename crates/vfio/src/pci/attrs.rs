//! The attribute names this backend publishes (bare names are in the driver's domain).

/// `pci` or `mdev`.
pub const TYPE: &str = "type";
/// PCI address of the (first) function.
pub const PCI_ADDRESS: &str = "pciAddress";
/// Vendor ID, 4 hex digits.
pub const VENDOR_ID: &str = "vendorID";
/// Device ID, 4 hex digits.
pub const DEVICE_ID: &str = "deviceID";
/// Class code, 6 hex digits.
pub const CLASS: &str = "class";
/// IOMMU group number.
pub const IOMMU_GROUP: &str = "iommuGroup";
/// NUMA node (absent when the kernel does not know).
pub const NUMA_NODE: &str = "numaNode";
/// The bound driver at discovery time.
pub const DRIVER: &str = "driver";
/// The resource name from the configuration.
pub const RESOURCE_NAME: &str = "resourceName";
/// `pf`, `vf` or `none`.
pub const SRIOV_ROLE: &str = "sriovRole";
/// The physical function of a VF.
pub const PHYSFN: &str = "physfn";
/// How many functions the device (IOMMU group) passes.
pub const FUNCTIONS: &str = "functions";
/// NVIDIA vGPU type number of a vGPU VF.
pub const VGPU_TYPE: &str = "vgpuType";
/// mdev instance UUID.
pub const UUID: &str = "uuid";
/// mdev type name (spaces → `_`).
pub const MDEV_TYPE: &str = "mdevType";
/// mdev type directory name, e.g. `nvidia-222`.
pub const MDEV_TYPE_ID: &str = "mdevTypeID";
/// PCI address of an mdev's parent.
pub const PARENT_ADDRESS: &str = "parentAddress";
/// Kubernetes' standard PCI bus ID attribute.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Kubernetes' standard PCIe root attribute.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
