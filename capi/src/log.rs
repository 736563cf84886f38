//! `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE` mapped onto symcomm's logging
//! ([`symcomm::log`]), installed once, by the first call into the library (see
//! [`ensure_installed`]) — unless the program already has a `tracing` subscriber, which is
//! left alone.
//!
//! Each `SYMCOMM_LOG*` variable that is set takes precedence over its NCCL counterpart:
//! - level: `SYMCOMM_LOG`, else `NCCL_DEBUG` (case-insensitive): `NONE` → off, `VERSION` →
//!   errors only plus a version line, `WARN` → warn, `INFO` → info, `ABORT` → info (the process
//!   is not aborted), `TRACE` → trace; any level from `VERSION` up prints the version line
//!   first. Unset: symcomm's default, warnings. An unknown value is ignored, as NCCL does (with
//!   a warning).
//! - subsystems: `SYMCOMM_LOG_SUBSYS`, else `NCCL_DEBUG_SUBSYS` (see [`SUBSYS`]; `^` inverts,
//!   `ALL` is every subsystem; names with no symcomm counterpart select nothing).
//! - destination: `SYMCOMM_LOG_FILE`, else `NCCL_DEBUG_FILE` (`%h` host name, `%p` pid), else
//!   stderr.

use std::sync::Once;

use symcomm::log::{LevelFilter, LogConfig, SubsysFilter};

/// NCCL's debug subsystems → symcomm's ([`symcomm::log::SUBSYSTEMS`]).
pub(crate) const SUBSYS: &[(&str, &[&str])] = &[
    ("INIT", &["init", "cuda"]),
    ("ENV", &["init"]),
    ("COLL", &["coll", "stream"]),
    ("P2P", &["coll"]),
    ("CALL", &["coll", "stream", "emu"]),
    ("NVLS", &["coll"]),
    ("ALLOC", &["alloc"]),
    ("SHM", &["alloc"]),
    ("REG", &["alloc"]),
    ("NET", &["bootstrap"]),
    ("BOOTSTRAP", &["bootstrap"]),
    ("PROXY", &["bootstrap"]),
    ("GRAPH", &["tune"]),
    ("TUNING", &["tune"]),
];

/// What `NCCL_DEBUG` asks for: the level, and whether to print the version line.
fn nccl_level(value: &str) -> Option<(LevelFilter, bool)> {
    Some(match value.trim().to_ascii_uppercase().as_str() {
        "NONE" => (LevelFilter::OFF, false),
        "VERSION" => (LevelFilter::ERROR, true),
        "WARN" => (LevelFilter::WARN, true),
        "INFO" | "ABORT" => (LevelFilter::INFO, true),
        "TRACE" => (LevelFilter::TRACE, true),
        _ => return None,
    })
}

/// `NCCL_DEBUG_SUBSYS` as symcomm's subsystems.
fn nccl_subsys(value: &str) -> SubsysFilter {
    let value = value.trim();
    let (invert, list) = match value.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    let mut names: Vec<&str> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if name.eq_ignore_ascii_case("ALL") {
            return if invert {
                SubsysFilter::only::<&str>(&[], false).unwrap_or_else(|_| SubsysFilter::all())
            } else {
                SubsysFilter::all()
            };
        }
        if let Some((_, ours)) = SUBSYS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
            names.extend_from_slice(ours);
        }
    }
    // Every name comes from SUBSYS, whose entries are symcomm subsystems (a unit test checks).
    SubsysFilter::only(&names, invert).unwrap_or_else(|_| SubsysFilter::all())
}

/// The configuration from `var` (`None`: unset): the `SYMCOMM_LOG*` value of each setting
/// when set, else its NCCL counterpart's; the version line to print first, if any; and a warning
/// for an `NCCL_DEBUG` value NCCL does not know.
///
/// # Errors
/// A bad `SYMCOMM_LOG*` value (NCCL values never fail: NCCL ignores what it does not know).
pub(crate) fn config(
    var: impl Fn(&str) -> Option<String>,
) -> symcomm::Result<(LogConfig, Option<String>, Option<String>)> {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let mut config = LogConfig::from_vars(set)?;
    let mut banner = None;
    let mut warning = None;
    if let Some(debug) = set("NCCL_DEBUG") {
        match nccl_level(&debug) {
            Some((level, version)) => {
                if set("SYMCOMM_LOG").is_none() {
                    config.level = level;
                }
                banner = version.then(version_line);
            }
            None => {
                warning = Some(format!(
                    "NCCL_DEBUG={debug} is not a level (NONE, VERSION, WARN, INFO, ABORT, \
                     TRACE): ignored"
                ));
            }
        }
    }
    if let (None, Some(subsys)) = (set("SYMCOMM_LOG_SUBSYS"), set("NCCL_DEBUG_SUBSYS")) {
        config.subsystems = nccl_subsys(&subsys);
    }
    if let (None, Some(file)) = (set("SYMCOMM_LOG_FILE"), set("NCCL_DEBUG_FILE")) {
        config.file = Some(file);
    }
    Ok((config, banner, warning))
}

