//! Tests of the cluster router over in-memory nodes (brute-force storage, able to fail, be
//! slow or answer "epoch moved"), checked against a brute force over what was acknowledged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use neardup_cluster::map::{
    ClusterMap, DesignInfo, NodeInfo, NodeState, Partition, Tablet, TabletState,
};
use neardup_proto::internal::ShardDocument;
use neardup_server::data_types::hits_to_resolve;
use neardup_server::{ProbeAnswer, Resolve, ScanPage};
use tonic::{Code, Request};

use super::*;

const DESIGN: &str = "5c2";

/// A node keeping its tablets and partitions in memory, probing by brute force restricted
/// to what a real table answers (entries sharing the table's prefix with the query).
struct MemNode {
    design: Arc<Design>,
    entries: Mutex<BTreeSet<(u32, u64, u64)>>,
    docs: Mutex<HashMap<String, DocInfo>>,
    fail: AtomicBool,
    /// Sleep up to this many ms per call (a pseudo-random amount).
    jitter_ms: AtomicU64,
    /// Sleep this many ms per call.
    delay_ms: AtomicU64,
    jitter_seed: AtomicU64,
    /// "Epoch moved" answers left, shared by the nodes of a test, and the epoch they name.
    moved: Arc<AtomicU64>,
    moved_epoch: AtomicU64,
    calls: AtomicU64,
    /// This node's id and the cluster's map, when it resolves the hits of partitions it
    /// serves as a real node does; unset, it resolves none.
    serves: Mutex<Option<(NodeId, watch::Receiver<Arc<ClusterMap>>)>>,
}

impl MemNode {
    fn new(design: Arc<Design>, moved: Arc<AtomicU64>) -> Arc<MemNode> {
        Arc::new(MemNode {
            design,
            entries: Mutex::new(BTreeSet::new()),
            docs: Mutex::new(HashMap::new()),
            fail: AtomicBool::new(false),
            jitter_ms: AtomicU64::new(0),
            delay_ms: AtomicU64::new(0),
            jitter_seed: AtomicU64::new(1),
            moved,
            moved_epoch: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            serves: Mutex::new(None),
        })
    }

    async fn gate(&self) -> DataResult<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err(DataError::Unavailable("told to fail".into()));
        }
        if self.moved.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |m| m.checked_sub(1)).is_ok()
        {
            let epoch = self.moved_epoch.load(Ordering::SeqCst);
            return Err(DataError::EpochMoved { epoch, why: "told to".into() });
        }
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let j = self.jitter_ms.load(Ordering::SeqCst);
        if j > 0 {
            let s = self.jitter_seed.fetch_add(0x9E37_79B9, Ordering::SeqCst);
            let ms = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) % (j + 1);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok(())
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `d` as a node returns it: with its sketch only when `sketches` asks for it.
fn with_sketch(d: &DocInfo, sketches: bool) -> DocInfo {
    DocInfo { sketch: if sketches { d.sketch.clone() } else { None }, ..d.clone() }
}

#[tonic::async_trait]
impl NodeApi for MemNode {
    async fn tablet_write(
        &self,
        _: u64,
        ops: Vec<(u32, TabletOp)>,
        _: bool,
        _: Option<Instant>,
    ) -> DataResult<()> {
        self.gate().await?;
        let mut e = Self::lock(&self.entries);
        for (t, op) in ops {
            match op {
                TabletOp::Put { gid, fp } => e.insert((t, gid, fp)),
                TabletOp::Remove { gid, fp } => e.remove(&(t, gid, fp)),
            };
        }
        Ok(())
    }

    async fn tablet_probe(
        &self,
        _: u64,
        probes: Vec<(u32, u64)>,
        k: u32,
        max: usize,
        resolve: Resolve,
        _: Option<Instant>,
    ) -> DataResult<ProbeAnswer> {
        self.gate().await?;
        let e = Self::lock(&self.entries);
        let results = probes
            .into_iter()
            .map(|(t, q)| {
                let spec = &self.design.tables()[t as usize];
                let shift = 64 - spec.prefix_bits;
                let pq = spec.perm.apply(q) >> shift;
                let hits: Vec<TabletHit> = e
                    .iter()
                    .filter(|(et, _, fp)| *et == t && spec.perm.apply(*fp) >> shift == pq)
                    .map(|&(_, gid, fp)| TabletHit { gid, fp, distance: (fp ^ q).count_ones() })
                    .filter(|h| h.distance <= k)
                    .collect();
                let cut = hits.len() > max;
                (hits.into_iter().take(max).collect(), cut)
            })
            .collect::<Vec<_>>();
        drop(e);
        let (gids, resolved) = match &*Self::lock(&self.serves) {
            Some((id, map)) if resolve != Resolve::No => {
                let map = map.borrow();
                hits_to_resolve(&results, |p| map.serving(Unit::Partition(p)).contains(id))
            }
            _ => (Vec::new(), Vec::new()),
        };
        let sketches = resolve.sketches();
        let docs = Self::lock(&self.docs)
            .values()
            .filter(|d| gids.binary_search(&d.gid).is_ok())
            .map(|d| with_sketch(d, sketches))
            .collect();
        Ok(ProbeAnswer { results, docs, resolved })
    }

    async fn doc_write(&self, _: u64, ops: Vec<DocOp>, _: Option<Instant>) -> DataResult<()> {
        self.gate().await?;
        let mut docs = Self::lock(&self.docs);
        for op in ops {
            match op {
                DocOp::Put(d) => {
                    let wins = docs
                        .get(&d.name)
                        .is_none_or(|h| h.gid == d.gid || (d.ts_ms, d.gid) > (h.ts_ms, h.gid));
                    if wins {
                        docs.insert(d.name.clone(), d);
                    }
                }
                DocOp::Remove { gid, name } => {
                    if docs.get(&name).is_some_and(|h| h.gid == gid) {
                        docs.remove(&name);
                    }
                }
            }
        }
        Ok(())
    }

    async fn doc_lookup(
        &self,
        _: u64,
        names: Vec<String>,
        _: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        self.gate().await?;
        let docs = Self::lock(&self.docs);
        Ok(names.iter().map(|n| docs.get(n).cloned()).collect())
    }

    async fn doc_resolve(
        &self,
        _: u64,
        gids: Vec<u64>,
        sketches: bool,
        _: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        self.gate().await?;
        let docs = Self::lock(&self.docs);
        let find = |g: &u64| docs.values().find(|d| d.gid == *g).map(|d| with_sketch(d, sketches));
        Ok(gids.iter().map(find).collect())
    }

