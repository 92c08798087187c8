//! A synchronous driver around `raft::RawNode`: one replica of the cluster map.
//!
//! No threads, clocks or sockets here: the caller ticks it, feeds it messages and proposals,
//! and calls [`Replica::handle_ready`], which returns the messages to send and the entries
//! applied. The threaded [`crate::ClusterNode`] and the deterministic simulation drive the
//! same code.
//!
//! # The ready loop
//!
//! [`Replica::handle_ready`] follows the order raft-rs documents for `RawNode::ready`:
//!
//! 1. **Leader messages** (`Ready::take_messages`) go out first: a leader may send its appends
//!    before persisting them (its own vote counts only once they are persisted, step 3).
//! 2. **Snapshot**: a snapshot from the leader is stored (it replaces the log) and the map is
//!    replaced by the snapshot's map, before any entry after it is appended.
//! 3. **Entries** are appended to the log and flushed.
//! 4. **Hard state** (term, vote, commit) is persisted: the vote before any message that
//!    carries it, and the commit index before (with) applying what it commits.
//! 5. **Persisted messages** (`take_persisted_messages`: votes, append responses) go out only
//!    now, because each promises something steps 2 to 4 made durable.
//! 6. **Committed entries** are applied to the map (conf changes to Raft's configuration too).
//! 7. **`advance`**, then the light ready: its commit index is persisted first, then its
//!    messages sent, then its committed entries applied; finally `advance_apply`.
//!
//! After applying, when `snapshot_every` entries have been applied since the last snapshot,
//! the map is written as the new snapshot and the log before it dropped.
//!
//! # Membership
//!
//! A conf change entry (`ConfChangeV2`) carries in its context the map [`Command`] that goes
//! with it (`AddNode` with the addresses for a new learner, `Promote` for a learner made voter,
//! `RemoveNode` for a removal), so Raft's configuration and the map change in the same entry
//! on every replica. The leader's [`Replica::tick`] does the duties: promote caught-up learners
//! while voters are fewer than `max_voters` (else mark them active), remove draining nodes when
//! that keeps a quorum and the map allows it (no unit loses its last serving replica up;
//! handing leadership away first when the draining node is itself), then liveness: an active
//! node not heard from for `failure_ticks` (counted from when this replica became leader at
//! the earliest) is proposed `NodeDown`, a down node heard within an election timeout
//! `NodeBack`, and a down node not heard from for `rebuild_ticks` `NodeLost` (its units are
//! rebuilt elsewhere). One change at a time.
//!
//! Should Raft's configuration drop a node whose `RemoveNode` the map refuses at commit (the
//! units changed since the proposal), the replicas apply `Command::Evict` instead: the map's
//! members always follow Raft's.
//!
//! Any replica may propose a command with [`Replica::propose_forwarded`] (a follower forwards
//! it to the leader); its outcome is the applied entry carrying the proposer's tag, and for a
//! `GrantIds` the range granted ([`AppliedEntry::granted`]).

use std::collections::BTreeMap;

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType,
    Message, MessageType, Snapshot,
};
use raft::{Config, RawNode, StateRole};

use crate::NodeId;
use crate::error::ClusterError;
use crate::map::{ClusterMap, Command, MapError, NodeState, Role};
use crate::storage::RaftStore;

/// How a replica is configured.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This replica's id.
    pub id: NodeId,
    /// Ticks without a leader before an election.
    pub election_ticks: usize,
    /// Ticks between the leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// The largest number of voters; further nodes stay learners.
    pub max_voters: usize,
    /// Compact the log after this many applied entries.
    pub snapshot_every: u64,
    /// A follower is caught up when its match index is at least the leader's last index minus
    /// this.
    pub catch_up_slack: u64,
    /// The leader proposes `NodeDown` for an active node it has not heard from for this many
    /// ticks (counted from when it became leader at the earliest), `NodeBack` for a down node
    /// it heard from within an election timeout.
    pub failure_ticks: u64,
    /// The leader proposes `NodeLost` for a down node it has not heard from for this many
    /// ticks (counted as `failure_ticks`), so its units are rebuilt on other nodes; 0: never.
    pub rebuild_ticks: u64,
    /// When true, the election timeout is exactly `election_ticks` instead of Raft's random
    /// pick in `[election_ticks, 2 * election_ticks)` (raft-rs draws it from the thread's
    /// RNG): deterministic simulations vary the ticks themselves.
    pub fixed_election_timeout: bool,
}

