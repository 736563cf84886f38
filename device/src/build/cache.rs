//! The build cache: compiled device code kept by the SHA-256 of everything that went into it.
//!
//! A crate's build script runs again for every build configuration: `cargo clippy`, `cargo test`,
//! `cargo build --release` each run it, and each would compile the same kernels again (minutes
//! for symcomm's own). The helper keys every compiler run by its inputs — the compiler and its
//! version, its full command line, the source and every header the build watches (the same files
//! as its `cargo:rerun-if-changed` lines) — and keeps the outputs in a directory shared by those
//! builds. A hit copies the outputs instead of compiling; anything that changes an input is a
//! miss.
//!
//! The directory is `SYMCOMM_BUILD_CACHE` when set (`off` disables the cache), otherwise
//! `<target dir>/symcomm-build-cache` (found from `OUT_DIR`), so `cargo clean` empties it.
//! Entries are written to a temporary directory and renamed into place, so concurrent builds
//! never see a partial entry. The cache is best effort: a directory that cannot be written means
//! compiling every time, never a failed build.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The variable naming the cache directory (`off`: no cache).
pub const CACHE_ENV: &str = "SYMCOMM_BUILD_CACHE";

/// A cache directory, or none (disabled, or no place for it).
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    dir: Option<PathBuf>,
}

/// The inputs of one compiler run, hashed in order; every part is length-prefixed, so that no
/// two different sequences of parts give the same bytes.
#[derive(Clone)]
pub(crate) struct Key(Sha256);

impl Key {
    /// A key for outputs of kind `what` (its layout version is part of it).
    pub(crate) fn new(what: &str) -> Self {
        let mut k = Key(Sha256::new());
        k.part(b"symcomm-build-cache/1");
        k.part(what.as_bytes());
        k
    }

    /// Adds one input.
    pub(crate) fn part(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    /// The entry name: the digest in hex.
    pub(crate) fn finish(self) -> String {
        self.0
            .finalize()
            .iter()
            .fold(String::with_capacity(64), |mut s, b| {
                use std::fmt::Write as _;
                let _ = write!(s, "{b:02x}");
                s
            })
    }
}

impl Cache {
    /// The cache of this build script: `SYMCOMM_BUILD_CACHE`, else beside the target directory's
    /// profile directories (`OUT_DIR` is `<target>[/<triple>]/<profile>/build/<pkg>/out`).
    pub(crate) fn locate(out_dir: &Path) -> Self {
        println!("cargo:rerun-if-env-changed={CACHE_ENV}");
        Self::locate_with(std::env::var_os(CACHE_ENV), out_dir)
    }

    fn locate_with(var: Option<std::ffi::OsString>, out_dir: &Path) -> Self {
        let dir = match var {
            Some(v) if v == "off" => None,
            Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
            _ => {
                let mut up = out_dir.ancestors();
                match (up.nth(2), up.nth(1)) {
                    (Some(build), Some(target))
                        if build.file_name().is_some_and(|n| n == "build") =>
                    {
                        Some(target.join("symcomm-build-cache"))
                    }
                    _ => None,
                }
            }
        };
        Cache { dir }
    }

    /// A cache in `dir` (tests).
    #[cfg(test)]
    fn at(dir: &Path) -> Self {
        Cache {
            dir: Some(dir.to_owned()),
        }
    }

    /// Copies entry `key`'s files to their destinations: `(name in the entry, destination)`.
    /// True when every one was there and copied; false (nothing to rely on) otherwise.
    pub(crate) fn fetch(&self, key: &str, files: &[(&str, &Path)]) -> bool {
        let Some(dir) = &self.dir else { return false };
        let entry = dir.join(key);
        if !entry.join(COMPLETE).is_file() {
            return false;
        }
        files
            .iter()
            .all(|(name, dest)| std::fs::copy(entry.join(name), dest).is_ok())
    }

