//! `nvidia-smi` stand-in (see `nvml_mock::tools`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = std::env::var_os("NVML_MOCK_SETTINGS").map(std::path::PathBuf::from);
    let machine = std::env::var_os("NVML_MOCK_MACHINE").map(std::path::PathBuf::from);
    let (code, out) = nvml_mock::tools::smi::run(&args, settings.as_deref(), machine.as_deref());
    if code == 0 {
        print!("{out}");
    } else {
        eprintln!("{out}");
    }
    std::process::exit(code);
}
