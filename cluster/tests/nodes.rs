//! Three `ClusterNode`s in one process over an in-process transport: bootstrap, join, promote,
//! kill the leader, a new leader with the same map, restart from the directories.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neardup_cluster::map::{DesignInfo, NodeState, Role};
use neardup_cluster::{
    ClusterConfig, ClusterError, ClusterMetrics, ClusterNode, NodeId, Transport,
};

/// Nodes by internal address; a node missing from it is unreachable.
#[derive(Clone, Default)]
struct Net {
    nodes: Arc<Mutex<HashMap<String, ClusterNode>>>,
    /// Addresses cut off from everyone.
    cut: Arc<Mutex<Vec<String>>>,
}

struct Link {
    net: Net,
    from_addr: String,
}

impl Transport for Link {
    fn send(&self, _to: NodeId, to_addr: &str, message: Vec<u8>) {
        let cut = self.net.cut.lock().unwrap();
        if cut.iter().any(|a| a == to_addr || *a == self.from_addr) {
            return;
        }
        drop(cut);
        let node = self.net.nodes.lock().unwrap().get(to_addr).cloned();
        if let Some(node) = node {
            let _ = node.step(&message, &self.from_addr);
        }
    }
}

fn addr(id: NodeId) -> String {
    format!("node{id}:internal")
}

fn start(net: &Net, dir: &std::path::Path, id: NodeId, bootstrap: bool) -> ClusterNode {
    start_with(net, dir, id, bootstrap, ClusterMetrics::default())
}

fn start_with(
    net: &Net,
    dir: &std::path::Path,
    id: NodeId,
    bootstrap: bool,
    metrics: ClusterMetrics,
) -> ClusterNode {
    // Liveness stays out of these tests' way (a slow machine would mark nodes down).
    start_cfg(net, dir, id, bootstrap, metrics, Duration::from_secs(3600))
}

fn start_cfg(
    net: &Net,
    dir: &std::path::Path,
    id: NodeId,
    bootstrap: bool,
    metrics: ClusterMetrics,
    failure_timeout: Duration,
) -> ClusterNode {
    let mut cfg =
        ClusterConfig::new(id, format!("node{id}:public"), addr(id), dir.join(format!("n{id}")));
    cfg.tick = Duration::from_millis(10);
    cfg.snapshot_every = 5;
    cfg.failure_timeout = failure_timeout;
    if bootstrap {
        cfg.bootstrap = Some(DesignInfo { name: "5c2".into(), tables: 10, max_k: 3 });
    }
    let link = Arc::new(Link { net: net.clone(), from_addr: addr(id) });
    let node = ClusterNode::start(cfg, link, metrics).unwrap();
    net.nodes.lock().unwrap().insert(addr(id), node.clone());
    node
}

/// Waits (bounded) until `f` holds.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < end, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

async fn add(leader: &ClusterNode, id: NodeId) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match leader.add_node(id, format!("node{id}:public"), addr(id)).await {
            Ok(_) => return,
            Err(ClusterError::Unavailable(_)) if Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("add {id}: {e}"),
        }
    }
}