/// One entry applied to the map.
#[derive(Clone, Debug)]
pub struct AppliedEntry {
    /// Its index.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// The proposer's tag (entry context), empty for entries without one.
    pub tag: Vec<u8>,
    /// The command, if the entry carried one.
    pub command: Option<Command>,
    /// The map's epoch after it, or why the map refused it.
    pub result: Result<u64, MapError>,
    /// The map's epoch after it (also when refused).
    pub epoch: u64,
    /// The sequence numbers an applied `GrantIds` granted.
    pub granted: Option<std::ops::Range<u64>>,
}

/// What one [`Replica::handle_ready`] produced.
#[derive(Default, Debug)]
pub struct Outbox {
    /// Messages to send, in order.
    pub messages: Vec<Message>,
    /// Entries applied, in order.
    pub applied: Vec<AppliedEntry>,
    /// A snapshot installed from the leader, if one was: its index and map.
    pub installed_snapshot: Option<(u64, ClusterMap)>,
    /// Snapshots sent.
    pub snapshot_sends: u64,
    /// Elections this replica started.
    pub elections: u64,
}

/// One Raft replica of the cluster map.
pub struct Replica {
    raw: RawNode<RaftStore>,
    store: RaftStore,
    cfg: ReplicaConfig,
    map: ClusterMap,
    conf: ConfState,
    applied: u64,
    ticks: u64,
    last_heard: BTreeMap<NodeId, u64>,
    /// A duty proposal's index: no further duty until it is applied.
    duty_wait: u64,
    last_term: u64,
    /// Whether this replica led at the last duty round, and since which tick.
    leading: bool,
    leader_since: u64,
    /// The tick of the last message from the leader of the current term.
    leader_contact: Option<u64>,
    /// Contact with the cluster, confirmed: see [`Replica::in_contact`].
    sync: ContactSync,
}

/// How a replica that has (re)gained contact learns that it has caught up: a follower asks
/// the leader for its commit index (a Raft read index) and is in contact once it has applied
/// that far; a leader once it has committed an entry of its term and applied everything
/// committed. Losing contact, or a new term or role, starts over under a new generation, so
/// an answer to an earlier ask counts for nothing.
#[derive(Debug, Default)]
struct ContactSync {
    generation: u64,
    term: u64,
    leading: bool,
    /// The tick of the last ask under this generation.
    asked: Option<u64>,
    asks: u64,
    /// The index to have applied, once known.
    index: Option<u64>,
}

impl ContactSync {
    /// Whether this generation was started under `term` and role: a change is only noticed
    /// at the next tick, and counts as lost contact until then.
    fn generation_matches(&self, term: u64, leading: bool) -> bool {
        self.term == term && self.leading == leading
    }
}

fn leader_role(raw: &RawNode<RaftStore>) -> bool {
    raw.raft.state == StateRole::Leader
}

impl Replica {
    /// Opens a replica on its store: the map from the store's snapshot (empty for a node that
    /// has not joined yet), the committed entries after it replayed by the first readies.
    pub fn open(
        cfg: ReplicaConfig,
        store: RaftStore,
        logger: &slog::Logger,
    ) -> Result<Replica, ClusterError> {
        let snap = store.snapshot_now();
        let map = if snap.data.is_empty() {
            ClusterMap::default()
        } else {
            ClusterMap::decode(&snap.data)
                .map_err(|e| ClusterError::Corrupt(format!("the snapshot's map: {e}")))?
        };
        let applied = snap.get_metadata().index;
        let conf = snap.get_metadata().get_conf_state().clone();
        let raft_cfg = Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            applied,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        let raft_cfg = if cfg.fixed_election_timeout {
            Config {
                min_election_tick: cfg.election_ticks,
                max_election_tick: cfg.election_ticks + 1,
                ..raft_cfg
            }
        } else {
            raft_cfg
        };
        raft_cfg
            .validate()
            .map_err(|e| ClusterError::InvalidArgument(format!("raft configuration: {e}")))?;
        let last_term = store.hard_state().term;
        let raw = RawNode::new(&raft_cfg, store.clone(), logger)?;
        Ok(Replica {
            raw,
            store,
            cfg,
            map,
            conf,
            applied,
            ticks: 0,
            last_heard: BTreeMap::new(),
            duty_wait: 0,
            last_term,
            leading: false,
            leader_since: 0,
            leader_contact: None,
            sync: ContactSync::default(),
        })
    }

