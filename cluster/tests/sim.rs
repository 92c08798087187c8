//! The deterministic simulation: several [`Replica`]s of the cluster map in one process over a
//! simulated network driven by a seeded generator. The network drops, delays, reorders,
//! duplicates and partitions messages; replicas crash and restart from their stores; the
//! leader is asked to change the map, add and remove nodes and hand leadership over.
//!
//! Checked at every step:
//! - at most one leader per term;
//! - every replica applies a contiguous run of entries, and each entry (term, command, result,
//!   the map after it) is the one every other replica applied at that index: one history;
//! - a snapshot a replica installs or restarts from holds the map that history has there;
//! - an acknowledged change (applied on the leader that proposed it) stays in that history.
//!
//! At the end the network heals and the replicas must agree: every member applies up to the
//! same index and holds the same map, which holds every acknowledged change.
//!
//! `NEARDUP_SIM_SEEDS` (default 200) sets the number of seeds, `NEARDUP_SIM_STEPS` (default
//! 3000) the steps per seed. The stores are the crate's [`RaftStore`] over [`MemKv`] (the sled
//! layer below it is tested in the crate's storage tests).

use std::collections::{BTreeMap, BTreeSet};

use neardup_cluster::NodeId;
use neardup_cluster::logger::discard_logger;
use neardup_cluster::map::{ClusterMap, Command, DesignInfo, NodeInfo, NodeState, Role};
use neardup_cluster::replica::{Outbox, Replica, ReplicaConfig};
use neardup_cluster::storage::{MemKv, RaftStore};
use raft::eraftpb::{ConfChangeType, Message};

/// splitmix64: small, seedable, good enough to drive a simulation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `p` per mille.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

const SLOTS: u64 = 6;

struct Slot {
    kv: MemKv,
    replica: Option<Replica>,
    /// Down (crashed) until this step.
    down_until: u64,
    /// The map this replica's history says it holds (replayed from its applied entries).
    shadow: ClusterMap,
    next_index: u64,
}

/// What was applied at an index: term, command, result, the encoded map after it.
type HistoryEntry = (u64, Option<Command>, Result<u64, String>, Vec<u8>);

struct InFlight {
    at: u64,
    msg: Message,
}

/// What can go wrong on purpose, to see the checks fail.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// A restarted replica forgets whom it voted for.
    Amnesia,
}

struct Sim {
    rng: Rng,
    step: u64,
    slots: BTreeMap<NodeId, Slot>,
    net: Vec<InFlight>,
    /// Group of each node while partitioned.
    groups: Option<BTreeMap<NodeId, u64>>,
    drop_per_mille: u64,
    dup_per_mille: u64,
    max_delay: u64,
    leaders: BTreeMap<u64, NodeId>,
    /// index -> (term, command, result epoch, map after)
    history: BTreeMap<u64, HistoryEntry>,
    /// Proposals (proposer, index, term) not yet seen applied by their proposer.
    proposed: Vec<(NodeId, u64, u64)>,
    /// Acknowledged changes: index -> term.
    acked: BTreeMap<u64, u64>,
    removed: BTreeSet<NodeId>,
    fault: Fault,
    stats: Stats,
}

#[derive(Default, Debug, Clone)]
struct Stats {
    delivered: u64,
    dropped: u64,
    acked: u64,
    restarts: u64,
    snapshots: u64,
    elections: u64,
    max_term: u64,
    final_epoch: u64,
    final_index: u64,
    voters: usize,
    members: usize,
    removals: usize,
}

fn config(id: NodeId) -> ReplicaConfig {
    ReplicaConfig {
        id,
        election_ticks: 10,
        heartbeat_ticks: 2,
        max_voters: 3,
        snapshot_every: 20,
        catch_up_slack: 2,
        fixed_election_timeout: true,
    }
}

fn design() -> DesignInfo {
    DesignInfo { name: "5c2".into(), tables: 4, max_k: 3 }
}

