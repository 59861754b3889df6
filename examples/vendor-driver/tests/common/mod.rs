//! What the driver's tests share: a fake host with FPGA cards, the driver's binary as a process,
//! and waiting with a deadline.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long anything the driver does may take in a test.
pub const WAIT: Duration = Duration::from_secs(20);

/// A host root in a temporary directory: `/sys/class/fpga_manager/fpga<N>/{name,state}` and a
/// stand-in `/dev/fpga<N>` per card. Deleted when dropped.
#[derive(Debug)]
pub struct Host(tempfile::TempDir);

impl Host {
    /// A host with `cards` (name → `state`).
    pub fn with_cards(cards: &[(&str, &str)]) -> Host {
        let host = Host(tempfile::tempdir().unwrap());
        std::fs::create_dir_all(host.path().join("dev")).unwrap();
        for (card, state) in cards {
            let dir = host.card_dir(card);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("name"), "Xilinx Zynq FPGA Manager\n").unwrap();
            host.set_state(card, state);
            std::fs::write(host.path().join("dev").join(card), "").unwrap();
        }
        host
    }

    /// The host's `/`.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    fn card_dir(&self, card: &str) -> PathBuf {
        self.path().join("sys/class/fpga_manager").join(card)
    }

    /// Takes the card away (hot-unplug): its sysfs directory and its device node.
    pub fn remove(&self, card: &str) {
        std::fs::remove_dir_all(self.card_dir(card)).unwrap();
        std::fs::remove_file(self.path().join("dev").join(card)).unwrap();
    }

    /// Writes the card's `state` file, as the kernel's FPGA manager would.
    pub fn set_state(&self, card: &str, state: &str) {
        std::fs::write(self.card_dir(card).join("state"), format!("{state}\n")).unwrap();
    }
}

/// The `fpga-driver` binary with `args`.
pub fn driver(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fpga-driver"));
    cmd.args(args).env("RUST_LOG", "warn").stdin(Stdio::null());
    cmd
}

/// Runs the driver with `args` to the end.
pub fn run(args: &[&str]) -> Output {
    driver(args).output().unwrap()
}

/// `fpga-driver run --config <config>` as a process; killed if a failing test leaves it running.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts the daemon on `config`, its standard error in `<config>.log`.
    pub fn start(config: &Path) -> Daemon {
        let log = config.with_extension("log");
        let stderr = std::fs::File::create(&log).unwrap();
        let child = driver(&["run", "--config", config.to_str().unwrap()])
            .stderr(stderr)
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    /// What the daemon has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the daemon with SIGTERM, as the kubelet's pod shutdown does, and checks that it
    /// exits cleanly.
    pub fn stop(mut self) {
        let term = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        assert!(term.unwrap().success());
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the driver did not stop:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "the driver exited with {status}:\n{}",
            self.log()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks `ready` every 20 ms until it holds, for at most [`WAIT`]; panics with `what`.
pub async fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