    /// This replica's id.
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// The map as applied here.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// The store (shared with Raft).
    pub fn store(&self) -> &RaftStore {
        &self.store
    }

    /// The last applied index.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The commit index known here.
    pub fn committed(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The leader this replica knows, if any.
    pub fn leader(&self) -> Option<NodeId> {
        match self.raw.raft.leader_id {
            0 => None,
            id => Some(id),
        }
    }

    /// Whether this replica is the leader.
    pub fn is_leader(&self) -> bool {
        leader_role(&self.raw)
    }

    /// The Raft configuration as applied here.
    pub fn conf(&self) -> &ConfState {
        &self.conf
    }

    /// True when this replica has applied everything committed that it knows of, knows a
    /// leader (the commit index came from it) and, as leader, has committed an entry of its
    /// term (so its commit index is the cluster's).
    pub fn is_ready(&self) -> bool {
        !self.map.cluster_id.is_empty()
            && self.leader().is_some()
            && self.applied >= self.committed()
            && (!self.is_leader() || self.raw.raft.commit_to_current_term())
    }

    /// The leader's view of which members are caught up (empty on other replicas).
    pub fn progress(&self) -> BTreeMap<NodeId, bool> {
        if !self.is_leader() {
            return BTreeMap::new();
        }
        self.map.nodes.keys().map(|&id| (id, self.caught_up(id))).collect()
    }

    fn reachable(&self, id: NodeId) -> bool {
        id == self.cfg.id
            || self
                .last_heard
                .get(&id)
                .is_some_and(|&t| self.ticks.saturating_sub(t) <= self.cfg.election_ticks as u64)
    }

    fn caught_up(&self, id: NodeId) -> bool {
        if id == self.cfg.id {
            return true;
        }
        let last = self.raw.raft.raft_log.last_index();
        self.reachable(id)
            && self
                .raw
                .raft
                .prs()
                .get(id)
                .is_some_and(|p| p.matched + self.cfg.catch_up_slack >= last)
    }

    /// Starts an election at once when this replica is the only voter, so that a bootstrapped
    /// or restarted single node does not wait for an election timeout. Call it after the first
    /// [`Replica::handle_ready`], which applies the committed conf changes after the snapshot.
    pub fn campaign_if_sole_voter(&mut self) -> Result<(), ClusterError> {
        if self.conf.voters == [self.cfg.id] && !self.is_leader() {
            self.raw.campaign()?;
        }
        Ok(())
    }

    /// Advances Raft's clock by one tick and, on the leader, does the membership duties.
    pub fn tick(&mut self) -> Result<(), ClusterError> {
        self.ticks += 1;
        self.raw.tick();
        self.track_contact();
        self.duties()
    }

    /// Whether the leader of this term (as leader: a quorum of voters) was heard from within
    /// an election timeout: enough to propose (Raft orders the proposal), not to answer
    /// data reads (see [`Replica::in_contact`]).
    pub fn heard(&self) -> bool {
        if self.is_leader() {
            let voters = &self.conf.voters;
            return voters.iter().filter(|&&v| self.reachable(v)).count() > voters.len() / 2;
        }
        let window = self.cfg.election_ticks as u64;
        self.leader().is_some()
            && self.leader_contact.is_some_and(|t| self.ticks.saturating_sub(t) <= window)
    }

    /// At each tick: starts a new generation when contact was lost or the term or role
    /// changed, and, in contact but not yet caught up, learns the index to catch up to (a
    /// follower asks the leader every other tick until it answers).
    fn track_contact(&mut self) {
        let (term, leading, heard) = (self.term(), self.is_leader(), self.heard());
        let sync = &mut self.sync;
        if !heard || sync.term != term || sync.leading != leading {
            sync.generation += 1;
            sync.term = term;
            sync.leading = leading;
            sync.asked = None;
            sync.index = None;
        }
        if !heard || sync.index.is_some() {
            return;
        }
        if leading {
            if self.raw.raft.commit_to_current_term() {
                sync.index = Some(self.raw.raft.raft_log.committed);
            }
        } else if sync.asked.is_none_or(|t| self.ticks >= t + 2) {
            sync.asked = Some(self.ticks);
            sync.asks += 1;
            let mut ctx = Vec::with_capacity(16);
            ctx.extend_from_slice(&sync.generation.to_be_bytes());
            ctx.extend_from_slice(&sync.asks.to_be_bytes());
            self.raw.read_index(ctx);
        }
    }

    /// Takes the leader's answers to this replica's asks: the first one of the current
    /// generation sets the index to catch up to.
    fn take_read_states(&mut self, states: Vec<raft::ReadState>) {
        for rs in states {
            let generation = rs.request_ctx.get(..8).and_then(|b| b.try_into().ok());
            if generation.map(u64::from_be_bytes) == Some(self.sync.generation)
                && self.sync.index.is_none()
                && !self.sync.leading
            {
                self.sync.index = Some(rs.index);
            }
        }
    }

    /// Runs the leader's membership duties now (promote a caught-up learner, remove a drained
    /// node) rather than at the next tick: a driver calls it once an applied change may have
    /// made the next one possible. A dropped proposal is retried at the next tick.
    pub fn duties(&mut self) -> Result<(), ClusterError> {
        match self.leader_duties() {
            Err(ClusterError::Unavailable(_)) => Ok(()),
            r => r,
        }
    }

    /// True while this replica is in touch with the cluster and caught up with it: as leader,
    /// a quorum of voters (itself included) was heard from within an election timeout;
    /// otherwise the leader of its term was. And since contact was last (re)gained, the
    /// replica has applied everything the cluster had committed by then (a follower asks the
    /// leader's commit index). A node cut off from the cluster turns false within about an
    /// election timeout and must stop answering data requests; back in contact, it answers
    /// again only once it has applied what the others decided meanwhile (that it was marked
    /// down, say, and no longer gets writes).
    pub fn in_contact(&self) -> bool {
        self.heard()
            && self.sync.generation_matches(self.term(), self.is_leader())
            && self.sync.index.is_some_and(|i| self.applied >= i)
    }

    /// Refuses a message from a peer that raft-rs would take as proof of an impossible state
    /// and abort on (`fatal!`), stopping this node: no correct peer sends one, but a damaged
    /// or forged message must not stop the Raft thread. Dropping it is safe, as Raft
    /// tolerates lost messages.
    fn check_incoming(&self, msg: &Message) -> Result<(), ClusterError> {
        let bad = |why: String| Err(ClusterError::InvalidArgument(format!("raft message: {why}")));
        let log = &self.raw.raft.raft_log;
        match msg.get_msg_type() {
            MessageType::MsgPropose if msg.entries.is_empty() => {
                bad("a proposal without entries".into())
            }
            // Forwarded to the leader as they are, and raft-rs refuses to send these with a
            // term: peers never set one.
            MessageType::MsgPropose | MessageType::MsgReadIndex if msg.term != 0 => {
                bad(format!("a {:?} with term {}", msg.get_msg_type(), msg.term))
            }
            // A read index request carries its context as its one entry: raft-rs reads it
            // without looking.
            MessageType::MsgReadIndex if msg.entries.len() != 1 => {
                bad(format!("a read index request with {} entries, not 1", msg.entries.len()))
            }
            // A vote is asked for a term: raft-rs answers in the term asked and refuses to
            // send an answer without one.
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote if msg.term == 0 => {
                bad(format!("a {:?} without a term", msg.get_msg_type()))
            }
            // Sent in the leader's term; raft-rs takes a term-0 answer past the log as
            // matching it, and commits beyond its log.
            MessageType::MsgReadIndexResp if msg.term == 0 => {
                bad("a read index answer without a term".into())
            }
            MessageType::MsgTransferLeader if msg.term != 0 && !self.is_leader() => {
                bad(format!("a leadership transfer in term {} to a follower", msg.term))
            }
            MessageType::MsgHeartbeat if msg.commit > log.last_index() => bad(format!(
                "a heartbeat commits index {} past this log's last index {}",
                msg.commit,
                log.last_index()
            )),
            MessageType::MsgAppend => {
                // Entries follow the index, in terms that never go down, from the term of
                // the entry before them up to the sender's (raft-rs takes a term-0 entry past
                // the log as already there, then commits beyond its log).
                let mut floor = msg.log_term.max(1);
                for (i, e) in msg.entries.iter().enumerate() {
                    if Some(e.index) != msg.index.checked_add(i as u64 + 1) {
                        return bad(format!(
                            "append after index {}: entry {i} has index {}",
                            msg.index, e.index
                        ));
                    }
                    if e.term < floor || (msg.term != 0 && e.term > msg.term) {
                        return bad(format!(
                            "append in term {} after term {}: entry {} has term {}",
                            msg.term, msg.log_term, e.index, e.term
                        ));
                    }
                    floor = e.term;
                }
                // An entry that differs from a committed one here would make raft-rs
                // overwrite the committed log.
                if log.match_term(msg.index, msg.log_term)
                    && let Some(e) = msg
                        .entries
                        .iter()
                        .find(|e| e.index <= log.committed && !log.match_term(e.index, e.term))
                {
                    return bad(format!(
                        "entry {} (term {}) conflicts with the committed log",
                        e.index, e.term
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Steps a message from a peer. InvalidArgument, and the message dropped, for one that no
    /// correct peer sends (see `check_incoming`).
    pub fn step(&mut self, msg: Message) -> Result<(), ClusterError> {
        self.check_incoming(&msg)?;
        let (from, term) = (msg.from, msg.term);
        if from != 0 {
            self.last_heard.insert(from, self.ticks);
        }
        let r = self.raw.step(msg);
        if from != 0 && from == self.raw.raft.leader_id && term == self.raw.raft.term {
            self.leader_contact = Some(self.ticks);
        }
        match r {
            Ok(()) => Ok(()),
            // A message from a node not (or no longer) in the configuration: ignored.
            Err(raft::Error::StepPeerNotFound) | Err(raft::Error::StepLocalMsg) => Ok(()),
            // A proposal forwarded to a replica that no longer leads nor knows a leader: lost,
            // as a dropped message would be; its proposer times out.
            Err(raft::Error::ProposalDropped) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The leader (id) to name in a `NotLeader` answer.
    fn not_leader(&self) -> ClusterError {
        ClusterError::NotLeader {
            leader: self.leader().map(|id| {
                let addr =
                    self.map.nodes.get(&id).map(|n| n.internal_addr.clone()).unwrap_or_default();
                (id, addr)
            }),
        }
    }

    /// Whether raft-rs has a ready to handle: persisting a ready can make another (a commit
    /// that the persisted entries complete), so a driver handles readies until this is false.
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Whether a membership change may be proposed now (none in flight).
    pub fn change_in_flight(&self) -> bool {
        self.raw.raft.has_pending_conf() || self.applied < self.duty_wait
    }

    /// Leader only: proposes a map command; returns the (index, term) the entry got.
    pub fn propose(&mut self, cmd: &Command, tag: Vec<u8>) -> Result<(u64, u64), ClusterError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        self.raw.propose(tag, cmd.encode())?;
        Ok((self.raw.raft.raft_log.last_index(), self.raw.raft.term))
    }

    /// Proposes a map command from any replica: a follower forwards it to the leader (Raft's
    /// proposal forwarding). The outcome is known only when an entry with this `tag` is
    /// applied, so the tag must be unique. NotLeader without a known leader.
    pub fn propose_forwarded(&mut self, cmd: &Command, tag: Vec<u8>) -> Result<(), ClusterError> {
        if !self.is_leader() && self.leader().is_none() {
            return Err(self.not_leader());
        }
        self.raw.propose(tag, cmd.encode())?;
        Ok(())
    }

    /// Leader only: proposes one conf change together with the map command that goes with it.
    pub fn propose_conf_change(
        &mut self,
        change: ConfChangeType,
        node: NodeId,
        cmd: &Command,
        tag: Vec<u8>,
    ) -> Result<(u64, u64), ClusterError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        if self.raw.raft.has_pending_conf() {
            return Err(ClusterError::Unavailable(
                "another membership change is in progress; retry".into(),
            ));
        }
        let mut single = ConfChangeSingle::default();
        single.set_change_type(change);
        single.node_id = node;
        let mut cc = ConfChangeV2::default();
        cc.set_changes(vec![single].into());
        cc.context = cmd.encode().into();
        self.raw.propose_conf_change(tag, cc)?;
        Ok((self.raw.raft.raft_log.last_index(), self.raw.raft.term))
    }

    /// Leader only: checks that `id` may be removed. Refuses (FailedPrecondition, saying why)
    /// the last voter, and a voter whose removal would leave fewer reachable caught-up voters
    /// than a quorum of the remaining ones.
    pub fn check_removal(&self, id: NodeId) -> Result<(), ClusterError> {
        let Some(node) = self.map.nodes.get(&id) else {
            return Err(ClusterError::NotFound(id));
        };
        if node.role != Role::Voter && !self.conf.voters.contains(&id) {
            return Ok(());
        }
        let remaining: Vec<NodeId> =
            self.conf.voters.iter().copied().filter(|&v| v != id).collect();
        if remaining.is_empty() {
            return Err(ClusterError::FailedPrecondition(format!(
                "node {id} is the last voter; a cluster cannot remove its last voter"
            )));
        }
        let quorum = remaining.len() / 2 + 1;
        let healthy: Vec<NodeId> =
            remaining.iter().copied().filter(|&v| self.caught_up(v)).collect();
        if healthy.len() < quorum {
            return Err(ClusterError::FailedPrecondition(format!(
                "removing node {id} would lose quorum: {} voters would remain, only {} of them \
                 ({:?}) reachable and caught up, a quorum needs {quorum}",
                remaining.len(),
                healthy.len(),
                healthy
            )));
        }
        Ok(())
    }

    /// Leader only: hands leadership to `to` (a voter).
    pub fn transfer_leader(&mut self, to: NodeId) -> Result<(), ClusterError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        if !self.conf.voters.contains(&to) {
            return Err(ClusterError::FailedPrecondition(format!(
                "node {to} is not a voter; only a voter can lead"
            )));
        }
        if to != self.cfg.id {
            self.raw.transfer_leader(to);
        }
        Ok(())
    }

    fn leader_duties(&mut self) -> Result<(), ClusterError> {
        let leader = self.is_leader();
        if leader && !self.leading {
            self.leader_since = self.ticks;
        }
        self.leading = leader;
        if !self.is_leader() || self.change_in_flight() || !self.raw.raft.commit_to_current_term() {
            return Ok(());
        }
        // Removals first: a draining node leaves once that keeps a quorum.
        let draining: Vec<NodeId> = self
            .map
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Draining)
            .map(|n| n.id)
            .collect();
        for id in draining {
            if id == self.cfg.id {
                if self.conf.voters.len() > 1 {
                    // Hand leadership to a caught-up voter; it finishes the removal.
                    if let Some(&to) =
                        self.conf.voters.iter().find(|&&v| v != id && self.caught_up(v))
                    {
                        self.raw.transfer_leader(to);
                    }
                    return Ok(());
                }
                continue;
            }
            let command = Command::RemoveNode { id };
            if !self.conf.voters.contains(&id) && !self.conf.learners.contains(&id) {
                // Raft removed it but the map refused then (the unit's state changed between
                // proposal and commit): the map's removal alone, once it is allowed.
                if self.map.check(&command).is_ok() {
                    let (index, _) = self.propose(&command, Vec::new())?;
                    self.duty_wait = index;
                    return Ok(());
                }
                continue;
            }
            // The map refuses the removal while the node holds a unit's last serving replica
            // that is up: it waits until the unit's new replicas are ready.
            if self.check_removal(id).is_ok() && self.map.check(&command).is_ok() {
                let (index, _) =
                    self.propose_conf_change(ConfChangeType::RemoveNode, id, &command, Vec::new())?;
                self.duty_wait = index;
                return Ok(());
            }
        }
        // Then promotions of caught-up learners.
        let voters = self.conf.voters.len();
        let learners: Vec<(NodeId, NodeState)> = self
            .map
            .nodes
            .values()
            .filter(|n| {
                n.role == Role::Learner && matches!(n.state, NodeState::Joining | NodeState::Active)
            })
            .map(|n| (n.id, n.state))
            .collect();
        for (id, state) in learners {
            if !self.conf.learners.contains(&id) || !self.caught_up(id) {
                continue;
            }
            let index = if voters < self.cfg.max_voters {
                self.propose_conf_change(
                    ConfChangeType::AddNode,
                    id,
                    &Command::Promote { id },
                    Vec::new(),
                )?
                .0
            } else if state == NodeState::Joining {
                self.propose(&Command::SetState { id, state: NodeState::Active }, Vec::new())?.0
            } else {
                continue;
            };
            self.duty_wait = index;
            return Ok(());
        }
        self.liveness_duty()
    }

    /// Marks silent active nodes down and heard down nodes back, one change at a time.
    fn liveness_duty(&mut self) -> Result<(), ClusterError> {
        let window = self.cfg.election_ticks as u64;
        // The change, and for a node marked down the ticks it has been silent.
        let change = self.map.nodes.values().find_map(|n| {
            if n.id == self.cfg.id {
                // The leader hears itself: marked down by hand, it is back at once.
                return (n.state == NodeState::Down).then_some((Command::NodeBack { id: n.id }, 0));
            }
            let heard = self.last_heard.get(&n.id).copied();
            let silent = self.ticks.saturating_sub(heard.unwrap_or(0).max(self.leader_since));
            match n.state {
                NodeState::Active if silent > self.cfg.failure_ticks => {
                    Some((Command::NodeDown { id: n.id }, silent))
                }
                NodeState::Down
                    if heard.is_some_and(|t| {
                        t >= self.leader_since && self.ticks.saturating_sub(t) <= window
                    }) =>
                {
                    Some((Command::NodeBack { id: n.id }, 0))
                }
                NodeState::Down
                    if !n.lost && self.cfg.rebuild_ticks > 0 && silent > self.cfg.rebuild_ticks =>
                {
                    Some((Command::NodeLost { id: n.id }, silent))
                }
                _ => None,
            }
        });
        if let Some((cmd, silent)) = change
            && self.map.check(&cmd).is_ok()
        {
            match cmd {
                Command::NodeDown { id } => {
                    tracing::warn!(node = id, silent_ticks = silent, "marking a silent node down")
                }
                Command::NodeLost { id } => tracing::warn!(
                    node = id,
                    silent_ticks = silent,
                    "marking a node lost: down past the rebuild time, its replicas are rebuilt \
                     on the other nodes"
                ),
                _ => {}
            }
            let (index, _) = self.propose(&cmd, Vec::new())?;
            self.duty_wait = index;
        }
        Ok(())
    }

    /// Handles one `Ready` in the documented order (see the module docs). Returns with nothing
    /// done when Raft has nothing ready.
    pub fn handle_ready(&mut self, out: &mut Outbox) -> Result<(), ClusterError> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        self.take_read_states(rd.take_read_states());
        // 1. Leader messages.
        self.send(rd.take_messages(), out);
        // 2. Snapshot from the leader.
        if !rd.snapshot().is_empty() {
            self.install_snapshot(rd.snapshot(), out)?;
        }
        // 3. Entries.
        self.store.append(rd.entries())?;
        // 4. Hard state (vote, term, commit).
        if let Some(hs) = rd.hs() {
            if hs.term > self.last_term && hs.vote == self.cfg.id {
                out.elections += 1;
            }
            self.last_term = hs.term;
            self.store.set_hard_state(hs)?;
        }
        // 5. Messages that promise what steps 2-4 persisted.
        self.send(rd.take_persisted_messages(), out);
        // 6. Committed entries.
        self.apply(rd.take_committed_entries(), out)?;
        // 7. Advance; the light ready's commit index before its entries.
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.store.set_commit(commit)?;
        }
        self.send(light.take_messages(), out);
        self.apply(light.take_committed_entries(), out)?;
        self.raw.advance_apply_to(self.applied);
        if !out.applied.is_empty() {
            self.store.set_applied(self.applied, &self.conf, self.map.encode())?;
        }
        self.maybe_compact()
    }

    fn send(&mut self, msgs: Vec<Message>, out: &mut Outbox) {
        for m in msgs {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                out.snapshot_sends += 1;
                // Delivery is best effort; if it is lost the follower rejects the next append
                // and the leader sends the snapshot again.
                self.raw.report_snapshot(m.to, raft::SnapshotStatus::Finish);
            }
            out.messages.push(m);
        }
    }

    fn install_snapshot(&mut self, snap: &Snapshot, out: &mut Outbox) -> Result<(), ClusterError> {
        let map = ClusterMap::decode(&snap.data)
            .map_err(|e| ClusterError::Corrupt(format!("a snapshot from the leader: {e}")))?;
        self.store.apply_snapshot(snap)?;
        self.map = map;
        self.conf = snap.get_metadata().get_conf_state().clone();
        self.applied = snap.get_metadata().index;
        out.installed_snapshot = Some((self.applied, self.map.clone()));
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>, out: &mut Outbox) -> Result<(), ClusterError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            let mut granted = None;
            let (command, result) = match e.get_entry_type() {
                EntryType::EntryNormal if e.data.is_empty() => (None, Ok(self.map.epoch)),
                EntryType::EntryNormal => match Command::decode(&e.data) {
                    Ok(cmd) => {
                        let grant = match cmd {
                            Command::GrantIds { count, .. } => Some(self.map.next_grant(count)),
                            _ => None,
                        };
                        let r = self.map.apply(&cmd).map(|()| self.map.epoch);
                        if r.is_ok() {
                            granted = grant;
                            self.report_unavailable(&cmd);
                        }
                        (Some(cmd), r)
                    }
                    Err(err) => (None, Err(err)),
                },
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data).map_err(|err| {
                        ClusterError::Corrupt(format!("conf change {}: {err}", e.index))
                    })?;
                    let r = self.raw.apply_conf_change(&cc);
                    self.apply_conf(r, &cc.context)
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data).map_err(|err| {
                        ClusterError::Corrupt(format!("conf change {}: {err}", e.index))
                    })?;
                    let r = self.raw.apply_conf_change(&cc);
                    self.apply_conf(r, &cc.context)
                }
            };
            self.applied = e.index;
            out.applied.push(AppliedEntry {
                index: e.index,
                term: e.term,
                tag: e.context.to_vec(),
                command,
                result,
                epoch: self.map.epoch,
                granted,
            });
        }
        Ok(())
    }

    /// A node marked down may leave units without a serving replica: said once, when applied.
    fn report_unavailable(&self, cmd: &Command) {
        let down = match cmd {
            Command::NodeDown { id } => *id,
            Command::SetState { id, state: NodeState::Down } => *id,
            _ => return,
        };
        let units = self.map.unavailable_units();
        if !units.is_empty() {
            tracing::warn!(
                node = down,
                count = units.len(),
                first = ?units.first(),
                "node marked down: these units have no serving replica up; their reads and \
                 writes fail until one is back"
            );
        }
    }

    fn apply_conf(
        &mut self,
        conf: raft::Result<ConfState>,
        context: &[u8],
    ) -> (Option<Command>, Result<u64, MapError>) {
        match conf {
            Ok(cs) => self.conf = cs,
            // Refused the same way on every replica (an invalid configuration): the map stays.
            Err(e) => return (None, Err(MapError::Refused(format!("conf change: {e}")))),
        }
        if context.is_empty() {
            return (None, Ok(self.map.epoch));
        }
        match Command::decode(context) {
            Ok(Command::RemoveNode { id })
                if !self.conf.voters.contains(&id)
                    && !self.conf.learners.contains(&id)
                    && self.map.check(&Command::RemoveNode { id }).is_err()
                    && self.map.nodes.contains_key(&id) =>
            {
                // Raft removed it: the map follows (see `Command::Evict`).
                let cmd = Command::Evict { id };
                let r = self.map.apply(&cmd).map(|()| self.map.epoch);
                tracing::warn!(
                    node = id,
                    unavailable = self.map.unavailable_units().len(),
                    "a node left Raft's configuration while the map refused its removal; evicted"
                );
                (Some(cmd), r)
            }
            Ok(cmd) => {
                let r = self.map.apply(&cmd).map(|()| self.map.epoch);
                (Some(cmd), r)
            }
            Err(err) => (None, Err(err)),
        }
    }

    fn maybe_compact(&mut self) -> Result<(), ClusterError> {
        let snap_index = self.store.first() - 1;
        if self.applied >= snap_index + self.cfg.snapshot_every.max(1)
            && self.applied <= self.store.last()
        {
            self.store.compact(self.applied, &self.conf, self.map.encode())?;
        }
        Ok(())
    }
}
