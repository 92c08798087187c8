//! The `neardup-bench` program; see the `neardup_bench` crate.

fn main() {
    std::process::exit(neardup_bench::main());
}
