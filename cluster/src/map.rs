//! The cluster map: the state machine Raft replicates.
//!
//! Pure: no I/O, no clocks, no randomness. Every replica applies the same [`Command`]s in the
//! same order and so holds the same [`ClusterMap`]. A command either applies whole, bumping the
//! epoch by exactly one, or is refused with a [`MapError`] and changes nothing. Commands and
//! maps travel as JSON (the Raft entries' data and the snapshots' data).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::NodeId;
use crate::placement;

/// Whether a node votes in Raft elections and commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Votes and counts for quorum.
    Voter,
    /// Receives the log but does not vote (a new node, or one beyond the largest voter count).
    Learner,
}

/// The life cycle of a node in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeState {
    /// Added, still catching up with the log.
    Joining,
    /// Caught up and serving.
    Active,
    /// Being removed: it takes no new work and leaves the Raft group next.
    Draining,
    /// Known to be unreachable.
    Down,
}

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's Raft id, unique in the cluster.
    pub id: NodeId,
    /// The address clients reach its public gRPC service at.
    pub public_addr: String,
    /// The address its peers reach its internal services (Raft) at.
    pub internal_addr: String,
    /// Voter or learner.
    pub role: Role,
    /// Where it stands in its life cycle.
    pub state: NodeState,
    /// The epoch of the map that last marked it down (0: never). What a filling replica
    /// recorded of the writes it took before then is void: it missed the writes made while
    /// it was down.
    #[serde(default)]
    pub down_epoch: u64,
    /// Down for longer than the cluster's rebuild time ([`Command::NodeLost`]): placement
    /// no longer counts on it, so each unit it held is rebuilt on other nodes, from the
    /// surviving replicas. Cleared once the node is back.
    #[serde(default)]
    pub lost: bool,
}

impl NodeInfo {
    /// An active voter: how the node that starts a cluster enters its map.
    pub fn active_voter(id: NodeId, public_addr: String, internal_addr: String) -> NodeInfo {
        NodeInfo {
            id,
            public_addr,
            internal_addr,
            role: Role::Voter,
            state: NodeState::Active,
            down_epoch: 0,
            lost: false,
        }
    }
}

/// The table design of the cluster's index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesignInfo {
    /// The design's name (for example `"5c2"`), as the index parses it.
    pub name: String,
    /// How many permuted tables the design has.
    pub tables: u32,
    /// The largest Hamming distance the design answers exactly.
    pub max_k: u32,
}

/// Whether a tablet is in place or on its way elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TabletState {
    /// Served by its nodes.
    Active,
    /// Being copied to other nodes (used by later placement work).
    Moving,
}

/// One table of the design restricted to the permuted values in `[start, end]` (inclusive).
/// For now every table is one tablet covering everything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tablet {
    /// The table of the design.
    pub table: u32,
    /// The smallest permuted value the tablet holds.
    pub start: u64,
    /// The largest permuted value the tablet holds.
    pub end: u64,
    /// The nodes holding it.
    pub nodes: Vec<NodeId>,
    /// In place or moving.
    pub state: TabletState,
    /// Replicas that take writes but do not serve reads yet: new ones being filled, or ones
    /// back from [`NodeState::Down`] catching up.
    #[serde(default)]
    pub filling: Vec<NodeId>,
    /// The epoch at which its writers last changed (see [`ClusterMap::writers_since`]).
    #[serde(default)]
    pub writers_epoch: u64,
}

/// One partition of the documents: those whose name hashes to `index` (see
/// [`ClusterMap::partition_of`]). It holds each document's name, fingerprint, timestamp,
/// cluster and sketch, and is where a fingerprint entry's id is resolved to its document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// The partition's number, `0..partitions.len()`.
    pub index: u32,
    /// Replicas that serve reads and take writes.
    pub nodes: Vec<NodeId>,
    /// Replicas that take writes but do not serve reads yet (as [`Tablet::filling`]).
    #[serde(default)]
    pub filling: Vec<NodeId>,
    /// The epoch at which its writers last changed (see [`ClusterMap::writers_since`]).
    #[serde(default)]
    pub writers_epoch: u64,
}

/// A unit of placement: a tablet (named by its table and first permuted value) or a
/// document partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Unit {
    /// The tablet of `table` starting at permuted value `start`.
    Tablet {
        /// Its table.
        table: u32,
        /// Its first permuted value.
        start: u64,
    },
    /// A document partition.
    Partition(u32),
}

/// The replicated map of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// The cluster's id, chosen once at bootstrap; empty before.
    pub cluster_id: String,
    /// Bumped by one by every applied command.
    pub epoch: u64,
    /// The table design, set at bootstrap.
    pub design: Option<DesignInfo>,
    /// Every member, by id.
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    /// The tablets, ordered by table then start.
    pub tablets: Vec<Tablet>,
    /// The document partitions, ordered by index.
    #[serde(default)]
    pub partitions: Vec<Partition>,
    /// How many nodes hold each tablet and partition (fewer while the cluster is smaller).
    #[serde(default)]
    pub replicas: u32,
    /// Each table is cut into `2^split_bits` tablets by the leading bits of its permuted
    /// values.
    #[serde(default)]
    pub split_bits: u32,
    /// The next document sequence number to grant (see `Command::GrantIds`); sequence
    /// numbers start at 1 (a map that says 0 grants from 1).
    #[serde(default)]
    pub next_gid_seq: u64,
    /// Serving replicas that placement moved away: (unit, node). They serve and take writes
    /// until every filling replica of the unit is ready (see [`crate::placement`]).
    #[serde(default)]
    pub leaving: BTreeSet<(Unit, NodeId)>,
    /// Ids of the nodes removed (or evicted) from the cluster: never members again, and
    /// refused by the other nodes even when they hold a valid certificate.
    #[serde(default)]
    pub removed: BTreeSet<NodeId>,
    /// The design's smallest prefix (bits), from the bootstrap: a tablet splits only at a
    /// multiple of `2^(64 - min_prefix_bits)` ([`Command::SplitTablet`]), so that a
    /// query's prefix still decides one tablet per table. `None` (unknown): no splits.
    #[serde(default)]
    pub min_prefix_bits: Option<u32>,
}

/// How a new cluster lays out its data (the [`Command::Bootstrap`] parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Replicas of every tablet and partition (1 to [`MAX_REPLICAS`]); fewer while the
    /// cluster has fewer usable nodes.
    pub replicas: u32,
    /// Each table is cut into `2^split_bits` tablets (at most [`MAX_SPLIT_BITS`] and at most
    /// the design's smallest prefix).
    pub split_bits: u32,
    /// Document partitions (1 to [`MAX_PARTITIONS`]: a gid keeps its partition in 8 bits).
    pub partitions: u32,
}

impl Default for Layout {
    /// 2 replicas, 4 tablets per table, 16 partitions.
    fn default() -> Self {
        Layout { replicas: 2, split_bits: 2, partitions: 16 }
    }
}

/// The most replicas a unit may have.
pub const MAX_REPLICAS: u32 = 16;
/// The most split bits: 256 tablets per table keep the map small.
pub const MAX_SPLIT_BITS: u32 = 8;
/// The most document partitions: a gid holds its partition in its low 8 bits.
pub const MAX_PARTITIONS: u32 = 256;
/// The largest block [`Command::GrantIds`] grants at once.
pub const MAX_GRANT: u64 = 1 << 24;
/// Sequence numbers stay below this: `seq << 8` fits a u64.
pub const GID_SEQ_LIMIT: u64 = 1 << 56;

