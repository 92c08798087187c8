//! [`ClusterNode`]: a [`Replica`] on its own thread.
//!
//! The thread owns the replica. Everything reaches it through one inbox channel (messages
//! from peers, changes with a reply channel, shutdown); it wakes at once on input and
//! otherwise at the next tick (`recv_timeout`). After every wake-up it handles Raft's ready
//! state until there is none, sends the messages through the [`Transport`], answers the
//! changes that were applied, and publishes the map, the readiness and the status. Callers
//! never wait on the thread except for the answer to their own change.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::{ConfChangeType, Message};
use tokio::sync::{oneshot, watch};

use crate::error::ClusterError;
use crate::map::{ClusterMap, Command, NodeInfo, NodeState, Role};
use crate::metrics::{ClusterMetrics, RoleLabels};
use crate::replica::{Outbox, Replica, ReplicaConfig};
use crate::storage::{Identity, RaftStore};
use crate::{ClusterConfig, NodeId, STALL_WARN, Transport};

/// A change that was applied: the map's epoch after it and the Raft index it is at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The map's epoch once the change is applied.
    pub epoch: u64,
    /// The Raft index applied.
    pub index: u64,
}

/// A node's view of the cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterStatus {
    /// This node's id.
    pub node_id: NodeId,
    /// The leader it knows, if any.
    pub leader: Option<NodeId>,
    /// Its current term.
    pub term: u64,
    /// The epoch of its applied map.
    pub epoch: u64,
    /// Its last applied index.
    pub applied: u64,
    /// The commit index it knows.
    pub committed: u64,
    /// Its applied map.
    pub map: Arc<ClusterMap>,
    /// On the leader: whether each member is reachable and caught up with the log. Empty on
    /// other nodes.
    pub progress: std::collections::BTreeMap<NodeId, bool>,
}

type Reply = oneshot::Sender<Result<Applied, ClusterError>>;

/// A submitted command's outcome: where it applied, and the ids a grant granted.
type SubmitResult = Result<(Applied, Option<Range<u64>>), ClusterError>;

/// Where a submitted command's outcome goes.
type SubmitReply = oneshot::Sender<SubmitResult>;

enum Input {
    Message(Message, String),
    Add { id: NodeId, public_addr: String, internal_addr: String, reply: Reply },
    Remove { id: NodeId, reply: Reply },
    Transfer { to: NodeId, reply: Reply },
    Submit { cmd: Command, reply: SubmitReply },
    Shutdown,
}

/// A running cluster node; clones share it.
#[derive(Clone)]
pub struct ClusterNode {
    shared: Arc<Shared>,
}

struct Shared {
    id: NodeId,
    tx: Sender<Input>,
    status: Arc<Mutex<ClusterStatus>>,
    map_rx: watch::Receiver<Arc<ClusterMap>>,
    ready_rx: watch::Receiver<bool>,
    contact: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    fn stop(&self) {
        let _ = self.tx.send(Input::Shutdown);
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop();
    }
}

fn stopped() -> ClusterError {
    ClusterError::Unavailable("the cluster node has stopped".into())
}

fn new_cluster_id(node_id: NodeId) -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(node_id);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// The smallest prefix of the design named `name`; `None` (with a warning) when the name does
/// not parse here: the split is then checked against its general bound only.
fn min_prefix_bits(name: &str) -> Option<u32> {
    match neardup_core::Design::parse(name) {
        Ok(d) => Some(d.min_prefix_bits()),
        Err(e) => {
            tracing::warn!(design = name, error = %e, "cannot read the design's prefixes");
            None
        }
    }
}

/// `timeout` in whole ticks, at least one.
fn failure_ticks(timeout: Duration, tick: Duration) -> u64 {
    let tick = tick.as_nanos().max(1);
    (timeout.as_nanos().div_ceil(tick)).clamp(1, u64::MAX as u128) as u64
}

