//! The `neardup` command line; see the `neardup_cli` crate.

fn main() {
    std::process::exit(neardup_cli::main());
}
