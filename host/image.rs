//! symcomm's built-in device code, embedded at build time (see `build.rs`).

include!(concat!(env!("OUT_DIR"), "/symcomm_device_image.rs"));
