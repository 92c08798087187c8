//! The `neardup` command line; see the `neardup_cli` crate.
#![forbid(unsafe_code)]

fn main() {
    std::process::exit(neardup_cli::main());
}