    /// Stores `(name in the entry, source file)` as entry `key`. Best effort: failures leave the
    /// cache without the entry.
    pub(crate) fn store(&self, key: &str, files: &[(&str, &Path)]) {
        let Some(dir) = &self.dir else { return };
        let entry = dir.join(key);
        if entry.join(COMPLETE).is_file() {
            return;
        }
        let tmp = dir.join(format!(
            ".tmp-{key}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let written = std::fs::create_dir_all(&tmp).is_ok()
            && files
                .iter()
                .all(|(name, src)| std::fs::copy(src, tmp.join(name)).is_ok())
            && std::fs::write(tmp.join(COMPLETE), b"").is_ok();
        if written && entry.exists() {
            // Left by a build killed while storing (no marker): replaced.
            let _ = std::fs::remove_dir_all(&entry);
        }
        // A concurrent build may have renamed its copy into place first: then ours is dropped.
        if !(written && std::fs::rename(&tmp, &entry).is_ok()) {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
}

/// The marker written last into an entry: an entry without it is not used.
const COMPLETE: &str = ".complete";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn key(parts: &[&[u8]]) -> String {
        let mut k = Key::new("test");
        for p in parts {
            k.part(p);
        }
        k.finish()
    }

    #[test]
    fn every_input_and_its_boundaries_change_the_key() {
        let base = key(&[b"nvcc 13.0", b"-O3", b"source"]);
        assert_eq!(base.len(), 64);
        assert_eq!(base, key(&[b"nvcc 13.0", b"-O3", b"source"]));
        for other in [
            key(&[b"nvcc 13.1", b"-O3", b"source"]),
            key(&[b"nvcc 13.0", b"-O2", b"source"]),
            key(&[b"nvcc 13.0", b"-O3", b"sourcE"]),
            // The same bytes split differently.
            key(&[b"nvcc 13.0-", b"O3", b"source"]),
            key(&[b"nvcc 13.0", b"-O3source"]),
        ] {
            assert_ne!(base, other);
        }
        let mut other_kind = Key::new("other");
        other_kind.part(b"nvcc 13.0").part(b"-O3").part(b"source");
        assert_ne!(base, other_kind.finish());
    }

    #[test]
    fn stores_and_fetches_whole_entries_only() {
        let root = std::env::temp_dir().join(format!("symcomm-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let cache = Cache::at(&root.join("cache"));
        let (a, b) = (root.join("a.bin"), root.join("b.txt"));
        std::fs::write(&a, [1u8, 2, 3]).unwrap();
        std::fs::write(&b, "report").unwrap();
        let (a2, b2) = (root.join("a2.bin"), root.join("b2.txt"));

        assert!(!cache.fetch("k1", &[("a", &a2), ("b", &b2)]), "empty cache");
        cache.store("k1", &[("a", &a), ("b", &b)]);
        assert!(cache.fetch("k1", &[("a", &a2), ("b", &b2)]));
        assert_eq!(std::fs::read(&a2).unwrap(), [1, 2, 3]);
        assert_eq!(std::fs::read_to_string(&b2).unwrap(), "report");
        assert!(!cache.fetch("k1", &[("a", &a2), ("missing", &b2)]));
        assert!(!cache.fetch("k2", &[("a", &a2)]), "another key");

        // An entry without its completion marker (a build killed while storing) is not used.
        std::fs::remove_file(root.join("cache/k1").join(COMPLETE)).unwrap();
        assert!(!cache.fetch("k1", &[("a", &a2)]));
        cache.store("k1", &[("a", &b)]);
        assert!(
            cache.fetch("k1", &[("a", &a2)]),
            "an incomplete entry is replaced"
        );
        assert_eq!(std::fs::read_to_string(&a2).unwrap(), "report");

        // A failed store (a source file missing) leaves no entry and no temporary directory.
        cache.store("k3", &[("a", &a), ("gone", &root.join("gone"))]);
        assert!(!cache.fetch("k3", &[("a", &a2)]));
        let left: Vec<_> = std::fs::read_dir(root.join("cache"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.iter().all(|n| !n.starts_with(".tmp")), "{left:?}");

        // Disabled: never a hit, storing does nothing.
        let off = Cache { dir: None };
        off.store("k4", &[("a", &a)]);
        assert!(!off.fetch("k4", &[("a", &a2)]));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn locates_the_target_directory_from_out_dir() {
        let out = Path::new("/w/target/debug/build/symcomm-0123/out");
        let dir = |var: Option<&str>, out: &Path| Cache::locate_with(var.map(Into::into), out).dir;
        assert_eq!(
            dir(None, out).as_deref(),
            Some(Path::new("/w/target/symcomm-build-cache"))
        );
        assert_eq!(
            dir(
                None,
                Path::new("/w/target/x86_64-unknown-linux-gnu/release/build/p-1/out")
            )
            .as_deref(),
            Some(Path::new(
                "/w/target/x86_64-unknown-linux-gnu/symcomm-build-cache"
            ))
        );
        assert_eq!(dir(Some(""), out), dir(None, out));
        assert_eq!(dir(Some("/c"), out).as_deref(), Some(Path::new("/c")));
        assert_eq!(dir(Some("off"), out), None);
        assert_eq!(dir(None, Path::new("/somewhere/out")), None);
    }
}
