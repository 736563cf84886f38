//! The `symcomm` tool's `tracing` subscriber. The library only emits `tracing` events and never
//! installs a subscriber; this module is the tool's (other programs install their own).
//!
//! Environment (modelled on `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_FILE`):
//! - `SYMCOMM_LOG`: `off`, `error`, `warn` (default), `info`, `debug`, `trace`.
//! - `SYMCOMM_LOG_SUBSYS`: comma-separated subsystems whose events below `warn` are shown:
//!   `init`, `bootstrap`, `alloc`, `coll`, `tune`, `emu`, or `all` (default). A leading `^`
//!   inverts the list (`^emu` = everything but the emulator). Warnings and errors always pass.
//! - `SYMCOMM_LOG_FILE`: write to this file instead of stderr; `%h` expands to the host name and
//!   `%p` to the process id (`/tmp/symcomm.%h.%p.log`).
//!
//! Library code emits events with `target: "symcomm::<subsystem>"` (for example
//! `tracing::info!(target: "symcomm::init", ...)`); that target decides the subsystem.

use std::fs::File;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::prelude::*;

/// A bad variable value or an unwritable log file, as a message.
pub(crate) type Result<T> = std::result::Result<T, String>;

/// The subsystems of `SYMCOMM_LOG_SUBSYS`, each the second segment of an event target.
pub(crate) const SUBSYSTEMS: &[&str] = &["init", "bootstrap", "alloc", "coll", "tune", "emu"];

/// Parsed `SYMCOMM_LOG_SUBSYS`: which subsystems show events below `warn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubsysFilter {
    invert: bool,
    /// `None` = all.
    names: Option<Vec<String>>,
}

impl SubsysFilter {
    /// Parses the variable's value (`None` or empty = all subsystems).
    ///
    /// # Errors
    /// A message naming an unknown subsystem.
    pub(crate) fn parse(value: Option<&str>) -> Result<Self> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(SubsysFilter {
                invert: false,
                names: None,
            });
        };
        let (invert, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut names = Vec::new();
        for name in list
            .split(',')
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
        {
            if name == "all" {
                return Ok(SubsysFilter {
                    invert,
                    names: None,
                });
            }
            if !SUBSYSTEMS.contains(&name.as_str()) {
                return Err(format!(
                    "SYMCOMM_LOG_SUBSYS: unknown subsystem `{name}` (known: all, {})",
                    SUBSYSTEMS.join(", ")
                ));
            }
            names.push(name);
        }
        Ok(SubsysFilter {
            invert,
            names: Some(names),
        })
    }

    /// Whether an event below `warn` with this target is shown.
    pub(crate) fn allows(&self, target: &str) -> bool {
        let listed = match &self.names {
            None => true,
            Some(names) => {
                let sub = target
                    .strip_prefix("symcomm::")
                    .and_then(|t| t.split("::").next());
                sub.is_some_and(|s| names.iter().any(|n| n == s))
            }
        };
        listed != self.invert
    }
}

/// Parses `SYMCOMM_LOG` (`None` or empty = `warn`).
///
/// # Errors
/// A message for an unknown level.
pub(crate) fn parse_level(value: Option<&str>) -> Result<LevelFilter> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("warn") => Ok(LevelFilter::WARN),
        Some("off") | Some("none") => Ok(LevelFilter::OFF),
        Some("error") => Ok(LevelFilter::ERROR),
        Some("info") => Ok(LevelFilter::INFO),
        Some("debug") => Ok(LevelFilter::DEBUG),
        Some("trace") => Ok(LevelFilter::TRACE),
        Some(other) => Err(format!(
            "SYMCOMM_LOG: unknown level `{other}` (use off, error, warn, info, debug or trace)"
        )),
    }
}

/// Expands `%h` (host name) and `%p` (process id) in a `SYMCOMM_LOG_FILE` pattern; `%%` is `%`.
pub(crate) fn expand_file_pattern(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// This machine's host name (for `%h`).
fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Installs a global `tracing` subscriber configured from `SYMCOMM_LOG`, `SYMCOMM_LOG_SUBSYS` and
/// `SYMCOMM_LOG_FILE`. Call once at program start; later calls (or a subscriber installed by
/// someone else) leave the existing one in place and return `Ok`.
///
/// # Errors
/// A message for a bad variable value or a log file that cannot be created; nothing is
/// installed then.
pub(crate) fn init() -> Result<()> {
    let level = parse_level(std::env::var("SYMCOMM_LOG").ok().as_deref())?;
    let subsys = SubsysFilter::parse(std::env::var("SYMCOMM_LOG_SUBSYS").ok().as_deref())?;
    let filter = filter_fn(move |meta| {
        *meta.level() <= tracing::Level::WARN || subsys.allows(meta.target())
    });
    let base = tracing_subscriber::fmt::layer()
        .with_target(true)
        .with_thread_names(true);
    let registry = tracing_subscriber::registry();
    let result = match std::env::var("SYMCOMM_LOG_FILE")
        .ok()
        .filter(|p| !p.is_empty())
    {
        Some(pattern) => {
            let path = expand_file_pattern(&pattern, &hostname(), std::process::id());
            let file = File::create(&path).map_err(|e| format!("SYMCOMM_LOG_FILE {path}: {e}"))?;
            let layer = base
                .with_ansi(false)
                .with_writer(Mutex::new(file))
                .with_filter(level)
                .with_filter(filter);
            registry.with(layer).try_init()
        }
        None => {
            let layer = base
                .with_writer(std::io::stderr)
                .with_filter(level)
                .with_filter(filter);
            registry.with(layer).try_init()
        }
    };
    // An already-installed subscriber is not an error for a program helper.
    let _ = result;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_like_nccl_debug() {
        assert_eq!(parse_level(None).ok(), Some(LevelFilter::WARN));
        assert_eq!(parse_level(Some("INFO")).ok(), Some(LevelFilter::INFO));
        assert_eq!(parse_level(Some("trace")).ok(), Some(LevelFilter::TRACE));
        assert_eq!(parse_level(Some("off")).ok(), Some(LevelFilter::OFF));
        let err = parse_level(Some("loud"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("loud"), "{err}");
    }

    #[test]
    fn subsystems_select_and_invert() {
        let all = SubsysFilter::parse(None).ok();
        assert!(
            all.as_ref()
                .is_some_and(|f| f.allows("symcomm::emu") && f.allows("other"))
        );
        let some = SubsysFilter::parse(Some("init, coll")).ok();
        assert!(
            some.as_ref()
                .is_some_and(|f| f.allows("symcomm::init") && f.allows("symcomm::coll::ring"))
        );
        assert!(
            some.as_ref()
                .is_some_and(|f| !f.allows("symcomm::emu") && !f.allows("cudarc"))
        );
        let inv = SubsysFilter::parse(Some("^emu")).ok();
        assert!(
            inv.as_ref()
                .is_some_and(|f| !f.allows("symcomm::emu") && f.allows("symcomm::init"))
        );
        assert!(SubsysFilter::parse(Some("init,nope")).is_err());
    }

    #[test]
    fn file_pattern_expands_host_and_pid() {
        assert_eq!(
            expand_file_pattern("/tmp/s.%h.%p.log", "node7", 42),
            "/tmp/s.node7.42.log"
        );
        assert_eq!(expand_file_pattern("100%%-%x%", "h", 1), "100%-%x%");
    }
}