/// A change of the map, carried as the data of one Raft entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Starts a cluster: sets its id and design, with `node` its only (voting) member holding
    /// every tablet (`tables * 2^split_bits`) and every partition. Only on an empty map.
    Bootstrap {
        /// The new cluster's id (not empty).
        cluster_id: String,
        /// Its table design.
        design: DesignInfo,
        /// The first node.
        node: NodeInfo,
        /// Replicas, split bits, partitions.
        #[serde(default)]
        layout: Layout,
        /// The design's smallest prefix (bits): `split_bits` may not exceed it, so a query's
        /// prefix decides one tablet per table. `None`: not checked.
        #[serde(default)]
        min_prefix_bits: Option<u32>,
    },
    /// Adds a node as a joining learner.
    AddNode {
        /// Its id, not in the map yet.
        id: NodeId,
        /// Its public address.
        public_addr: String,
        /// Its internal address.
        internal_addr: String,
    },
    /// Makes a learner a voter and active (it caught up).
    Promote {
        /// The node.
        id: NodeId,
    },
    /// Sets a node's role.
    SetRole {
        /// The node.
        id: NodeId,
        /// Its new role.
        role: Role,
    },
    /// Sets a node's state.
    SetState {
        /// The node.
        id: NodeId,
        /// Its new state.
        state: NodeState,
    },
    /// Removes a node from the map and from every tablet.
    RemoveNode {
        /// The node.
        id: NodeId,
    },
    /// Sets the nodes holding a table's tablets (a manual override: no filling, no leaving;
    /// the next membership change places them again).
    SetTabletNodes {
        /// The table.
        table: u32,
        /// The nodes, every one a member.
        nodes: Vec<NodeId>,
    },
    /// Grants `node` the document sequence numbers `[next_gid_seq, next_gid_seq + count)`
    /// (1 to [`MAX_GRANT`]); the applied entry carries the range back.
    GrantIds {
        /// The node the block is for (a member).
        node: NodeId,
        /// How many sequence numbers.
        count: u64,
    },
    /// Marks an active node down (unreachable): its replicas stay listed, routers skip it.
    NodeDown {
        /// The node.
        id: NodeId,
    },
    /// Marks a down node active again: each unit it serves takes it as filling (it catches
    /// up before serving), unless it is the unit's only serving replica left up.
    NodeBack {
        /// The node.
        id: NodeId,
    },
    /// Removes a node that Raft's configuration no longer holds although the map refused its
    /// `RemoveNode` (the units changed between proposal and commit): the map follows Raft,
    /// even when that leaves units without a serving replica. Applied by the replicas in
    /// place of that `RemoveNode`; not proposed.
    Evict {
        /// The node.
        id: NodeId,
    },
    /// A filling replica caught up: it serves from now on; once none of the unit's replicas
    /// is filling, its leaving ones are dropped.
    ReplicaReady {
        /// The unit.
        unit: Unit,
        /// The node whose replica is ready.
        node: NodeId,
    },
    /// Cuts a tablet in two at permuted value `at`: `[start, at - 1]` keeps the unit, and
    /// `[at, end]` becomes the tablet starting at `at`, on the same nodes, so no data moves
    /// (each node stores a table's tablets together). Placement then balances the tablets
    /// again, which may move the new one. Refused while any replica of the tablet fills or
    /// leaves, and unless `at` is inside the tablet at a prefix boundary (see
    /// [`ClusterMap::min_prefix_bits`]).
    SplitTablet {
        /// The table.
        table: u32,
        /// The tablet's first permuted value.
        start: u64,
        /// The first permuted value of the new tablet.
        at: u64,
    },
    /// Places every unit again as a membership change would (see [`crate::placement`]): the
    /// units a manual [`Command::SetTabletNodes`] put aside go back to balance.
    Rebalance,
    /// Marks a down node lost (down for longer than the rebuild time): placement stops
    /// counting on it, so its units take new replicas on the other nodes, filled from the
    /// surviving ones; its own replicas leave once those are ready. Back, it is active again
    /// and placed like a new node.
    NodeLost {
        /// The node.
        id: NodeId,
    },
}

/// Why node `id` cannot be added again.
pub fn removed_message(id: NodeId) -> String {
    format!("node {id} was removed from the cluster; a node coming back joins under a new id")
}

/// Why a command was refused or a map could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The cluster is already bootstrapped.
    #[error("the cluster is already bootstrapped (cluster id {0})")]
    AlreadyBootstrapped(String),
    /// The cluster is not bootstrapped yet.
    #[error("the cluster is not bootstrapped")]
    NotBootstrapped,
    /// The id is taken.
    #[error("node id {id} is already in use by {existing_addr}")]
    IdInUse {
        /// The id.
        id: NodeId,
        /// The internal address of the node holding it.
        existing_addr: String,
    },
    /// No such node.
    #[error("no node {0} in the cluster")]
    NoSuchNode(NodeId),
    /// The command is malformed (empty id, address, design).
    #[error("invalid command: {0}")]
    Invalid(String),
    /// The command would leave the map unusable or is not allowed in this state.
    #[error("refused: {0}")]
    Refused(String),
    /// The bytes are not a map or a command.
    #[error("cannot decode: {0}")]
    Decode(String),
}

impl Command {
    /// The command as entry data.
    pub fn encode(&self) -> Vec<u8> {
        // Serialising these plain enums cannot fail (string keys, no maps with other keys).
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The command from entry data.
    pub fn decode(bytes: &[u8]) -> Result<Command, MapError> {
        serde_json::from_slice(bytes).map_err(|e| MapError::Decode(e.to_string()))
    }
}

impl Tablet {
    /// The unit this tablet is.
    pub fn unit(&self) -> Unit {
        Unit::Tablet { table: self.table, start: self.start }
    }
}

impl ClusterMap {
    /// Applies a command: on success the epoch grows by one; on refusal nothing changes.
    pub fn apply(&mut self, cmd: &Command) -> Result<(), MapError> {
        let mut next = self.clone();
        next.apply_inner(cmd)?;
        // Only a node still down stays lost.
        for n in next.nodes.values_mut().filter(|n| n.state != NodeState::Down) {
            n.lost = false;
        }
        next.epoch = self.epoch + 1;
        next.mark_writer_changes(self);
        *self = next;
        Ok(())
    }

    /// Stamps every unit whose writers differ from `before`'s with this map's epoch.
    fn mark_writer_changes(&mut self, before: &ClusterMap) {
        let writers = |m: &ClusterMap, u: Unit| {
            let mut w = m.writers(u);
            w.sort_unstable();
            w
        };
        let changed: BTreeSet<Unit> =
            self.units().filter(|&u| writers(self, u) != writers(before, u)).collect();
        let epoch = self.epoch;
        for t in self.tablets.iter_mut().filter(|t| changed.contains(&t.unit())) {
            t.writers_epoch = epoch;
        }
        for p in self.partitions.iter_mut().filter(|p| changed.contains(&Unit::Partition(p.index)))
        {
            p.writers_epoch = epoch;
        }
    }

    fn bootstrapped(&self) -> Result<(), MapError> {
        if self.cluster_id.is_empty() { Err(MapError::NotBootstrapped) } else { Ok(()) }
    }

    fn node_mut(&mut self, id: NodeId) -> Result<&mut NodeInfo, MapError> {
        self.nodes.get_mut(&id).ok_or(MapError::NoSuchNode(id))
    }

