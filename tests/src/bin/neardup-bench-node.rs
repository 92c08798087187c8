//! The `neardup-bench` measurement program, as a binary of the test package (see
//! Cargo.toml).

fn main() {
    std::process::exit(neardup_bench::main());
}
