//! What the command line writes: the daemon's log lines, the command line's own messages on
//! stderr (plain, or JSON lines under `--log-format json`), and its answers on stdout.

use std::sync::atomic::{AtomicBool, Ordering};

use super::args::LogFormat;

/// Set when `--log-format json` is given: messages of the command line itself (fatal errors,
/// warnings) are then JSON lines like the daemon's logs.
static JSON_MESSAGES: AtomicBool = AtomicBool::new(false);

/// The program's name in its messages (`kubedev`, or a vendor's driver's).
static PROGRAM: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn program() -> &'static str {
    PROGRAM.get().map_or("kubedev", String::as_str)
}

/// Names the program in its messages `name` instead of `kubedev`.
pub(super) fn set_program_name(name: String) {
    let _ = PROGRAM.set(name);
}

/// Starts the daemon's logging in `format`; under JSON the command line's own messages are
/// JSON lines too.
pub(super) fn init_logging(format: LogFormat) {
    JSON_MESSAGES.store(matches!(format, LogFormat::Json), Ordering::Relaxed);
    // kube-rs logs each failed API request at ERROR without saying what it was for; kubedev
    // logs those failures itself, with their context and at a bounded rate.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
    });
    // A closed stderr (the reader of our logs went away) must not panic a task mid-log:
    // tracing-subscriber would report its write error with `eprintln!`, which panics.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .with_writer(move || OneLineStderr { colours: ansi });
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Standard error for log events: each event is written whole, with every control character
/// escaped but its final newline, so that a value from a request can never start a forged log
/// line or reach the operator's terminal as an escape sequence (the terminal's own colours stay).
struct OneLineStderr {
    colours: bool,
}

impl std::io::Write for OneLineStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let line = kubedev_core::echo::escape_log_line(&text, self.colours);
        std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
}

/// Severity of a message of the command line.
#[derive(Debug, Clone, Copy)]
pub(super) enum Level {
    Error,
    Warn,
    Info,
}

/// Prints a message of the command line on stderr: `kubedev: MESSAGE`, or under
/// `--log-format json` one JSON line shaped like the daemon's log lines (`timestamp`, `level`,
/// `fields.message`, `target`), so a log pipeline reads every line.
pub(super) fn say(level: Level, message: &str) {
    use std::io::Write as _;
    let line = if JSON_MESSAGES.load(Ordering::Relaxed) {
        json_line(level, message)
    } else {
        format!("{}: {message}", program())
    };
    // A closed stderr leaves nobody to tell; it must not panic.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn json_line(level: Level, message: &str) -> String {
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
    let mut timestamp = String::new();
    // Formatting into a String cannot fail; without a timestamp the line is still valid.
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let level = match level {
        Level::Error => "ERROR",
        Level::Warn => "WARN",
        Level::Info => "INFO",
    };
    serde_json::json!({
        "timestamp": timestamp,
        "level": level,
        "fields": {"message": message},
        "target": program(),
    })
    .to_string()
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
pub(super) fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