fn leader_of(nodes: &[&ClusterNode]) -> Option<ClusterNode> {
    nodes.iter().find(|n| n.status().leader == Some(n.id())).map(|n| (*n).clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_join_lose_their_leader_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let net = Net::default();
    let metrics = ClusterMetrics::default();
    let n1 = start_with(&net, dir.path(), 1, true, metrics.clone());
    let mut ready = n1.watch_ready();
    tokio::time::timeout(Duration::from_secs(30), ready.wait_for(|r| *r)).await.unwrap().unwrap();
    assert_eq!(n1.status().leader, Some(1));
    // The last voter cannot leave; only a voter can lead.
    match n1.remove_node(1).await {
        Err(ClusterError::FailedPrecondition(m)) => assert!(m.contains("last voter"), "{m}"),
        r => panic!("{r:?}"),
    }
    assert!(matches!(n1.transfer_leader(9).await, Err(ClusterError::FailedPrecondition(_))));
    assert!(matches!(n1.remove_node(9).await, Err(ClusterError::NotFound(9))));
    let n2 = start(&net, dir.path(), 2, false);
    let n3 = start(&net, dir.path(), 3, false);
    // A follower (or a node outside the cluster) answers NotLeader.
    assert!(matches!(
        n2.add_node(9, "p".into(), "i".into()).await,
        Err(ClusterError::NotLeader { .. })
    ));
    add(&n1, 2).await;
    add(&n1, 3).await;
    // Idempotent; another address is refused.
    n1.add_node(3, "node3:public".into(), addr(3)).await.unwrap();
    assert!(matches!(
        n1.add_node(3, "x".into(), "elsewhere".into()).await,
        Err(ClusterError::IdInUse { id: 3, .. })
    ));
    let all = [&n1, &n2, &n3];
    wait_until("three active voters everywhere", || {
        all.iter().all(|n| {
            let m = n.watch_map().borrow().clone();
            m.nodes.len() == 3
                && m.nodes.values().all(|x| x.role == Role::Voter && x.state == NodeState::Active)
        })
    });
    wait_until("every node ready", || all.iter().all(|n| *n.watch_ready().borrow()));
    let progress = n1.status().progress;
    assert_eq!(progress.len(), 3);
    let values: HashMap<&str, u64> = metrics.snapshot().into_iter().collect();
    assert_eq!(values["is_leader"], 1);
    assert_eq!(values["members_voter"], 3);
    assert_eq!(values["epoch"], n1.status().epoch);
    assert!(values["elections_total"] >= 1 && values["proposals_total"] >= 2, "{values:?}");
    assert!(values["snapshot_sends_total"] >= 2, "{values:?}");
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for name in [
        "neardup_cluster_term",
        "neardup_cluster_members{role=\"voter\"} 3",
        "neardup_cluster_elections_total",
    ] {
        assert!(text.contains(name), "{name} missing in\n{text}");
    }

    // Transfer leadership to 2, then kill it.
    n1.transfer_leader(2).await.unwrap();
    // Node 1 saw node 2 lead; node 2 publishes its own status a moment later.
    wait_until("node 2 leads", || n2.status().leader == Some(2));
    net.nodes.lock().unwrap().remove(&addr(2));
    n2.shutdown();
    n2.shutdown();
    assert!(matches!(
        n2.add_node(7, "p".into(), "i".into()).await,
        Err(ClusterError::Unavailable(_))
    ));
    wait_until("a new leader", || leader_of(&[&n1, &n3]).is_some());
    let leader = leader_of(&[&n1, &n3]).unwrap();
    // With node 2 down, removing another voter would lose quorum.
    let other = if leader.id() == 1 { 3 } else { 1 };
    match leader.remove_node(other).await {
        Err(ClusterError::FailedPrecondition(m)) => assert!(m.contains("quorum"), "{m}"),
        r => panic!("{r:?}"),
    }
    // The majority can still change the map: add a learner (node 4, never started).
    let before = leader.status().epoch;
    let end = Instant::now() + Duration::from_secs(30);
    let applied = loop {
        match leader.add_node(4, "node4:public".into(), addr(4)).await {
            Ok(a) => break a,
            Err(ClusterError::Unavailable(_)) if Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(applied.epoch > before);
    wait_until("the same map on the survivors", || {
        n1.watch_map().borrow().epoch == applied.epoch
            && n3.watch_map().borrow().epoch == applied.epoch
    });
    assert_eq!(*n1.watch_map().borrow().clone(), *n3.watch_map().borrow().clone());
    // Remove the never-started learner (drains first, no quorum at stake).
    let removed = leader.remove_node(4).await.unwrap();
    assert!(removed.epoch >= applied.epoch + 2);
    assert!(!leader.watch_map().borrow().nodes.contains_key(&4));
    let map = leader.watch_map().borrow().clone();

    // Stop everything and restart on the same directories: same map, a leader again.
    n1.shutdown();
    n3.shutdown();
    net.nodes.lock().unwrap().clear();
    let n1 = start(&net, dir.path(), 1, true);
    let n2 = start(&net, dir.path(), 2, false);
    let n3 = start(&net, dir.path(), 3, false);
    let all = [&n1, &n2, &n3];
    wait_until("everyone ready after the restart", || {
        all.iter().all(|n| *n.watch_ready().borrow())
    });
    wait_until("the map after the restart", || {
        all.iter().all(|n| n.watch_map().borrow().epoch == map.epoch)
    });
    for n in all {
        assert_eq!(*n.watch_map().borrow().clone(), *map);
    }
    for n in all {
        n.shutdown();
    }
    // A directory holding another node's state is refused.
    let link = Arc::new(Link { net: net.clone(), from_addr: addr(5) });
    let cfg = ClusterConfig::new(5, "p", addr(5), dir.path().join("n1"));
    match ClusterNode::start(cfg, link, ClusterMetrics::default()) {
        Err(ClusterError::FailedPrecondition(m)) => assert!(m.contains("node 1"), "{m}"),
        r => panic!("{:?}", r.err()),
    }
}

async fn add_retrying(
    node: &ClusterNode,
    id: NodeId,
) -> Result<neardup_cluster::Applied, ClusterError> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match node.add_node(id, format!("node{id}:public"), addr(id)).await {
            Err(ClusterError::Unavailable(_)) if Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            r => return r,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_cannot_change_the_map_and_the_majority_can() {
    let dir = tempfile::tempdir().unwrap();
    let net = Net::default();
    let n1 = start(&net, dir.path(), 1, true);
    let mut ready = n1.watch_ready();
    tokio::time::timeout(Duration::from_secs(30), ready.wait_for(|r| *r)).await.unwrap().unwrap();
    let n2 = start(&net, dir.path(), 2, false);
    let n3 = start(&net, dir.path(), 3, false);
    add(&n1, 2).await;
    add(&n1, 3).await;
    let all = [&n1, &n2, &n3];
    wait_until("three voters", || {
        all.iter()
            .all(|n| n.watch_map().borrow().voters().count() == 3 && *n.watch_ready().borrow())
    });
    // Cut the leader (node 1) off.
    net.cut.lock().unwrap().push(addr(1));
    let before = n1.watch_map().borrow().epoch;
    // The minority side cannot change the map: it steps down (check_quorum) or never commits.
    match n1.add_node(5, "node5:public".into(), addr(5)).await {
        Err(ClusterError::NotLeader { .. }) | Err(ClusterError::Unavailable(_)) => {}
        r => panic!("the cut-off leader answered {r:?}"),
    }
    wait_until("the cut-off leader steps down", || n1.status().leader != Some(1));
    assert_eq!(n1.watch_map().borrow().epoch, before);
    // The majority elects a leader and changes the map.
    wait_until("a leader on the majority side", || leader_of(&[&n2, &n3]).is_some());
    let leader = leader_of(&[&n2, &n3]).unwrap();
    let applied = add_retrying(&leader, 4).await.unwrap();
    assert!(applied.epoch > before);
    // Healed: one map.
    net.cut.lock().unwrap().clear();
    wait_until("one map after healing", || {
        all.iter().all(|n| n.watch_map().borrow().epoch >= applied.epoch)
            && *n1.watch_map().borrow().clone() == *leader.watch_map().borrow().clone()
    });
    assert!(n1.watch_map().borrow().nodes.contains_key(&4));
    for n in all {
        n.shutdown();
    }
}

/// Grants through any node until one answers (a follower forwards to the leader).
async fn grant(node: &ClusterNode, count: u64) -> std::ops::Range<u64> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match node.grant_ids(count).await {
            Ok(r) => return r,
            Err(ClusterError::Unavailable(_)) | Err(ClusterError::NotLeader { .. })
                if Instant::now() < end =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("grant on node {}: {e}", node.id()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_contact_and_liveness() {
    let dir = tempfile::tempdir().unwrap();
    let net = Net::default();
    let timeout = Duration::from_millis(300);
    let metrics = ClusterMetrics::default();
    let n1 = start_cfg(&net, dir.path(), 1, true, metrics.clone(), timeout);
    let mut ready = n1.watch_ready();
    tokio::time::timeout(Duration::from_secs(30), ready.wait_for(|r| *r)).await.unwrap().unwrap();
    wait_until("node 1 in contact", || n1.in_contact());
    let map = n1.watch_map().borrow().clone();
    assert_eq!((map.tablets.len(), map.partitions.len(), map.replicas), (40, 16, 2));
    assert!(matches!(n1.grant_ids(0).await, Err(ClusterError::InvalidArgument(_))));
    let n2 = start_cfg(&net, dir.path(), 2, false, ClusterMetrics::default(), timeout);
    let n3 = start_cfg(&net, dir.path(), 3, false, ClusterMetrics::default(), timeout);
    // Not a member yet: no leader known, no contact, no grant.
    assert!(!n2.in_contact());
    assert!(n2.grant_ids(5).await.is_err());
    add(&n1, 2).await;
    add(&n1, 3).await;
    let all = [&n1, &n2, &n3];
    wait_until("three active voters", || {
        all.iter().all(|n| {
            let m = n.watch_map().borrow().clone();
            m.voters().count() == 3 && m.nodes.values().all(|x| x.state == NodeState::Active)
        })
    });
    wait_until("everyone in contact", || all.iter().all(|n| n.in_contact()));
    // Every node is granted its own block, followers through the leader.
    let mut granted = vec![grant(&n1, 100).await, grant(&n2, 10).await, grant(&n3, 1).await];
    assert_eq!(granted[0].end - granted[0].start, 100);
    // The new replicas report ready (their copies are not this crate's business).
    for n in all {
        let m = n.watch_map().borrow().clone();
        for u in m.units() {
            if m.writers(u).contains(&n.id()) && !m.serving(u).contains(&n.id()) {
                n.replica_ready(u).await.unwrap();
                // Answered after the map it speaks of is published: a filler that reads
                // its map now never sees the replica filling still (and fills it again).
                assert!(n.watch_map().borrow().serving(u).contains(&n.id()), "{u:?}");
            }
        }
    }
    // A follower answers once it applied the change, which may be before the leader has
    // published its own map: wait for node 1's.
    wait_until("every unit served by 2 replicas on node 1", || {
        let m = n1.watch_map().borrow().clone();
        m.units().all(|u| m.serving(u).len() == 2 && m.writers(u).len() == 2)
    });
    let m = n1.watch_map().borrow().clone();
    // Refused: a replica that is not filling.
    let unit = m.units().find(|&u| m.serving(u).contains(&2)).unwrap();
    assert!(matches!(n2.replica_ready(unit).await, Err(ClusterError::FailedPrecondition(_))));

    // Node 3 cut off: it loses contact, the others mark it down.
    net.cut.lock().unwrap().push(addr(3));
    wait_until("node 3 out of contact", || !n3.in_contact());
    wait_until("node 3 marked down", || {
        n1.watch_map().borrow().nodes[&3].state == NodeState::Down
            && n2.watch_map().borrow().nodes[&3].state == NodeState::Down
    });
    // The majority keeps contact (a heartbeat late on a loaded machine costs a moment's
    // resync, so this waits rather than samples).
    wait_until("nodes 1 and 2 in contact", || n1.in_contact() && n2.in_contact());
    let values: HashMap<&str, u64> = metrics.snapshot().into_iter().collect();
    assert_eq!(values["down_nodes"], 1, "{values:?}");
    assert_eq!(values["unavailable_units"], 0, "{values:?}");
    // The cut-off node cannot be granted ids.
    assert!(n3.grant_ids(5).await.is_err());
    granted.push(grant(&n2, 50).await);
    // Healed: back, and its replicas fill before serving.
    net.cut.lock().unwrap().clear();
    wait_until("node 3 back", || n1.watch_map().borrow().nodes[&3].state == NodeState::Active);
    wait_until("node 3 in contact", || n3.in_contact());
    let m = n1.watch_map().borrow().clone();
    assert!(m.units().all(|u| !m.serving(u).contains(&3)));
    assert!(m.units().any(|u| m.writers(u).contains(&3)));

    // Restart everything: grants go on above the earlier ones.
    for n in all {
        n.shutdown();
    }
    net.nodes.lock().unwrap().clear();
    let n1 = start_cfg(&net, dir.path(), 1, true, ClusterMetrics::default(), timeout);
    let n2 = start_cfg(&net, dir.path(), 2, false, ClusterMetrics::default(), timeout);
    let n3 = start_cfg(&net, dir.path(), 3, false, ClusterMetrics::default(), timeout);
    granted.push(grant(&n3, 7).await);
    granted.push(grant(&n1, 7).await);
    for w in granted.windows(2) {
        assert!(w[0].end <= w[1].start, "{granted:?}");
    }
    assert!(granted[0].start >= 1);
    for n in [&n1, &n2, &n3] {
        n.shutdown();
    }
}