impl Sim {
    fn new(seed: u64, fault: Fault) -> Result<Sim, String> {
        let mut rng = Rng(seed);
        let drop_per_mille = rng.below(150);
        let dup_per_mille = rng.below(50);
        let max_delay = 1 + rng.below(6);
        let mut sim = Sim {
            rng,
            step: 0,
            slots: BTreeMap::new(),
            net: Vec::new(),
            groups: None,
            drop_per_mille,
            dup_per_mille,
            max_delay,
            leaders: BTreeMap::new(),
            history: BTreeMap::new(),
            proposed: Vec::new(),
            acked: BTreeMap::new(),
            removed: BTreeSet::new(),
            fault,
            stats: Stats::default(),
        };
        for id in 1..=SLOTS {
            let kv = MemKv::default();
            if id == 1 {
                let store = RaftStore::open(Box::new(kv.clone())).map_err(|e| e.to_string())?;
                let mut map = ClusterMap::default();
                map.apply(&Command::Bootstrap {
                    cluster_id: format!("sim-{seed}"),
                    design: design(),
                    node: NodeInfo {
                        id,
                        public_addr: "p1".into(),
                        internal_addr: "i1".into(),
                        role: Role::Voter,
                        state: NodeState::Active,
                    },
                })
                .map_err(|e| e.to_string())?;
                store.bootstrap(vec![1], map.encode()).map_err(|e| e.to_string())?;
                sim.history.insert(1, (1, None, Ok(map.epoch), map.encode()));
            }
            sim.slots.insert(
                id,
                Slot {
                    kv,
                    replica: None,
                    down_until: 0,
                    shadow: ClusterMap::default(),
                    next_index: 0,
                },
            );
            sim.open(id)?;
        }
        Ok(sim)
    }

    fn open(&mut self, id: NodeId) -> Result<(), String> {
        let slot = self.slots.get_mut(&id).ok_or("no slot")?;
        let store =
            RaftStore::open(Box::new(slot.kv.clone())).map_err(|e| format!("reopen {id}: {e}"))?;
        let replica = Replica::open(config(id), store, &discard_logger())
            .map_err(|e| format!("open {id}: {e}"))?;
        slot.shadow = replica.map().clone();
        slot.next_index = replica.applied() + 1;
        let at = replica.applied();
        slot.replica = Some(replica);
        self.check_snapshot(id, at)
    }

    /// A replica starting from (or installing) a snapshot at `index` holds history's map there.
    fn check_snapshot(&self, id: NodeId, index: u64) -> Result<(), String> {
        if index == 0 {
            return Ok(());
        }
        let slot = &self.slots[&id];
        match self.history.get(&index) {
            Some((_, _, _, map)) if *map != slot.shadow.encode() => Err(format!(
                "step {}: node {id} holds at snapshot {index} a map unlike the history's",
                self.step
            )),
            _ => Ok(()),
        }
    }

    fn up(&self, id: NodeId) -> bool {
        let s = &self.slots[&id];
        s.replica.is_some() && s.down_until <= self.step
    }

    fn linked(&self, a: NodeId, b: NodeId) -> bool {
        match &self.groups {
            Some(g) => g.get(&a) == g.get(&b),
            None => true,
        }
    }

    fn leader(&self) -> Option<NodeId> {
        self.slots
            .iter()
            .filter(|(id, s)| self.up(**id) && s.replica.as_ref().is_some_and(|r| r.is_leader()))
            .map(|(id, s)| (s.replica.as_ref().map(|r| r.term()).unwrap_or(0), *id))
            .max()
            .map(|(_, id)| id)
    }

    fn ready(&mut self, id: NodeId) -> Result<(), String> {
        if !self.up(id) {
            return Ok(());
        }
        loop {
            let mut out = Outbox::default();
            let slot = self.slots.get_mut(&id).ok_or("no slot")?;
            let replica = slot.replica.as_mut().ok_or("down")?;
            replica.handle_ready(&mut out).map_err(|e| format!("node {id} ready: {e}"))?;
            let idle = out.messages.is_empty()
                && out.applied.is_empty()
                && out.installed_snapshot.is_none();
            self.absorb(id, out)?;
            if idle {
                break;
            }
        }
        let slot = &self.slots[&id];
        let replica = slot.replica.as_ref().ok_or("down")?;
        if slot.shadow != *replica.map() {
            return Err(format!(
                "step {}: node {id}'s map differs from its applied entries",
                self.step
            ));
        }
        if replica.is_leader() {
            let term = replica.term();
            if let Some(other) = self.leaders.insert(term, id)
                && other != id
            {
                return Err(format!(
                    "step {}: two leaders in term {term}: {other} and {id}",
                    self.step
                ));
            }
        }
        Ok(())
    }

