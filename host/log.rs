//! symcomm's `tracing` subscriber, for programs that want one: the `symcomm` tool and the NCCL
//! library (`libnccl.so.2`, which maps `NCCL_DEBUG*` onto it). The library itself only emits
//! `tracing` events and never installs a subscriber on its own; [`init`] / [`LogConfig::install`]
//! do, once, and never replace one the program already has.
//!
//! Environment (modelled on `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_FILE`):
//! - `SYMCOMM_LOG`: `off`, `error`, `warn` (default), `info`, `debug`, `trace`.
//! - `SYMCOMM_LOG_SUBSYS`: comma-separated subsystems whose events below `warn` are shown (see
//!   [`SUBSYSTEMS`]), or `all` (default). A leading `^` inverts the list (`^emu` = everything
//!   but the emulator). Warnings and errors always pass.
//! - `SYMCOMM_LOG_FILE`: write to this file instead of stderr; `%h` expands to the host name and
//!   `%p` to the process id (`/tmp/symcomm.%h.%p.log`).
//!
//! Library code emits events with `target: "symcomm::<subsystem>"` (for example
//! `tracing::info!(target: "symcomm::init", ...)`); that target decides the subsystem.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;

pub use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::prelude::*;

use crate::{Error, Result};

/// The subsystems of `SYMCOMM_LOG_SUBSYS`, each the second segment of an event target
/// (`symcomm::<subsystem>`).
pub const SUBSYSTEMS: &[&str] = &[
    "init",
    "bootstrap",
    "alloc",
    "coll",
    "tune",
    "emu",
    "cuda",
    "stream",
];

/// Which subsystems show events below `warn` (`SYMCOMM_LOG_SUBSYS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsysFilter {
    invert: bool,
    /// `None` = all.
    names: Option<Vec<String>>,
}

impl SubsysFilter {
    /// Every subsystem.
    pub fn all() -> Self {
        SubsysFilter {
            invert: false,
            names: None,
        }
    }

    /// The subsystems `names` (each one of [`SUBSYSTEMS`]), or all but them when `invert`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming an unknown subsystem.
    pub fn only<S: AsRef<str>>(names: &[S], invert: bool) -> Result<Self> {
        let mut list = Vec::with_capacity(names.len());
        for name in names {
            let name = name.as_ref().trim().to_ascii_lowercase();
            if !SUBSYSTEMS.contains(&name.as_str()) {
                return Err(Error::InvalidArgument(format!(
                    "SYMCOMM_LOG_SUBSYS: unknown subsystem `{name}` (known: all, {})",
                    SUBSYSTEMS.join(", ")
                )));
            }
            if !list.contains(&name) {
                list.push(name);
            }
        }
        Ok(SubsysFilter {
            invert,
            names: Some(list),
        })
    }

    /// Parses the variable's value (`None` or empty = all subsystems).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming an unknown subsystem.
    pub fn parse(value: Option<&str>) -> Result<Self> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(SubsysFilter::all());
        };
        let (invert, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let names: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if names.iter().any(|n| n.eq_ignore_ascii_case("all")) {
            return Ok(SubsysFilter {
                invert,
                names: None,
            });
        }
        SubsysFilter::only(&names, invert)
    }

    /// Whether an event below `warn` with this target is shown.
    pub fn allows(&self, target: &str) -> bool {
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
/// [`Error::InvalidArgument`] for an unknown level.
pub fn parse_level(value: Option<&str>) -> Result<LevelFilter> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("warn") => Ok(LevelFilter::WARN),
        Some("off") | Some("none") => Ok(LevelFilter::OFF),
        Some("error") => Ok(LevelFilter::ERROR),
        Some("info") => Ok(LevelFilter::INFO),
        Some("debug") => Ok(LevelFilter::DEBUG),
        Some("trace") => Ok(LevelFilter::TRACE),
        Some(other) => Err(Error::InvalidArgument(format!(
            "SYMCOMM_LOG: unknown level `{other}` (use off, error, warn, info, debug or trace)"
        ))),
    }
}

/// Expands `%h` (host name) and `%p` (process id) in a log file pattern; `%%` is `%`.
pub fn expand_file_pattern(pattern: &str, host: &str, pid: u32) -> String {
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

/// What a subscriber shows and where it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// The most verbose level shown.
    pub level: LevelFilter,
    /// The subsystems whose events below `warn` are shown.
    pub subsystems: SubsysFilter,
    /// A file name pattern (`%h` host name, `%p` process id; see [`expand_file_pattern`]), or
    /// `None` for stderr.
    pub file: Option<String>,
}

impl Default for LogConfig {
    /// `warn` and above of every subsystem, on stderr.
    fn default() -> Self {
        LogConfig {
            level: LevelFilter::WARN,
            subsystems: SubsysFilter::all(),
            file: None,
        }
    }
}