/// The version line `NCCL_DEBUG=VERSION` (and above) prints.
fn version_line() -> String {
    format!(
        "NCCL version {} (symcomm-nccl {}: NCCL's C ABI over symcomm)",
        crate::version::text(),
        env!("CARGO_PKG_VERSION")
    )
}

/// Installs the subscriber on the first call (every entry point calls this); a bad
/// `SYMCOMM_LOG*` value or an unwritable log file is reported once on stderr and leaves
/// logging off.
pub(crate) fn ensure_installed() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let outcome = config(|name| std::env::var(name).ok()).and_then(|(c, banner, warning)| {
            if c.install(banner.as_deref())? {
                if let Some(w) = warning {
                    tracing::warn!(target: "symcomm::init", "{w}");
                }
            }
            Ok(())
        });
        if let Err(e) = outcome {
            eprintln!("symcomm-nccl: logging is off: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn vars(list: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            list.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn nccl_levels_map_onto_symcomms() {
        let (c, banner, warning) = config(vars(&[("NCCL_DEBUG", "info")])).unwrap();
        assert_eq!(c.level, LevelFilter::INFO);
        assert!(banner.unwrap().contains("NCCL version 2.21.5"));
        assert!(warning.is_none());
        let (c, banner, _) = config(vars(&[("NCCL_DEBUG", "VERSION")])).unwrap();
        assert_eq!(c.level, LevelFilter::ERROR);
        assert!(banner.is_some());
        let (c, banner, _) = config(vars(&[("NCCL_DEBUG", "NONE")])).unwrap();
        assert_eq!((c.level, banner), (LevelFilter::OFF, None));
        let (c, _, _) = config(vars(&[("NCCL_DEBUG", "ABORT")])).unwrap();
        assert_eq!(c.level, LevelFilter::INFO);
        let (c, _, _) = config(vars(&[("NCCL_DEBUG", "TRACE")])).unwrap();
        assert_eq!(c.level, LevelFilter::TRACE);
        let (c, banner, warning) = config(vars(&[("NCCL_DEBUG", "LOUD")])).unwrap();
        assert_eq!((c, banner), (LogConfig::default(), None));
        assert!(warning.unwrap().contains("LOUD"));
        assert_eq!(config(vars(&[])).unwrap().0, LogConfig::default());
    }

    #[test]
    fn symcomm_variables_take_precedence() {
        let (c, _, _) = config(vars(&[
            ("NCCL_DEBUG", "INFO"),
            ("SYMCOMM_LOG", "error"),
            ("NCCL_DEBUG_SUBSYS", "INIT"),
            ("SYMCOMM_LOG_SUBSYS", "emu"),
            ("NCCL_DEBUG_FILE", "/tmp/nccl.%p"),
            ("SYMCOMM_LOG_FILE", "/tmp/symcomm.%p"),
        ]))
        .unwrap();
        assert_eq!(c.level, LevelFilter::ERROR);
        assert!(c.subsystems.allows("symcomm::emu") && !c.subsystems.allows("symcomm::init"));
        assert_eq!(c.file.as_deref(), Some("/tmp/symcomm.%p"));
        let (c, _, _) = config(vars(&[("NCCL_DEBUG_FILE", "/tmp/nccl.%h")])).unwrap();
        assert_eq!(c.file.as_deref(), Some("/tmp/nccl.%h"));
        assert!(config(vars(&[("NCCL_DEBUG", "INFO"), ("SYMCOMM_LOG", "loud")])).is_err());
    }

    #[test]
    fn nccl_subsystems_select_and_invert() {
        let f = nccl_subsys("INIT,COLL");
        assert!(f.allows("symcomm::init") && f.allows("symcomm::coll"));
        assert!(!f.allows("symcomm::bootstrap") && !f.allows("symcomm::emu"));
        let f = nccl_subsys("^init");
        assert!(!f.allows("symcomm::init") && f.allows("symcomm::alloc"));
        let f = nccl_subsys("ALL");
        assert!(f.allows("symcomm::emu"));
        let f = nccl_subsys("^ALL");
        assert!(!f.allows("symcomm::emu"));
        // Names without a symcomm counterpart select nothing.
        let f = nccl_subsys("PROFILE");
        assert!(!f.allows("symcomm::init"));
    }

    #[test]
    fn every_mapped_subsystem_is_symcomms() {
        for (nccl, ours) in SUBSYS {
            assert!(SubsysFilter::only(ours, false).is_ok(), "{nccl}");
        }
    }
}
