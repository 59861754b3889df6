//! NVML return codes and event-type bits the mock uses, with their `nvmlErrorString` texts.

pub(crate) const SUCCESS: u32 = 0;
pub(crate) const ERROR_UNINITIALIZED: u32 = 1;
pub(crate) const ERROR_INVALID_ARGUMENT: u32 = 2;
pub(crate) const ERROR_NOT_SUPPORTED: u32 = 3;
pub(crate) const ERROR_NOT_FOUND: u32 = 6;
pub(crate) const ERROR_INSUFFICIENT_SIZE: u32 = 7;
pub(crate) const ERROR_DRIVER_NOT_LOADED: u32 = 9;
pub(crate) const ERROR_TIMEOUT: u32 = 10;
pub(crate) const ERROR_GPU_IS_LOST: u32 = 15;
pub(crate) const ERROR_IN_USE: u32 = 19;
pub(crate) const ERROR_MEMORY: u32 = 20;
pub(crate) const ERROR_INSUFFICIENT_RESOURCES: u32 = 23;
pub(crate) const ERROR_ARGUMENT_VERSION_MISMATCH: u32 = 25;
pub(crate) const ERROR_UNKNOWN: u32 = 999;

pub(crate) const EVENT_SINGLE_BIT_ECC: u64 = 1;
pub(crate) const EVENT_DOUBLE_BIT_ECC: u64 = 2;
pub(crate) const EVENT_PSTATE: u64 = 4;
pub(crate) const EVENT_XID: u64 = 8;
pub(crate) const EVENT_CLOCK: u64 = 16;

/// The text `nvmlErrorString` returns for a code, NUL-terminated.
pub(crate) fn error_cstr(code: u32) -> &'static [u8] {
    match code {
        0 => b"Success\0",
        1 => b"Uninitialized\0",
        2 => b"Invalid Argument\0",
        3 => b"Not Supported\0",
        4 => b"Insufficient Permissions\0",
        5 => b"Already Initialized\0",
        6 => b"Not Found\0",
        7 => b"Insufficient Size\0",
        8 => b"Insufficient External Power\0",
        9 => b"Driver Not Loaded\0",
        10 => b"Timeout\0",
        11 => b"Interrupt request issue\0",
        12 => b"NVML Shared Library Not Found\0",
        13 => b"Function Not Found\0",
        14 => b"Corrupted infoROM\0",
        15 => b"GPU is lost\0",
        16 => b"GPU requires restart\0",
        17 => b"The operating system has blocked the request.\0",
        18 => b"RM has detected an NVML/RM version mismatch.\0",
        19 => b"In use by another client\0",
        20 => b"Insufficient Memory\0",
        21 => b"No data\0",
        22 => b"The requested vgpu operation is not available on target device, because ECC is enabled\0",
        23 => b"Insufficient resources for request\0",
        24 => b"Frequency not supported\0",
        25 => b"Argument version mismatch\0",
        26 => b"Deprecated\0",
        27 => b"Not Ready\0",
        28 => b"GPU Not Found\0",
        29 => b"Invalid State\0",
        30 => b"Reset Type Not Supported\0",
        _ => b"Unknown Error\0",
    }
}

/// The text of a code without the NUL.
pub(crate) fn error_string(code: u32) -> String {
    let bytes = error_cstr(code);
    String::from_utf8_lossy(&bytes[..bytes.len() - 1]).into_owned()
}
