//! The cluster's Raft path: `Command::decode` and `ClusterMap::decode` (JSON, the entries and
//! snapshots of the Raft log), and Raft messages as the internal `Raft` service receives them
//! (`RaftMessage`/`RaftBatch` through prost, then `eraftpb::Message` through protobuf) stepped
//! into a `Replica` (raft-rs `RawNode` over the crate's `RaftStore` on a `MemKv`), with its
//! readies handled: entries appended, committed commands applied to the map, snapshots
//! installed.
//!
//! Input: a mode byte, then the bytes. Mode bits 0-1: 0 a command (applied to a bootstrapped
//! map), 1 a map, 2 an encoded `RaftBatch`, 3 `eraftpb::Message`s as items (`u16` LE length,
//! bytes). Bit 2: the replica leads a one-voter cluster, else it follows in a three-voter one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neardup_cluster::logger::discard_logger;
use neardup_cluster::map::{ClusterMap, Command, DesignInfo, Layout, NodeInfo};
use neardup_cluster::replica::{Outbox, Replica, ReplicaConfig};
use neardup_cluster::storage::{MemKv, RaftStore};
use neardup_fuzz::{join_items, split_items, write_seeds};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{Entry, EntryType, Message, MessageType};

fn node(id: u64) -> NodeInfo {
    NodeInfo::active_voter(id, format!("p{id}"), format!("i{id}"))
}

fn bootstrap_cmd() -> Command {
    Command::Bootstrap {
        cluster_id: "fuzz".into(),
        design: DesignInfo { name: "5c2".into(), tables: 4, max_k: 3 },
        node: node(1),
        layout: Layout { replicas: 2, split_bits: 1, partitions: 4 },
        min_prefix_bits: Some(26),
    }
}

fn bootstrapped() -> ClusterMap {
    let mut map = ClusterMap::default();
    map.apply(&bootstrap_cmd()).expect("bootstrap");
    map
}

fn replica(leader: bool) -> Replica {
    let kv = MemKv::default();
    let store = RaftStore::open(Box::new(kv)).expect("store");
    let mut map = bootstrapped();
    let voters = if leader { vec![1] } else { vec![1, 2, 3] };
    if !leader {
        for id in [2, 3] {
            map.nodes.insert(id, node(id));
        }
    }
    store.bootstrap(voters, map.encode()).expect("bootstrap");
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
    let mut r = Replica::open(cfg, store, &discard_logger()).expect("replica");
    drain(&mut r);
    if leader {
        r.campaign_if_sole_voter().expect("campaign");
        drain(&mut r);
    }
    r
}

fn drain(r: &mut Replica) {
    for _ in 0..32 {
        if !r.has_ready() {
            return;
        }
        let mut out = Outbox::default();
        if r.handle_ready(&mut out).is_err() {
            return;
        }
        for a in &out.applied {
            assert!(a.epoch <= r.map().epoch);
        }
    }
}

fn step_all(messages: &[&[u8]], leader: bool) {
    let decoded: Vec<Message> =
        messages.iter().filter_map(|m| Message::parse_from_bytes(m).ok()).collect();
    if decoded.is_empty() {
        return;
    }
    let mut r = replica(leader);
    for msg in decoded {
        let _ = r.step(msg);
        drain(&mut r);
        let _ = r.tick();
        drain(&mut r);
    }
    // Whatever the messages did, the map applied is one the map accepts back.
    let bytes = r.map().encode();
    assert_eq!(&ClusterMap::decode(&bytes).expect("own map decodes"), r.map());
}

fn command(bytes: &[u8]) {
    let Ok(cmd) = Command::decode(bytes) else { return };
    assert_eq!(Command::decode(&cmd.encode()).expect("own command decodes"), cmd);
    let mut map = bootstrapped();
    let checked = map.check(&cmd).is_ok();
    let before = map.clone();
    match map.apply(&cmd) {
        Ok(()) => assert!(checked && map.epoch >= before.epoch),
        Err(_) => assert!(!checked),
    }
    assert_eq!(ClusterMap::decode(&map.encode()).expect("own map decodes"), map);
}

fn cluster_map(bytes: &[u8]) {
    let Ok(mut map) = ClusterMap::decode(bytes) else { return };
    assert_eq!(ClusterMap::decode(&map.encode()).expect("own map decodes"), map);
    let _ = map.units().count();
    let _ = map.unavailable_units();
    let _ = map.partition_of("https://example.com/a");
    let _ = map.voters().count();
    let ids: Vec<u64> = map.nodes.keys().copied().collect();
    for id in ids.iter().take(4) {
        let _ = map.filling_on(*id);
        let _ = map.is_up(*id);
    }
    for unit in map.units().take(8).collect::<Vec<_>>() {
        let _ = map.serving(unit);
        let _ = map.writers(unit);
        let _ = map.writers_since(unit);
    }
    for t in 0..2 {
        let _ = map.tablet_for(t, 0x1234_5678_9ABC_DEF0);
        let _ = map.partition(t);
    }
    let _ = map.next_grant(3);
    let _ = map.apply(&Command::GrantIds { node: 1, count: 5 });
    let _ = map.apply(&bootstrap_cmd());
}

fn entry(index: u64, term: u64, data: Vec<u8>) -> Entry {
    let mut e = Entry::default();
    e.set_entry_type(EntryType::EntryNormal);
    e.index = index;
    e.term = term;
    e.data = data.into();
    e
}

fn message(t: MessageType, from: u64, term: u64, entries: Vec<Entry>) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(t);
    m.from = from;
    m.to = 1;
    m.term = term;
    m.index = 1;
    m.log_term = 1;
    m.commit = 1;
    m.set_entries(entries.into());
    m.write_to_bytes().expect("encode")
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let grant = Command::GrantIds { node: 1, count: 5 }.encode();
    let cmds = [bootstrap_cmd().encode(), grant.clone()];
    for (i, c) in cmds.iter().enumerate() {
        out.push((format!("command-{i}"), [&[0u8][..], c].concat()));
    }
    out.push(("map".into(), [&[1u8][..], &bootstrapped().encode()].concat()));
    let msgs = [
        message(MessageType::MsgAppend, 2, 2, vec![entry(2, 2, grant.clone())]),
        message(MessageType::MsgHeartbeat, 2, 2, vec![]),
        message(MessageType::MsgRequestVote, 3, 3, vec![]),
        message(MessageType::MsgPropose, 2, 0, vec![entry(0, 0, grant.clone())]),
        message(MessageType::MsgAppendResponse, 2, 1, vec![]),
    ];
    let refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
    for leader in [0u8, 4] {
        out.push((format!("messages-{leader}"), [&[3 | leader][..], &join_items(&refs)].concat()));
        let batch = neardup_proto::internal::RaftBatch {
            messages: msgs.to_vec(),
            from_id: 2,
            from_addr: "i2".into(),
        };
        out.push((format!("batch-{leader}"), [&[2 | leader][..], &batch.encode_to_vec()].concat()));
    }
    out
}

fuzz_target!(init: { write_seeds(seeds()) }, |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let leader = mode & 4 != 0;
    match mode & 3 {
        0 => command(rest),
        1 => cluster_map(rest),
        2 => {
            if let Ok(b) = neardup_proto::internal::RaftBatch::decode(rest) {
                let refs: Vec<&[u8]> = b.messages.iter().take(8).map(|m| m.as_slice()).collect();
                step_all(&refs, leader);
            }
            if let Ok(m) = neardup_proto::internal::RaftMessage::decode(rest) {
                step_all(&[&m.message], leader);
            }
        }
        _ => step_all(&split_items(rest, 8), leader),
    }
});
