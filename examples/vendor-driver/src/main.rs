//! The FPGA driver: kubedev's whole command line (`run`, `check-config`, `discover`,
//! `cdi generate`, `who-uses`, `simulate`, `policy check`) with one backend kind, `fpga`,
//! configured under `backends.fpga`.

fn main() -> std::process::ExitCode {
    kubedev::Daemon::builder()
        .program("fpga-driver", env!("CARGO_PKG_VERSION"))
        .backend(fpga_driver::factory())
        .main()
}
