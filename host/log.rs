//! Logging setup for binaries, examples and tests (the library itself never installs a
//! subscriber).
