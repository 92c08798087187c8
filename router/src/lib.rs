//! # neardup-router
//!
//! neardup's public gRPC service, `neardup.v1.Neardup`, in front of a shard.
//!
//! - [`service::Router`]: validates every request against the documented [`Limits`]
//!   (k within the design, exactly one of fingerprint or text, id length, batch and message
//!   size), fingerprints texts, honours deadlines, refuses work beyond the in-flight limit,
//!   records metrics, and maps errors to gRPC codes in one place ([`error`]).
//! - [`shard::ShardApi`]: the shard role, with two implementations: [`shard::InProcess`]
//!   (embedded mode, the shard service in this process) and [`shard::Remote`] (a shard node
//!   over the internal gRPC API).
//! - [`cluster::ClusterRouter`]: the shard role over the nodes of a cluster (tablets and
//!   document partitions reached through `neardup_server::NodeApi`; [`node_client`] holds the
//!   gRPC clients of the nodes' `Data` service).
//! - [`server::serve`]: the listener with health (following the shard's) and reflection.
//!
//! ```no_run
//! # async fn run(shard: std::sync::Arc<dyn neardup_router::ShardApi>) {
//! use neardup_router::{Limits, Router, RpcMetrics};
//! let router = Router::new(shard, 3, Limits::default(), RpcMetrics::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:50051").await.unwrap();
//! neardup_router::server::serve(listener, router, None, None, std::future::pending()).await.unwrap();
//! # }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backup;
pub mod cluster;
pub mod error;
pub mod fill;
pub mod hedge;
pub mod limits;
pub mod metrics;
pub mod node_client;
pub mod server;
pub mod service;
pub mod shard;
pub mod text;
pub mod verify;

pub use cluster::{ClusterRouter, GrpcNode, GrpcNodes, IdSource, NodeResolver};
pub use error::{Result, RouterError};
pub use limits::Limits;
pub use metrics::RpcMetrics;
pub use service::Router;
pub use shard::{InProcess, Remote, ShardApi, ShardHealth};
pub use verify::VerifyDefaults;
