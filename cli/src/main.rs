//! The `neardup` command line; see the `neardup_cli` crate.
#![forbid(unsafe_code)]

/// mimalloc rather than glibc's malloc: see `docs/service.md`, "CPU per request".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(neardup_cli::main());
}
