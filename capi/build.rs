//! The shared library's SONAME is `libnccl.so.2`, NCCL's: a library preloaded under that SONAME
//! replaces NCCL for every program linked against it (PyTorch's RPATH included), instead of
//! interposing only the symbols it happens to define.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
