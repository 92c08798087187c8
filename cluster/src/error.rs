//! The crate's one error type. The server maps it to gRPC codes once.

use crate::NodeId;
use crate::map::MapError;

/// What went wrong in the cluster layer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// This node is not the leader; `leader` is the one it knows (id, internal address), if any.
    #[error("not the leader{}", match leader {
        Some((id, addr)) => format!("; the leader is node {id} at {addr}"),
        None => "; no leader is known".to_string(),
    })]
    NotLeader {
        /// The known leader's id and internal address.
        leader: Option<(NodeId, String)>,
    },
    /// The change is not allowed in the cluster's current state (says why).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The request is malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The node id is taken by a node at another address.
    #[error("node id {id} is already in use by the node at {existing_addr}")]
    IdInUse {
        /// The id.
        id: NodeId,
        /// The internal address of the node that holds it.
        existing_addr: String,
    },
    /// No such node in the map.
    #[error("no node {0} in the cluster")]
    NotFound(NodeId),
    /// Not possible now; a retry may work (leadership lost, proposal dropped, shutting down).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The Raft storage failed (I/O).
    #[error("cluster storage: {0}")]
    Storage(String),
    /// The Raft storage holds bytes that fail their checksum or do not decode.
    #[error("cluster storage is corrupt: {0}")]
    Corrupt(String),
}

impl From<MapError> for ClusterError {
    fn from(e: MapError) -> Self {
        match e {
            MapError::IdInUse { id, existing_addr } => ClusterError::IdInUse { id, existing_addr },
            MapError::NoSuchNode(id) => ClusterError::NotFound(id),
            MapError::Invalid(m) => ClusterError::InvalidArgument(m),
            MapError::Decode(m) => ClusterError::Corrupt(m),
            e @ (MapError::AlreadyBootstrapped(_)
            | MapError::NotBootstrapped
            | MapError::Refused(_)) => ClusterError::FailedPrecondition(e.to_string()),
        }
    }
}

impl From<sled::Error> for ClusterError {
    fn from(e: sled::Error) -> Self {
        match e {
            sled::Error::Corruption { .. } => ClusterError::Corrupt(e.to_string()),
            e => ClusterError::Storage(e.to_string()),
        }
    }
}

impl From<raft::Error> for ClusterError {
    fn from(e: raft::Error) -> Self {
        match e {
            raft::Error::ProposalDropped => ClusterError::Unavailable(
                "the proposal was dropped (no leader or a change in progress)".into(),
            ),
            raft::Error::Store(raft::StorageError::Other(inner)) => {
                match inner.downcast::<ClusterError>() {
                    Ok(e) => *e,
                    Err(other) => ClusterError::Storage(other.to_string()),
                }
            }
            raft::Error::CodecError(e) => {
                ClusterError::InvalidArgument(format!("raft message: {e}"))
            }
            e => ClusterError::Unavailable(format!("raft: {e}")),
        }
    }
}
