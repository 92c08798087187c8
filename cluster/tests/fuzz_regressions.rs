//! Raft messages the `raft` fuzz target (`fuzz/`, see docs/security.md) found to stop a node:
//! raft-rs aborts (`fatal!`) on messages no correct peer sends, and the Raft thread stopped
//! with it. [`Replica::step`] now refuses them with InvalidArgument, and the replica goes on.

use neardup_cluster::ClusterError;
use neardup_cluster::logger::discard_logger;
use neardup_cluster::map::{ClusterMap, Command, DesignInfo, Layout, NodeInfo};
use neardup_cluster::replica::{Outbox, Replica, ReplicaConfig};
use neardup_cluster::storage::{MemKv, RaftStore};
use protobuf::Message as _;
use raft::Storage as _;
use raft::eraftpb::{Entry, Message, MessageType};

fn node(id: u64) -> NodeInfo {
    NodeInfo::active_voter(id, format!("p{id}"), format!("i{id}"))
}

/// Node 1 of a cluster of `voters`, bootstrapped, its first readies handled; leading when
/// it is the only voter.
fn replica(voters: Vec<u64>) -> Replica {
    let store = RaftStore::open(Box::new(MemKv::default())).unwrap();
    let mut map = ClusterMap::default();
    map.apply(&Command::Bootstrap {
        cluster_id: "fuzz".into(),
        design: DesignInfo { name: "5c2".into(), tables: 4, max_k: 3 },
        node: node(1),
        layout: Layout { replicas: 2, split_bits: 1, partitions: 4 },
        min_prefix_bits: Some(26),
    })
    .unwrap();
    for &id in voters.iter().filter(|&&id| id != 1) {
        map.nodes.insert(id, node(id));
    }
    store.bootstrap(voters, map.encode()).unwrap();
    let cfg = ReplicaConfig {
        id: 1,
        election_ticks: 10,
        heartbeat_ticks: 2,
        max_voters: 3,
        snapshot_every: 4,
        catch_up_slack: 2,
        failure_ticks: 20,
        rebuild_ticks: 0,
        fixed_election_timeout: true,
    };
    let mut r = Replica::open(cfg, store, &discard_logger()).unwrap();
    drain(&mut r);
    r.campaign_if_sole_voter().unwrap();
    drain(&mut r);
    r
}

fn drain(r: &mut Replica) {
    while r.has_ready() {
        r.handle_ready(&mut Outbox::default()).unwrap();
    }
}

fn refused(r: &mut Replica, bytes: &[u8]) {
    let msg = Message::parse_from_bytes(bytes).unwrap();
    match r.step(msg) {
        Err(ClusterError::InvalidArgument(why)) => assert!(why.contains("raft message"), "{why}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    drain(r);
}

/// `crash-95da3cd1…`: a `MsgPropose` from node 2 with no entries, to a leader ("stepped empty
/// MsgProp").
#[test]
fn empty_proposal_is_refused() {
    let mut r = replica(vec![1]);
    assert!(r.is_leader());
    refused(&mut r, &[8, 2, 16, 1, 24, 2, 40, 1, 64, 1]);
    // The leader still works.
    let epoch = r.map().epoch;
    r.propose(&Command::GrantIds { node: 1, count: 5 }, Vec::new()).unwrap();
    drain(&mut r);
    assert_eq!(r.map().epoch, epoch + 1);
}

/// A heartbeat committing past the follower's log ("to_commit … is out of range").
#[test]
fn heartbeat_past_the_log_is_refused() {
    let mut r = replica(vec![1, 2, 3]);
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeat);
    m.from = 2;
    m.to = 1;
    m.term = 5;
    m.commit = 1_000;
    refused(&mut r, &m.write_to_bytes().unwrap());
}

/// An append whose entries do not follow its index, or that rewrites a committed entry.
#[test]
fn append_that_breaks_the_log_is_refused() {
    let mut r = replica(vec![1, 2, 3]);
    let entry = |index, term| Entry { index, term, ..Default::default() };
    let append = |index, log_term, entries: Vec<Entry>| {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.from = 2;
        m.to = 1;
        m.term = 5;
        m.index = index;
        m.log_term = log_term;
        m.set_entries(entries.into());
        m.write_to_bytes().unwrap()
    };
    refused(&mut r, &append(1, 1, vec![entry(7, 5)]));
    // Found by the fuzz target: an entry of term 0 past the log ("to_commit 2 is out of
    // range [last_index 1]").
    refused(&mut r, &append(1, 1, vec![entry(2, 0)]));
    // On a leader that committed an entry of its term: an append from a later term that
    // replaces it.
    let mut r = replica(vec![1]);
    let c = r.committed();
    let before = r.store().term(c - 1).unwrap();
    let later = r.term() + 7;
    refused(&mut r, &append(c - 1, before, vec![entry(c, later)]));
    assert!(r.is_leader());
}

/// `crash-1fa67fbb…`: a `MsgPropose` carrying a term, which a follower forwards to its leader
/// as it is ("term should not be set when sending MsgPropose"); the same for `MsgReadIndex`.
#[test]
fn forwarded_message_with_a_term_is_refused() {
    let mut r = replica(vec![1, 2, 3]);
    for t in [MessageType::MsgPropose, MessageType::MsgReadIndex] {
        let mut m = Message::default();
        m.set_msg_type(t);
        m.from = 2;
        m.to = 1;
        m.term = 2;
        m.set_entries(vec![Entry { data: b"{}".to_vec().into(), ..Default::default() }].into());
        refused(&mut r, &m.write_to_bytes().unwrap());
    }
}

/// A vote request without a term, which raft-rs would answer in term 0 ("term should be set
/// when sending MsgRequestVoteResponse"); the same for a pre-vote.
#[test]
fn vote_request_without_a_term_is_refused() {
    let mut r = replica(vec![1, 2, 3]);
    for t in [MessageType::MsgRequestVote, MessageType::MsgRequestPreVote] {
        let mut m = Message::default();
        m.set_msg_type(t);
        m.from = 2;
        m.to = 1;
        refused(&mut r, &m.write_to_bytes().unwrap());
    }
}

/// `crash-90f46b20…`: a `MsgReadIndex` without its context entry, which raft-rs indexes
/// without looking ("index out of bounds: the len is 0"), from a peer and as if from the
/// node itself.
#[test]
fn read_index_without_its_entry_is_refused() {
    let mut r = replica(vec![1]);
    assert!(r.is_leader());
    for from in [0, 1, 2] {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgReadIndex);
        m.from = from;
        m.to = 1;
        refused(&mut r, &m.write_to_bytes().unwrap());
    }
    // Two entries are no read index request either.
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgReadIndex);
    m.from = 2;
    m.to = 1;
    let e = Entry { data: b"ctx".to_vec().into(), ..Default::default() };
    m.set_entries(vec![e.clone(), e].into());
    refused(&mut r, &m.write_to_bytes().unwrap());
    assert!(r.is_leader());
}

/// `crash-ee749f75…`: a `MsgReadIndexResp` without a term, naming an index past the log:
/// raft-rs reads the term of an index beyond its log as 0, takes it as a match, and commits
/// past its log ("to_commit 65 is out of range").
#[test]
fn read_index_answer_without_a_term_is_refused() {
    let mut r = replica(vec![1, 2, 3]);
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgReadIndexResp);
    m.from = 2;
    m.to = 1;
    m.index = 65;
    m.set_entries(vec![Entry { data: b"ctx".to_vec().into(), ..Default::default() }].into());
    refused(&mut r, &m.write_to_bytes().unwrap());
}