/// Opens the store in `cfg.dir`, checks its identity and bootstraps it when asked.
pub(crate) fn open_store(cfg: &ClusterConfig) -> Result<RaftStore, ClusterError> {
    if cfg.node_id == 0 {
        return Err(ClusterError::InvalidArgument("node id 0 is reserved".into()));
    }
    if cfg.internal_addr.is_empty() {
        return Err(ClusterError::InvalidArgument(
            "a cluster node needs an internal address".into(),
        ));
    }
    let store = RaftStore::open_dir(&cfg.dir)?;
    match store.identity() {
        Some(id) if id.node_id != cfg.node_id => {
            return Err(ClusterError::FailedPrecondition(format!(
                "{} holds the Raft state of node {}, not node {}",
                cfg.dir.display(),
                id.node_id,
                cfg.node_id
            )));
        }
        Some(_) => {}
        None => store.set_identity(Identity { node_id: cfg.node_id, cluster_id: String::new() })?,
    }
    let fresh = store.last() == 0 && store.hard_state() == Default::default();
    match &cfg.bootstrap {
        Some(design) if fresh => {
            let cluster_id = new_cluster_id(cfg.node_id);
            let mut map = ClusterMap::default();
            map.apply(&Command::Bootstrap {
                cluster_id: cluster_id.clone(),
                design: design.clone(),
                node: NodeInfo::active_voter(
                    cfg.node_id,
                    cfg.public_addr.clone(),
                    cfg.internal_addr.clone(),
                ),
                layout: cfg.layout,
                min_prefix_bits: min_prefix_bits(&design.name),
            })?;
            store.bootstrap(vec![cfg.node_id], map.encode())?;
            store.set_identity(Identity { node_id: cfg.node_id, cluster_id })?;
            tracing::info!(node = cfg.node_id, "bootstrapped a new cluster");
        }
        Some(_) => tracing::info!(
            node = cfg.node_id,
            "the Raft directory holds a cluster already; bootstrap ignored"
        ),
        None => {}
    }
    Ok(store)
}