    fn absorb(&mut self, id: NodeId, out: Outbox) -> Result<(), String> {
        let Outbox { messages, applied, installed_snapshot, snapshot_sends, elections } = out;
        self.stats.snapshots += snapshot_sends;
        self.stats.elections += elections;
        if let Some((index, map)) = installed_snapshot {
            let slot = self.slots.get_mut(&id).ok_or("no slot")?;
            slot.shadow = map;
            slot.next_index = index + 1;
            self.check_snapshot(id, index)?;
        }
        for a in applied {
            let slot = self.slots.get_mut(&id).ok_or("no slot")?;
            if a.index != slot.next_index {
                return Err(format!(
                    "step {}: node {id} applied {} after {}",
                    self.step,
                    a.index,
                    slot.next_index - 1
                ));
            }
            slot.next_index += 1;
            if let Some(cmd) = &a.command {
                let _ = slot.shadow.apply(cmd);
            }
            if slot.shadow.epoch != a.epoch {
                return Err(format!(
                    "step {}: node {id} epoch {} after entry {}",
                    self.step, a.epoch, a.index
                ));
            }
            let entry = (
                a.term,
                a.command.clone(),
                a.result.clone().map_err(|e| e.to_string()),
                slot.shadow.encode(),
            );
            match self.history.get(&a.index) {
                Some(h) if *h != entry => {
                    return Err(format!(
                        "step {}: node {id} applied at {} term {} {:?}, history has term {} {:?}",
                        self.step, a.index, a.term, a.command, h.0, h.1
                    ));
                }
                Some(_) => {}
                None => {
                    self.history.insert(a.index, entry);
                }
            }
            if let Some(pos) =
                self.proposed.iter().position(|&(p, i, t)| p == id && i == a.index && t == a.term)
            {
                self.proposed.swap_remove(pos);
                self.acked.insert(a.index, a.term);
                self.stats.acked += 1;
            }
        }
        for m in messages {
            if self.rng.chance(self.drop_per_mille) {
                self.stats.dropped += 1;
                continue;
            }
            let copies = if self.rng.chance(self.dup_per_mille) { 2 } else { 1 };
            for _ in 0..copies {
                let at = self.step + self.rng.below(self.max_delay + 1);
                self.net.push(InFlight { at, msg: m.clone() });
            }
        }
        Ok(())
    }

    fn deliver(&mut self) -> Result<(), String> {
        let now = self.step;
        let mut due: Vec<InFlight> = Vec::new();
        let mut later = Vec::with_capacity(self.net.len());
        for f in self.net.drain(..) {
            if f.at <= now { due.push(f) } else { later.push(f) }
        }
        self.net = later;
        // Reorder what is due.
        for i in (1..due.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            due.swap(i, j);
        }
        let mut touched = BTreeSet::new();
        for f in due {
            let (from, to) = (f.msg.from, f.msg.to);
            if !self.slots.contains_key(&to) || !self.up(to) || !self.linked(from, to) {
                self.stats.dropped += 1;
                continue;
            }
            self.stats.delivered += 1;
            let slot = self.slots.get_mut(&to).ok_or("no slot")?;
            let replica = slot.replica.as_mut().ok_or("down")?;
            replica.step(f.msg).map_err(|e| format!("node {to} step: {e}"))?;
            touched.insert(to);
        }
        for id in touched {
            self.ready(id)?;
        }
        Ok(())
    }

