//! The cluster map: the state machine Raft replicates.
//!
//! Pure: no I/O, no clocks, no randomness. Every replica applies the same [`Command`]s in the
//! same order and so holds the same [`ClusterMap`]. A command either applies whole, bumping the
//! epoch by exactly one, or is refused with a [`MapError`] and changes nothing. Commands and
//! maps travel as JSON (the Raft entries' data and the snapshots' data).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::NodeId;

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
    /// The next document sequence number to grant (see `Command::GrantIds`).
    #[serde(default)]
    pub next_gid_seq: u64,
}

/// A change of the map, carried as the data of one Raft entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Starts a cluster: sets its id and design, with `node` its only (voting) member holding
    /// one tablet per table. Only on an empty map.
    Bootstrap {
        /// The new cluster's id (not empty).
        cluster_id: String,
        /// Its table design.
        design: DesignInfo,
        /// The first node.
        node: NodeInfo,
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
    /// Sets the nodes holding a table's tablets.
    SetTabletNodes {
        /// The table.
        table: u32,
        /// The nodes, every one a member.
        nodes: Vec<NodeId>,
    },
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

impl ClusterMap {
    /// Applies a command: on success the epoch grows by one; on refusal nothing changes.
    pub fn apply(&mut self, cmd: &Command) -> Result<(), MapError> {
        let mut next = self.clone();
        next.apply_inner(cmd)?;
        next.epoch = self.epoch + 1;
        *self = next;
        Ok(())
    }

    fn bootstrapped(&self) -> Result<(), MapError> {
        if self.cluster_id.is_empty() { Err(MapError::NotBootstrapped) } else { Ok(()) }
    }

    fn node_mut(&mut self, id: NodeId) -> Result<&mut NodeInfo, MapError> {
        self.nodes.get_mut(&id).ok_or(MapError::NoSuchNode(id))
    }

    fn apply_inner(&mut self, cmd: &Command) -> Result<(), MapError> {
        match cmd {
            Command::Bootstrap { cluster_id, design, node } => {
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
                self.cluster_id = cluster_id.clone();
                self.design = Some(design.clone());
                let mut first = node.clone();
                first.role = Role::Voter;
                first.state = NodeState::Active;
                self.nodes.insert(first.id, first);
                self.tablets = (0..design.tables)
                    .map(|table| Tablet {
                        table,
                        start: 0,
                        end: u64::MAX,
                        nodes: vec![node.id],
                        state: TabletState::Active,
                        filling: Vec::new(),
                    })
                    .collect();
            }
            Command::AddNode { id, public_addr, internal_addr } => {
                self.bootstrapped()?;
                check_node(*id, internal_addr)?;
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
                node.role = Role::Voter;
                node.state = NodeState::Active;
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
                let node = self.node_mut(*id)?;
                if node.state == *state {
                    return Err(MapError::Refused(format!("node {id} is already {state:?}")));
                }
                node.state = *state;
            }
            Command::RemoveNode { id } => {
                self.bootstrapped()?;
                let node = self.nodes.get(id).ok_or(MapError::NoSuchNode(*id))?;
                if node.role == Role::Voter
                    && self.nodes.values().filter(|n| n.role == Role::Voter).count() == 1
                {
                    return Err(MapError::Refused(format!("node {id} is the last voter")));
                }
                self.nodes.remove(id);
                for tablet in &mut self.tablets {
                    tablet.nodes.retain(|n| n != id);
                }
            }
            Command::SetTabletNodes { table, nodes } => {
                self.bootstrapped()?;
                if let Some(missing) = nodes.iter().find(|n| !self.nodes.contains_key(n)) {
                    return Err(MapError::NoSuchNode(*missing));
                }
                let mut found = false;
                for tablet in self.tablets.iter_mut().filter(|t| t.table == *table) {
                    tablet.nodes = nodes.clone();
                    found = true;
                }
                if !found {
                    return Err(MapError::Invalid(format!("no table {table} in the design")));
                }
            }
        }
        Ok(())
    }

    /// The partition a document name belongs to: `xxh3_64(name) % partitions`. Names are
    /// hashed as UTF-8 bytes. `None` before there are partitions.
    pub fn partition_of(&self, name: &str) -> Option<u32> {
        let n = self.partitions.len() as u64;
        (n > 0).then(|| (xxhash_rust::xxh3::xxh3_64(name.as_bytes()) % n) as u32)
    }

    /// The tablet of `table` that holds permuted value `permuted`.
    pub fn tablet_for(&self, table: u32, permuted: u64) -> Option<&Tablet> {
        self.tablets.iter().find(|t| t.table == table && t.start <= permuted && permuted <= t.end)
    }

    /// A partition by index.
    pub fn partition(&self, index: u32) -> Option<&Partition> {
        self.partitions.get(index as usize).filter(|p| p.index == index)
    }

    /// The replicas of a unit: serving ones and filling ones. Empty for an unknown unit.
    fn replicas_of(&self, unit: Unit) -> (&[NodeId], &[NodeId]) {
        match unit {
            Unit::Tablet { table, start } => self
                .tablets
                .iter()
                .find(|t| t.table == table && t.start == start)
                .map_or((&[], &[]), |t| (&t.nodes, &t.filling)),
            Unit::Partition(p) => self.partition(p).map_or((&[], &[]), |p| (&p.nodes, &p.filling)),
        }
    }

    fn up(&self, id: NodeId) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.state != NodeState::Down)
    }

    /// The replicas of `unit` that serve reads: its serving replicas not marked down.
    pub fn serving(&self, unit: Unit) -> Vec<NodeId> {
        self.replicas_of(unit).0.iter().copied().filter(|&n| self.up(n)).collect()
    }

    /// The replicas of `unit` a write must reach: serving and filling replicas not marked
    /// down.
    pub fn writers(&self, unit: Unit) -> Vec<NodeId> {
        let (nodes, filling) = self.replicas_of(unit);
        nodes.iter().chain(filling).copied().filter(|&n| self.up(n)).collect()
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
            },
        }
    }

    fn add(id: NodeId) -> Command {
        Command::AddNode { id, public_addr: format!("p{id}"), internal_addr: format!("i{id}") }
    }

    #[test]
    fn bootstrap_then_membership() {
        let mut map = ClusterMap::default();
        assert_eq!(map.apply(&add(2)), Err(MapError::NotBootstrapped));
        map.apply(&boot()).unwrap();
        assert_eq!(map.epoch, 1);
        assert_eq!(map.tablets.len(), 10);
        assert!(map.tablets.iter().all(|t| t.nodes == vec![1]));
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
        map.apply(&Command::Promote { id: 2 }).unwrap();
        assert_eq!(map.nodes[&2].role, Role::Voter);
        assert_eq!(map.epoch, 3);
        map.apply(&Command::SetState { id: 1, state: NodeState::Draining }).unwrap();
        map.apply(&Command::RemoveNode { id: 1 }).unwrap();
        assert!(map.tablets.iter().all(|t| t.nodes.is_empty()));
        assert!(matches!(map.apply(&Command::RemoveNode { id: 2 }), Err(MapError::Refused(_))));
        assert_eq!(map.epoch, 5);
        let bytes = map.encode();
        assert_eq!(ClusterMap::decode(&bytes).unwrap(), map);
        assert!(ClusterMap::decode(&bytes[..bytes.len() - 1]).is_err());
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
            },
            Tablet {
                table: 0,
                start: 1 << 63,
                end: u64::MAX,
                nodes: vec![2, 1],
                state: TabletState::Active,
                filling: vec![],
            },
        ];
        map.partitions = vec![
            Partition { index: 0, nodes: vec![1, 2], filling: vec![] },
            Partition { index: 1, nodes: vec![2], filling: vec![1] },
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
        assert_eq!(map.writers(Unit::Partition(1)), vec![1]);
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
            (0u32..12, proptest::collection::vec(id, 0..3))
                .prop_map(|(table, nodes)| Command::SetTabletNodes { table, nodes }),
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
}
