//! Generates the Rust code of `proto/**/*.proto` with the protoc of `protoc-bin-vendored`,
//! so a fresh machine needs nothing but cargo. The generated code goes to OUT_DIR and is not
//! checked in: it is always the code of the .proto files beside it.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let files = [
        "neardup/v1/neardup.proto",
        "neardup/internal/v1/shard.proto",
        "neardup/internal/v1/data.proto",
        "neardup/admin/v1/admin.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    // The protoc path is given to this build only; PROTOC is not set for other crates.
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("neardup_descriptor.bin"))
        .codec_path("crate::codec::Codec")
        .compile_with_config(config, &files, &["."])?;
    Ok(())
}
