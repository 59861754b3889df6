//! The MPS control daemon stand-in: `-d` starts a daemon serving the control socket of the pipe
//! directory; without arguments it is the client, sending each line of standard input as a
//! command and printing the answers.
//!
//! Commands: `set_default_active_thread_percentage <0-100>`,
//! `get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit <dev> <limit>`
//! (limit as `<n>M` or `<n>G`), `get_default_device_pinned_mem_limit <dev>`, `quit` (the daemon
//! removes its socket and pid file and exits).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The daemon's control socket in the pipe directory.
pub const CONTROL: &str = "control";
/// The daemon's pid file in the pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The daemon's log in the log directory.
pub const LOG: &str = "control.log";
/// The hidden argument the started daemon runs with.
const SERVE: &str = "--serve-daemon";

/// The pipe and log directories from the environment, with MPS's defaults.
pub fn dirs() -> (PathBuf, PathBuf) {
    let var =
        |k: &str, d: &str| std::env::var_os(k).map_or_else(|| PathBuf::from(d), PathBuf::from);
    (
        var("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
        var("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"),
    )
}

/// Runs the tool with `args` (without the program name); returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let (pipe, log) = dirs();
    let result = match args.first().map(String::as_str) {
        None => client(&pipe, std::io::stdin().lock(), &mut std::io::stdout()),
        Some("-d") => start(&pipe),
        Some(SERVE) => serve(&pipe, &log),
        Some(other) => Err(format!("unknown option {other}")),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// `-d`: starts the daemon in its own process group and returns once it answers.
fn start(pipe: &Path) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    if UnixStream::connect(pipe.join(CONTROL)).is_ok() {
        return Err("An instance of this daemon is already running".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    std::process::Command::new(exe)
        .arg(SERVE)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the daemon: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if UnixStream::connect(pipe.join(CONTROL)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err("the daemon did not start within 5 s".into())
}

/// The daemon: serves commands until `quit`.
fn serve(pipe: &Path, log_dir: &Path) -> Result<(), String> {
    let socket = pipe.join(CONTROL);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let pid_file = pipe.join(PID_FILE);
    std::fs::write(&pid_file, format!("{}\n", std::process::id()))
        .map_err(|e| format!("{}: {e}", pid_file.display()))?;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join(LOG))
        .map_err(|e| format!("{}: {e}", log_dir.display()))?;
    let devices = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
    let _ = writeln!(log, "[mock] Startup: CUDA_VISIBLE_DEVICES={devices}");
    let mut state = Daemon::default();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let mut writer = match conn.try_clone() {
            Ok(w) => w,
            Err(_) => continue,
        };
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(log, "[mock] Command: {line}");
            let (answer, quit) = state.command(&line);
            let _ = writeln!(writer, "{answer}");
            if quit {
                let _ = std::fs::remove_file(&socket);
                let _ = std::fs::remove_file(&pid_file);
                let _ = writeln!(log, "[mock] Exit");
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The daemon's settings.
#[derive(Debug, Default)]
struct Daemon {
    percentage: Option<u32>,
    pinned: BTreeMap<String, String>,
}

impl Daemon {
    /// The answer to one command line, and whether the daemon stops.
    fn command(&mut self, line: &str) -> (String, bool) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["set_default_active_thread_percentage", n] => match n.parse::<u32>() {
                Ok(n) if n <= 100 => {
                    self.percentage = Some(n);
                    (n.to_string(), false)
                }
                _ => (format!("Invalid percentage {n}"), false),
            },
            ["get_default_active_thread_percentage"] => {
                (self.percentage.unwrap_or(100).to_string(), false)
            }
            ["set_default_device_pinned_mem_limit", dev, limit] => {
                let valid = limit
                    .strip_suffix(['M', 'G'])
                    .is_some_and(|n| n.parse::<u64>().is_ok_and(|n| n > 0));
                if !valid {
                    return (format!("Invalid memory limit {limit}"), false);
                }
                self.pinned.insert((*dev).to_string(), (*limit).to_string());
                (String::new(), false)
            }
            ["get_default_device_pinned_mem_limit", dev] => (
                self.pinned.get(*dev).cloned().unwrap_or_else(|| "0".into()),
                false,
            ),
            ["quit"] => (String::new(), true),
            _ => (format!("Unknown command: {line}"), false),
        }
    }
}

/// The client: sends each input line and prints the daemon's answer.
fn client(pipe: &Path, input: impl BufRead, out: &mut impl Write) -> Result<(), String> {
    let socket = pipe.join(CONTROL);
    let conn = UnixStream::connect(&socket)
        .map_err(|_| "Cannot find MPS control daemon process".to_string())?;
    let mut writer = conn.try_clone().map_err(|e| e.to_string())?;
    let mut answers = BufReader::new(conn).lines();
    for line in input.lines() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        writeln!(writer, "{line}").map_err(|e| e.to_string())?;
        let answer = answers
            .next()
            .ok_or("the daemon closed the connection")?
            .map_err(|e| e.to_string())?;
        if !answer.is_empty() {
            writeln!(out, "{answer}").map_err(|e| e.to_string())?;
        }
        if line.trim() == "quit" {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_checked_and_remembered() {
        let mut d = Daemon::default();
        assert_eq!(d.command("get_default_active_thread_percentage").0, "100");
        assert_eq!(d.command("set_default_active_thread_percentage 40").0, "40");
        assert_eq!(d.command("get_default_active_thread_percentage").0, "40");
        assert!(
            d.command("set_default_active_thread_percentage 140")
                .0
                .starts_with("Invalid")
        );
        assert_eq!(
            d.command("set_default_device_pinned_mem_limit GPU-1 1024M")
                .0,
            ""
        );
        assert_eq!(
            d.command("get_default_device_pinned_mem_limit GPU-1").0,
            "1024M"
        );
        assert!(
            d.command("set_default_device_pinned_mem_limit GPU-1 lots")
                .0
                .starts_with("Invalid")
        );
        assert!(d.command("quit").1);
    }
}