    /// Pages of at most `limit` (3 when 0) entries, cut between permuted values.
    async fn tablet_scan(
        &self,
        _: u64,
        table: u32,
        start: u64,
        end: u64,
        from: u64,
        limit: u32,
        _: Option<Instant>,
    ) -> DataResult<ScanPage<(u64, u64)>> {
        self.gate().await?;
        let spec = &self.design.tables()[table as usize];
        let e = Self::lock(&self.entries);
        let from = from.max(start);
        let mut out: Vec<(u64, u64, u64)> = e
            .iter()
            .filter(|(t, _, fp)| *t == table && (from..=end).contains(&spec.perm.apply(*fp)))
            .map(|&(_, gid, fp)| (spec.perm.apply(fp), gid, fp))
            .collect();
        out.sort_unstable();
        let limit = if limit == 0 { 3 } else { limit as usize };
        let mut next = None;
        if let Some(&(cut, ..)) = out.get(limit) {
            out.retain(|&(p, ..)| p < cut);
            next = Some(cut);
        }
        Ok(ScanPage { items: out.into_iter().map(|(_, g, f)| (g, f)).collect(), next })
    }

    /// Pages of at most `limit` (2 when 0) documents, by gid.
    async fn partition_scan(
        &self,
        _: u64,
        partition: u32,
        cursor: u64,
        limit: u32,
        _: Option<Instant>,
    ) -> DataResult<ScanPage<DocInfo>> {
        self.gate().await?;
        let docs = Self::lock(&self.docs);
        let mut all: Vec<DocInfo> =
            docs.values().filter(|d| gid_partition(d.gid) == partition).cloned().collect();
        all.sort_unstable_by_key(|d| d.gid);
        let limit = if limit == 0 { 2 } else { limit as usize };
        let items: Vec<DocInfo> = all.into_iter().skip(cursor as usize).take(limit + 1).collect();
        let next = (items.len() > limit).then_some(cursor + limit as u64);
        Ok(ScanPage { items: items.into_iter().take(limit).collect(), next })
    }

    async fn stats(&self, _: u64, _: Option<Instant>) -> DataResult<NodeStats> {
        self.gate().await?;
        let docs = Self::lock(&self.docs);
        let mut partitions: BTreeMap<u32, u64> = BTreeMap::new();
        for d in docs.values() {
            *partitions.entry(gid_partition(d.gid)).or_default() += 1;
        }
        let stats = StatsResponse { documents: docs.len() as u64, ..Default::default() };
        Ok(NodeStats { stats, partitions: partitions.into_iter().collect() })
    }
}

/// Ids from one counter, in blocks.
struct Counter(AtomicU64);

#[tonic::async_trait]
impl IdSource for Counter {
    async fn grant(&self, count: u64) -> Result<Range<u64>, Status> {
        let start = self.0.fetch_add(count, Ordering::SeqCst);
        Ok(start..start + count)
    }
}

/// A map of `n` nodes (addresses from `addrs`, or made up), the design's tablets cut by
/// `split_bits`, `parts` partitions, every unit on 2 nodes, spread.
fn map_of(addrs: &[String], split_bits: u32, parts: u32) -> ClusterMap {
    let design = Design::parse(DESIGN).unwrap();
    let n = addrs.len() as u64;
    let mut map = ClusterMap {
        cluster_id: "test".into(),
        epoch: 5,
        design: Some(DesignInfo {
            name: DESIGN.into(),
            tables: design.tables().len() as u32,
            max_k: design.max_k(),
        }),
        replicas: 2,
        split_bits,
        ..Default::default()
    };
    for (i, a) in addrs.iter().enumerate() {
        let id = i as u64 + 1;
        map.nodes.insert(id, NodeInfo::active_voter(id, a.clone(), a.clone()));
    }
    let two = |i: u64| vec![i % n + 1, (i + 1) % n + 1];
    let mut i = 0;
    for table in 0..design.tables().len() as u32 {
        for r in 0..(1u64 << split_bits) {
            let (start, end) = if split_bits == 0 {
                (0, u64::MAX)
            } else {
                let s = r << (64 - split_bits);
                (s, s | (u64::MAX >> split_bits))
            };
            map.tablets.push(Tablet {
                table,
                start,
                end,
                nodes: two(i),
                state: TabletState::Active,
                filling: Vec::new(),
                writers_epoch: 0,
            });
            i += 1;
        }
    }
    map.partitions = (0..parts)
        .map(|p| Partition {
            index: p,
            nodes: two(u64::from(p)),
            filling: Vec::new(),
            writers_epoch: 0,
        })
        .collect();
    map
}

struct Cluster {
    nodes: BTreeMap<NodeId, Arc<MemNode>>,
    map_tx: watch::Sender<Arc<ClusterMap>>,
    moved: Arc<AtomicU64>,
    ids: Arc<Counter>,
}

impl Cluster {
    fn new(split_bits: u32) -> Cluster {
        let addrs: Vec<String> = (1..=3).map(|i| format!("node{i}:1")).collect();
        let map = map_of(&addrs, split_bits, 16);
        let design = Arc::new(Design::parse(DESIGN).unwrap());
        let moved = Arc::new(AtomicU64::new(0));
        let nodes: BTreeMap<NodeId, Arc<MemNode>> =
            (1..=3).map(|id| (id, MemNode::new(design.clone(), moved.clone()))).collect();
        let (map_tx, _) = watch::channel(Arc::new(map));
        for (&id, node) in &nodes {
            *MemNode::lock(&node.serves) = Some((id, map_tx.subscribe()));
        }
        Cluster { nodes, map_tx, moved, ids: Arc::new(Counter(AtomicU64::new(0))) }
    }

    fn router(&self, local: Option<NodeId>) -> ClusterRouter {
        let nodes = self.nodes.clone();
        let resolver: NodeResolver = Arc::new(move |id| match nodes.get(&id) {
            Some(n) => n.clone() as Arc<dyn NodeApi>,
            None => Arc::new(Unreachable(format!("no node {id}"))),
        });
        ClusterRouter::new(self.map_tx.subscribe(), resolver, self.ids.clone(), local)
    }

