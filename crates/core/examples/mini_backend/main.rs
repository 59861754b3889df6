//! Runs the serial-port backend of `backend.rs` against a fake host root and checks what it
//! answers, so a wrong answer exits non-zero. See docs/writing-a-backend.md.
//!
//! Run: `cargo run -p kubedev-core --example mini_backend`

mod backend;

use std::time::Duration;

use backend::SerialBackend;
use kubedev_core::{AllocatedDevice, BackendContext, ClaimRef, Consumer, DeviceName, DeviceSource};
use kubedev_core::{Health, Preparer, SourceEvent};
use tokio::sync::mpsc;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A fake host root: ttyUSB0 (FTDI) with its /dev node, ttyUSB1 (CP210x) without, ttyS0.
    let root = tempfile::tempdir()?;
    let at = |p: &str| root.path().join(p);
    std::fs::create_dir_all(at("sys/class/tty/ttyS0"))?;
    for (tty, driver) in [("ttyUSB0", "ftdi_sio"), ("ttyUSB1", "cp210x")] {
        std::fs::create_dir_all(at(&format!("sys/class/tty/{tty}/device")))?;
        let link = at(&format!("sys/class/tty/{tty}/device/driver"));
        std::os::unix::fs::symlink(format!("../../../bus/serial/drivers/{driver}"), link)?;
    }
    std::fs::create_dir_all(at("dev"))?;
    std::fs::write(at("dev/ttyUSB0"), "")?;
    let backend = SerialBackend::new(&BackendContext::for_tests(root.path(), at("state")))?;

    let pool = backend.discover().await?.remove(0);
    println!("discovered: {}", serde_json::to_string(&pool)?);
    let names: Vec<&str> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(pool.name.as_str(), "node-a-serial");
    assert_eq!(names, ["ttyusb0", "ttyusb1"]);
    assert!(!pool.devices[1].health.is_healthy(), "no /dev/ttyUSB1 yet");

    // /dev/ttyUSB1 appears: the watcher reports that device healthy.
    std::fs::write(at("dev/ttyUSB1"), "")?;
    let (tx, mut rx) = mpsc::channel(8);
    let event = tokio::select! {
        r = backend.watch(tx) => return Err(format!("watch ended: {r:?}").into()),
        ev = tokio::time::timeout(Duration::from_secs(5), rx.recv()) => ev?.ok_or("no event")?,
    };
    println!("watch: {event:?}");
    let (device, health) = (backend.device_ref("ttyUSB1")?, Health::healthy());
    assert_eq!(event, SourceEvent::Health { device, health });

    let claim = ClaimRef {
        uid: "0b6f4c1e".into(),
        namespace: "lab".into(),
        name: "modem".into(),
    };
    let consumer = Consumer::Claim(claim.clone());
    // What the runtime passes for a claim that was allocated ttyusb0.
    let ttyusb0 = vec![AllocatedDevice {
        admin_access: false,
        device: backend.device_ref("ttyUSB0")?,
        request: "port".into(),
        share_id: None,
        config: vec![],
    }];
    let prepared = backend.prepare(&consumer, &ttyusb0).await?;
    let edits = serde_json::to_string_pretty(&prepared[0].edits)?;
    println!("edits for {}: {edits}", prepared[0].device.device);
    assert_eq!(prepared[0].edits.env["SERIAL_PORTS"], "/dev/ttyUSB0");
    let again = backend.prepare(&consumer, &ttyusb0).await?;
    assert_eq!(prepared, again, "prepare is idempotent");

    let mut ttyusb9 = ttyusb0.clone();
    ttyusb9[0].device.device = DeviceName::new("ttyusb9")?;
    let err = backend.prepare(&consumer, &ttyusb9).await.err();
    let err = err.ok_or("ttyusb9 was prepared")?.to_string();
    assert_eq!(err, "unknown device node-a-serial/ttyusb9");
    backend.unprepare(&claim, &ttyusb0).await?;
    backend.unprepare(&claim, &ttyusb9).await?; // never prepared: still Ok
    Ok(())
}
