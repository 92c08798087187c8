//! # neardup-proto
//!
//! neardup's gRPC interface: the `.proto` files under `proto/` and the Rust code tonic and
//! prost generate from them at build time (with a vendored `protoc`, so cargo is all a
//! machine needs).
//!
//! - [`v1`]: the public API, package `neardup.v1`, what clients call.
//! - [`internal`]: what the router asks of shard nodes, and the Raft transport between
//!   nodes, package `neardup.internal.v1`.
//! - [`admin`]: the cluster's administration (status, membership, leadership), package
//!   `neardup.admin.v1`, served on each node's internal listener.
//! - [`FILE_DESCRIPTOR_SET`]: every package's descriptors, for gRPC reflection.
//!
//! Versioning rules are in `proto/VERSIONING.md`: within `v1`, additive changes only.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod codec;

/// Generated code, in modules that mirror the protobuf packages.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod neardup {
    /// The public API, package `neardup.v1` (see `proto/neardup/v1/neardup.proto`).
    pub mod v1 {
        tonic::include_proto!("neardup.v1");
    }
    /// The administration API, package `neardup.admin.v1`.
    pub mod admin {
        /// Package `neardup.admin.v1` (see `proto/neardup/admin/v1/admin.proto`).
        pub mod v1 {
            tonic::include_proto!("neardup.admin.v1");
        }
    }
    /// Internal packages.
    pub mod internal {
        /// Package `neardup.internal.v1` (see `proto/neardup/internal/v1/shard.proto` and `data.proto`).
        pub mod v1 {
            tonic::include_proto!("neardup.internal.v1");
        }
    }
}

pub use neardup::admin::v1 as admin;
pub use neardup::internal::v1 as internal;
pub use neardup::v1;

/// Encoded `FileDescriptorSet` of every package, for the reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("neardup_descriptor");

/// Name of the public service, as health checks and reflection know it.
pub const PUBLIC_SERVICE: &str = "neardup.v1.Neardup";
/// Name of the internal shard service.
pub const SHARD_SERVICE: &str = "neardup.internal.v1.Shard";
/// Name of the internal data service (tablets and document partitions of cluster nodes).
pub const DATA_SERVICE: &str = "neardup.internal.v1.Data";
/// Name of the internal Raft transport service.
pub const RAFT_SERVICE: &str = "neardup.internal.v1.Raft";
/// Name of the administration service.
pub const ADMIN_SERVICE: &str = "neardup.admin.v1.Admin";