    /// What a write that failed halfway leaves: `d`'s entries on every node's tablets, the
    /// document itself on `holder` alone.
    async fn half_written(&self, epoch: u64, d: DocInfo, holder: NodeId) {
        let (gid, fp) = (d.gid, d.fp);
        for n in self.nodes.values() {
            let ops = (0..10).map(|t| (t, TabletOp::Put { gid, fp })).collect();
            n.tablet_write(epoch, ops, false, None).await.unwrap();
        }
        self.nodes[&holder].doc_write(epoch, vec![DocOp::Put(d)], None).await.unwrap();
    }

    fn set_state(&self, id: NodeId, state: NodeState) {
        self.map_tx.send_modify(|m| {
            let mut next = (**m).clone();
            next.nodes.get_mut(&id).unwrap().state = state;
            next.epoch += 1;
            *m = Arc::new(next);
        });
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// `fp` with up to `max` random bits flipped.
    fn near(&mut self, fp: u64, max: u64) -> u64 {
        let mut f = fp;
        for _ in 0..self.below(max + 1) {
            f ^= 1 << self.below(64);
        }
        f
    }
}

/// The acknowledged documents: name -> (fp, ts).
type Model = BTreeMap<String, (u64, i64)>;

/// Brute force: (distance, ts, name) of every document within k of `q` but `skip`.
fn brute(model: &Model, q: u64, k: u32, skip: Option<&str>) -> Vec<(u32, i64, String)> {
    let mut v: Vec<(u32, i64, String)> = model
        .iter()
        .filter(|(n, _)| Some(n.as_str()) != skip)
        .map(|(n, &(fp, ts))| ((fp ^ q).count_ones(), ts, n.clone()))
        .filter(|(d, _, _)| *d <= k)
        .collect();
    v.sort();
    v
}

fn doc(name: &str, fp: u64, ts: i64) -> ShardDocument {
    ShardDocument { id: name.into(), fingerprint: fp, timestamp_ms: ts, sketch: Vec::new() }
}

fn probe_req(fps: Vec<u64>, k: u32, limit: u32) -> ProbeRequest {
    ProbeRequest { fingerprints: fps, k, limit, ..Default::default() }
}

/// Checks a query result against the brute force: with `limit` at least the brute force's
/// size the same documents and distances in (distance, timestamp) order; otherwise a
/// prefix in that order, marked truncated.
fn check_result(r: &QueryResult, want: &[(u32, i64, String)], limit: usize, model: &Model) {
    let got: Vec<(u32, i64, String)> =
        r.matches.iter().map(|m| (m.distance, m.timestamp_ms, m.id.clone())).collect();
    for m in &r.matches {
        assert_eq!(model.get(&m.id).map(|x| x.0), Some(m.fingerprint), "{m:?}");
    }
    let keys: Vec<(u32, i64)> = got.iter().map(|g| (g.0, g.1)).collect();
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "order: {got:?}");
    assert_eq!(got.len(), want.len().min(limit), "got {got:?} want {want:?}");
    assert_eq!(r.truncated, want.len() > limit);
    if want.len() <= limit {
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, want);
    } else {
        // A prefix by (distance, ts): nothing left out comes strictly before what is in.
        let last = keys.last().copied().unwrap();
        for w in want {
            if (w.0, w.1) < last {
                assert!(got.contains(w), "{w:?} left out before {last:?}");
            }
        }
        for g in &got {
            assert!(want.contains(g));
        }
    }
}

