//! The checkpoint file itself: reading it without following links or blocking on special files,
//! its format (`MAJOR.MINOR` version, CRC-32 of the canonical payload) both ways, and moving a
//! corrupt file aside.

use kubedev_core::echo::echo;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use kubedev_core::{atomic_file, safefs};

use super::{CHECKPOINT_FILE, CheckpointError, ClaimRecord};

/// The major format version this code writes and understands.
const FORMAT_MAJOR: u64 = 1;
/// The minor format version this code writes (1.1: the `owner` of a started prepare).
const FORMAT_MINOR: u64 = 1;

/// Files larger than this are not parsed (and count as corrupt).
const MAX_CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// How many `.corrupt-<n>` names are tried before giving up.
const MAX_CORRUPT_COPIES: u32 = 10_000;

/// The part of the file the checksum covers.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Payload {
    #[serde(default)]
    pub(super) boot_id: String,
    #[serde(default)]
    pub(super) claims: super::Claims,
}

/// What reading the checkpoint file found.
#[derive(Debug)]
pub(super) enum FileState {
    Missing,
    Corrupt(String),
    Valid(Payload),
}

pub(super) fn read_checkpoint(path: &Path) -> Result<FileState, CheckpointError> {
    let read_err = |source| CheckpointError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = match safefs::read_regular(path, MAX_CHECKPOINT_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(FileState::Missing),
        // Never opened (a FIFO would block, a link would be followed): it is moved aside, as
        // the rename does not open it either, and a fresh checkpoint starts.
        Err(safefs::SafeOpenError::NotAFile { found, .. }) => {
            return Ok(FileState::Corrupt(format!("{found}, not a regular file")));
        }
        Err(safefs::SafeOpenError::Io { source, .. }) => return Err(read_err(source)),
    };
    if bytes.len() as u64 > MAX_CHECKPOINT_BYTES {
        return Ok(FileState::Corrupt(format!(
            "larger than {MAX_CHECKPOINT_BYTES} bytes"
        )));
    }
    Ok(match decode(&bytes) {
        Ok(payload) => FileState::Valid(payload),
        Err(reason) => FileState::Corrupt(reason),
    })
}

/// Parses a checkpoint file; the error says what is wrong with it.
fn decode(bytes: &[u8]) -> Result<Payload, String> {
    let doc: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("not valid JSON: {}", kubedev_core::echo::chain(&e)))?;
    let Value::Object(mut doc) = doc else {
        return Err("not a JSON object".into());
    };
    let version = doc
        .get("version")
        .and_then(Value::as_str)
        .ok_or("no \"version\" string")?;
    let major = version
        .split_once('.')
        .and_then(|(major, minor)| {
            minor.parse::<u64>().ok()?;
            major.parse::<u64>().ok()
        })
        .ok_or_else(|| format!("version {} is not MAJOR.MINOR", echo(version)))?;
    if major != FORMAT_MAJOR {
        return Err(format!(
            "unsupported format version {} (this version reads {FORMAT_MAJOR}.x)",
            echo(version)
        ));
    }
    let checksum = doc
        .get("checksum")
        .and_then(Value::as_str)
        .ok_or("no \"checksum\" string")?
        .to_owned();
    let payload = doc.remove("payload").ok_or("no \"payload\"")?;
    let expected = checksum_of(&payload)
        .map_err(|e| format!("payload unreadable: {}", kubedev_core::echo::chain(&e)))?;
    if checksum != expected {
        return Err(format!(
            "checksum mismatch: file says {}, payload has {expected:?}",
            echo(&checksum)
        ));
    }
    let payload: Payload = serde_json::from_value(payload).map_err(|e| {
        format!(
            "payload has the wrong shape: {}",
            kubedev_core::echo::chain(&e)
        )
    })?;
    if let Some((key, record)) = payload.claims.iter().find(|(k, r)| **k != r.claim.uid) {
        return Err(format!(
            "claim recorded under UID {key:?} has UID {:?}",
            record.claim.uid
        ));
    }
    Ok(payload)
}

/// One record as the checksum covers it: compact JSON with object keys sorted.
pub(super) fn canonical_record(record: &ClaimRecord) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::new();
    write_canonical(&serde_json::to_value(record)?, &mut out)?;
    Ok(out)
}

