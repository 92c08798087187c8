//! One module per subcommand.

pub mod backup;
pub mod cert;
pub mod check;
pub mod cluster;
pub mod cluster_node;
pub mod cluster_serve;
pub mod common;
pub mod delete;
pub mod fingerprint;
pub mod health;
pub mod insert;
pub mod query;
pub mod router;
pub mod secrets;
pub mod serve;
pub mod shard;
pub mod stats;
pub mod token;
