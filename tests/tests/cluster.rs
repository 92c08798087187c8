//! A cluster of real `neardup serve` processes: kill the leader, restart everything, grow and
//! shrink under a status-reading client, and partition the leader away (network namespaces).
//!
//! Every test keeps the set of membership changes the cluster acknowledged and checks that
//! the map's node set at the end is exactly that set. No test asserts on time: waits are
//! bounded safety nets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use neardup_proto::admin::{RemoveNodeRequest, Role, StatusResponse, Tablet};
use neardup_tests::cluster::{Member, Netns, add_node, admin, check_well_formed, node_ids};
use neardup_tests::skip_without;
use serde_json::Value;

/// The replicated part of a status: everything but who answers and what it alone knows.
type MapView = (String, u64, Vec<(u64, String, String, i32, i32)>, Vec<Tablet>);

/// What no fault may change: the cluster's id and its members' ids, addresses and roles.
/// (States, placement and the epoch move on their own: a node is marked down and back, its
/// replicas fill and serve.)
fn members_of(v: &MapView) -> (String, Vec<(u64, String, String, i32)>) {
    let nodes = v.2.iter().map(|(id, p, i, role, _)| (*id, p.clone(), i.clone(), *role)).collect();
    (v.0.clone(), nodes)
}

fn map_view(s: &StatusResponse) -> MapView {
    let nodes = s
        .nodes
        .iter()
        .map(|n| (n.id, n.public_addr.clone(), n.internal_addr.clone(), n.role, n.state))
        .collect();
    (s.cluster_id.clone(), s.epoch, nodes, s.tablets.clone())
}