    fn propose(&mut self) -> Result<(), String> {
        let Some(lid) = self.leader() else { return Ok(()) };
        let map = self.slots[&lid].replica.as_ref().ok_or("down")?.map().clone();
        let ids: Vec<NodeId> = map.nodes.keys().copied().collect();
        let pick = self.rng.below(100);
        let replica = self.slots.get_mut(&lid).and_then(|s| s.replica.as_mut()).ok_or("down")?;
        let r = if pick < 20 {
            // Add the next slot not yet in the map (and never removed).
            match (1..=SLOTS).find(|id| !map.nodes.contains_key(id) && !self.removed.contains(id)) {
                Some(id) if !replica.change_in_flight() => replica.propose_conf_change(
                    ConfChangeType::AddLearnerNode,
                    id,
                    &Command::AddNode {
                        id,
                        public_addr: format!("p{id}"),
                        internal_addr: format!("i{id}"),
                    },
                    Vec::new(),
                ),
                _ => return Ok(()),
            }
        } else if pick < 24 && self.removed.len() < 2 && ids.len() >= 4 {
            // Drain a node (the leader's duties remove it when that keeps a quorum).
            let id = ids[self.rng.below(ids.len() as u64) as usize];
            if id == 1 || replica.check_removal(id).is_err() {
                return Ok(());
            }
            self.removed.insert(id);
            replica.propose(&Command::SetState { id, state: NodeState::Draining }, Vec::new())
        } else if pick < 60 {
            let id = ids[self.rng.below(ids.len() as u64) as usize];
            let state = if self.rng.chance(500) { NodeState::Down } else { NodeState::Active };
            replica.propose(&Command::SetState { id, state }, Vec::new())
        } else {
            let table = self.rng.below(5) as u32;
            let nodes = ids.iter().copied().filter(|_| self.rng.chance(500)).collect();
            replica.propose(&Command::SetTabletNodes { table, nodes }, Vec::new())
        };
        if let Ok((index, term)) = r {
            self.proposed.push((lid, index, term));
        }
        self.ready(lid)
    }

    fn crash(&mut self, id: NodeId) -> Result<(), String> {
        let slot = self.slots.get_mut(&id).ok_or("no slot")?;
        slot.replica = None;
        if self.fault == Fault::Amnesia {
            let store = RaftStore::open(Box::new(slot.kv.clone())).map_err(|e| e.to_string())?;
            let mut hs = store.hard_state();
            hs.vote = 0;
            store.set_hard_state(&hs).map_err(|e| e.to_string())?;
        }
        slot.down_until = self.step + 1 + self.rng.below(60);
        self.stats.restarts += 1;
        self.open(id)
    }

    fn run_step(&mut self, chaos: bool) -> Result<(), String> {
        self.step += 1;
        let ids: Vec<NodeId> = self.slots.keys().copied().collect();
        for &id in &ids {
            if self.up(id) && self.rng.chance(400) {
                let replica =
                    self.slots.get_mut(&id).and_then(|s| s.replica.as_mut()).ok_or("down")?;
                replica.tick().map_err(|e| format!("node {id} tick: {e}"))?;
                self.ready(id)?;
            }
        }
        self.deliver()?;
        if !chaos {
            return Ok(());
        }
        if self.rng.chance(60) {
            self.propose()?;
        }
        if self.rng.chance(if self.fault == Fault::None { 3 } else { 30 }) {
            let id = ids[self.rng.below(ids.len() as u64) as usize];
            self.crash(id)?;
        }
        if self.rng.chance(3)
            && let Some(lid) = self.leader()
        {
            let to = 1 + self.rng.below(SLOTS);
            let replica =
                self.slots.get_mut(&lid).and_then(|s| s.replica.as_mut()).ok_or("down")?;
            let _ = replica.transfer_leader(to);
            self.ready(lid)?;
        }
        match &self.groups {
            None if self.rng.chance(4) => {
                let g = ids.iter().map(|&id| (id, self.rng.below(2))).collect();
                self.groups = Some(g);
            }
            Some(_) if self.rng.chance(8) => self.groups = None,
            _ => {}
        }
        Ok(())
    }

