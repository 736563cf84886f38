//! The environment parsers that read one value, for the `env` fuzz target (`fuzz/`): the same
//! functions `init` and `CommOptions::from_env` call. The launcher variables go through the
//! public [`BootstrapConfig::from_vars`](crate::BootstrapConfig::from_vars), the algorithm
//! through [`tune::parse_algo`](crate::tune::parse_algo), ids through `UniqueId`'s `FromStr`.

use std::time::Duration;

use crate::Result;

/// A duration as `SYMCOMM_TIMEOUT`, `SYMCOMM_HEARTBEAT`, `SYMCOMM_PEER_TIMEOUT` and
/// `SYMCOMM_INIT_TIMEOUT` take it (`30`, `2.5s`, `500ms`, `2m`).
///
/// # Errors
/// Why it does not parse.
pub fn timeout(text: &str) -> std::result::Result<Duration, String> {
    crate::bootstrap::parse_timeout(text)
}

/// A `SYMCOMM_STAGING_BYTES` value (`None`: unset).
///
/// # Errors
/// As the variable's own check: `InvalidArgument` outside 4096..=16 GiB.
pub fn staging_bytes(value: Option<&str>) -> Result<u64> {
    crate::comm::coll::parse_staging_bytes(value)
}