/// Starts node 1 with `--bootstrap`, then nodes 2..=n with `--join` (and an AddNode of the
/// test's own, idempotent, whose answer is the acknowledgement); waits until every node sees
/// every node as a voter (up to 5), and a leader. Returns the members and the acknowledged node ids.
async fn form(dir: &Path, n: u64) -> (Vec<Member>, BTreeSet<u64>) {
    let mut members: Vec<Member> = (1..=n).map(|id| Member::on_loopback(id, dir)).collect();
    members[0].start_first(&["--bootstrap"]).await;
    members[0].wait_status("a leader", |s| s.leader == 1 && s.epoch >= 1).await;
    let mut acked = BTreeSet::from([1]);
    for i in 1..n as usize {
        let via = members[0].internal.clone();
        members[i].start_first(&["--join", &via]).await;
        let m = &members[i];
        let r = retry(|| add_node(&via, m)).await;
        assert!(r.epoch >= 1);
        acked.insert(m.id);
    }
    for m in members.iter_mut() {
        m.wait_status("every node a voter, and a leader", |s| {
            node_ids(s).len() == n as usize
                && s.leader != 0
                && s.nodes.iter().all(|x| x.role == Role::Voter as i32)
        })
        .await;
    }
    // Each node has applied the map and its shard serves: the public health says SERVING.
    for m in &members {
        let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
        let limit = Instant::now() + Duration::from_secs(120);
        while m.public_health().await != Some(serving) {
            assert!(Instant::now() < limit, "node {} never SERVING:\n{}", m.id, m.log_text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    (members, acked)
}

/// Retries a call that may meet no leader yet (bounded: 200 tries, a safety net).
async fn retry<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut last = None;
    for _ in 0..200 {
        match call().await {
            Ok(v) => return v,
            Err(s)
                if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) =>
            {
                last = Some(s);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => panic!("refused: {s:?}"),
        }
    }
    panic!("no answer after 200 tries: {last:?}")
}

/// Waits until every running member sees the same map, with `ids` as its nodes and a leader
/// among them; returns that map.
async fn agreed(members: &mut [&mut Member], ids: &BTreeSet<u64>) -> MapView {
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        let mut views = Vec::new();
        for m in members.iter() {
            match m.status().await {
                Ok(s) if &node_ids(&s) == ids && ids.contains(&s.leader) => {
                    check_well_formed(&s).unwrap();
                    views.push(map_view(&s));
                }
                _ => break,
            }
        }
        if views.len() == members.len() && views.windows(2).all(|w| w[0] == w[1]) {
            return views.swap_remove(0);
        }
        assert!(Instant::now() < limit, "no agreement on nodes {ids:?}: {views:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_the_leader_elects_another_with_the_same_members() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, acked) = form(dir.path(), 3).await;
    let before = agreed(&mut members.iter_mut().collect::<Vec<_>>(), &acked).await;
    for round in 0..2 {
        let leader = members[0].status().await.unwrap().leader;
        let li = members.iter().position(|m| m.id == leader).unwrap();
        members[li].kill9();
        for (i, m) in members.iter_mut().enumerate() {
            if i != li {
                m.wait_status("a new leader", |s| s.leader != 0 && s.leader != leader).await;
            }
        }
        let mut rest: Vec<&mut Member> =
            members.iter_mut().enumerate().filter(|(i, _)| *i != li).map(|(_, m)| m).collect();
        let after = agreed(&mut rest, &acked).await;
        assert_eq!(members_of(&after), members_of(&before), "round {round}");
        assert!(after.1 >= before.1, "round {round}: the epoch went back");
        // The killed node comes back with its id and map (no flags: identity from its dir).
        members[li].start(&[]);
        let now = agreed(&mut members.iter_mut().collect::<Vec<_>>(), &acked).await;
        assert_eq!(members_of(&now), members_of(&before), "round {round}");
        assert!(now.1 >= after.1, "round {round}: the epoch went back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_every_node_keeps_the_members_and_the_epoch_grows() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, acked) = form(dir.path(), 3).await;
    let before = agreed(&mut members.iter_mut().collect::<Vec<_>>(), &acked).await;
    for m in members.iter_mut() {
        m.terminate();
    }
    for m in members.iter_mut() {
        m.start(&[]);
    }
    let after = agreed(&mut members.iter_mut().collect::<Vec<_>>(), &acked).await;
    assert_eq!(members_of(&after), members_of(&before), "same members after a restart of all");
    assert!(after.1 >= before.1, "the epoch went back: {} after {}", after.1, before.1);
    // A restart with another id on a node's directory is refused, clearly.
    members[2].terminate();
    let out = neardup_tests::run(&[
        "serve",
        "--data",
        members[2].data.to_str().unwrap(),
        "--node-id",
        "7",
        "--listen",
        "127.0.0.1:0",
        "--internal-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("belongs to node 3"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_to_five_and_remove_one_while_a_client_reads_status() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, mut acked) = form(dir.path(), 3).await;
    // The reader: status from every node in turn, until told to stop (at most 20,000 calls
    // or two minutes). Every answer must be well-formed, and no node's epoch goes back.
    let stop = Arc::new(AtomicBool::new(false));
    let addrs: Vec<String> = members.iter().map(|m| m.internal.clone()).collect();
    let reader = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            let mut answers = 0u64;
            let end = Instant::now() + Duration::from_secs(120);
            for i in 0..20_000usize {
                if stop.load(Ordering::Relaxed) || Instant::now() > end {
                    break;
                }
                let addr = &addrs[i % addrs.len()];
                let Ok(mut c) = admin(addr).await else { continue };
                let Ok(s) = c.status(neardup_proto::admin::StatusRequest {}).await else {
                    continue;
                };
                let s = s.into_inner();
                check_well_formed(&s).unwrap();
                let prev = last.insert(addr.clone(), s.epoch).unwrap_or(0);
                assert!(s.epoch >= prev, "node at {addr}: epoch {} after {prev}", s.epoch);
                answers += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            answers
        })
    };
    // Changes sent to a follower, which forwards them to the leader.
    let leader = members[0].status().await.unwrap().leader;
    let follower = members.iter().find(|m| m.id != leader).unwrap().internal.clone();
    for id in 4..=5 {
        let mut m = Member::on_loopback(id, dir.path());
        let via = follower.clone();
        m.start_first(&["--join", &via]).await;
        let r = retry(|| add_node(&via, &m)).await;
        assert!(r.epoch >= 1);
        acked.insert(id);
        members.push(m);
    }
    // Five voters once the new nodes have caught up.
    members[0]
        .wait_status("five voters", |s| {
            s.nodes.len() == 5 && s.nodes.iter().all(|n| n.role == Role::Voter as i32)
        })
        .await;
    // The leader refuses a removal while it does not see a quorum of the other voters
    // caught up (a loaded machine delays followers): wait until it sees every voter caught
    // up, and retry a refusal for that reason for a while.
    let all_caught_up = Instant::now() + Duration::from_secs(120);
    let leader = 'seen: loop {
        for m in members.iter() {
            if let Ok(s) = m.status().await
                && s.leader == s.node_id
                && s.nodes.len() == 5
                && s.nodes.iter().all(|n| n.caught_up)
            {
                break 'seen s.leader;
            }
        }
        assert!(Instant::now() < all_caught_up, "no leader saw every voter caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let via = members.iter().find(|m| m.id != leader && m.id != 2).unwrap().internal.clone();
    let until = Instant::now() + Duration::from_secs(60);
    let r = loop {
        let r = retry(|| async {
            match admin(&via).await?.remove_node(RemoveNodeRequest { node_id: 2 }).await {
                Ok(r) => Ok(Ok(r.into_inner())),
                Err(s)
                    if s.code() == tonic::Code::FailedPrecondition
                        && s.message().contains("would lose quorum")
                        && Instant::now() < until =>
                {
                    Ok(Err(s))
                }
                Err(s) => Err(s),
            }
        })
        .await;
        match r {
            Ok(r) => break r,
            Err(s) => {
                eprintln!("removal refused for now: {}", s.message());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(r.epoch >= 1);
    acked.remove(&2);
    let mut rest: Vec<&mut Member> = members.iter_mut().filter(|m| m.id != 2).collect();
    let view = agreed(&mut rest, &acked).await;
    assert_eq!(view.2.iter().map(|n| n.0).collect::<BTreeSet<_>>(), acked);
    stop.store(true, Ordering::Relaxed);
    let answers = reader.await.unwrap();
    assert!(answers > 0, "the reader got answers");
    eprintln!("{answers} status answers checked");
}

/// `neardup cluster status` inside member `m`'s namespace, retried until `ready` holds
/// (a safety net of two minutes).
fn wait_cli(m: &Member, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(v) = m.status_cli()
            && ready(&v)
        {
            return v;
        }
        assert!(
            Instant::now() < limit,
            "node {}: no {what}; last {:?}\n{}",
            m.id,
            m.status_cli(),
            m.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ids_of(v: &Value) -> BTreeSet<u64> {
    v["nodes"]
        .as_array()
        .map(|a| a.iter().filter_map(|n| n["id"].as_u64()).collect())
        .unwrap_or_default()
}

/// The replicated part of a status printed by `neardup cluster status`.
fn json_map(v: &Value) -> Value {
    let nodes: Vec<Value> = v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            serde_json::json!([
                n["id"],
                n["public_addr"],
                n["internal_addr"],
                n["role"],
                n["state"]
            ])
        })
        .collect();
    serde_json::json!([v["cluster_id"], v["epoch"], nodes, v["tablets"]])
}

#[test]
fn a_partitioned_leader_cannot_change_the_map_and_one_map_remains_after_healing() {
    let net = match Netns::create(3) {
        Ok(n) => n,
        Err(why) => {
            skip_without(&format!("network namespaces (ip netns): {why}"));
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let mut members = net.members(dir.path());
    members[0].start(&["--bootstrap"]);
    wait_cli(&members[0], "a leader", |v| v["leader"] == 1);
    let via = members[0].internal.clone();
    let mut acked = BTreeSet::from([1u64]);
    for i in 1..3 {
        members[i].start(&["--join", &via]);
        let m = &members[i];
        let id = m.id.to_string();
        let args = [
            "cluster",
            "add",
            "--addr",
            &via,
            "--node-id",
            &id,
            "--public",
            &m.public,
            "--internal",
            &m.internal,
        ];
        let mut done = false;
        for _ in 0..100 {
            if members[0].cli(&args).is_ok() {
                done = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(done, "node {id} added");
        acked.insert(m.id);
    }
    for m in &members {
        wait_cli(m, "three voters and a leader", |v| {
            ids_of(v).len() == 3
                && !v["leader"].is_null()
                && v["nodes"].as_array().unwrap().iter().all(|n| n["role"] == "voter")
        });
    }
    let leader = members[0].status_cli().unwrap()["leader"].as_u64().unwrap();
    let li = (leader - 1) as usize;
    net.cut(li).unwrap();
    // The minority side (the old leader alone) cannot change the map.
    let old = &members[li];
    let refused = old.cli(&[
        "cluster",
        "add",
        "--addr",
        &old.internal,
        "--node-id",
        "9",
        "--public",
        "10.201.0.99:7000",
        "--internal",
        "10.201.0.99:7001",
        "--timeout-ms",
        "3000",
    ]);
    assert!(refused.is_err(), "the minority added a node: {refused:?}");
    eprintln!("leader {leader} cut off; its AddNode: {}", refused.unwrap_err());
    // The majority elects a leader of its own and can.
    let majority: Vec<usize> = (0..3).filter(|&i| i != li).collect();
    let m = &members[majority[0]];
    let mut added = None;
    for _ in 0..100 {
        match m.cli(&[
            "cluster",
            "add",
            "--addr",
            &m.internal,
            "--node-id",
            "4",
            "--public",
            "10.201.0.98:7000",
            "--internal",
            "10.201.0.98:7001",
            "--timeout-ms",
            "3000",
        ]) {
            Ok(v) => {
                added = Some(v);
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    assert!(added.is_some(), "the majority could not add a node:\n{}", m.log_text());
    eprintln!("the majority's AddNode: {}", added.unwrap_or_default());
    acked.insert(4);
    net.heal(li).unwrap();
    // One map again, everywhere: exactly the acknowledged nodes.
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        let views: Vec<Value> = members.iter().filter_map(|m| m.status_cli().ok()).collect();
        let one = views.len() == 3
            && views.iter().all(|v| ids_of(v) == acked && !v["leader"].is_null())
            && views.windows(2).all(|w| json_map(&w[0]) == json_map(&w[1]));
        if one {
            break;
        }
        assert!(Instant::now() < limit, "no single map after healing: {views:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for m in members.iter_mut() {
        m.kill9();
    }
    drop(members);
    drop(net);
}

#[test]
fn the_cluster_map_benchmark_prints_its_figures() {
    let neardup = neardup_tests::binary();
    let out = neardup_tests::run_bench(&[
        "cluster-map",
        "--neardup",
        neardup.to_str().unwrap(),
        "--nodes",
        "3",
        "--kills",
        "1",
        "--changes",
        "1",
        "--tick-ms",
        "20",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("3 nodes: new leader after kill -9"), "{stdout}");
    let last = stdout.lines().last().expect("a JSON line");
    let r: Value = serde_json::from_str(last).expect("the last line is JSON");
    let size = &r["cluster_map"][0];
    assert_eq!(size["nodes"], 3);
    assert_eq!(size["kills"], 1);
    assert_eq!(size["changes"], 2, "an AddNode and a RemoveNode");
    for key in ["new_leader_ms", "change_commit_ms", "change_seen_by_all_ms"] {
        let (median, max) = (size[key]["median"].as_f64(), size[key]["max"].as_f64());
        assert!(median.unwrap() > 0.0 && max.unwrap() >= median.unwrap(), "{key}: {size}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_errors_have_their_codes_and_the_epoch_and_metrics_show_the_cluster() {
    use neardup_proto::admin::{AddNodeRequest, TransferLeaderRequest};
    use neardup_proto::internal::RaftMessage;
    use neardup_proto::internal::raft_client::RaftClient;
    use tonic::Code;

    let dir = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", neardup_tests::free_port());
    let mut m = Member::on_loopback(1, dir.path());
    m.start(&["--bootstrap", "--set", &format!("metrics_listen={metrics}")]);
    let s = m.wait_status("a leader", |s| s.leader == 1).await;
    let mut a = admin(&m.internal).await.unwrap();
    let epoch_of = |st: &tonic::Status| -> u64 {
        st.metadata().get("neardup-epoch").unwrap().to_str().unwrap().parse().unwrap()
    };
    let bad = |node_id, public: &str, internal: &str| AddNodeRequest {
        node_id,
        public_addr: public.into(),
        internal_addr: internal.into(),
    };
    let cases = [
        (a.add_node(bad(0, "h:1", "h:2")).await.unwrap_err(), Code::InvalidArgument),
        (a.add_node(bad(1, "h:1", "h:2")).await.unwrap_err(), Code::AlreadyExists),
        (a.remove_node(RemoveNodeRequest { node_id: 42 }).await.unwrap_err(), Code::NotFound),
        (
            a.remove_node(RemoveNodeRequest { node_id: 1 }).await.unwrap_err(),
            Code::FailedPrecondition,
        ),
        (
            // Only a voter can lead: a transfer to anything else is refused as such.
            a.transfer_leader(TransferLeaderRequest { node_id: 42 }).await.unwrap_err(),
            Code::FailedPrecondition,
        ),
    ];
    for (status, code) in cases {
        assert_eq!(status.code(), code, "{status:?}");
        assert_eq!(epoch_of(&status), s.epoch, "the error carries the epoch: {status:?}");
    }
    assert!(m.status().await.unwrap().epoch == s.epoch, "refused changes change nothing");
    // A node joining with an id in use by another address stops with a clear error.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let mut twin = Member::on_loopback(1, &other);
    twin.start(&["--join", &m.internal]);
    assert!(!twin.wait_exit(), "the twin must fail");
    let log = twin.log_text();
    assert!(log.contains("cannot join the cluster") && log.contains("already in use"), "{log}");
    // A Raft message that does not decode is refused; the node goes on.
    let mut raft = RaftClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{}", m.internal))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let junk = RaftMessage { message: vec![0xff; 7], from_id: 9, from_addr: "h:1".into() };
    assert_eq!(raft.step(junk).await.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(m.status().await.unwrap().leader, 1);
    // The cluster's series are on the node's /metrics.
    let body = {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&metrics).unwrap();
        c.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).unwrap();
        body
    };
    for series in ["neardup_cluster_epoch", "neardup_cluster_is_leader 1", "neardup_cluster_term"] {
        assert!(body.contains(series), "{series} missing:\n{body}");
    }
}

/// A single-node server (no cluster flags) refuses Raft messages with FAILED_PRECONDITION.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_outside_a_cluster_refuses_raft_messages() {
    use neardup_proto::internal::RaftMessage;
    use neardup_proto::internal::raft_client::RaftClient;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node =
        neardup_tests::Node::start(&["shard", "--data", data.to_str().unwrap()], dir.path());
    node.serving().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let msg = RaftMessage { message: vec![], from_id: 2, from_addr: "h:1".into() };
    let e = RaftClient::new(channel).step(msg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not in a cluster"), "{e:?}");
    node.terminate();
}