impl ClusterNode {
    /// Opens (or creates) the Raft state in `cfg.dir` and starts the Raft thread. A node
    /// restarted on its dir comes back with its id and map; a dir holding another node id is
    /// refused (FailedPrecondition).
    pub fn start(
        cfg: ClusterConfig,
        transport: Arc<dyn Transport>,
        metrics: ClusterMetrics,
    ) -> Result<ClusterNode, ClusterError> {
        let store = open_store(&cfg)?;
        let replica = Replica::open(
            ReplicaConfig {
                id: cfg.node_id,
                election_ticks: cfg.election_ticks,
                heartbeat_ticks: cfg.heartbeat_ticks,
                max_voters: cfg.max_voters.max(1),
                snapshot_every: cfg.snapshot_every.max(1),
                catch_up_slack: 2,
                failure_ticks: failure_ticks(cfg.failure_timeout, cfg.tick),
                rebuild_ticks: if cfg.rebuild_after.is_zero() {
                    0
                } else {
                    failure_ticks(cfg.rebuild_after, cfg.tick)
                },
                fixed_election_timeout: false,
            },
            store,
            &crate::logger::raft_logger(cfg.node_id),
        )?;
        let (tx, rx) = mpsc::channel();
        let map = Arc::new(replica.map().clone());
        let (map_tx, map_rx) = watch::channel(map.clone());
        let (ready_tx, ready_rx) = watch::channel(false);
        let ready_tx = Arc::new(ready_tx);
        let status = Arc::new(Mutex::new(ClusterStatus {
            node_id: cfg.node_id,
            epoch: map.epoch,
            applied: replica.applied(),
            map,
            ..Default::default()
        }));
        let wait = (cfg.tick * cfg.election_ticks as u32 * 5).max(Duration::from_secs(10));
        let contact = Arc::new(AtomicBool::new(false));
        let mut runner = Runner {
            replica,
            transport,
            metrics,
            tick: cfg.tick.max(Duration::from_millis(1)),
            wait,
            addrs: HashMap::new(),
            waiters: Vec::new(),
            answers: Vec::new(),
            submit_answers: Vec::new(),
            status: status.clone(),
            map_tx,
            ready_tx,
            was_leader: false,
            identity_cluster: String::new(),
            submits: Vec::new(),
            submit_wait: (cfg.tick * cfg.election_ticks as u32 * 3).max(Duration::from_secs(1)),
            tag_seq: 0,
            tag_nonce: new_cluster_id(cfg.node_id),
            contact: contact.clone(),
        };
        runner.identity_cluster =
            runner.replica.store().identity().map(|i| i.cluster_id).unwrap_or_default();
        let ready_after = runner.ready_tx.clone();
        let contact_after = contact.clone();
        let thread = std::thread::Builder::new()
            .name(format!("neardup-raft-{}", cfg.node_id))
            .spawn(move || {
                // raft-rs panics on states it deems impossible (a log it was told is committed
                // but is not there): the node then stops and says so, health no longer ready.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runner.run(rx)))
                    .is_err()
                {
                    tracing::error!("the Raft thread panicked; the cluster node has stopped");
                    ready_after.send_replace(false);
                    contact_after.store(false, Ordering::Release);
                }
            })
            .map_err(|e| ClusterError::Unavailable(format!("cannot start the Raft thread: {e}")))?;
        Ok(ClusterNode {
            shared: Arc::new(Shared {
                id: cfg.node_id,
                tx,
                status,
                map_rx,
                ready_rx,
                contact,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.shared.id
    }

    /// An incoming message from a peer (`from_addr`: its internal address, learned for
    /// replies). Returns at once; InvalidArgument when the bytes are not a Raft message.
    pub fn step(&self, message: &[u8], from_addr: &str) -> Result<(), ClusterError> {
        self.step_as(message, None, from_addr)
    }

    /// As [`ClusterNode::step`], for a sender known to be node `sender` (from its
    /// certificate): a message claiming to come from another node is refused.
    pub fn step_as(
        &self,
        message: &[u8],
        sender: Option<NodeId>,
        from_addr: &str,
    ) -> Result<(), ClusterError> {
        let msg = Message::parse_from_bytes(message)
            .map_err(|e| ClusterError::InvalidArgument(format!("not a Raft message: {e}")))?;
        if let Some(sender) = sender
            && msg.from != sender
        {
            return Err(ClusterError::InvalidArgument(format!(
                "a Raft message from node {} sent by node {sender}",
                msg.from
            )));
        }
        self.shared.tx.send(Input::Message(msg, from_addr.to_string())).map_err(|_| stopped())
    }

    async fn ask(&self, make: impl FnOnce(Reply) -> Input) -> Result<Applied, ClusterError> {
        let (reply, rx) = oneshot::channel();
        self.shared.tx.send(make(reply)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Leader only (else `NotLeader` with the leader): adds a node as a learner; the leader
    /// promotes it to voter once caught up while voters are fewer than `max_voters`. The same
    /// id with the same internal address again is Ok (idempotent); the same id with another
    /// address is `IdInUse`.
    pub async fn add_node(
        &self,
        id: NodeId,
        public_addr: String,
        internal_addr: String,
    ) -> Result<Applied, ClusterError> {
        self.ask(|reply| Input::Add { id, public_addr, internal_addr, reply }).await
    }

    /// Leader only: marks the node draining, then removes it (conf change) and answers once
    /// the removal is applied. Refused with FailedPrecondition (saying why) when it would lose
    /// quorum or remove the last voter. Removing the leader itself hands leadership over
    /// first; the answer may then be Unavailable while the new leader completes the removal.
    pub async fn remove_node(&self, id: NodeId) -> Result<Applied, ClusterError> {
        self.ask(|reply| Input::Remove { id, reply }).await
    }

    /// Leader only: hands leadership to voter `to`; answers once `to` leads.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<Applied, ClusterError> {
        self.ask(|reply| Input::Transfer { to, reply }).await
    }

    /// Proposes `cmd` (a normal entry: never a membership change, which needs a conf change
    /// too) from this node, leader or not (a follower forwards it to the leader), and answers
    /// once this node applied it: where, and for a `GrantIds` the sequence numbers granted. The map's refusal comes back as its error. Unavailable at once when
    /// this node has not heard from a leader within an election timeout (as leader: from a
    /// quorum), and when no answer came within three
    /// election timeouts (at least 1 s; the command may or may not be applied: read the map).
    async fn submit(&self, cmd: Command) -> Result<(Applied, Option<Range<u64>>), ClusterError> {
        let (reply, rx) = oneshot::channel();
        self.shared.tx.send(Input::Submit { cmd, reply }).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Grants this node `count` document sequence numbers (1 to [`crate::map::MAX_GRANT`]),
    /// through the leader: blocks never overlap across nodes, leaders and restarts, and no
    /// number is granted twice. A document's gid is `(seq << 8) | partition`.
    pub async fn grant_ids(&self, count: u64) -> Result<Range<u64>, ClusterError> {
        if count == 0 || count > crate::map::MAX_GRANT {
            return Err(ClusterError::InvalidArgument(format!(
                "a grant is 1 to {} ids, not {count}",
                crate::map::MAX_GRANT
            )));
        }
        match self.submit(Command::GrantIds { node: self.id(), count }).await? {
            (_, Some(range)) => Ok(range),
            (_, None) => Err(ClusterError::Unavailable("the grant carried no range".into())),
        }
    }

    /// Reports this node's replica of `unit` caught up (filling -> serving), through the
    /// leader.
    pub async fn replica_ready(&self, unit: crate::map::Unit) -> Result<Applied, ClusterError> {
        Ok(self.submit(Command::ReplicaReady { unit, node: self.id() }).await?.0)
    }

    /// Cuts tablet `(table, start)` in two at permuted value `at`, through the leader
    /// ([`Command::SplitTablet`]); placement may then move the new half.
    pub async fn split_tablet(
        &self,
        table: u32,
        start: u64,
        at: u64,
    ) -> Result<Applied, ClusterError> {
        Ok(self.submit(Command::SplitTablet { table, start, at }).await?.0)
    }

    /// Places every unit again, through the leader ([`Command::Rebalance`]).
    pub async fn rebalance(&self) -> Result<Applied, ClusterError> {
        Ok(self.submit(Command::Rebalance).await?.0)
    }

    /// Marks this node down, through the leader, so that the leader marks it back and its
    /// replicas catch up before they serve (a node does this after a restart: it may have
    /// missed writes while it was away).
    pub async fn mark_self_down(&self) -> Result<Applied, ClusterError> {
        Ok(self.submit(Command::NodeDown { id: self.id() }).await?.0)
    }

    /// True while this node is in touch with the cluster: it heard from the leader within an
    /// election timeout, or it leads and heard from a quorum of voters within one, and it has
    /// applied what the cluster had committed when contact was (re)gained
    /// ([`Replica::in_contact`](crate::replica::Replica::in_contact)). A node cut off must stop
    /// answering data requests (its replicas may be stale).
    pub fn in_contact(&self) -> bool {
        self.shared.contact.load(Ordering::Acquire)
    }

    /// This node's view of the cluster.
    pub fn status(&self) -> ClusterStatus {
        self.shared.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The applied map, updated on every change.
    pub fn watch_map(&self) -> watch::Receiver<Arc<ClusterMap>> {
        self.shared.map_rx.clone()
    }

    /// True once this node has applied the committed map (health SERVING needs it).
    pub fn watch_ready(&self) -> watch::Receiver<bool> {
        self.shared.ready_rx.clone()
    }

    /// Stops the Raft thread (everything is persisted as it happens); idempotent. Pending
    /// changes are answered Unavailable.
    pub fn shutdown(&self) {
        self.shared.stop();
    }
}

enum Wait {
    /// A proposed entry at (index, term); on success, `then_removal` waits for the removal.
    Entry { index: u64, term: u64, then_removal: Option<NodeId> },
    /// The node leaves the map.
    Removal(NodeId),
    /// `to` becomes the leader.
    Transfer(NodeId),
}

struct Waiter {
    wait: Wait,
    reply: Reply,
    deadline: Instant,
}

struct Runner {
    replica: Replica,
    transport: Arc<dyn Transport>,
    metrics: ClusterMetrics,
    tick: Duration,
    wait: Duration,
    addrs: HashMap<NodeId, String>,
    waiters: Vec<Waiter>,
    answers: Vec<(Reply, Result<Applied, ClusterError>)>,
    /// Answers to submitted commands applied in this drain, sent after the publication too.
    submit_answers: Vec<(SubmitReply, SubmitResult)>,
    status: Arc<Mutex<ClusterStatus>>,
    map_tx: watch::Sender<Arc<ClusterMap>>,
    ready_tx: Arc<watch::Sender<bool>>,
    was_leader: bool,
    identity_cluster: String,
    /// Submitted commands waiting for their entry (by tag) to be applied here.
    submits: Vec<Submit>,
    /// How long a submitted command waits for its entry: a few election timeouts.
    submit_wait: Duration,
    tag_seq: u64,
    /// Makes this run's tags unlike any earlier run's.
    tag_nonce: String,
    contact: Arc<AtomicBool>,
}

struct Submit {
    tag: Vec<u8>,
    reply: SubmitReply,
    deadline: Instant,
}

impl Runner {
    fn run(mut self, rx: Receiver<Input>) {
        let mut next_tick = Instant::now() + self.tick;
        if let Err(e) = self.drain() {
            return self.fail(e);
        }
        if let Err(e) = self.replica.campaign_if_sole_voter().and_then(|()| self.drain()) {
            return self.fail(e);
        }
        loop {
            let now = Instant::now();
            let input = match rx.recv_timeout(next_tick.saturating_duration_since(now)) {
                Ok(input) => Some(input),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut inputs: Vec<Input> = input.into_iter().collect();
            while inputs.len() < 1024 {
                match rx.try_recv() {
                    Ok(i) => inputs.push(i),
                    Err(_) => break,
                }
            }
            let mut shutdown = false;
            for input in inputs {
                match input {
                    Input::Shutdown => shutdown = true,
                    other => self.handle(other),
                }
            }
            if shutdown {
                break;
            }
            let now = Instant::now();
            if now >= next_tick {
                let late = now - next_tick;
                if late >= STALL_WARN {
                    tracing::warn!(late_ms = late.as_millis() as u64, "a Raft tick came late");
                }
                if let Err(e) = self.replica.tick() {
                    tracing::warn!(error = %e, "leader duty failed");
                }
                next_tick += self.tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + self.tick;
                }
            }
            let started = Instant::now();
            if let Err(e) = self.drain() {
                return self.fail(e);
            }
            let took = started.elapsed();
            if took >= STALL_WARN {
                tracing::warn!(
                    took_ms = took.as_millis() as u64,
                    "handling Raft's readies took long"
                );
            }
        }
        self.ready_tx.send_replace(false);
        self.contact.store(false, Ordering::Release);
        for w in self.waiters.drain(..) {
            let _ = w.reply.send(Err(stopped()));
        }
        for s in self.submits.drain(..) {
            let _ = s.reply.send(Err(stopped()));
        }
    }

    /// A storage failure stops the node: the state machine cannot go on safely.
    fn fail(mut self, e: ClusterError) {
        tracing::error!(error = %e, "the Raft thread stops");
        self.ready_tx.send_replace(false);
        self.contact.store(false, Ordering::Release);
        for w in self.waiters.drain(..) {
            let _ = w.reply.send(Err(e.clone()));
        }
        for s in self.submits.drain(..) {
            let _ = s.reply.send(Err(e.clone()));
        }
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Message(msg, from_addr) => {
                if msg.from != 0 && !from_addr.is_empty() {
                    self.addrs.insert(msg.from, from_addr);
                }
                if let Err(e) = self.replica.step(msg) {
                    tracing::debug!(error = %e, "raft message refused");
                }
            }
            Input::Add { id, public_addr, internal_addr, reply } => {
                let r = self.add(id, public_addr, internal_addr);
                self.answer(r, reply);
            }
            Input::Remove { id, reply } => {
                let r = self.remove(id);
                self.answer(r, reply);
            }
            Input::Transfer { to, reply } => {
                let r = self.replica.transfer_leader(to).map(|()| {
                    if to == self.replica.id() {
                        Err(self.applied_now())
                    } else {
                        Ok(Wait::Transfer(to))
                    }
                });
                self.answer(r, reply);
            }
            Input::Submit { cmd, reply } => {
                self.tag_seq += 1;
                let tag =
                    format!("submit:{}:{}:{}", self.replica.id(), self.tag_nonce, self.tag_seq)
                        .into_bytes();
                if !self.replica.heard() {
                    let _ = reply.send(Err(ClusterError::Unavailable(
                        "this node is not in contact with a leader; retry".into(),
                    )));
                    return;
                }
                match self.replica.propose_forwarded(&cmd, tag.clone()) {
                    Ok(()) => {
                        self.metrics.inner.proposals.inc();
                        self.submits.push(Submit {
                            tag,
                            reply,
                            deadline: Instant::now() + self.submit_wait,
                        });
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Input::Shutdown => {}
        }
    }

    /// Err(Applied) = answered already.
    fn answer(&mut self, r: Result<Result<Wait, Applied>, ClusterError>, reply: Reply) {
        match r {
            Ok(Ok(wait)) => {
                self.waiters.push(Waiter { wait, reply, deadline: Instant::now() + self.wait })
            }
            Ok(Err(applied)) => {
                let _ = reply.send(Ok(applied));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    fn applied_now(&self) -> Applied {
        Applied { epoch: self.replica.map().epoch, index: self.replica.applied() }
    }

    fn leader_check(&self) -> Result<(), ClusterError> {
        if self.replica.is_leader() {
            return Ok(());
        }
        let leader = self.replica.leader().map(|id| {
            let addr = self
                .replica
                .map()
                .nodes
                .get(&id)
                .map(|n| n.internal_addr.clone())
                .or_else(|| self.addrs.get(&id).cloned())
                .unwrap_or_default();
            (id, addr)
        });
        Err(ClusterError::NotLeader { leader })
    }

    fn add(
        &mut self,
        id: NodeId,
        public_addr: String,
        internal_addr: String,
    ) -> Result<Result<Wait, Applied>, ClusterError> {
        self.leader_check()?;
        if id == 0 {
            return Err(ClusterError::InvalidArgument("node id 0 is reserved".into()));
        }
        if internal_addr.is_empty() {
            return Err(ClusterError::InvalidArgument(format!(
                "node {id} needs an internal address"
            )));
        }
        if self.replica.map().is_removed(id) {
            return Err(ClusterError::InvalidArgument(crate::map::removed_message(id)));
        }
        if let Some(n) = self.replica.map().nodes.get(&id) {
            return if n.internal_addr == internal_addr {
                Ok(Err(self.applied_now()))
            } else {
                Err(ClusterError::IdInUse { id, existing_addr: n.internal_addr.clone() })
            };
        }
        if self.replica.change_in_flight() {
            return Err(ClusterError::Unavailable(
                "another membership change is in progress; retry".into(),
            ));
        }
        let cmd = Command::AddNode { id, public_addr, internal_addr };
        let (index, term) = self.replica.propose_conf_change(
            ConfChangeType::AddLearnerNode,
            id,
            &cmd,
            Vec::new(),
        )?;
        self.metrics.inner.proposals.inc();
        Ok(Ok(Wait::Entry { index, term, then_removal: None }))
    }

    fn remove(&mut self, id: NodeId) -> Result<Result<Wait, Applied>, ClusterError> {
        self.leader_check()?;
        let Some(node) = self.replica.map().nodes.get(&id) else {
            return Err(ClusterError::NotFound(id));
        };
        let draining = node.state == NodeState::Draining;
        self.replica.check_removal(id)?;
        if draining {
            return Ok(Ok(Wait::Removal(id)));
        }
        let (index, term) = self
            .replica
            .propose(&Command::SetState { id, state: NodeState::Draining }, Vec::new())?;
        self.metrics.inner.proposals.inc();
        Ok(Ok(Wait::Entry { index, term, then_removal: Some(id) }))
    }

    /// Handles readies until none is left, then answers and publishes.
    fn drain(&mut self) -> Result<(), ClusterError> {
        let mut duties = true;
        loop {
            let mut out = Outbox::default();
            self.replica.handle_ready(&mut out)?;
            let idle = out.messages.is_empty()
                && out.applied.is_empty()
                && out.installed_snapshot.is_none();
            // An applied change may make the next one possible (a drained node's removal, a
            // promotion): the leader starts it now, not at the next tick; once per drain.
            let applied = !out.applied.is_empty();
            self.deliver(out);
            if applied && duties {
                duties = false;
                if let Err(e) = self.replica.duties() {
                    tracing::warn!(error = %e, "leader duty failed");
                }
                continue;
            }
            // A ready that showed nothing may still have made another (a commit completed by
            // the entries it persisted): waiting for the next tick would delay it.
            if idle && !self.replica.has_ready() {
                break;
            }
        }
        self.settle_waiters();
        self.publish()?;
        // Answers go out after the publication: who gets one sees the map it speaks of.
        for (reply, r) in self.answers.drain(..) {
            let _ = reply.send(r);
        }
        for (reply, r) in self.submit_answers.drain(..) {
            let _ = reply.send(r);
        }
        Ok(())
    }

    fn deliver(&mut self, out: Outbox) {
        let Outbox { messages, applied, installed_snapshot: _, snapshot_sends, elections } = out;
        self.metrics.inner.snapshot_sends.inc_by(snapshot_sends);
        self.metrics.inner.elections.inc_by(elections);
        for m in messages {
            let to = m.to;
            let addr = self
                .replica
                .map()
                .nodes
                .get(&to)
                .map(|n| n.internal_addr.clone())
                .or_else(|| self.addrs.get(&to).cloned());
            let Some(addr) = addr else {
                tracing::debug!(to, "no address for a Raft peer; message dropped");
                continue;
            };
            match m.write_to_bytes() {
                Ok(bytes) => self.transport.send(to, &addr, bytes),
                Err(e) => tracing::warn!(error = %e, "cannot encode a Raft message"),
            }
        }
        for a in applied {
            if !a.tag.is_empty()
                && let Some(pos) = self.submits.iter().position(|s| s.tag == a.tag)
            {
                let s = self.submits.swap_remove(pos);
                let r = match &a.result {
                    Ok(epoch) => Ok((Applied { epoch: *epoch, index: a.index }, a.granted.clone())),
                    Err(e) => Err(ClusterError::from(e.clone())),
                };
                // After the publication (see `drain`): a filler told its replica is ready
                // must not read a map that still lists it filling.
                self.submit_answers.push((s.reply, r));
            }
            let mut i = 0;
            while i < self.waiters.len() {
                let done = match &self.waiters[i].wait {
                    Wait::Entry { index, term, then_removal } if *index == a.index => {
                        if *term != a.term {
                            Some(Err(ClusterError::Unavailable(
                                "the change was replaced by a new leader's log and not applied; retry".into(),
                            )))
                        } else {
                            match (&a.result, then_removal) {
                                (Ok(_), Some(id)) => {
                                    let id = *id;
                                    self.waiters[i].wait = Wait::Removal(id);
                                    self.waiters[i].deadline = Instant::now() + self.wait;
                                    None
                                }
                                (Ok(epoch), None) => {
                                    Some(Ok(Applied { epoch: *epoch, index: a.index }))
                                }
                                (Err(e), _) => Some(Err(ClusterError::from(e.clone()))),
                            }
                        }
                    }
                    _ => None,
                };
                match done {
                    Some(r) => {
                        let w = self.waiters.swap_remove(i);
                        self.answers.push((w.reply, r));
                    }
                    None => i += 1,
                }
            }
        }
    }

    fn settle_waiters(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.submits.len() {
            if now >= self.submits[i].deadline {
                let s = self.submits.swap_remove(i);
                let _ = s.reply.send(Err(ClusterError::Unavailable(
                    "no answer in time; the command may or may not be applied: read the map and \
                     retry"
                        .into(),
                )));
            } else {
                i += 1;
            }
        }
        let leader = self.replica.is_leader();
        let lost = self.was_leader && !leader;
        self.was_leader = leader;
        let applied = self.applied_now();
        let current_leader = self.replica.leader();
        let me = self.replica.id();
        let map = self.replica.map();
        let mut i = 0;
        while i < self.waiters.len() {
            let w = &self.waiters[i];
            let r = match w.wait {
                Wait::Removal(id) if !map.nodes.contains_key(&id) => Some(Ok(applied)),
                Wait::Transfer(to) if current_leader == Some(to) => Some(Ok(applied)),
                Wait::Transfer(to) if current_leader.is_some_and(|l| l != to && l != me) => {
                    Some(Err(ClusterError::Unavailable(format!(
                        "leadership went to node {} instead of node {to}",
                        current_leader.unwrap_or_default()
                    ))))
                }
                Wait::Entry { .. } if lost => Some(Err(ClusterError::Unavailable(
                    "this node lost the leadership; the change may or may not be applied, \
                     read the map and retry"
                        .into(),
                ))),
                _ if now >= w.deadline => Some(Err(match w.wait {
                    Wait::Removal(id) => ClusterError::Unavailable(format!(
                        "node {id} is draining; its removal is not applied here yet"
                    )),
                    _ => ClusterError::Unavailable(
                        "the change timed out; read the map and retry".into(),
                    ),
                })),
                _ => None,
            };
            match r {
                Some(r) => {
                    let w = self.waiters.swap_remove(i);
                    self.answers.push((w.reply, r));
                }
                None => i += 1,
            }
        }
    }

    fn publish(&mut self) -> Result<(), ClusterError> {
        let r = &self.replica;
        let map = r.map();
        if !map.cluster_id.is_empty() && self.identity_cluster != map.cluster_id {
            if !self.identity_cluster.is_empty() {
                tracing::warn!(
                    was = %self.identity_cluster,
                    now = %map.cluster_id,
                    "this node's Raft state changed cluster"
                );
            }
            r.store()
                .set_identity(Identity { node_id: r.id(), cluster_id: map.cluster_id.clone() })?;
            self.identity_cluster = map.cluster_id.clone();
        }
        let changed = {
            let cur = self.map_tx.borrow();
            cur.epoch != map.epoch || cur.cluster_id != map.cluster_id || **cur != *map
        };
        let shared_map = if changed { Arc::new(map.clone()) } else { self.map_tx.borrow().clone() };
        let status = ClusterStatus {
            node_id: r.id(),
            leader: r.leader(),
            term: r.term(),
            epoch: map.epoch,
            applied: r.applied(),
            committed: r.committed(),
            map: shared_map.clone(),
            progress: r.progress(),
        };
        let m = &self.metrics.inner;
        m.term.set(status.term);
        m.is_leader.set(r.is_leader() as i64);
        m.epoch.set(status.epoch);
        m.applied_index.set(status.applied);
        m.committed_index.set(status.committed);
        if changed {
            m.unavailable_units.set(map.unavailable_units().len() as i64);
            m.down_nodes
                .set(map.nodes.values().filter(|n| n.state == NodeState::Down).count() as i64);
        }
        self.contact.store(r.in_contact(), Ordering::Release);
        let voters = map.nodes.values().filter(|n| n.role == Role::Voter).count();
        m.members.get_or_create(&RoleLabels { role: "voter" }).set(voters as i64);
        m.members
            .get_or_create(&RoleLabels { role: "learner" })
            .set((map.nodes.len() - voters) as i64);
        // The status first, then the watches: a watcher woken by them reads a status at least
        // as new.
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = status;
        if changed {
            self.map_tx.send_replace(shared_map);
        }
        let ready = r.is_ready();
        self.ready_tx.send_if_modified(|v| {
            let changed = *v != ready;
            *v = ready;
            changed
        });
        Ok(())
    }
}
