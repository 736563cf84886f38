//! The environment parsers: launcher and bootstrap variables through the public
//! `BootstrapConfig::from_vars` (torchrun, Open MPI, MPICH, Slurm, `SYMCOMM_ID`,
//! `SYMCOMM_SECRET`, `MASTER_ADDR` / `MASTER_PORT`, timeouts, host id, interface), and the
//! one-value tunables (`SYMCOMM_ALGO`, `SYMCOMM_STAGING_BYTES`, the timeouts). The input is a
//! list of `<name index byte><value>\n` records. Properties: no input panics; no error shows 8
//! consecutive characters of a secret set through `SYMCOMM_SECRET` or `SYMCOMM_ID` unless
//! another variable's value carries them too.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use symcomm::testing::parse;
use symcomm::{BootstrapConfig, tune};

const NAMES: [&str; 24] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SYMCOMM_ID",
    "SYMCOMM_SECRET",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SYMCOMM_PORT",
    "SYMCOMM_INIT_TIMEOUT",
    "SYMCOMM_HOST_ID",
    "SYMCOMM_SOCKET_IFNAME",
];

/// The 32-hex-digit runs of a secret-carrying value (the secret itself, or a field of an id).
fn secrets(value: &str) -> Vec<&str> {
    value
        .split(|c: char| !c.is_ascii_hexdigit())
        .filter(|s| s.len() >= 32)
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut vars = HashMap::new();
    for record in data.split(|&b| b == b'\n') {
        let Some((&index, value)) = record.split_first() else {
            continue;
        };
        let name = NAMES[usize::from(index) % NAMES.len()];
        let mut value = String::from_utf8_lossy(value).into_owned();
        // A host name would be resolved (getaddrinfo: files, DNS): keep MASTER_ADDR to
        // addresses, so that an input costs no lookups.
        if name == "MASTER_ADDR" && value.trim().parse::<std::net::IpAddr>().is_err() {
            value = "127.0.0.1".into();
        }
        vars.insert(name, value);
    }
    let shown = match BootstrapConfig::from_vars(|n| vars.get(n).cloned()) {
        Ok(c) => format!("{c:?}"),
        Err(e) => format!("{e} {e:?}"),
    };
    for secret_var in ["SYMCOMM_SECRET", "SYMCOMM_ID"] {
        let Some(v) = vars.get(secret_var) else {
            continue;
        };
        for secret in secrets(v) {
            for w in symcomm_fuzz::secret_windows(secret, &shown) {
                // Another value shown as is, or as `Debug` escapes it (`"\0"` then `"01…"`
                // reads as the hex run `001…`: the fuzzer found that one).
                let elsewhere = vars.iter().any(|(n, other)| {
                    *n != secret_var
                        && [other.clone(), format!("{other:?}")]
                            .iter()
                            .any(|o| o.to_ascii_lowercase().contains(&w))
                });
                assert!(elsewhere, "{vars:?} shows part of a secret: {shown}");
            }
        }
    }

    for value in vars.values() {
        let _ = parse::timeout(value);
        let _ = parse::staging_bytes(Some(value));
        let _ = tune::parse_algo(Some(value));
    }
});
