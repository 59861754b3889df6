//! `nvidia-cuda-mps-control` stand-in (see `nvml_mock::tools`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(nvml_mock::tools::mps::main(&args));
}