/// Writes a checkpoint file of `records` (each UID with its [`canonical_record`] encoding, in
/// UID order) to `out` as it goes, never holding the whole file in memory: the checksum is
/// taken over the records first, then they are written after the header that carries it.
pub(super) fn write_records<'a, I>(
    out: &mut impl Write,
    boot_id: &str,
    records: I,
) -> std::io::Result<()>
where
    I: IntoIterator<Item = (&'a str, &'a [u8])> + Clone,
{
    let mut crc = !0u32;
    payload(boot_id, records.clone(), |piece| {
        crc = crc32_update(crc, piece);
        Ok(())
    })?;
    write!(
        out,
        "{{\"version\":\"{FORMAT_MAJOR}.{FORMAT_MINOR}\",\"checksum\":\"crc32:{:08x}\",\"payload\":",
        !crc
    )?;
    payload(boot_id, records, |piece| out.write_all(piece))?;
    out.write_all(b"}\n")
}

/// Hands the checkpoint's payload to `sink` piece by piece. Canonical order: `bootId` sorts
/// before `claims`, and the records come sorted by UID.
fn payload<'a>(
    boot_id: &str,
    records: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut quoted = Vec::new();
    sink(b"{\"bootId\":")?;
    serde_json::to_writer(&mut quoted, boot_id)?;
    sink(&quoted)?;
    sink(b",\"claims\":{")?;
    for (i, (uid, record)) in records.into_iter().enumerate() {
        if i > 0 {
            sink(b",")?;
        }
        quoted.clear();
        serde_json::to_writer(&mut quoted, uid)?;
        sink(&quoted)?;
        sink(b":")?;
        sink(record)?;
    }
    sink(b"}}")
}

/// Serializes a checkpoint file.
#[cfg(test)]
pub(super) fn encode(boot_id: &str, claims: &super::Claims) -> Result<Vec<u8>, serde_json::Error> {
    let records = claims
        .iter()
        .map(|(uid, r)| Ok((uid.as_str(), canonical_record(r)?)))
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    let mut bytes = Vec::new();
    write_records(
        &mut bytes,
        boot_id,
        records.iter().map(|(uid, r)| (*uid, r.as_slice())),
    )
    .map_err(serde_json::Error::io)?;
    Ok(bytes)
}

/// A checkpoint file around `payload` (any JSON), with the version and checksum a writer gives
/// it: what another daemon version could have written.
pub(super) fn seal(payload: &Value) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&serde_json::json!({
        "version": format!("{FORMAT_MAJOR}.{FORMAT_MINOR}"),
        "checksum": checksum_of(payload)?,
        "payload": payload,
    }))
}

/// The checksum string of a payload: `crc32:` and eight hex digits.
pub(super) fn checksum_of(payload: &Value) -> Result<String, serde_json::Error> {
    let mut canonical = Vec::new();
    write_canonical(payload, &mut canonical)?;
    Ok(format!("crc32:{:08x}", crc32(&canonical)))
}

/// Writes `value` as compact JSON with object keys sorted, whatever map type serde_json uses.
pub(super) fn write_canonical(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                write_canonical(item, out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out)?;
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) lookup table.
const CRC32_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            bit += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

pub(super) fn crc32(data: &[u8]) -> u32 {
    !crc32_update(!0u32, data)
}

/// The running CRC-32 state `crc` after `data` (start from `!0`, finish with `!`).
fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = CRC32_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// Renames a corrupt checkpoint to the first free `<name>.corrupt-<n>`.
pub(super) fn move_aside(path: &Path) -> Result<PathBuf, CheckpointError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| CHECKPOINT_FILE.to_owned());
    let dir = path.parent().unwrap_or(Path::new("."));
    let err = |to: &Path, source| CheckpointError::MoveAside {
        path: path.to_owned(),
        to: to.to_owned(),
        source,
    };
    for n in 1..=MAX_CORRUPT_COPIES {
        let to = dir.join(format!("{name}.corrupt-{n}"));
        match fs::symlink_metadata(&to) {
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(&to, e)),
        }
        fs::rename(path, &to).map_err(|e| err(&to, e))?;
        atomic_file::sync_dir(dir).map_err(|e| err(&to, e))?;
        return Ok(to);
    }
    let to = dir.join(format!("{name}.corrupt-{MAX_CORRUPT_COPIES}"));
    Err(err(
        &to,
        io::Error::other(format!(
            "{MAX_CORRUPT_COPIES} corrupt copies already kept; remove some"
        )),
    ))
}
