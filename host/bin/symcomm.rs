//! The `symcomm` command-line tool.
fn main() {
    println!("symcomm {}", env!("CARGO_PKG_VERSION"));
}
