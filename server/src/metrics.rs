//! The shard's Prometheus metrics: what it stores, its log, its merges and checkpoints.
//!
//! Registered into the process's registry by whoever serves `/metrics`; cloning shares the
//! same series.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// A histogram family whose members all take the same buckets.
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Buckets of the admission stages: 10 us to about 1.3 s, doubling.
fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 18))
}

/// A stage of one admission (CheckAndInsert on the shard), timed apart so that a slow
/// admission shows where it waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionStage {
    /// Finding the candidates in the index, under the read lock (waiting for it included).
    Candidates,
    /// Reading the candidates' sketches from the store; observed only when one was read.
    SketchReads,
    /// Waiting for the shard's write lock.
    WriteLock,
    /// Under the write lock: what changed since, the decision, and the log append.
    Decide,
    /// Waiting for group commit to make the record durable.
    Durable,
}

impl AdmissionStage {
    /// The value of the `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            AdmissionStage::Candidates => "candidates",
            AdmissionStage::SketchReads => "sketch_reads",
            AdmissionStage::WriteLock => "write_lock",
            AdmissionStage::Decide => "decide",
            AdmissionStage::Durable => "durable",
        }
    }
}

/// The shard's metrics. See the module docs.
#[derive(Clone)]
pub struct ShardMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    documents: Gauge,
    runs: Gauge,
    buffered: Gauge,
    table_bytes: Family<Labels, Gauge>,
    index_bytes: Gauge,
    wal_bytes: Gauge,
    disk_bytes: Gauge,
    merges: Counter,
    merged_documents: Counter,
    merge_seconds: Counter<f64, AtomicU64>,
    merges_running: Gauge,
    checkpoints: Counter,
    checkpoint_bytes: Counter,
    doc_snapshots: Counter,
    log_records: Counter,
    log_syncs: Histogram,
    admission_stages: Histograms,
    rebuilt_tables: Counter,
    recovery_seconds: Gauge<f64, AtomicU64>,
    corrupt: Gauge,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            inner: Arc::new(Inner {
                documents: Gauge::default(),
                runs: Gauge::default(),
                buffered: Gauge::default(),
                table_bytes: Family::default(),
                index_bytes: Gauge::default(),
                wal_bytes: Gauge::default(),
                disk_bytes: Gauge::default(),
                merges: Counter::default(),
                merged_documents: Counter::default(),
                merge_seconds: Counter::default(),
                merges_running: Gauge::default(),
                checkpoints: Counter::default(),
                checkpoint_bytes: Counter::default(),
                doc_snapshots: Counter::default(),
                log_records: Counter::default(),
                log_syncs: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
                admission_stages: Family::new_with_constructor(stage_histogram),
                rebuilt_tables: Counter::default(),
                recovery_seconds: Gauge::default(),
                corrupt: Gauge::default(),
            }),
        }
    }
}