async fn run_random(c: &Cluster, router: &ClusterRouter, seed: u64, steps: usize) -> Model {
    let mut rng = Rng(seed);
    let mut model = Model::new();
    let bases: Vec<u64> = (0..8).map(|_| rng.next()).collect();
    let mut ts = 0i64;
    for _ in 0..steps {
        let base = bases[rng.below(bases.len() as u64) as usize];
        match rng.below(10) {
            0..=2 => {
                let n = 1 + rng.below(4);
                let mut docs = Vec::new();
                for _ in 0..n {
                    ts += 1 + rng.below(3) as i64 - 1;
                    docs.push(doc(&format!("d{}", rng.below(30)), rng.near(base, 4), ts));
                }
                let (mut ins, mut rep) = (0, 0);
                for d in &docs {
                    ins += 1;
                    rep += u64::from(model.contains_key(&d.id));
                    model.insert(d.id.clone(), (d.fingerprint, d.timestamp_ms));
                }
                let w = WriteRequest { documents: docs, ..Default::default() };
                let r = router.write(w, None).await.unwrap();
                assert_eq!((r.inserted, r.replaced), (ins, rep));
            }
            3 => {
                let ids: Vec<String> =
                    (0..1 + rng.below(3)).map(|_| format!("d{}", rng.below(30))).collect();
                let must = rng.below(3) == 0;
                let mut uniq: Vec<String> = ids.clone();
                uniq.dedup();
                let all_there = ids.iter().all(|i| model.contains_key(i));
                let w = WriteRequest {
                    deletes: ids.clone(),
                    deletes_must_exist: must,
                    ..Default::default()
                };
                let r = router.write(w, None).await;
                if must && !all_there {
                    assert_eq!(r.unwrap_err().code(), Code::NotFound);
                    continue;
                }
                let r = r.unwrap();
                let mut deleted = 0;
                let mut missing = Vec::new();
                for i in &ids {
                    if model.remove(i).is_some() {
                        deleted += 1;
                    } else {
                        missing.push(i.clone());
                    }
                }
                assert_eq!((r.deleted, r.missing), (deleted, missing));
            }
            4..=7 => {
                let qs: Vec<u64> = (0..1 + rng.below(3)).map(|_| rng.near(base, 4)).collect();
                let k = rng.below(4) as u32;
                let limit = if rng.below(3) == 0 { 2 } else { 1000 };
                let r = router.probe(probe_req(qs.clone(), k, limit), None).await.unwrap();
                assert_eq!(r.results.len(), qs.len());
                for (q, res) in qs.iter().zip(&r.results) {
                    assert_eq!(res.fingerprint, *q);
                    check_result(res, &brute(&model, *q, k, None), limit as usize, &model);
                }
            }
            _ => {
                ts += 1;
                let name = format!("d{}", rng.below(30));
                let fp = rng.near(base, 4);
                let k = rng.below(4) as u32;
                let skip = rng.below(2) == 0;
                let a = AdmitRequest {
                    document: Some(doc(&name, fp, ts)),
                    k,
                    limit: 1000,
                    skip_insert_if_duplicate: skip,
                    ..Default::default()
                };
                let want = brute(&model, fp, k, Some(&name));
                let d = router.admit(a, None).await.unwrap().decision.unwrap();
                assert_eq!(d.duplicate, !want.is_empty(), "{name} {want:?}");
                check_result(
                    &QueryResult {
                        matches: d.matches.clone(),
                        truncated: d.truncated,
                        fingerprint: fp,
                    },
                    &want,
                    1000,
                    &model,
                );
                assert_eq!(d.inserted, !(skip && d.duplicate));
                if !d.duplicate {
                    assert_eq!(d.original_id, name);
                }
                if d.inserted {
                    assert_eq!(d.replaced, model.contains_key(&name));
                    model.insert(name, (fp, ts));
                }
            }
        }
    }
    let _ = c;
    model
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_match_the_brute_force() {
    for split_bits in [0, 2] {
        let c = Cluster::new(split_bits);
        let router = c.router(Some(1));
        let mut health = router.health();
        let serving = health.wait_for(|h| *h == ShardHealth::Serving);
        tokio::time::timeout(Duration::from_secs(10), serving).await.unwrap().unwrap();
        let model = run_random(&c, &router, 0x5eed + u64::from(split_bits), 400).await;
        // Every node holds 2/3 of the partitions' documents, counted once each in stats.
        let s = router.stats(None).await.unwrap();
        assert_eq!(s.documents, model.len() as u64);
        // Every document is on both replicas of its partition.
        let map = c.map_tx.borrow().clone();
        for (name, (fp, _)) in &model {
            let p = map.partition_of(name).unwrap();
            for id in map.writers(Unit::Partition(p)) {
                let docs = MemNode::lock(&c.nodes[&id].docs);
                assert_eq!(docs.get(name).map(|d| d.fp), Some(*fp));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_marked_down_is_skipped_and_answers_stay_exact() {
    let c = Cluster::new(2);
    let router = c.router(None);
    let mut model = run_random(&c, &router, 7, 100).await;
    // Node 3 dies: not yet marked down, writes fail (UNAVAILABLE)...
    c.nodes[&3].fail.store(true, Ordering::SeqCst);
    let w = WriteRequest { documents: vec![doc("x", 1, 1)], ..Default::default() };
    assert_eq!(router.write(w, None).await.unwrap_err().code(), Code::Unavailable);
    // ...once marked down, writes and reads go on, exact.
    c.set_state(3, NodeState::Down);
    let mut rng = Rng(99);
    for i in 0..40 {
        let fp = rng.near(0xdead_beef_1234_5678, 3);
        let d = doc(&format!("down{i}"), fp, 100 + i);
        model.insert(d.id.clone(), (fp, 100 + i));
        router
            .write(WriteRequest { documents: vec![d], ..Default::default() }, None)
            .await
            .unwrap();
    }
    model.insert("x".into(), (1, 1));
    router
        .write(WriteRequest { documents: vec![doc("x", 1, 1)], ..Default::default() }, None)
        .await
        .unwrap();
    for q in [0xdead_beef_1234_5678u64, 1, rng.next()] {
        let r = router.probe(probe_req(vec![q], 3, 1000), None).await.unwrap();
        check_result(&r.results[0], &brute(&model, q, 3, None), 1000, &model);
    }
    // Stats count each partition once, from a replica that serves it: none is missed for
    // the node down.
    assert_eq!(router.stats(None).await.unwrap().documents, model.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_moved_is_retried_once_after_the_map_catches_up() {
    let c = Cluster::new(2);
    let router = c.router(Some(2));
    let epoch = c.map_tx.borrow().epoch;
    for n in c.nodes.values() {
        n.moved_epoch.store(epoch + 1, Ordering::SeqCst);
    }
    // One move: the router waits for epoch + 1 (the map moves a little later), then retries.
    c.moved.store(1, Ordering::SeqCst);
    let tx = c.map_tx.clone();
    let bump = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send_modify(|m| {
            let mut next = (**m).clone();
            next.epoch += 1;
            *m = Arc::new(next);
        });
    });
    let w = WriteRequest { documents: vec![doc("a", 42, 1)], ..Default::default() };
    let r = router.write(w, None).await.unwrap();
    bump.await.unwrap();
    assert_eq!(r.inserted, 1);
    assert_eq!(c.moved.load(Ordering::SeqCst), 0);
    assert_eq!(router.map.borrow().epoch, epoch + 1);
    let r = router.probe(probe_req(vec![42], 0, 10), None).await.unwrap();
    assert_eq!(r.results[0].matches.len(), 1);
    // Moves without end: one retry only, then UNAVAILABLE.
    for n in c.nodes.values() {
        n.moved_epoch.store(0, Ordering::SeqCst);
    }
    c.moved.store(1000, Ordering::SeqCst);
    let before = c.nodes.values().map(|n| n.calls.load(Ordering::SeqCst)).sum::<u64>();
    let e = router.probe(probe_req(vec![42], 0, 10), None).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    let after = c.nodes.values().map(|n| n.calls.load(Ordering::SeqCst)).sum::<u64>();
    // Two attempts, each stopped at its first step (the tablet probes, one call per node).
    assert!(after - before <= 6, "{} calls", after - before);
    assert!(1000 - c.moved.load(Ordering::SeqCst) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_admissions_of_near_duplicates_never_both_become_originals() {
    let c = Cluster::new(2);
    for n in c.nodes.values() {
        n.jitter_ms.store(3, Ordering::SeqCst);
    }
    let (r1, r2) = (Arc::new(c.router(Some(1))), Arc::new(c.router(Some(2))));
    let mut rng = Rng(0xadd);
    let mut both_dup = 0;
    for i in 0..40 {
        let fp = rng.next();
        let skip = i % 2 == 0;
        let req = |name: String, fp: u64| AdmitRequest {
            document: Some(doc(&name, fp, 1)),
            k: 3,
            limit: 10,
            skip_insert_if_duplicate: skip,
            ..Default::default()
        };
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        let (ra, rb) = tokio::join!(
            r1.admit(req(a.clone(), fp), None),
            r2.admit(req(b.clone(), fp ^ 0b101), None)
        );
        let (da, db) = (ra.unwrap().decision.unwrap(), rb.unwrap().decision.unwrap());
        let a_orig = !da.duplicate && da.original_id == a;
        let b_orig = !db.duplicate && db.original_id == b;
        assert!(!(a_orig && b_orig), "round {i}: both originals: {da:?} {db:?}");
        both_dup += u64::from(da.duplicate && db.duplicate);
        if skip {
            // What is stored agrees with the answers.
            let q = r1.probe(probe_req(vec![fp], 3, 10), None).await.unwrap();
            let stored: BTreeSet<String> =
                q.results[0].matches.iter().map(|m| m.id.clone()).collect();
            assert_eq!(stored.contains(&a), da.inserted);
            assert_eq!(stored.contains(&b), db.inserted);
        }
    }
    // Both yielding is allowed (see the module docs) but must be the exception: a rival
    // with a larger gid is given time to yield (measured: 0 to 2 of 40 rounds).
    assert!(both_dup <= 10, "{both_dup} of 40 rounds ended with two duplicates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_uses_the_stored_sketches() {
    use neardup_core::sketch::Sketch;
    let c = Cluster::new(2);
    let router = c.router(None);
    let text_a = "the quick brown fox jumps over the lazy dog again and again ".repeat(30);
    let text_b = "completely different words make up this other document here now ".repeat(30);
    let sa = crate::text::fingerprint_and_sketch(&text_a).unwrap().1;
    let sb = crate::text::fingerprint_and_sketch(&text_b).unwrap().1;
    let mut d = doc("a", 7, 1);
    d.sketch = sa.to_bytes().to_vec();
    router.write(WriteRequest { documents: vec![d], ..Default::default() }, None).await.unwrap();
    let ask = |s: &Sketch| ProbeRequest {
        fingerprints: vec![7 ^ 1],
        k: 0,
        limit: 10,
        sketches: vec![s.to_bytes().to_vec()],
        verify_jaccard: 0.9,
        candidate_k: 3,
        ..Default::default()
    };
    // Same text: kept, verified, although beyond k = 0.
    let r = router.probe(ask(&sa), None).await.unwrap();
    assert_eq!(r.results[0].matches.len(), 1);
    assert!(r.results[0].matches[0].verified);
    assert!(r.results[0].matches[0].jaccard > 0.99);
    // Another text: dropped although within candidate k.
    let r = router.probe(ask(&sb), None).await.unwrap();
    assert!(r.results[0].matches.is_empty());
    // An admission verifies the same way: the same text beyond k = 0 is a duplicate of "a",
    // another text within candidate k is not.
    let admit = |name: &str, s: &Sketch| {
        let mut d = doc(name, 7 ^ 1, 2);
        d.sketch = s.to_bytes().to_vec();
        AdmitRequest {
            document: Some(d),
            k: 0,
            limit: 10,
            verify_jaccard: 0.9,
            candidate_k: 3,
            skip_insert_if_duplicate: true,
        }
    };
    let same = router.admit(admit("b", &sa), None).await.unwrap().decision.unwrap();
    assert!(same.duplicate && same.original_id == "a", "{same:?}");
    let other = router.admit(admit("c", &sb), None).await.unwrap().decision.unwrap();
    assert!(!other.duplicate && other.inserted, "{other:?}");
}

/// The gRPC Data service on 127.0.0.1 over an in-memory node: every call round trips.
async fn serve(node: Arc<MemNode>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let svc = neardup_server::DataService::new(node);
    let handle = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(neardup_proto::internal::data_server::DataServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (addr, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_service_round_trips_over_grpc() {
    let design = Arc::new(Design::parse(DESIGN).unwrap());
    let moved = Arc::new(AtomicU64::new(0));
    let mem = MemNode::new(design.clone(), moved.clone());
    let (addr, server) = serve(mem.clone()).await;
    let node = GrpcNode::connect(&addr, 4 << 20, None).unwrap();
    let d = DocInfo {
        gid: 256 + 3,
        name: "a".into(),
        fp: 99,
        ts_ms: 5,
        cluster: 259,
        sketch: Some(vec![7; 66]),
    };
    node.tablet_write(1, vec![(0, TabletOp::Put { gid: d.gid, fp: 99 })], false, None)
        .await
        .unwrap();
    node.doc_write(1, vec![DocOp::Put(d.clone())], None).await.unwrap();
    let hits = node
        .tablet_probe(1, vec![(0, 98), (0, 1 << 63)], 2, 10, Resolve::No, None)
        .await
        .unwrap()
        .results;
    assert_eq!(
        hits,
        vec![(vec![TabletHit { gid: d.gid, fp: 99, distance: 1 }], false), (vec![], false)]
    );
    // A node that resolves nothing (this one) answers a resolving probe with its hits alone.
    let r = node.tablet_probe(1, vec![(0, 98)], 2, 10, Resolve::DocsWithSketches, None);
    let r = r.await.unwrap();
    assert_eq!((r.results, r.docs, r.resolved), (hits[..1].to_vec(), vec![], vec![]));
    assert_eq!(
        node.doc_lookup(1, vec!["a".into(), "b".into()], None).await.unwrap(),
        vec![Some(d.clone()), None]
    );
    assert_eq!(
        node.doc_resolve(1, vec![d.gid, 7], true, None).await.unwrap(),
        vec![Some(d.clone()), None]
    );
    // Without sketches, asked over the wire: the document without its sketch.
    assert_eq!(
        node.doc_resolve(1, vec![d.gid], false, None).await.unwrap(),
        vec![Some(DocInfo { sketch: None, ..d.clone() })]
    );
    let page = node.tablet_scan(1, 0, 0, u64::MAX, 0, 10, None).await.unwrap();
    assert_eq!(page, ScanPage { items: vec![(d.gid, 99)], next: None });
    let page = node.partition_scan(1, 3, 0, 10, None).await.unwrap();
    assert_eq!(page, ScanPage { items: vec![d.clone()], next: None });
    // A whole partition a page at a time (2 documents a page here), as a backup reads it.
    let more: Vec<DocOp> = (2..=5u64)
        .map(|i| DocOp::Put(DocInfo { gid: (i << 8) + 3, name: format!("p{i}"), ..d.clone() }))
        .collect();
    node.doc_write(1, more, None).await.unwrap();
    let all = scan_all(&node, 1, 3, None).await.unwrap();
    let mut gids: Vec<u64> = all.iter().map(|d| d.gid).collect();
    gids.sort_unstable();
    assert_eq!(gids, vec![259, 515, 771, 1027, 1283]);
    let st = node.stats(1, None).await.unwrap();
    assert_eq!((st.stats.documents, st.partitions), (5, vec![(3, 5)]));
    // Many entries come back in several chunks, all of them.
    let ops: Vec<(u32, TabletOp)> =
        (0..10_000u64).map(|i| (1, TabletOp::Put { gid: i << 8, fp: i * 7919 })).collect();
    node.tablet_write(1, ops, false, None).await.unwrap();
    let page = node.tablet_scan(1, 1, 0, u64::MAX, 0, 10_000, None).await.unwrap();
    assert_eq!((page.items.len(), page.next), (10_000, None));
    // A page says where the next starts, across the wire too.
    let page = node.tablet_scan(1, 1, 0, u64::MAX, 0, 9_000, None).await.unwrap();
    assert_eq!(page.items.len(), 9_000);
    let rest = node.tablet_scan(1, 1, 0, u64::MAX, page.next.unwrap(), 0, None).await.unwrap();
    assert_eq!(rest.items.len(), 3);
    // "Epoch moved" keeps its epoch across the wire.
    mem.moved_epoch.store(77, Ordering::SeqCst);
    moved.store(1, Ordering::SeqCst);
    let e = node.doc_lookup(1, vec!["a".into()], None).await.unwrap_err();
    assert!(matches!(e, DataError::EpochMoved { epoch: 77, .. }), "{e:?}");
    // Failures are UNAVAILABLE; an unreachable node too.
    mem.fail.store(true, Ordering::SeqCst);
    let e = node.doc_lookup(1, vec!["a".into()], None).await.unwrap_err();
    assert!(matches!(e, DataError::Unavailable(_)), "{e:?}");
    server.abort();
    let _ = server.await;
    let e = node.doc_lookup(1, vec!["a".into()], None).await.unwrap_err();
    assert!(matches!(e, DataError::Unavailable(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_service_runs_over_three_nodes_on_grpc() {
    use neardup_proto::v1::neardup_server::Neardup;
    use neardup_proto::v1::{
        Document, InsertRequest, QueryRequest, QueryTarget, document, query_target,
    };
    let design = Arc::new(Design::parse(DESIGN).unwrap());
    let moved = Arc::new(AtomicU64::new(0));
    let mut addrs = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..3 {
        let (a, h) = serve(MemNode::new(design.clone(), moved.clone())).await;
        addrs.push(a);
        servers.push(h);
    }
    let (tx, rx) = watch::channel(Arc::new(map_of(&addrs, 2, 16)));
    let nodes = GrpcNodes::new(rx.clone(), 4 << 20, None);
    let cluster =
        ClusterRouter::new(rx, nodes.resolver(None), Arc::new(Counter(AtomicU64::new(1))), None);
    let router = crate::Router::new(
        Arc::new(cluster),
        3,
        crate::Limits::default(),
        crate::RpcMetrics::default(),
    );
    let mut rng = Rng(31);
    let mut model = Model::new();
    let base = rng.next();
    let documents: Vec<Document> = (0..50)
        .map(|i| {
            let fp = rng.near(base, 5);
            model.insert(format!("p{i}"), (fp, i));
            Document {
                id: format!("p{i}"),
                content: Some(document::Content::Fingerprint(fp)),
                timestamp_ms: i,
                sketch: Vec::new(),
            }
        })
        .collect();
    let r = router.insert(Request::new(InsertRequest { documents })).await.unwrap();
    assert_eq!(r.get_ref().inserted, 50);
    for q in [base, rng.near(base, 2), rng.next()] {
        let req = QueryRequest {
            target: Some(QueryTarget {
                target: Some(query_target::Target::Fingerprint(q)),
                sketch: Vec::new(),
            }),
            k: Some(3),
            limit: 100,
            verify_jaccard: Some(0.0),
            candidate_k: None,
        };
        let r = router.query(Request::new(req)).await.unwrap().into_inner();
        check_result(&r.result.unwrap(), &brute(&model, q, 3, None), 100, &model);
    }
    drop(tx);
    for s in servers {
        s.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_node_does_not_hold_the_caller_past_its_deadline() {
    let c = Cluster::new(2);
    let router = c.router(None);
    router
        .write(WriteRequest { documents: vec![doc("a", 1, 1)], ..Default::default() }, None)
        .await
        .unwrap();
    c.nodes[&2].delay_ms.store(60_000, Ordering::SeqCst);
    let deadline = Some(Instant::now() + Duration::from_millis(100));
    let w = WriteRequest { documents: vec![doc("b", 2, 1)], ..Default::default() };
    assert_eq!(router.write(w, deadline).await.unwrap_err().code(), Code::DeadlineExceeded);
    let deadline = Some(Instant::now() + Duration::from_millis(100));
    let r = router.probe(probe_req(vec![1], 3, 10), deadline).await;
    // Node 2 serves some tablet or partition this probe needs, unless node 1 and 3 cover
    // them all; either way the answer comes, exact or DEADLINE_EXCEEDED.
    match r {
        Ok(r) => assert_eq!(r.results[0].matches.len(), 1),
        Err(e) => assert_eq!(e.code(), Code::DeadlineExceeded),
    }
    // A map without a design: not serving, and calls are UNAVAILABLE.
    let (_tx, rx) = watch::channel(Arc::new(ClusterMap::default()));
    let none = ClusterRouter::new(rx, Arc::new(|_| unreachable_node()), c.ids.clone(), None);
    assert!(matches!(*none.health().borrow(), ShardHealth::NotServing(_)));
    let e = none.probe(probe_req(vec![1], 0, 1), None).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
}

fn unreachable_node() -> Arc<dyn NodeApi> {
    Arc::new(Unreachable("none".into()))
}

fn total_calls(c: &Cluster) -> u64 {
    c.nodes.values().map(|n| n.calls.load(Ordering::SeqCst)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_cut_later_queries_and_each_step_is_one_call_per_node() {
    let c = Cluster::new(2);
    let router = c.router(None);
    let mut model = Model::new();
    let mut rng = Rng(4242);
    let base = rng.next();
    let docs: Vec<ShardDocument> = (0..30)
        .map(|i| {
            let fp = rng.near(base, 2);
            model.insert(format!("n{i:02}"), (fp, i));
            doc(&format!("n{i:02}"), fp, i)
        })
        .collect();
    let before = total_calls(&c);
    router.write(WriteRequest { documents: docs, ..Default::default() }, None).await.unwrap();
    // Lookup, tablet puts, document puts: at most one call per node each.
    assert!(total_calls(&c) - before <= 9, "{} calls", total_calls(&c) - before);
    let want = brute(&model, base, 3, None);
    assert_eq!(want.len(), 30);
    let before = total_calls(&c);
    let mut req = probe_req(vec![base; 3], 3, 100);
    req.max_matches = 40;
    let r = router.probe(req, None).await.unwrap();
    // Probes and resolves: at most one call per node each, for all three queries.
    assert!(total_calls(&c) - before <= 6, "{} calls", total_calls(&c) - before);
    check_result(&r.results[0], &want, 30, &model);
    assert!(!r.results[0].truncated);
    assert_eq!(r.results[1].matches.len(), 10);
    assert!(r.results[1].truncated);
    check_result(&r.results[1], &want, 10, &model);
    assert!(r.results[2].matches.is_empty() && r.results[2].truncated);
    // Bytes: each match counts its id (3 bytes) plus 40.
    let mut req = probe_req(vec![base; 2], 3, 100);
    req.max_bytes = 43 * 35;
    let r = router.probe(req, None).await.unwrap();
    assert_eq!((r.results[0].matches.len(), r.results[1].matches.len()), (30, 5));
    assert!(r.results[1].truncated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_replicas_take_writes_but_serve_no_reads() {
    let c = Cluster::new(2);
    // Nodes 1 and 2 serve every unit; node 3 fills every one.
    c.map_tx.send_modify(|m| {
        let mut next = (**m).clone();
        for t in &mut next.tablets {
            (t.nodes, t.filling) = (vec![1, 2], vec![3]);
        }
        for p in &mut next.partitions {
            (p.nodes, p.filling) = (vec![1, 2], vec![3]);
        }
        next.epoch += 1;
        *m = Arc::new(next);
    });
    // The local node is 3: it is still never asked to read.
    let router = c.router(Some(3));
    let w = WriteRequest { documents: vec![doc("a", 5, 1), doc("b", 6, 2)], ..Default::default() };
    router.write(w, None).await.unwrap();
    for n in c.nodes.values() {
        assert_eq!(MemNode::lock(&n.docs).len(), 2);
        assert_eq!(MemNode::lock(&n.entries).len(), 2 * 10);
    }
    c.nodes[&3].fail.store(true, Ordering::SeqCst);
    let r = router.probe(probe_req(vec![5], 2, 10), None).await.unwrap();
    assert_eq!(r.results[0].matches.len(), 2);
    // But a failing filling replica fails writes: it is a writer.
    let w = WriteRequest { documents: vec![doc("c", 7, 3)], ..Default::default() };
    assert_eq!(router.write(w, None).await.unwrap_err().code(), Code::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_on_through_another_replica_before_a_failed_node_is_marked_down() {
    let c = Cluster::new(2);
    let router = c.router(None);
    let model = run_random(&c, &router, 11, 100).await;
    // Node 3 stops answering; the map still lists it as serving. Every read still answers,
    // exactly, through the other replicas (the first call to node 3 fails and is retried).
    c.nodes[&3].fail.store(true, Ordering::SeqCst);
    let mut rng = Rng(5);
    for _ in 0..30 {
        let q = rng.next();
        let r = router.probe(probe_req(vec![q], 3, 1000), None).await.unwrap();
        check_result(&r.results[0], &brute(&model, q, 3, None), 1000, &model);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_removes_what_any_replica_holds() {
    let c = Cluster::new(0);
    let map = c.map_tx.borrow().clone();
    // A document that reached one replica of its partition only (a write that failed
    // halfway): entries on every tablet, the document on its partition's first node alone.
    let name = "half-written";
    let p = map.partition_of(name).unwrap();
    let holder = map.partition(p).unwrap().nodes[0];
    let other = map.partition(p).unwrap().nodes[1];
    // The router of the other replica, which reads its own copy first.
    let router = c.router(Some(other));
    let gid = make_gid(1 << 20, p);
    let fp = 0x1234_5678_9abc_def0;
    let d = DocInfo { gid, name: name.into(), fp, ts_ms: 1, cluster: gid, sketch: None };
    c.half_written(map.epoch, d, holder).await;
    // Deleting it removes it from that replica too, whichever replica a lookup would read.
    let del = WriteRequest { deletes: vec![name.into()], ..Default::default() };
    assert_eq!(router.write(del, None).await.unwrap().deleted, 1);
    for n in c.nodes.values() {
        let held = n.doc_lookup(map.epoch, vec![name.into()], None).await.unwrap();
        assert_eq!(held, vec![None]);
    }
    for local in [Some(holder), None] {
        let r = c.router(local).probe(probe_req(vec![fp], 0, 10), None).await.unwrap();
        assert!(r.results[0].matches.is_empty(), "{:?}", r.results[0]);
    }
}

/// A write tried twice, each try reaching one replica of the partition only, leaves the
/// replicas holding different documents under one name. A read that resolves its hits at
/// both replicas (each probed node resolves its own) answers the name once: the document
/// with the larger (timestamp, gid), which the replicas keep when they get both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_under_two_gids_by_its_replicas_is_answered_once() {
    let c = Cluster::new(0);
    let map = c.map_tx.borrow().clone();
    let name = "tried-twice";
    let p = map.partition_of(name).unwrap();
    let (first, second) = (map.partition(p).unwrap().nodes[0], map.partition(p).unwrap().nodes[1]);
    // The third node down: every read probes the two replicas of the partition, each of
    // which resolves the hits of its own answer.
    let third = (1..=3).find(|n| ![first, second].contains(n)).unwrap();
    c.set_state(third, NodeState::Down);
    let epoch = c.map_tx.borrow().epoch;
    let fp = 0x0f0f_1234_5678_9abc;
    let (g1, g2) = (make_gid(1 << 20, p), make_gid((1 << 20) + 1, p));
    for (gid, holder) in [(g1, first), (g2, second)] {
        let d = DocInfo { gid, name: name.into(), fp, ts_ms: 7, cluster: gid, sketch: None };
        c.half_written(epoch, d, holder).await;
    }
    for local in [Some(first), Some(second), None] {
        let r = c.router(local).probe(probe_req(vec![fp ^ 1], 2, 10), None).await.unwrap();
        let m = &r.results[0].matches;
        assert_eq!(m.len(), 1, "through {local:?}: {m:?}");
        assert_eq!((m[0].id.as_str(), m[0].distance, m[0].cluster_id), (name, 1, g2));
    }
}

/// Single-query reads that arrive while others are out go out together: 40 at once through
/// nodes that take 20 ms a call make at most half the calls 40 alone would, and every answer
/// is the brute force's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_small_reads_share_calls_and_stay_exact() {
    let c = Cluster::new(2);
    let router = Arc::new(c.router(None));
    let mut rng = Rng(0xc0a1);
    let bases: Vec<u64> = (0..4).map(|_| rng.next()).collect();
    let mut model = Model::new();
    let docs: Vec<ShardDocument> = (0..60)
        .map(|i| {
            let (name, fp) = (format!("d{i}"), rng.near(bases[i % 4], 4));
            model.insert(name.clone(), (fp, i as i64));
            doc(&name, fp, i as i64)
        })
        .collect();
    router.write(WriteRequest { documents: docs, ..Default::default() }, None).await.unwrap();
    for n in c.nodes.values() {
        n.delay_ms.store(20, Ordering::SeqCst);
    }
    let queries: Vec<u64> = (0..40).map(|i| rng.near(bases[i % 4], 3)).collect();
    let before = total_calls(&c);
    router.probe(probe_req(vec![queries[0]], 3, 100), None).await.unwrap();
    let alone = total_calls(&c) - before;
    let before = total_calls(&c);
    let tasks: Vec<_> = queries
        .iter()
        .map(|&q| {
            let r = router.clone();
            tokio::spawn(async move { r.probe(probe_req(vec![q], 3, 100), None).await })
        })
        .collect();
    for (task, &q) in tasks.into_iter().zip(&queries) {
        let r = task.await.unwrap().unwrap();
        check_result(&r.results[0], &brute(&model, q, 3, None), 100, &model);
    }
    let together = total_calls(&c) - before;
    assert!(
        together * 2 <= alone * queries.len() as u64,
        "{together} calls for {} reads at once, {alone} for one alone",
        queries.len()
    );
}

/// A query's probes go to the local node and at most one other: every tablet the local
/// node lacks has its replicas on the same two other nodes, and the query picks one of
/// them for all of its tables, while queries spread over both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_probes_the_local_node_and_at_most_one_other() {
    let c = Cluster::new(4);
    let router = c.router(Some(1));
    let mut rng = Rng(99);
    let calls = |id: NodeId| c.nodes[&id].calls.load(Ordering::SeqCst);
    let mut remote = BTreeMap::new();
    for _ in 0..60 {
        let before = (calls(2), calls(3));
        let r = router.probe(probe_req(vec![rng.next()], 3, 10), None).await.unwrap();
        // Nothing is stored: probes only, no resolve.
        assert!(r.results[0].matches.is_empty());
        let (two, three) = (calls(2) - before.0, calls(3) - before.1);
        assert!(two + three <= 1, "a query called node 2 {two} and node 3 {three} times");
        *remote.entry(if two > 0 { 2 } else { 3 }).or_insert(0) += two + three;
    }
    assert!(remote.get(&2) > Some(&0) && remote.get(&3) > Some(&0), "{remote:?}");
}

/// A node whose map lags behind still takes itself for a replica of a partition that moved
/// away (its copy no longer gets that partition's writes): the router trusts a probed node's
/// resolution only for partitions its own map has the node serve, and asks a serving
/// replica for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_node_does_not_resolve_a_partition_that_moved_away() {
    let c = Cluster::new(0);
    let name = "moved";
    let map = c.map_tx.borrow().clone();
    let p = map.partition_of(name).unwrap();
    let (x, y) = (map.partition(p).unwrap().nodes[0], map.partition(p).unwrap().nodes[1]);
    let z = (1..=3).find(|n| *n != x && *n != y).unwrap();
    // Node x holds every tablet, so a read through it probes it alone.
    c.map_tx.send_modify(|m| {
        let mut next = (**m).clone();
        for t in &mut next.tablets {
            t.nodes = vec![x, y];
        }
        next.epoch += 1;
        *m = Arc::new(next);
    });
    let router = c.router(Some(x));
    let (old_fp, new_fp) = (0x0f0f_0f0f_0f0f_0f0f_u64, 0xf0f0_f0f0_f0f0_f0f0_u64);
    let w = WriteRequest { documents: vec![doc(name, old_fp, 1)], ..Default::default() };
    router.write(w, None).await.unwrap();
    // Node x stops following the map; the partition moves from x to z.
    let (_frozen_tx, frozen) = watch::channel(c.map_tx.borrow().clone());
    *MemNode::lock(&c.nodes[&x].serves) = Some((x, frozen));
    c.map_tx.send_modify(|m| {
        let mut next = (**m).clone();
        next.partitions[p as usize].nodes = vec![y, z];
        next.epoch += 1;
        *m = Arc::new(next);
    });
    // The replacement reaches the partition's writers y and z; x keeps the old document.
    let w = WriteRequest { documents: vec![doc(name, new_fp, 2)], ..Default::default() };
    assert_eq!(router.write(w, None).await.unwrap().replaced, 1);
    let stale = c.nodes[&x].doc_lookup(0, vec![name.into()], None).await.unwrap();
    assert_eq!(stale[0].as_ref().map(|d| d.fp), Some(old_fp));
    let r = router.probe(probe_req(vec![new_fp], 0, 10), None).await.unwrap();
    let got: Vec<(&str, u64)> =
        r.results[0].matches.iter().map(|m| (m.id.as_str(), m.fingerprint)).collect();
    assert_eq!(got, vec![(name, new_fp)]);
}

/// A node that stops answering without failing (a long pause) is hedged around: its reads
/// go to the other serving replicas after the hedging delay, and every answer is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_hedged_around_a_paused_node_and_stay_exact() {
    let c = Cluster::new(2);
    let router = c.router(None);
    let model = run_random(&c, &router, 23, 60).await;
    c.nodes[&2].delay_ms.store(60_000, Ordering::SeqCst);
    let mut rng = Rng(77);
    let stored: Vec<u64> = model.values().map(|&(fp, _)| fp).collect();
    assert!(!stored.is_empty());
    // Fewer reads than the hedging budget's burst: each may need a second call.
    for i in 0..8 {
        let q = rng.near(stored[i % stored.len()], 2);
        let deadline = Some(Instant::now() + Duration::from_secs(20));
        let r = router.probe(probe_req(vec![q], 3, 1000), deadline).await.unwrap();
        check_result(&r.results[0], &brute(&model, q, 3, None), 1000, &model);
    }
    let (sent, won) = router.hedger.counts();
    assert!(sent > 0 && won == sent, "{sent} second calls, {won} answered first");
}
