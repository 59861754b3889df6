//! Every error type that wraps an operating-system error, rendered as the kubelet and the log
//! see it: the reason ("No space left on device (os error 28)") appears exactly once.

use std::io;
use std::path::PathBuf;

use kubedev_core::echo::chain;

use crate::cdi::CdiError;
use crate::checkpoint::CheckpointError;

const REASON: &str = "No space left on device (os error 28)";

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(28)
}

fn once(e: &(dyn std::error::Error + 'static)) {
    let text = chain(e);
    assert_eq!(text.matches(REASON).count(), 1, "{text}");
    assert!(text.len() < 512, "{text}");
}

#[test]
fn each_io_error_keeps_its_reason_once() {
    let path = PathBuf::from("/var/run/cdi/k8s.gpu.example.com-claim_uid.json");
    once(&CdiError::Io {
        op: "writing",
        path: path.clone(),
        source: enospc(),
    });
    let checkpoint = [
        CheckpointError::CreateDir {
            path: path.clone(),
            source: enospc(),
        },
        CheckpointError::ReadBootId {
            path: path.clone(),
            source: enospc(),
        },
        CheckpointError::Lock {
            path: path.clone(),
            source: enospc(),
        },
        CheckpointError::Read {
            path: path.clone(),
            source: enospc(),
        },
        CheckpointError::MoveAside {
            path: path.clone(),
            to: path.clone(),
            source: enospc(),
        },
        CheckpointError::Write {
            step: "writing",
            path: path.clone(),
            source: enospc(),
        },
        CheckpointError::NotAFile(kubedev_core::safefs::SafeOpenError::Io {
            path: path.clone(),
            source: enospc(),
        }),
    ];
    for e in &checkpoint {
        once(e);
    }
    // Wrapped again, as the prepare path does before the kubelet sees it.
    let wrapped = kubedev_kubelet_grpc::dra::ClaimError::retryable(
        "cdi",
        format!(
            "writing the CDI spec of claim default/train (uid): {}",
            chain(&checkpoint[5])
        ),
    );
    once(&wrapped);
}