    fn apply_inner(&mut self, cmd: &Command) -> Result<(), MapError> {
        match cmd {
            Command::Bootstrap { cluster_id, design, node, layout, min_prefix_bits } => {
                if !self.cluster_id.is_empty() {
                    return Err(MapError::AlreadyBootstrapped(self.cluster_id.clone()));
                }
                if cluster_id.is_empty() {
                    return Err(MapError::Invalid("empty cluster id".into()));
                }
                if design.tables == 0 {
                    return Err(MapError::Invalid("a design has at least one table".into()));
                }
                check_node(node.id, &node.internal_addr)?;
                check_layout(layout, *min_prefix_bits)?;
                self.cluster_id = cluster_id.clone();
                self.design = Some(design.clone());
                let mut first = node.clone();
                first.role = Role::Voter;
                first.state = NodeState::Active;
                self.nodes.insert(first.id, first);
                let sb = layout.split_bits;
                self.tablets = (0..design.tables)
                    .flat_map(|table| {
                        (0..1u64 << sb).map(move |r| {
                            let start = if sb == 0 { 0 } else { r << (64 - sb) };
                            Tablet {
                                table,
                                start,
                                end: start | (u64::MAX >> sb),
                                nodes: vec![node.id],
                                state: TabletState::Active,
                                filling: Vec::new(),
                                writers_epoch: 0,
                            }
                        })
                    })
                    .collect();
                self.partitions = (0..layout.partitions)
                    .map(|index| Partition {
                        index,
                        nodes: vec![node.id],
                        filling: Vec::new(),
                        writers_epoch: 0,
                    })
                    .collect();
                self.replicas = layout.replicas;
                self.split_bits = sb;
                self.next_gid_seq = 1;
                self.min_prefix_bits = *min_prefix_bits;
                placement::rebalance(self);
            }
            Command::AddNode { id, public_addr, internal_addr } => {
                self.bootstrapped()?;
                check_node(*id, internal_addr)?;
                if self.removed.contains(id) {
                    return Err(MapError::Refused(removed_message(*id)));
                }
                if let Some(existing) = self.nodes.get(id) {
                    return Err(MapError::IdInUse {
                        id: *id,
                        existing_addr: existing.internal_addr.clone(),
                    });
                }
                self.nodes.insert(
                    *id,
                    NodeInfo {
                        id: *id,
                        public_addr: public_addr.clone(),
                        internal_addr: internal_addr.clone(),
                        role: Role::Learner,
                        state: NodeState::Joining,
                        down_epoch: 0,
                        lost: false,
                    },
                );
            }
            Command::Promote { id } => {
                self.bootstrapped()?;
                let node = self.node_mut(*id)?;
                if node.role == Role::Voter {
                    return Err(MapError::Refused(format!("node {id} is already a voter")));
                }
                if node.state == NodeState::Draining {
                    return Err(MapError::Refused(format!("node {id} is draining")));
                }
                let was = node.state;
                node.role = Role::Voter;
                node.state = NodeState::Active;
                if was == NodeState::Down {
                    self.back(*id);
                }
                placement::rebalance(self);
            }
            Command::SetRole { id, role } => {
                self.bootstrapped()?;
                let last_voter = self.voters().count() == 1;
                let node = self.node_mut(*id)?;
                if node.role == Role::Voter && *role == Role::Learner && last_voter {
                    return Err(MapError::Refused(format!("node {id} is the last voter")));
                }
                if node.role == *role {
                    return Err(MapError::Refused(format!("node {id} is already a {role:?}")));
                }
                node.role = *role;
            }
            Command::SetState { id, state } => {
                self.bootstrapped()?;
                // `apply` gives this change the next epoch (as `NodeDown`).
                let epoch = self.epoch + 1;
                let node = self.node_mut(*id)?;
                if node.state == *state {
                    return Err(MapError::Refused(format!("node {id} is already {state:?}")));
                }
                let was = node.state;
                node.state = *state;
                if *state == NodeState::Down {
                    node.down_epoch = epoch;
                }
                if was == NodeState::Down && *state == NodeState::Active {
                    self.back(*id);
                }
                placement::rebalance(self);
            }
            Command::RemoveNode { id } => {
                self.bootstrapped()?;
                let node = self.nodes.get(id).ok_or(MapError::NoSuchNode(*id))?;
                if node.role == Role::Voter
                    && self.nodes.values().filter(|n| n.role == Role::Voter).count() == 1
                {
                    return Err(MapError::Refused(format!("node {id} is the last voter")));
                }
                if let Some(unit) = self
                    .units()
                    .find(|&u| self.replicas_of(u).0.contains(id) && !self.kept_without(u, *id))
                {
                    return Err(MapError::Refused(format!(
                        "node {id} holds the last serving replica of {unit:?} that is not down; \
                         wait until its new replicas are ready"
                    )));
                }
                self.remove_member(*id);
            }
            Command::Evict { id } => {
                self.bootstrapped()?;
                let node = self.nodes.get(id).ok_or(MapError::NoSuchNode(*id))?;
                if node.role == Role::Voter && self.voters().count() == 1 {
                    return Err(MapError::Refused(format!("node {id} is the last voter")));
                }
                self.remove_member(*id);
            }
            Command::SetTabletNodes { table, nodes } => {
                self.bootstrapped()?;
                if let Some(missing) = nodes.iter().find(|n| !self.nodes.contains_key(n)) {
                    return Err(MapError::NoSuchNode(*missing));
                }
                let mut found = false;
                for tablet in self.tablets.iter_mut().filter(|t| t.table == *table) {
                    tablet.nodes = nodes.clone();
                    tablet.filling.clear();
                    found = true;
                }
                if !found {
                    return Err(MapError::Invalid(format!("no table {table} in the design")));
                }
                self.leaving
                    .retain(|(u, _)| !matches!(u, Unit::Tablet { table: t, .. } if t == table));
            }
            Command::GrantIds { node, count } => {
                self.bootstrapped()?;
                if !self.nodes.contains_key(node) {
                    return Err(MapError::NoSuchNode(*node));
                }
                if *count == 0 || *count > MAX_GRANT {
                    return Err(MapError::Invalid(format!(
                        "a grant is 1 to {MAX_GRANT} ids, not {count}"
                    )));
                }
                let start = self.next_gid_seq.max(1);
                match start.checked_add(*count) {
                    Some(end) if end <= GID_SEQ_LIMIT => self.next_gid_seq = end,
                    _ => {
                        return Err(MapError::Refused(format!(
                            "the id space is exhausted ({start} of {GID_SEQ_LIMIT} granted)"
                        )));
                    }
                }
            }
            Command::NodeDown { id } => {
                self.bootstrapped()?;
                // `apply` gives this change the next epoch.
                let epoch = self.epoch + 1;
                let node = self.node_mut(*id)?;
                if node.state != NodeState::Active {
                    return Err(MapError::Refused(format!(
                        "node {id} is {:?}; only an active node is marked down",
                        node.state
                    )));
                }
                node.state = NodeState::Down;
                node.down_epoch = epoch;
            }
            Command::NodeBack { id } => {
                self.bootstrapped()?;
                let node = self.node_mut(*id)?;
                if node.state != NodeState::Down {
                    return Err(MapError::Refused(format!(
                        "node {id} is {:?}, not down",
                        node.state
                    )));
                }
                node.state = NodeState::Active;
                self.back(*id);
                placement::rebalance(self);
            }
            Command::ReplicaReady { unit, node } => {
                self.bootstrapped()?;
                if !self.is_up(*node) {
                    return Err(MapError::Refused(format!("node {node} is down or not a member")));
                }
                let Some((_, filling)) = self.replicas_mut(*unit) else {
                    return Err(MapError::Invalid(format!("no unit {unit:?} in the map")));
                };
                let Some(i) = filling.iter().position(|n| n == node) else {
                    return Err(MapError::Refused(format!(
                        "node {node} holds no filling replica of {unit:?}"
                    )));
                };
                filling.remove(i);
                if let Some((nodes, _)) = self.replicas_mut(*unit) {
                    nodes.push(*node);
                }
                placement::settle(self, *unit);
            }
            Command::SplitTablet { table, start, at } => {
                self.bootstrapped()?;
                self.split_tablet(*table, *start, *at)?;
                placement::rebalance(self);
            }
            Command::Rebalance => {
                self.bootstrapped()?;
                placement::rebalance(self);
            }
            Command::NodeLost { id } => {
                self.bootstrapped()?;
                let node = self.node_mut(*id)?;
                if node.state != NodeState::Down || node.lost {
                    let lost = if node.lost { " and lost already" } else { "" };
                    return Err(MapError::Refused(format!(
                        "node {id} is {:?}{lost}; only a node marked down is marked lost",
                        node.state
                    )));
                }
                node.lost = true;
                placement::rebalance(self);
            }
        }
        Ok(())
    }

    /// Removes node `id` from the members and from every unit, then places again.
    fn remove_member(&mut self, id: NodeId) {
        self.nodes.remove(&id);
        self.removed.insert(id);
        for tablet in &mut self.tablets {
            tablet.nodes.retain(|&n| n != id);
            tablet.filling.retain(|&n| n != id);
        }
        for p in &mut self.partitions {
            p.nodes.retain(|&n| n != id);
            p.filling.retain(|&n| n != id);
        }
        self.leaving.retain(|&(_, n)| n != id);
        placement::rebalance(self);
    }

    /// Whether node `id` was removed from the cluster (it may not come back under that id).
    pub fn is_removed(&self, id: NodeId) -> bool {
        self.removed.contains(&id)
    }

    /// Whether `cmd` would apply (without applying it).
    pub fn check(&self, cmd: &Command) -> Result<(), MapError> {
        self.clone().apply_inner(cmd)
    }

    /// The sequence numbers a [`Command::GrantIds`] of `count` applied next would grant.
    pub fn next_grant(&self, count: u64) -> Range<u64> {
        let start = self.next_gid_seq.max(1);
        start..start.saturating_add(count)
    }

    /// Node `id` is back from down: each unit it serves takes it as filling (a leaving
    /// replica of it is dropped instead), unless it was the unit's last serving replica
    /// standing. It was if every other serving replica is down and went down before it:
    /// writes need a serving replica up ([`writers`](Self::writers)), so none was taken
    /// after it went down, and it holds every acknowledged write. A replica that went down
    /// earlier missed the writes taken meanwhile: it waits, filling, for the last one.
    fn back(&mut self, id: NodeId) {
        let units: Vec<Unit> =
            self.units().filter(|&u| self.replicas_of(u).0.contains(&id)).collect();
        for unit in units {
            if self.last_standing(unit, id) {
                continue;
            }
            let leaving = self.leaving.remove(&(unit, id));
            if let Some((nodes, filling)) = self.replicas_mut(unit) {
                nodes.retain(|&n| n != id);
                if !leaving {
                    filling.push(id);
                }
            }
        }
    }

    /// Whether `id` was the last of `unit`'s serving replicas marked down, every other one
    /// being down (see [`back`](Self::back)).
    fn last_standing(&self, unit: Unit, id: NodeId) -> bool {
        let down_at = |n: NodeId| self.nodes.get(&n).map_or(0, |info| info.down_epoch);
        let mine = down_at(id);
        !self.kept_without(unit, id)
            && self.replicas_of(unit).0.iter().all(|&n| n == id || down_at(n) < mine)
    }

    /// Whether `unit` keeps a serving replica that is up when `id` is set aside.
    fn kept_without(&self, unit: Unit, id: NodeId) -> bool {
        self.replicas_of(unit).0.iter().any(|&n| n != id && self.is_up(n))
    }