impl ShardMetrics {
    /// Registers every series under `neardup_` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let m = &self.inner;
        let r = registry.sub_registry_with_prefix("neardup");
        r.register("documents", "Live documents stored", m.documents.clone());
        r.register("runs", "Immutable runs in the index", m.runs.clone());
        r.register("buffered_documents", "Documents in the write buffer", m.buffered.clone());
        r.register("table_bytes", "Memory of each permuted table", m.table_bytes.clone());
        r.register("index_bytes", "Memory of the whole index", m.index_bytes.clone());
        r.register("wal_bytes", "Bytes of write-ahead log records kept", m.wal_bytes.clone());
        r.register("disk_bytes", "Bytes of the database on disk", m.disk_bytes.clone());
        r.register("merges", "Run merges finished", m.merges.clone());
        r.register("merged_documents", "Documents written by merges", m.merged_documents.clone());
        r.register("merge_seconds", "Time spent merging runs", m.merge_seconds.clone());
        r.register("merges_running", "Merges under way", m.merges_running.clone());
        r.register("checkpoints", "Index checkpoints written", m.checkpoints.clone());
        r.register("checkpoint_bytes", "Bytes of runs written", m.checkpoint_bytes.clone());
        r.register("doc_snapshots", "Document snapshots written", m.doc_snapshots.clone());
        r.register("log_records", "Write-ahead log records appended", m.log_records.clone());
        r.register("log_sync_seconds", "Duration of each log sync (fsync)", m.log_syncs.clone());
        r.register(
            "admission_stage_seconds",
            "Time each stage of an admission (CheckAndInsert) took, by stage",
            m.admission_stages.clone(),
        );
        r.register(
            "rebuilt_tables",
            "Damaged tables rebuilt from intact ones on load",
            m.rebuilt_tables.clone(),
        );
        r.register(
            "recovery_seconds",
            "Time the last start took to load runs and replay the log",
            m.recovery_seconds.clone(),
        );
        r.register(
            "tablet_corrupt",
            "1 when a tablet could not be loaded and is not served",
            m.corrupt.clone(),
        );
    }

    /// Sets the gauges that describe the index.
    pub fn set_index(&self, docs: usize, runs: usize, buffered: usize, tables: &[usize]) {
        let m = &self.inner;
        m.documents.set(docs as i64);
        m.runs.set(runs as i64);
        m.buffered.set(buffered as i64);
        for (t, &b) in tables.iter().enumerate() {
            m.table_bytes.get_or_create(&vec![("table".into(), t.to_string())]).set(b as i64);
        }
        m.index_bytes.set(tables.iter().sum::<usize>() as i64);
    }

    /// Sets the log and disk sizes.
    pub fn set_sizes(&self, wal_bytes: u64, disk_bytes: Option<u64>) {
        self.inner.wal_bytes.set(wal_bytes as i64);
        if let Some(d) = disk_bytes {
            self.inner.disk_bytes.set(d as i64);
        }
    }

    /// A merge started (`true`) or ended.
    pub fn merge_running(&self, running: bool) {
        self.inner.merges_running.inc_by(if running { 1 } else { -1 });
    }

    /// Merges under way now.
    pub fn merges_running(&self) -> i64 {
        self.inner.merges_running.get()
    }

    /// A merge finished.
    pub fn merged(&self, docs: usize, seconds: f64) {
        self.inner.merges.inc();
        self.inner.merged_documents.inc_by(docs as u64);
        self.inner.merge_seconds.inc_by(seconds);
    }

    /// A checkpoint was written.
    pub fn checkpointed(&self, bytes: u64) {
        self.inner.checkpoints.inc();
        self.inner.checkpoint_bytes.inc_by(bytes);
    }

    /// A document snapshot was written.
    pub fn doc_snapshot(&self) {
        self.inner.doc_snapshots.inc();
    }

    /// Log records were appended.
    pub fn appended(&self, records: u64) {
        self.inner.log_records.inc_by(records);
    }

    /// One log sync took `seconds`.
    pub fn observe_sync(&self, seconds: f64) {
        self.inner.log_syncs.observe(seconds);
    }

    /// One stage of an admission took `seconds`.
    pub fn admission_stage(&self, stage: AdmissionStage, seconds: f64) {
        let labels = vec![("stage".to_string(), stage.name().to_string())];
        self.inner.admission_stages.get_or_create(&labels).observe(seconds);
    }

    /// Tables were rebuilt on load.
    pub fn rebuilt(&self, tables: usize) {
        self.inner.rebuilt_tables.inc_by(tables as u64);
    }

    /// Recovery took `seconds`.
    pub fn recovered(&self, seconds: f64) {
        self.inner.recovery_seconds.set(seconds);
    }

    /// A tablet is (or is no longer) corrupt.
    pub fn set_corrupt(&self, corrupt: bool) {
        self.inner.corrupt.set(i64::from(corrupt));
    }
}