    /// Heals everything and runs until the members agree (bounded).
    fn settle(&mut self) -> Result<(), String> {
        self.groups = None;
        self.drop_per_mille = 0;
        self.dup_per_mille = 0;
        let wake = self.step;
        for s in self.slots.values_mut() {
            s.down_until = s.down_until.min(wake);
        }
        for _ in 0..5000 {
            self.run_step(false)?;
            if let Some(lid) = self.leader() {
                let leader = self.slots[&lid].replica.as_ref().ok_or("down")?;
                let map = leader.map().clone();
                let target = leader.committed();
                let agreed = map.nodes.keys().all(|id| {
                    self.slots.get(id).and_then(|s| s.replica.as_ref()).is_some_and(|r| {
                        r.applied() == target && r.committed() == target && *r.map() == map
                    })
                });
                let busy = map.nodes.values().any(|n| {
                    n.state == NodeState::Draining
                        || (n.role == Role::Learner && n.state == NodeState::Joining)
                });
                if agreed && leader.applied() == target && !busy {
                    if let Some((&last, _)) = self.acked.iter().next_back()
                        && last > target
                    {
                        return Err(format!(
                            "acknowledged index {last} beyond the final commit {target}"
                        ));
                    }
                    for (i, t) in &self.acked {
                        if self.history.get(i).map(|h| h.0) != Some(*t) {
                            return Err(format!("acknowledged entry {i} (term {t}) lost"));
                        }
                    }
                    self.stats.final_epoch = map.epoch;
                    self.stats.final_index = target;
                    self.stats.voters =
                        map.nodes.values().filter(|n| n.role == Role::Voter).count();
                    self.stats.members = map.nodes.len();
                    self.stats.removals =
                        self.removed.iter().filter(|id| !map.nodes.contains_key(id)).count();
                    self.stats.max_term = self.leaders.keys().next_back().copied().unwrap_or(0);
                    return Ok(());
                }
            }
        }
        let views: Vec<String> = self
            .slots
            .iter()
            .filter_map(|(id, s)| {
                s.replica.as_ref().map(|r| {
                    format!(
                        "node {id}: leader {:?} term {} applied {} committed {} epoch {} members {:?}",
                        r.leader(),
                        r.term(),
                        r.applied(),
                        r.committed(),
                        r.map().epoch,
                        r.map().nodes.values().map(|n| (n.id, n.role, n.state)).collect::<Vec<_>>()
                    )
                })
            })
            .collect();
        Err(format!("no agreement after healing:\n{}", views.join("\n")))
    }
}

fn run_seed(seed: u64, steps: u64, fault: Fault) -> Result<Stats, String> {
    let mut sim = Sim::new(seed, fault)?;
    for _ in 0..steps {
        sim.run_step(true)?;
    }
    sim.settle()?;
    Ok(sim.stats)
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn seeded_chaos_keeps_one_history() {
    let seeds = env("NEARDUP_SIM_SEEDS", 200);
    let steps = env("NEARDUP_SIM_STEPS", 3000);
    let first = env("NEARDUP_SIM_FIRST_SEED", 1);
    let mut total = Stats::default();
    let (mut three_voters, mut with_learners, mut removals) = (0, 0, 0);
    for seed in first..first + seeds {
        match run_seed(seed, steps, Fault::None) {
            Ok(s) => {
                total.acked += s.acked;
                total.restarts += s.restarts;
                total.snapshots += s.snapshots;
                total.elections += s.elections;
                total.delivered += s.delivered;
                total.dropped += s.dropped;
                total.max_term = total.max_term.max(s.max_term);
                total.final_epoch += s.final_epoch;
                assert!(s.voters >= 1 && s.voters <= 3, "seed {seed}: {} voters", s.voters);
                if s.voters == 3 {
                    three_voters += 1;
                }
                if s.members > s.voters {
                    with_learners += 1;
                }
                removals += s.removals;
            }
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    eprintln!(
        "{seeds} seeds x {steps} steps: {total:?}; ended with 3 voters: {three_voters}, \
         with learners beyond them: {with_learners}; nodes removed: {removals}"
    );
    // The runs exercise what they claim to.
    assert!(total.acked > 0 && total.restarts > 0 && total.snapshots > 0, "{total:?}");
    assert!(three_voters > 0 && with_learners > 0 && removals > 0);
}

/// The checks can fail: replicas that forget their vote on restart break Raft's safety (two
/// leaders in a term, then diverging histories), and the harness sees it on some seed.
#[test]
fn amnesia_is_caught() {
    let steps = env("NEARDUP_SIM_STEPS", 3000);
    let mut caught = Vec::new();
    for seed in 1..=env("NEARDUP_SIM_AMNESIA_SEEDS", 100) {
        if let Err(e) = run_seed(seed, steps, Fault::Amnesia) {
            caught.push((seed, e));
        }
    }
    for (seed, e) in &caught {
        eprintln!("amnesia caught on seed {seed}: {e}");
    }
    assert!(!caught.is_empty(), "no seed caught replicas that forget their vote");
}