impl LogConfig {
    /// From `SYMCOMM_LOG`, `SYMCOMM_LOG_SUBSYS` and `SYMCOMM_LOG_FILE`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad value.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From the three variables as `var` reads them (`None`: unset).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad value.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        Ok(LogConfig {
            level: parse_level(var("SYMCOMM_LOG").as_deref())?,
            subsystems: SubsysFilter::parse(var("SYMCOMM_LOG_SUBSYS").as_deref())?,
            file: var("SYMCOMM_LOG_FILE").filter(|p| !p.is_empty()),
        })
    }

    /// Installs a global subscriber with this configuration, unless the program has one already
    /// (then nothing changes and the result is `Ok(false)`). `banner`, when given, is written
    /// first as a line of its own to the same destination (a version line, say) — also when
    /// the level shows nothing else — if and only if this call installs the subscriber.
    ///
    /// # Errors
    /// [`Error::Io`] for a log file that cannot be created; nothing is installed then.
    pub fn install(&self, banner: Option<&str>) -> Result<bool> {
        if tracing::dispatcher::has_been_set() {
            return Ok(false);
        }
        let subsys = self.subsystems.clone();
        let filter = filter_fn(move |meta| {
            *meta.level() <= tracing::Level::WARN || subsys.allows(meta.target())
        });
        let base = tracing_subscriber::fmt::layer()
            .with_target(true)
            .with_thread_names(true);
        let registry = tracing_subscriber::registry();
        let installed = match &self.file {
            Some(pattern) => {
                let path = expand_file_pattern(pattern, &hostname(), std::process::id());
                let mut file =
                    File::create(&path).map_err(|e| Error::io(format!("log file {path}"), e))?;
                if let Some(line) = banner {
                    writeln!(file, "{line}")
                        .map_err(|e| Error::io(format!("log file {path}"), e))?;
                }
                let layer = base
                    .with_ansi(false)
                    .with_writer(Mutex::new(file))
                    .with_filter(self.level)
                    .with_filter(filter);
                registry.with(layer).try_init().is_ok()
            }
            None => {
                // Colours only on a terminal: a piped or redirected stderr gets plain text.
                let layer = base
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr)
                    .with_filter(self.level)
                    .with_filter(filter);
                let installed = registry.with(layer).try_init().is_ok();
                if let (true, Some(line)) = (installed, banner) {
                    eprintln!("{line}");
                }
                installed
            }
        };
        Ok(installed)
    }
}

/// Installs a global subscriber configured from `SYMCOMM_LOG`, `SYMCOMM_LOG_SUBSYS` and
/// `SYMCOMM_LOG_FILE` ([`LogConfig::from_env`]). Call once at program start; later calls (or a
/// subscriber installed by someone else) leave the existing one in place and return `Ok(false)`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a bad variable value, [`Error::Io`] for a log file that
/// cannot be created; nothing is installed then.
pub fn init() -> Result<bool> {
    LogConfig::from_env()?.install(None)
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
        // An empty list shows no subsystem; inverted, every one.
        let none = SubsysFilter::only::<&str>(&[], false).ok();
        assert!(none.is_some_and(|f| !f.allows("symcomm::init")));
        let every = SubsysFilter::only::<&str>(&[], true).ok();
        assert!(every.is_some_and(|f| f.allows("symcomm::init")));
    }

    #[test]
    fn file_pattern_expands_host_and_pid() {
        assert_eq!(
            expand_file_pattern("/tmp/s.%h.%p.log", "node7", 42),
            "/tmp/s.node7.42.log"
        );
        assert_eq!(expand_file_pattern("100%%-%x%", "h", 1), "100%-%x%");
    }

    /// A program's own subscriber stays: `install` changes nothing (not even the log file).
    #[test]
    fn an_existing_subscriber_is_kept() {
        let dir = std::env::temp_dir().join(format!("symcomm-log-test-{}", std::process::id()));
        let file = dir.join("never.log");
        let config = LogConfig {
            file: Some(file.to_string_lossy().into_owned()),
            ..LogConfig::default()
        };
        // Whether or not another test set one already, one is set now.
        let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::new());
        assert!(matches!(config.install(Some("banner")), Ok(false)));
        assert!(!file.exists());
    }

    #[test]
    fn the_config_reads_its_three_variables() {
        let vars = |name: &str| match name {
            "SYMCOMM_LOG" => Some("debug".to_owned()),
            "SYMCOMM_LOG_SUBSYS" => Some("^emu".to_owned()),
            "SYMCOMM_LOG_FILE" => Some(String::new()),
            _ => None,
        };
        let c = LogConfig::from_vars(vars).ok();
        assert!(c.as_ref().is_some_and(|c| c.level == LevelFilter::DEBUG
            && !c.subsystems.allows("symcomm::emu")
            && c.file.is_none()));
        assert_eq!(
            LogConfig::from_vars(|_| None).ok(),
            Some(LogConfig::default())
        );
        assert!(LogConfig::from_vars(|n| (n == "SYMCOMM_LOG").then(|| "x".to_owned())).is_err());
    }
}
