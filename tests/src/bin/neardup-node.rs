//! The `neardup` command line, as a binary of the test package (see Cargo.toml).

fn main() {
    std::process::exit(neardup_cli::main());
}