    /// Every unit: the tablets in order, then the partitions.
    pub fn units(&self) -> impl Iterator<Item = Unit> + '_ {
        self.tablets
            .iter()
            .map(Tablet::unit)
            .chain(self.partitions.iter().map(|p| Unit::Partition(p.index)))
    }

    /// The units `node` holds a filling replica of: it copies them from a serving replica
    /// (while taking their writes), then reports each with `ReplicaReady`.
    pub fn filling_on(&self, node: NodeId) -> Vec<Unit> {
        self.units().filter(|&u| self.is_filling_on(u, node)).collect()
    }

    /// Whether `node` holds a filling replica of `unit` (see [`filling_on`](Self::filling_on)).
    pub fn is_filling_on(&self, unit: Unit, node: NodeId) -> bool {
        self.replicas_of(unit).1.contains(&node)
    }

    /// Whether `node` holds a replica of `unit` in the map (serving, leaving or filling). A
    /// node drops its copy of a unit once this is false: the map took the replica away.
    pub fn holds(&self, unit: Unit, node: NodeId) -> bool {
        let (nodes, filling) = self.replicas_of(unit);
        nodes.contains(&node) || filling.contains(&node)
    }

    /// The units without a serving replica that is up: reads and writes of them fail until
    /// a replica is back.
    pub fn unavailable_units(&self) -> Vec<Unit> {
        self.units().filter(|&u| self.serving(u).is_empty()).collect()
    }

    /// The partition a document name belongs to: `xxh3_64(name) % partitions`. Names are
    /// hashed as UTF-8 bytes. `None` before there are partitions.
    pub fn partition_of(&self, name: &str) -> Option<u32> {
        let n = self.partitions.len() as u64;
        (n > 0).then(|| (xxhash_rust::xxh3::xxh3_64(name.as_bytes()) % n) as u32)
    }

    /// The tablet of `table` that holds permuted value `permuted`.
    pub fn tablet_for(&self, table: u32, permuted: u64) -> Option<&Tablet> {
        // The last tablet starting at or below (table, permuted): the tablets are ordered.
        let i = self.tablets.partition_point(|t| (t.table, t.start) <= (table, permuted));
        let t = self.tablets.get(i.checked_sub(1)?)?;
        (t.table == table && permuted <= t.end).then_some(t)
    }

    /// The tablet of `table` starting at permuted value `start`.
    pub fn tablet(&self, table: u32, start: u64) -> Option<&Tablet> {
        self.tablet_index(table, start).map(|i| &self.tablets[i])
    }

    fn tablet_index(&self, table: u32, start: u64) -> Option<usize> {
        self.tablets.binary_search_by_key(&(table, start), |t| (t.table, t.start)).ok()
    }

    /// Whether `unit` has no replica filling and none leaving: its replicas are where
    /// placement wants them (what a [`Command::SplitTablet`] needs).
    pub fn is_settled(&self, unit: Unit) -> bool {
        let (nodes, filling) = self.replicas_of(unit);
        filling.is_empty() && !nodes.iter().any(|&n| self.leaving.contains(&(unit, n)))
    }

    /// [`Command::SplitTablet`] without the placement after it.
    fn split_tablet(&mut self, table: u32, start: u64, at: u64) -> Result<(), MapError> {
        let unit = Unit::Tablet { table, start };
        let Some(i) = self.tablet_index(table, start) else {
            return Err(MapError::Invalid(format!("no unit {unit:?} in the map")));
        };
        let Some(bits) = self.min_prefix_bits else {
            return Err(MapError::Refused(
                "the map does not know the design's prefix length (bootstrapped by an older \
                 release), so no tablet splits"
                    .into(),
            ));
        };
        let t = &self.tablets[i];
        let step = 1u64.checked_shl(64 - bits.min(64)).unwrap_or(0);
        if at <= t.start || at > t.end || (step > 1 && !at.is_multiple_of(step)) {
            return Err(MapError::Invalid(format!(
                "{at:#x} is not a prefix boundary ({bits} bits) inside {unit:?}, which ends at \
                 {:#x}",
                t.end
            )));
        }
        if !self.is_settled(unit) {
            return Err(MapError::Refused(format!(
                "{unit:?} has replicas filling or leaving; it splits once they are settled"
            )));
        }
        let mut upper = t.clone();
        upper.start = at;
        self.tablets[i].end = at - 1;
        self.tablets.insert(i + 1, upper);
        Ok(())
    }

    /// The tablet unit of `table` of `design` that holds fingerprint `fp` (the tablet of its
    /// permuted value); `None` when the table or the tablet is not there.
    pub fn tablet_unit(&self, design: &neardup_core::Design, table: u32, fp: u64) -> Option<Unit> {
        let spec = design.tables().get(table as usize)?;
        self.tablet_for(table, spec.perm.apply(fp)).map(|t| Unit::Tablet { table, start: t.start })
    }

    /// A partition by index.
    pub fn partition(&self, index: u32) -> Option<&Partition> {
        self.partitions.get(index as usize).filter(|p| p.index == index)
    }

    /// The replicas of a unit: serving ones and filling ones. Empty for an unknown unit.
    pub(crate) fn replicas_of(&self, unit: Unit) -> (&[NodeId], &[NodeId]) {
        match unit {
            Unit::Tablet { table, start } => {
                self.tablet(table, start).map_or((&[], &[]), |t| (&t.nodes, &t.filling))
            }
            Unit::Partition(p) => self.partition(p).map_or((&[], &[]), |p| (&p.nodes, &p.filling)),
        }
    }

    pub(crate) fn replicas_mut(
        &mut self,
        unit: Unit,
    ) -> Option<(&mut Vec<NodeId>, &mut Vec<NodeId>)> {
        match unit {
            Unit::Tablet { table, start } => {
                let i = self.tablet_index(table, start)?;
                let t = &mut self.tablets[i];
                Some((&mut t.nodes, &mut t.filling))
            }
            Unit::Partition(p) => self
                .partitions
                .get_mut(p as usize)
                .filter(|x| x.index == p)
                .map(|x| (&mut x.nodes, &mut x.filling)),
        }
    }

    /// Whether `id` is a member not marked down.
    pub fn is_up(&self, id: NodeId) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.state != NodeState::Down)
    }

    /// The replicas of `unit` that serve reads: its serving replicas not marked down.
    pub fn serving(&self, unit: Unit) -> Vec<NodeId> {
        self.replicas_of(unit).0.iter().copied().filter(|&n| self.is_up(n)).collect()
    }

    /// The replicas of `unit` a write must reach: serving and filling replicas not marked
    /// down. None while no serving replica is up: a filling replica alone could not keep
    /// what it took, since the serving replica that comes back (and serves at once, being
    /// the last one standing) would lack it.
    pub fn writers(&self, unit: Unit) -> Vec<NodeId> {
        let (nodes, filling) = self.replicas_of(unit);
        if !nodes.iter().any(|&n| self.is_up(n)) {
            return Vec::new();
        }
        nodes.iter().chain(filling).copied().filter(|&n| self.is_up(n)).collect()
    }

    /// The epoch at which the writers of `unit` last changed: a write sent under an older
    /// map may have missed one of them, so a replica refuses it. Every replica computes it
    /// from the same sequence of commands, so every node refuses alike whatever maps it
    /// skipped (0 for an unknown unit, or in a map from before the field existed).
    pub fn writers_since(&self, unit: Unit) -> u64 {
        match unit {
            Unit::Tablet { table, start } => {
                self.tablet(table, start).map_or(0, |t| t.writers_epoch)
            }
            Unit::Partition(p) => self.partition(p).map_or(0, |x| x.writers_epoch),
        }
    }

    /// The voters' ids.
    pub fn voters(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.values().filter(|n| n.role == Role::Voter).map(|n| n.id)
    }

    /// The map as bytes (a snapshot's data).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A map from [`ClusterMap::encode`]'s bytes.
    pub fn decode(bytes: &[u8]) -> Result<ClusterMap, MapError> {
        serde_json::from_slice(bytes).map_err(|e| MapError::Decode(e.to_string()))
    }
}

fn check_layout(layout: &Layout, min_prefix_bits: Option<u32>) -> Result<(), MapError> {
    let Layout { replicas, split_bits, partitions } = *layout;
    if !(1..=MAX_REPLICAS).contains(&replicas) {
        return Err(MapError::Invalid(format!(
            "replicas must be 1 to {MAX_REPLICAS}, not {replicas}"
        )));
    }
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        return Err(MapError::Invalid(format!(
            "partitions must be 1 to {MAX_PARTITIONS}, not {partitions}"
        )));
    }
    let max = min_prefix_bits.map_or(MAX_SPLIT_BITS, |p| p.min(MAX_SPLIT_BITS));
    if split_bits > max {
        return Err(MapError::Invalid(format!(
            "split_bits must be at most {max} (the design's smallest prefix is {}), not \
             {split_bits}",
            min_prefix_bits.map_or("unknown".to_string(), |p| format!("{p} bits"))
        )));
    }
    Ok(())
}

fn check_node(id: NodeId, internal_addr: &str) -> Result<(), MapError> {
    if id == 0 {
        return Err(MapError::Invalid("node id 0 is reserved".into()));
    }
    if internal_addr.is_empty() {
        return Err(MapError::Invalid(format!("node {id} has no internal address")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn design() -> DesignInfo {
        DesignInfo { name: "5c2".into(), tables: 10, max_k: 3 }
    }

    fn boot() -> Command {
        Command::Bootstrap {
            cluster_id: "c1".into(),
            design: design(),
            node: NodeInfo {
                id: 1,
                public_addr: "p1".into(),
                internal_addr: "i1".into(),
                role: Role::Learner,
                state: NodeState::Joining,
                down_epoch: 0,
                lost: false,
            },
            layout: Layout::default(),
            min_prefix_bits: Some(26),
        }
    }

    /// Every replica that is filling reports ready.
    fn all_ready(map: &mut ClusterMap) {
        let pending: Vec<(Unit, NodeId)> = map
            .units()
            .flat_map(|u| map.replicas_of(u).1.iter().map(move |&n| (u, n)).collect::<Vec<_>>())
            .collect();
        for (unit, node) in pending {
            map.apply(&Command::ReplicaReady { unit, node }).unwrap();
        }
    }

    /// A bootstrapped map of three voters, every replica ready.
    fn three_voters() -> ClusterMap {
        let mut map = ClusterMap::default();
        map.apply(&boot()).unwrap();
        for id in [2, 3] {
            map.apply(&add(id)).unwrap();
            map.apply(&Command::Promote { id }).unwrap();
            all_ready(&mut map);
        }
        map
    }

    fn add(id: NodeId) -> Command {
        Command::AddNode { id, public_addr: format!("p{id}"), internal_addr: format!("i{id}") }
    }

    #[test]
    fn a_split_keeps_the_nodes_and_placement_then_spreads_the_tablets() {
        let mut map = three_voters();
        let t = map.tablets[0].clone();
        let unit = t.unit();
        let mid = 1u64 << 61;
        let split = |at| Command::SplitTablet { table: t.table, start: t.start, at };
        // Not at a prefix boundary, outside the tablet, at its start: refused.
        for at in [mid + 1, t.end.wrapping_add(1), t.start] {
            assert!(matches!(map.apply(&split(at)), Err(MapError::Invalid(_))), "{at:#x}");
        }
        assert!(matches!(
            map.apply(&Command::SplitTablet { table: 0, start: 5, at: mid }),
            Err(MapError::Invalid(_))
        ));
        // A map that does not know the prefix length refuses.
        let mut unknown = map.clone();
        unknown.min_prefix_bits = None;
        assert!(matches!(unknown.apply(&split(mid)), Err(MapError::Refused(_))));
        let before = map.clone();
        map.apply(&split(mid)).unwrap();
        assert_eq!(map.tablets.len(), 41);
        let (lower, upper) = (map.tablet(0, t.start).unwrap(), map.tablet(0, mid).unwrap());
        assert_eq!((lower.end, upper.end), (mid - 1, t.end));
        assert_eq!(lower.nodes, t.nodes);
        assert_eq!(map.tablet_for(0, mid - 1).unwrap().start, t.start);
        assert_eq!(map.tablet_for(0, mid).unwrap().start, mid);
        assert_eq!(map.tablet_for(0, t.end).unwrap().start, mid);
        // Placement balanced the 41 tablets (2 replicas on 3 nodes: 27 or 28 each) by moving
        // at most one replica; every other unit stayed where it was.
        let loads: Vec<usize> = [1, 2, 3]
            .iter()
            .map(|n| {
                map.tablets
                    .iter()
                    .filter(|t| placement::targets(&map, t.unit()).contains(n))
                    .count()
            })
            .collect();
        assert!(loads.iter().all(|&l| l == 27 || l == 28), "{loads:?}");
        let moved = target_pairs(&map).difference(&target_pairs(&before)).count();
        assert!(moved <= 3, "{moved} replicas moved");
        // A tablet with a replica filling does not split until it is ready.
        let filling = map.tablets.iter().find(|t| !t.filling.is_empty()).map(|t| t.unit());
        if let Some(Unit::Tablet { table, start }) = filling {
            let end = map.tablet(table, start).unwrap().end;
            let at = start + (((end - start) / 2) & !((1 << 38) - 1));
            let r = map.apply(&Command::SplitTablet { table, start, at });
            assert!(matches!(r, Err(MapError::Refused(_))), "{r:?}");
        }
        all_ready(&mut map);
        assert!(map.holds(unit, t.nodes[0]));
    }

    #[test]
    fn a_rebalance_places_a_manual_override_again() {
        let mut map = three_voters();
        map.apply(&Command::SetTabletNodes { table: 0, nodes: vec![1] }).unwrap();
        let on = |map: &ClusterMap| {
            map.tablets.iter().filter(|t| t.table == 0).map(|t| t.nodes.clone()).collect::<Vec<_>>()
        };
        assert!(on(&map).iter().all(|n| n == &vec![1]));
        map.apply(&Command::Rebalance).unwrap();
        all_ready(&mut map);
        let loads: Vec<usize> = [1, 2, 3]
            .iter()
            .map(|n| map.tablets.iter().filter(|t| t.nodes.contains(n)).count())
            .collect();
        assert!(loads.iter().all(|&l| l == 26 || l == 27), "{loads:?}");
        assert!(on(&map).iter().all(|n| n.len() == 2));
        // Balanced already: nothing changes but the epoch.
        let before = map.clone();
        map.apply(&Command::Rebalance).unwrap();
        assert_eq!(map.tablets, before.tablets);
        assert_eq!(map.epoch, before.epoch + 1);
    }

    #[test]
    fn bootstrap_then_membership() {
        let mut map = ClusterMap::default();
        assert_eq!(map.apply(&add(2)), Err(MapError::NotBootstrapped));
        map.apply(&boot()).unwrap();
        assert_eq!(map.epoch, 1);
        // 10 tables cut in 4 by their top two bits, 16 partitions, all on node 1.
        assert_eq!(map.tablets.len(), 40);
        assert_eq!(map.partitions.len(), 16);
        assert_eq!((map.replicas, map.split_bits, map.next_gid_seq), (2, 2, 1));
        assert!(map.tablets.iter().all(|t| t.nodes == vec![1] && t.filling.is_empty()));
        assert!(map.partitions.iter().all(|p| p.nodes == vec![1]));
        let t1: Vec<(u64, u64)> =
            map.tablets.iter().filter(|t| t.table == 1).map(|t| (t.start, t.end)).collect();
        assert_eq!(
            t1,
            vec![
                (0, (1 << 62) - 1),
                (1 << 62, (2 << 62) - 1),
                (2 << 62, (3 << 62) - 1),
                (3 << 62, u64::MAX)
            ]
        );
        for v in [0, 1 << 62, u64::MAX, 12345 << 40] {
            let t = map.tablet_for(3, v).unwrap();
            assert!(t.start <= v && v <= t.end && t.start >> 62 == v >> 62);
        }
        assert_eq!(map.nodes[&1].role, Role::Voter);
        assert_eq!(map.nodes[&1].state, NodeState::Active);
        assert!(matches!(map.apply(&boot()), Err(MapError::AlreadyBootstrapped(_))));

        map.apply(&add(2)).unwrap();
        assert_eq!(map.nodes[&2].role, Role::Learner);
        assert_eq!(map.nodes[&2].state, NodeState::Joining);
        assert_eq!(
            map.apply(&add(2)),
            Err(MapError::IdInUse { id: 2, existing_addr: "i2".into() })
        );
        // Joining nodes hold nothing; once promoted node 2 fills a second replica of each.
        assert!(map.units().all(|u| map.writers(u) == vec![1]));
        map.apply(&Command::Promote { id: 2 }).unwrap();
        assert_eq!(map.nodes[&2].role, Role::Voter);
        assert_eq!(map.epoch, 3);
        assert!(map.units().all(|u| map.serving(u) == vec![1] && map.writers(u) == vec![1, 2]));
        all_ready(&mut map);
        assert!(map.units().all(|u| map.serving(u) == vec![1, 2]));
        map.apply(&Command::SetState { id: 1, state: NodeState::Draining }).unwrap();
        // Node 1 leaves every unit; node 2 serves each already, so it is dropped at once.
        assert!(map.units().all(|u| map.serving(u) == vec![2]));
        map.apply(&Command::RemoveNode { id: 1 }).unwrap();
        assert!(map.tablets.iter().all(|t| t.nodes == vec![2]));
        assert!(matches!(map.apply(&Command::RemoveNode { id: 2 }), Err(MapError::Refused(_))));
        assert_eq!(map.epoch, 5 + 56);
        // A removed node never comes back under its id.
        assert!(map.is_removed(1) && !map.is_removed(2));
        match map.apply(&add(1)) {
            Err(MapError::Refused(why)) => assert!(why.contains("was removed"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(map.epoch, 5 + 56);
        let bytes = map.encode();
        assert_eq!(ClusterMap::decode(&bytes).unwrap(), map);
        assert!(ClusterMap::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    /// Every command that changes a unit's writers stamps the unit with its epoch; the rest
    /// leave the stamp alone, so a node that skipped maps refuses the same writes.
    #[test]
    fn writer_changes_are_stamped_with_their_epoch() {
        let mut map = three_voters();
        let stamps = |m: &ClusterMap| m.units().map(|u| m.writers_since(u)).collect::<Vec<_>>();
        let before = stamps(&map);
        let held_by_3: Vec<Unit> = map.units().filter(|&u| map.holds(u, 3)).collect();
        assert!(!held_by_3.is_empty() && held_by_3.len() < map.units().count());
        map.apply(&Command::GrantIds { node: 1, count: 10 }).unwrap();
        assert_eq!(stamps(&map), before, "a grant changes no writers");
        map.apply(&Command::NodeDown { id: 3 }).unwrap();
        let down = map.epoch;
        assert_eq!(map.nodes[&3].down_epoch, down, "the node carries when it was marked down");
        for u in map.units() {
            let want = if held_by_3.contains(&u) { down } else { map.writers_since(u) };
            assert_eq!(map.writers_since(u), want, "{u:?}");
        }
        map.apply(&Command::NodeBack { id: 3 }).unwrap();
        let back = map.epoch;
        assert_eq!(map.nodes[&3].down_epoch, down, "and keeps it when back");
        assert!(held_by_3.iter().all(|&u| map.writers_since(u) == back));
        // Filling to serving keeps the writers: the stamp stays.
        all_ready(&mut map);
        assert!(held_by_3.iter().all(|&u| map.writers_since(u) == back));
        assert!(map.units().all(|u| map.writers_since(u) < back || held_by_3.contains(&u)));
        assert_eq!(ClusterMap::decode(&map.encode()).unwrap(), map);
    }

    /// A node down past the rebuild time is marked lost: its units take new replicas on the
    /// other nodes and drop its own once those are ready; back, it is placed like a new node.
    #[test]
    fn a_lost_node_has_its_units_rebuilt_elsewhere() {
        let mut map = three_voters();
        let held: Vec<Unit> = map.units().filter(|&u| map.holds(u, 3)).collect();
        assert!(!held.is_empty());
        let refused = |m: &ClusterMap, id| m.check(&Command::NodeLost { id }).is_err();
        assert!(refused(&map, 3), "only a down node is marked lost");
        map.apply(&Command::NodeDown { id: 3 }).unwrap();
        let before = map.clone();
        map.apply(&Command::NodeLost { id: 3 }).unwrap();
        assert!(map.nodes[&3].lost && refused(&map, 3) && refused(&map, 9));
        assert_eq!(placement::usable(&map), vec![1, 2]);
        for &u in &held {
            // The surviving replica serves and takes writes; the new one fills from it.
            let other: Vec<NodeId> = before.serving(u);
            assert_eq!(map.serving(u), other, "{u:?}");
            assert_eq!(map.replicas_of(u).1.len(), 1, "{u:?}: one new replica");
            assert!(map.leaving.contains(&(u, 3)));
            assert_eq!(map.writers(u).len(), 2);
        }
        all_ready(&mut map);
        assert!(map.units().all(|u| !map.holds(u, 3) && map.serving(u).len() == 2));
        // Back: active, no longer lost, and given its share again (filling).
        map.apply(&Command::NodeBack { id: 3 }).unwrap();
        assert!(!map.nodes[&3].lost && map.is_up(3));
        assert!(!map.filling_on(3).is_empty());
        all_ready(&mut map);
        assert_eq!(placement::usable(&map), vec![1, 2, 3]);
        // Back before the rebuild ends: its leaving replicas are dropped, and it is placed
        // again like any node.
        map.apply(&Command::NodeDown { id: 3 }).unwrap();
        map.apply(&Command::NodeLost { id: 3 }).unwrap();
        map.apply(&Command::NodeBack { id: 3 }).unwrap();
        assert!(map.leaving.is_empty() && !map.filling_on(3).is_empty());
        all_ready(&mut map);
        assert!(map.units().all(|u| map.serving(u).len() == 2));
        assert_eq!(ClusterMap::decode(&map.encode()).unwrap(), map);
    }

    #[test]
    fn bootstrap_layouts_are_checked() {
        let with = |replicas, split_bits, partitions, min_prefix_bits| {
            let Command::Bootstrap { cluster_id, design, node, .. } = boot() else {
                unreachable!()
            };
            let layout = Layout { replicas, split_bits, partitions };
            ClusterMap::default().apply(&Command::Bootstrap {
                cluster_id,
                design,
                node,
                layout,
                min_prefix_bits,
            })
        };
        assert_eq!(with(1, 0, 1, Some(26)), Ok(()));
        assert_eq!(with(MAX_REPLICAS, MAX_SPLIT_BITS, MAX_PARTITIONS, None), Ok(()));
        assert_eq!(with(3, 4, 16, Some(4)), Ok(()));
        for (r, sb, p, min) in [
            (0, 2, 16, Some(26)),
            (MAX_REPLICAS + 1, 2, 16, Some(26)),
            (2, 2, 0, Some(26)),
            (2, 2, MAX_PARTITIONS + 1, Some(26)),
            (2, 5, 16, Some(4)),
            (2, MAX_SPLIT_BITS + 1, 16, None),
        ] {
            assert!(matches!(with(r, sb, p, min), Err(MapError::Invalid(_))), "{r} {sb} {p}");
        }
        // One tablet per table without a split; 256 per table at the most.
        let mut map = ClusterMap::default();
        let Command::Bootstrap { cluster_id, design, node, .. } = boot() else { unreachable!() };
        let layout = Layout { replicas: 1, split_bits: 0, partitions: 1 };
        map.apply(&Command::Bootstrap { cluster_id, design, node, layout, min_prefix_bits: None })
            .unwrap();
        assert!(map.tablets.iter().all(|t| (t.start, t.end) == (0, u64::MAX)));
        // A Bootstrap written without a layout reads with the defaults.
        let mut v: serde_json::Value = serde_json::from_slice(&boot().encode()).unwrap();
        let fields = v["Bootstrap"].as_object_mut().unwrap();
        fields.remove("layout");
        fields.remove("min_prefix_bits");
        match Command::decode(v.to_string().as_bytes()).unwrap() {
            Command::Bootstrap { layout, min_prefix_bits: None, .. } => {
                assert_eq!(layout, Layout::default())
            }
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn grants_down_and_back() {
        let mut map = ClusterMap::default();
        map.apply(&boot()).unwrap();
        map.apply(&add(2)).unwrap();
        map.apply(&Command::Promote { id: 2 }).unwrap();
        all_ready(&mut map);
        assert_eq!(map.next_grant(10), 1..11);
        map.apply(&Command::GrantIds { node: 2, count: 10 }).unwrap();
        assert_eq!(map.next_grant(5), 11..16);
        for bad in [0, MAX_GRANT + 1] {
            let r = map.apply(&Command::GrantIds { node: 2, count: bad });
            assert!(matches!(r, Err(MapError::Invalid(_))));
        }
        assert_eq!(
            map.apply(&Command::GrantIds { node: 9, count: 1 }),
            Err(MapError::NoSuchNode(9))
        );
        map.next_gid_seq = GID_SEQ_LIMIT - 1;
        assert!(matches!(
            map.apply(&Command::GrantIds { node: 2, count: 2 }),
            Err(MapError::Refused(_))
        ));
        map.next_gid_seq = 11;
        // Node 2 down: it stays listed, nothing serves from it, nothing is unavailable.
        assert!(matches!(map.apply(&Command::NodeBack { id: 2 }), Err(MapError::Refused(_))));
        map.apply(&Command::NodeDown { id: 2 }).unwrap();
        assert!(matches!(map.apply(&Command::NodeDown { id: 2 }), Err(MapError::Refused(_))));
        assert!(map.units().all(|u| map.serving(u) == vec![1] && map.writers(u) == vec![1]));
        assert!(map.unavailable_units().is_empty());
        let unit = map.units().next().unwrap();
        // A down node is not the last serving replica up: node 1 is, and cannot leave.
        map.apply(&Command::SetState { id: 1, state: NodeState::Draining }).unwrap();
        assert!(matches!(map.apply(&Command::RemoveNode { id: 1 }), Err(MapError::Refused(_))));
        // Node 1 down as well: every unit is unavailable (applied, reported).
        map.apply(&Command::SetState { id: 1, state: NodeState::Active }).unwrap();
        map.apply(&Command::NodeDown { id: 1 }).unwrap();
        assert_eq!(map.unavailable_units().len(), 56);
        assert!(map.units().all(|u| map.writers(u).is_empty()));
        // Node 2 back first: it missed what node 1 took after node 2 went down, so it
        // fills, and nothing serves or takes writes until node 1 is back.
        map.apply(&Command::NodeBack { id: 2 }).unwrap();
        assert_eq!(map.unavailable_units().len(), 56);
        assert!(map.units().all(|u| map.writers(u).is_empty()));
        assert_eq!(map.filling_on(2).len(), 56);
        // Node 1 back: the last serving replica standing, it serves at once; node 2 fills
        // from it.
        map.apply(&Command::NodeBack { id: 1 }).unwrap();
        assert_eq!((map.serving(unit), map.writers(unit)), (vec![1], vec![1, 2]));
        assert!(matches!(
            map.apply(&Command::ReplicaReady { unit, node: 1 }),
            Err(MapError::Refused(_))
        ));
        assert!(map.filling_on(1).is_empty() && map.holds(unit, 2) && !map.holds(unit, 3));
        map.apply(&Command::ReplicaReady { unit, node: 2 }).unwrap();
        assert_eq!(map.serving(unit), vec![1, 2]);
        assert_eq!(map.filling_on(2).len(), 55);
        all_ready(&mut map);
        // A filling replica whose only serving replica goes down takes no writes either,
        // and the serving one back serves at once: it went down last.
        map.apply(&Command::NodeDown { id: 2 }).unwrap();
        map.apply(&Command::NodeBack { id: 2 }).unwrap();
        assert_eq!((map.serving(unit), map.writers(unit)), (vec![1], vec![1, 2]));
        map.apply(&Command::SetState { id: 1, state: NodeState::Down }).unwrap();
        assert_eq!(map.nodes[&1].down_epoch, map.epoch, "marked down by SetState too");
        assert!(map.writers(unit).is_empty() && map.serving(unit).is_empty());
        map.apply(&Command::SetState { id: 1, state: NodeState::Active }).unwrap();
        assert_eq!((map.serving(unit), map.writers(unit)), (vec![1], vec![1, 2]));
    }

    #[test]
    fn units_and_their_replicas() {
        let mut map = ClusterMap::default();
        map.apply(&boot()).unwrap();
        map.apply(&add(2)).unwrap();
        map.tablets = vec![
            Tablet {
                table: 0,
                start: 0,
                end: u64::MAX >> 1,
                nodes: vec![1],
                state: TabletState::Active,
                filling: vec![2],
                writers_epoch: 0,
            },
            Tablet {
                table: 0,
                start: 1 << 63,
                end: u64::MAX,
                nodes: vec![2, 1],
                state: TabletState::Active,
                filling: vec![],
                writers_epoch: 0,
            },
        ];
        map.partitions = vec![
            Partition { index: 0, nodes: vec![1, 2], filling: vec![], writers_epoch: 0 },
            Partition { index: 1, nodes: vec![2], filling: vec![1], writers_epoch: 0 },
        ];
        assert_eq!(map.tablet_for(0, 5).unwrap().start, 0);
        assert_eq!(map.tablet_for(0, u64::MAX).unwrap().start, 1 << 63);
        assert!(map.tablet_for(1, 5).is_none());
        let low = Unit::Tablet { table: 0, start: 0 };
        assert_eq!(map.serving(low), vec![1]);
        assert_eq!(map.writers(low), vec![1, 2]);
        map.nodes.get_mut(&2).unwrap().state = NodeState::Down;
        assert_eq!(map.writers(low), vec![1]);
        assert_eq!(map.serving(Unit::Tablet { table: 0, start: 1 << 63 }), vec![1]);
        assert_eq!(map.serving(Unit::Partition(1)), Vec::<NodeId>::new());
        // Its filling replica alone takes no writes: node 2, back, would lack them.
        assert_eq!(map.writers(Unit::Partition(1)), Vec::<NodeId>::new());
        assert!(map.serving(Unit::Partition(7)).is_empty());
        // The partition of a name is fixed by its hash, and covers every partition.
        let mut seen = [false; 2];
        for i in 0..64 {
            let name = format!("https://example.com/{i}");
            let p = map.partition_of(&name).unwrap();
            assert_eq!(p as u64, xxhash_rust::xxh3::xxh3_64(name.as_bytes()) % 2);
            seen[p as usize] = true;
        }
        assert_eq!(seen, [true, true]);
        assert_eq!(ClusterMap::default().partition_of("x"), None);
        // Maps written before these fields existed still decode.
        let old = r#"{"cluster_id":"c","epoch":1,"design":null,"nodes":{},"tablets":[{"table":0,"start":0,"end":1,"nodes":[1],"state":"Active"}]}"#;
        let m = ClusterMap::decode(old.as_bytes()).unwrap();
        assert!(m.tablets[0].filling.is_empty() && m.partitions.is_empty());
    }

    fn command() -> impl Strategy<Value = Command> {
        let id = 0u64..6;
        prop_oneof![
            Just(boot()),
            id.clone().prop_map(add),
            (id.clone(), 0u8..2).prop_map(|(id, a)| Command::AddNode {
                id,
                public_addr: String::new(),
                internal_addr: if a == 0 { String::new() } else { "x".into() },
            }),
            id.clone().prop_map(|id| Command::Promote { id }),
            (id.clone(), any::<bool>()).prop_map(|(id, v)| Command::SetRole {
                id,
                role: if v { Role::Voter } else { Role::Learner }
            }),
            (id.clone(), 0u8..4).prop_map(|(id, s)| Command::SetState {
                id,
                state: [
                    NodeState::Joining,
                    NodeState::Active,
                    NodeState::Draining,
                    NodeState::Down
                ][s as usize]
            }),
            id.clone().prop_map(|id| Command::RemoveNode { id }),
            (0u32..12, proptest::collection::vec(id.clone(), 0..3))
                .prop_map(|(table, nodes)| Command::SetTabletNodes { table, nodes }),
            (id.clone(), 0u64..3).prop_map(|(node, count)| Command::GrantIds { node, count }),
            id.clone().prop_map(|id| Command::NodeDown { id }),
            id.clone().prop_map(|id| Command::NodeBack { id }),
            id.clone().prop_map(|id| Command::NodeLost { id }),
            id.clone().prop_map(|id| Command::Evict { id }),
            (0u32..12, 0u64..4, 0u64..9).prop_map(|(table, q, f)| Command::SplitTablet {
                table,
                start: q << 62,
                at: (q << 62).wrapping_add(f << 59),
            }),
            Just(Command::Rebalance),
            (id, 0u32..12, 0u64..4, any::<bool>()).prop_map(|(node, i, q, tablet)| {
                let unit = if tablet {
                    Unit::Tablet { table: i, start: q << 62 }
                } else {
                    Unit::Partition(i)
                };
                Command::ReplicaReady { unit, node }
            }),
        ]
    }

    proptest! {
        #[test]
        fn replay_is_deterministic(cmds in proptest::collection::vec(command(), 0..60)) {
            let mut a = ClusterMap::default();
            let mut b = ClusterMap::default();
            let mut applied = 0;
            for cmd in &cmds {
                // Entries travel encoded: replay the decoded form on the second map.
                let decoded = Command::decode(&cmd.encode()).unwrap();
                let before = a.clone();
                let ra = a.apply(cmd);
                let rb = b.apply(&decoded);
                prop_assert_eq!(&ra, &rb);
                match ra {
                    Ok(()) => {
                        applied += 1;
                        prop_assert_eq!(a.epoch, before.epoch + 1);
                    }
                    Err(_) => prop_assert_eq!(&a, &before),
                }
                prop_assert_eq!(&a, &b);
                // Invariants: tablets only name members; a bootstrapped map keeps a voter.
                for t in &a.tablets {
                    for n in &t.nodes {
                        prop_assert!(a.nodes.contains_key(n));
                    }
                }
                if !a.cluster_id.is_empty() {
                    prop_assert!(a.voters().count() >= 1);
                }
            }
            prop_assert_eq!(a.epoch, applied);
            prop_assert_eq!(ClusterMap::decode(&a.encode()).unwrap(), a);
        }
    }

    /// A membership step; `ReplicaReady` names a unit and node by position in the map.
    #[derive(Clone, Debug)]
    enum Op {
        Cmd(Command),
        Ready(usize, usize),
        /// Splits the tablet at this position, this far (of 256) into its range.
        Split(usize, u8),
    }

    fn membership_op() -> impl Strategy<Value = Op> {
        let id = 1u64..7;
        prop_oneof![
            2 => id.clone().prop_map(|id| Op::Cmd(add(id))),
            3 => id.clone().prop_map(|id| Op::Cmd(Command::Promote { id })),
            2 => (id.clone(), 0u8..4).prop_map(|(id, s)| Op::Cmd(Command::SetState {
                id,
                state: [
                    NodeState::Joining,
                    NodeState::Active,
                    NodeState::Draining,
                    NodeState::Down
                ][s as usize]
            })),
            2 => id.clone().prop_map(|id| Op::Cmd(Command::NodeDown { id })),
            2 => id.clone().prop_map(|id| Op::Cmd(Command::NodeBack { id })),
            1 => id.clone().prop_map(|id| Op::Cmd(Command::NodeLost { id })),
            2 => id.clone().prop_map(|id| Op::Cmd(Command::RemoveNode { id })),
            1 => (id, 1u64..1000).prop_map(|(node, count)| Op::Cmd(Command::GrantIds { node, count })),
            8 => (any::<usize>(), any::<usize>()).prop_map(|(u, n)| Op::Ready(u, n)),
            2 => (any::<usize>(), any::<u8>()).prop_map(|(t, f)| Op::Split(t, f)),
            1 => Just(Op::Cmd(Command::Rebalance)),
        ]
    }

    fn to_command(map: &ClusterMap, op: &Op) -> Option<Command> {
        match op {
            Op::Cmd(c) => Some(c.clone()),
            Op::Ready(u, n) => {
                let units: Vec<Unit> =
                    map.units().filter(|&x| !map.replicas_of(x).1.is_empty()).collect();
                let unit = *units.get(u % units.len().max(1))?;
                let filling = map.replicas_of(unit).1;
                Some(Command::ReplicaReady { unit, node: filling[n % filling.len()] })
            }
            Op::Split(t, f) => {
                let t = map.tablets.get(t % map.tablets.len().max(1))?;
                // At a 26-bit prefix boundary, or at the start (refused).
                let at = t.start + ((t.end - t.start) >> 8) * u64::from(*f);
                Some(Command::SplitTablet {
                    table: t.table,
                    start: t.start,
                    at: at & !((1 << 38) - 1),
                })
            }
        }
    }

    /// Each table's tablets, in order, cover every permuted value once.
    fn check_tiling(map: &ClusterMap) -> Result<(), TestCaseError> {
        for table in 0..map.design.as_ref().map_or(0, |d| d.tables) {
            let ranges: Vec<(u64, u64)> =
                map.tablets.iter().filter(|t| t.table == table).map(|t| (t.start, t.end)).collect();
            prop_assert_eq!(ranges.first().map(|r| r.0), Some(0));
            prop_assert_eq!(ranges.last().map(|r| r.1), Some(u64::MAX));
            for w in ranges.windows(2) {
                prop_assert!(w[0].0 <= w[0].1 && w[0].1.checked_add(1) == Some(w[1].0), "{:?}", w);
            }
        }
        prop_assert!(map.tablets.is_sorted_by_key(|t| (t.table, t.start)));
        Ok(())
    }

    /// The placement invariants of a bootstrapped map.
    fn check_placement(map: &ClusterMap) -> Result<(), TestCaseError> {
        let usable = placement::usable(map);
        let r = placement::replica_target(map, usable.len());
        let mut per_kind: [BTreeMap<NodeId, usize>; 2] = Default::default();
        for n in &usable {
            per_kind[0].insert(*n, 0);
            per_kind[1].insert(*n, 0);
        }
        for unit in map.units() {
            let (nodes, filling) = map.replicas_of(unit);
            let targets = placement::targets(map, unit);
            let mut distinct = targets.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), targets.len(), "{:?}: {:?}", unit, targets);
            prop_assert_eq!(targets.len(), r, "{:?}: {:?} on {:?}", unit, targets, usable);
            for n in nodes.iter().chain(filling) {
                prop_assert!(map.nodes.contains_key(n));
            }
            prop_assert!(filling.iter().all(|n| !nodes.contains(n)));
            let kind = usize::from(matches!(unit, Unit::Partition(_)));
            for n in &targets {
                prop_assert!(usable.contains(n));
                *per_kind[kind].entry(*n).or_default() += 1;
            }
        }
        for (u, n) in &map.leaving {
            prop_assert!(map.replicas_of(*u).0.contains(n));
        }
        for loads in &per_kind {
            let (lo, hi) = (loads.values().min(), loads.values().max());
            if let (Some(lo), Some(hi)) = (lo, hi) {
                prop_assert!(hi - lo <= 1, "unbalanced: {:?}", loads);
            }
        }
        Ok(())
    }

    fn target_pairs(map: &ClusterMap) -> BTreeSet<(Unit, NodeId)> {
        map.units()
            .flat_map(|u| placement::targets(map, u).into_iter().map(move |n| (u, n)))
            .collect()
    }

    proptest! {
        #[test]
        fn placement_after_membership_changes(
            replicas in 1u32..4,
            split_bits in 0u32..3,
            partitions in 1u32..9,
            ops in proptest::collection::vec(membership_op(), 0..80),
        ) {
            let Command::Bootstrap { cluster_id, design, node, .. } = boot() else { unreachable!() };
            let layout = Layout { replicas, split_bits, partitions };
            let bootstrap = Command::Bootstrap {
                cluster_id, design, node, layout, min_prefix_bits: Some(26),
            };
            let mut map = ClusterMap::default();
            map.apply(&bootstrap).unwrap();
            let mut replay = map.clone();
            check_placement(&map)?;
            let mut grants: Vec<Range<u64>> = Vec::new();
            for op in &ops {
                let Some(cmd) = to_command(&map, op) else { continue };
                let before = map.clone();
                let grant = map.next_grant(match cmd { Command::GrantIds { count, .. } => count, _ => 0 });
                let r = map.apply(&cmd);
                prop_assert_eq!(&replay.apply(&Command::decode(&cmd.encode()).unwrap()), &r);
                prop_assert_eq!(&replay, &map);
                if r.is_err() {
                    prop_assert_eq!(&map, &before);
                    continue;
                }
                check_placement(&map)?;
                check_tiling(&map)?;
                if let Command::SplitTablet { table, start, at } = cmd {
                    // Both halves where the tablet was.
                    let was = before.tablet(table, start).unwrap();
                    prop_assert!(at > was.start && at <= was.end && at.is_multiple_of(1 << 38));
                    prop_assert!(was.filling.is_empty());
                    for p in [start, at] {
                        let t = map.tablet(table, p).unwrap();
                        // Served only where the whole was: a new replica fills first.
                        let ok = t.nodes.iter().all(|n| was.nodes.contains(n));
                        prop_assert!(ok, "{:?} served by {:?}, was {:?}", p, t.nodes, was.nodes);
                    }
                    prop_assert_eq!(map.tablet(table, start).unwrap().end, at - 1);
                    prop_assert_eq!(map.tablet(table, at).unwrap().end, was.end);
                }
                let marks_down = matches!(
                    cmd,
                    Command::NodeDown { .. } | Command::SetState { state: NodeState::Down, .. }
                );
                if !marks_down {
                    // No unit loses its last serving replica that is up.
                    for u in before.units() {
                        if !before.serving(u).is_empty() {
                            prop_assert!(!map.serving(u).is_empty(), "{:?} after {:?}", u, cmd);
                        }
                    }
                }
                if let Command::GrantIds { .. } = cmd {
                    prop_assert!(grant.start >= 1 && grant.end == map.next_gid_seq);
                    prop_assert!(grants.iter().all(|g| g.end <= grant.start));
                    grants.push(grant);
                }
                // A node becoming usable in a balanced map receives; nobody else does.
                let was = placement::usable(&before);
                let now = placement::usable(&map);
                if now.len() == was.len() + 1 && was.iter().all(|n| now.contains(n)) {
                    let new = now.iter().find(|n| !was.contains(n)).copied();
                    let old = target_pairs(&before);
                    for (u, n) in target_pairs(&map) {
                        prop_assert!(old.contains(&(u, n)) || Some(n) == new, "{:?} moved to {}", u, n);
                    }
                }
            }
            // Every node back and every replica ready: the units hold exactly their targets.
            let down: Vec<NodeId> =
                map.nodes.values().filter(|n| n.state == NodeState::Down).map(|n| n.id).collect();
            for id in down {
                map.apply(&Command::NodeBack { id }).unwrap();
            }
            all_ready(&mut map);
            check_placement(&map)?;
            for u in map.units() {
                let (nodes, filling) = map.replicas_of(u);
                prop_assert!(filling.is_empty());
                if nodes.iter().any(|&n| map.is_up(n) && !map.leaving.contains(&(u, n))) {
                    let mut t = placement::targets(&map, u);
                    let mut n = nodes.to_vec();
                    t.sort();
                    n.sort();
                    prop_assert_eq!(t, n);
                }
            }
            prop_assert_eq!(ClusterMap::decode(&map.encode()).unwrap(), map);
        }
    }
}
