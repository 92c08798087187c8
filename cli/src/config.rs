//! The service's configuration: defaults, then a TOML file, then the environment, then
//! flags, each overriding the one before.
//!
//! - File: `--config FILE` or `NEARDUP_CONFIG`; its keys are those of [`Config`] (see
//!   `docs/service.md` for the table of keys and defaults). Unknown keys are an error.
//! - Environment: `NEARDUP_KEY` for a top-level key and `NEARDUP_SECTION__KEY` for a key in
//!   a section (`NEARDUP_STORAGE__CACHE_MB=512`). Values are read as TOML scalars, or as
//!   strings when they do not parse as one. Variables whose first part names no key or
//!   section (`NEARDUP_SERVER`, the client's) are left alone; a wrong key inside a section
//!   is an error.
//! - Flags: the common ones by name (`--data`, `--listen`, `--metrics-listen`, `--design`),
//!   any key with `--set section.key=value`.
//!
//! `neardup serve --print-config` prints the configuration in force and exits.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use neardup_core::codec::TableOptions;
use neardup_core::{Design, IndexConfig};
use neardup_router::{Limits, VerifyDefaults};
use neardup_server::ShardConfig;
use neardup_server::access::{Access, AccessConfig, MetricsToken};
use neardup_server::tls::{ClusterTls, ClusterTlsFiles, Tls, TlsFiles};
use serde::{Deserialize, Serialize};

use crate::error::CliError;

/// The whole configuration; every field has a default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the public gRPC API (`serve`, `router`) or of the internal one (`shard`).
    pub listen: String,
    /// Data directory (`serve`, `shard`).
    pub data: PathBuf,
    /// Address of the Prometheus `/metrics` endpoint; empty: none.
    pub metrics_listen: String,
    /// Log format: `text` or `json` (filter with `RUST_LOG`).
    pub log_format: String,
    /// The index.
    pub index: IndexSection,
    /// Storage and maintenance.
    pub storage: StorageSection,
    /// Request limits.
    pub limits: Limits,
    /// Verification defaults of CheckAndInsert and Query.
    pub verify: VerifyDefaults,
    /// The router role.
    pub router: RouterSection,
    /// Cluster mode of `serve` (see `docs/cluster.md`).
    pub cluster: ClusterSection,
    /// Tokens with roles (see `docs/security.md`).
    pub auth: AuthSection,
    /// TLS on the public API (see `docs/security.md`).
    pub tls: TlsSection,
}

/// `[tls]`: TLS on the public API.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// The server's certificate chain (PEM); empty, with `key_file`: plaintext.
    pub cert_file: String,
    /// Its private key (PEM).
    pub key_file: String,
}

/// `[auth]`: who may call what, on the public API and the admin API.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// The tokens file (each token's SHA-256 with a role and a name); empty: no token is
    /// checked.
    pub tokens_file: String,
    /// Health checks need a token too.
    pub close_health: bool,
    /// Reflection needs a token too.
    pub close_reflection: bool,
    /// A file holding the bearer token `/metrics` asks for; empty: the metrics are open.
    pub metrics_token_file: String,
}

/// `[index]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct IndexSection {
    /// Table design: `paper-10`, `paper-4`, `paper-16`, `paper-20`, or a text like `5c2`.
    pub design: String,
    /// Documents in the write buffer before it becomes a run.
    pub buffer_docs: usize,
    /// Runs of one size merged at once.
    pub merge_fanout: usize,
    /// Past this many runs, the two smallest neighbours are merged (queries visit every
    /// run).
    pub max_runs: usize,
    /// Huffman-XOR block size in bytes.
    pub block_bytes: usize,
    /// Block coding: `xor` (the paper's) or `gap` (about two bits a fingerprint smaller).
    pub codec: String,
    /// Tables in memory: `blocks` (Huffman-XOR) or `packed` (fixed-width low bits under a
    /// top-bits directory: faster lookups; stored on disk as blocks all the same).
    pub layout: String,
}

/// The service's block size. Small blocks: a query decodes a few values per table instead
/// of half a 1 KiB block, about three times faster at 10M documents, for 11% more memory.
pub const SERVICE_BLOCK_BYTES: usize = 128;

/// `[storage]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSection {
    /// The storage engine's page cache, MiB.
    pub cache_mb: u64,
    /// Refuse to start with less free disk than this, MiB.
    pub min_free_mb: u64,
    /// Write a checkpoint after this many logged operations.
    pub checkpoint_ops: u64,
    /// ... or this many seconds after the last one, when anything changed.
    pub checkpoint_interval_secs: u64,
    /// Snapshot documents (and truncate the log) when the log reaches this size, MiB.
    pub snapshot_log_mb: u64,
    /// Turn an idle write buffer into a run after this many milliseconds.
    pub idle_flush_ms: u64,
    /// Merge every run into one, and write a checkpoint, after this many seconds without
    /// writes.
    pub compact_idle_secs: u64,
    /// Tables of each run written to disk (the others are rebuilt at start from these).
    pub stored_tables: usize,
}

/// `[router]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RouterSection {
    /// The shard node the `router` role sends to.
    pub shard: String,
}

/// `[cluster]`: a node of a cluster. `serve` runs in cluster mode when `bootstrap` is set,
/// `join` is given, or the data directory already holds cluster state; otherwise these keys
/// are unused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// This node's id, unique in the cluster (not 0); 0: the id stored in the data directory.
    pub node_id: u64,
    /// With `node_id` 0 on a new node: the id is 1 + the number ending the host name
    /// (`neardup-2` is node 3), as a Kubernetes StatefulSet names its pods.
    pub node_id_from_hostname: bool,
    /// Address of the internal listener: Raft, the admin API and the shard service.
    pub internal_listen: String,
    /// Public address the other nodes and clients are told; empty: the bound `listen` address.
    pub advertise_public: String,
    /// Internal address the other nodes are told; empty: the bound `internal_listen` address.
    pub advertise_internal: String,
    /// Start a new cluster with this node as its only voter.
    pub bootstrap: bool,
    /// Join the cluster through this member's internal address (HOST:PORT); empty: none.
    /// A node told to join through its own advertised internal address starts the cluster
    /// instead, as `bootstrap` (so that every member of a StatefulSet can be given the first
    /// one's address).
    pub join: String,
    /// A file holding an admin token, sent with the join when the cluster checks tokens;
    /// empty: none.
    pub join_token_file: String,
    /// Raft tick, milliseconds.
    pub tick_ms: u64,
    /// Ticks without a heartbeat before a follower calls an election.
    pub election_ticks: usize,
    /// Ticks between the leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Most voters; further nodes stay learners.
    pub max_voters: usize,
    /// Compact the Raft log into a snapshot of the map after this many applied entries.
    pub snapshot_every: u64,
    /// Nodes holding each tablet and document partition (set at bootstrap).
    pub replicas: u32,
    /// Each table is cut into 2^split_bits tablets (set at bootstrap).
    pub split_bits: u32,
    /// Document partitions, 1 to 256 (set at bootstrap).
    pub partitions: u32,
    /// The leader marks a node down after this long without hearing from it, milliseconds.
    pub failure_timeout_ms: u64,
    /// The leader marks a down node lost after this long without hearing from it,
    /// milliseconds: each unit it held is rebuilt on the other nodes. 0: never.
    pub rebuild_after_ms: u64,
    /// Most megabytes a second this node copies into the replicas it fills (a rebuild, a
    /// move, a node back; two at a time), all together, and removes of the copies the map
    /// took away from it, so that copies leave room for queries. 0: unlimited.
    pub copy_rate_mb: u64,
    /// Entries a page of a tablet copy holds (a partition's pages hold an eighth as many
    /// documents): the memory a copy takes on each side. 0: the source's default, 65536.
    pub copy_page_entries: u32,
    /// A tablet splits in two, on the same nodes, once its replicas hold more than this many
    /// entries (each a fingerprint of one table); placement then spreads the tablets. 0:
    /// tablets never split.
    pub split_entries: u64,
    /// The cluster CA's certificate (PEM): with `tls_cert_file` and `tls_key_file`, the
    /// internal port takes only connections presenting a certificate it signed, and this node
    /// calls its peers with its own (mutual TLS). Empty: plaintext.
    pub tls_ca_file: String,
    /// This node's certificate (PEM), signed by the cluster CA and naming the node (URI SAN
    /// `urn:neardup:node:ID`, as `neardup cert issue --node-id` makes).
    pub tls_cert_file: String,
    /// Its key (PEM).
    pub tls_key_file: String,
    /// Allow listening beyond loopback without TLS (public port without `[tls]`, internal
    /// port without `tls_*`): anyone who reaches the ports can then read every document,
    /// write, and join or remove nodes.
    pub insecure: bool,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            node_id: 0,
            node_id_from_hostname: false,
            internal_listen: "127.0.0.1:50061".into(),
            advertise_public: String::new(),
            advertise_internal: String::new(),
            bootstrap: false,
            join: String::new(),
            join_token_file: String::new(),
            tick_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 2,
            max_voters: 5,
            snapshot_every: 1000,
            replicas: 2,
            split_bits: 2,
            partitions: 16,
            failure_timeout_ms: 2000,
            rebuild_after_ms: 300_000,
            copy_rate_mb: 0,
            copy_page_entries: 65536,
            split_entries: 1 << 24,
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            insecure: false,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:50051".into(),
            data: PathBuf::from("./neardup-data"),
            metrics_listen: "127.0.0.1:9464".into(),
            log_format: "text".into(),
            index: IndexSection::default(),
            storage: StorageSection::default(),
            limits: Limits::default(),
            verify: VerifyDefaults::default(),
            router: RouterSection::default(),
            cluster: ClusterSection::default(),
            auth: AuthSection::default(),
            tls: TlsSection::default(),
        }
    }
}

impl Default for IndexSection {
    fn default() -> Self {
        let c = IndexConfig::default();
        IndexSection {
            design: "8c2".into(),
            buffer_docs: c.buffer_docs,
            merge_fanout: c.merge_fanout,
            max_runs: c.max_runs,
            block_bytes: SERVICE_BLOCK_BYTES,
            codec: "xor".into(),
            layout: "blocks".into(),
        }
    }
}

impl Default for StorageSection {
    fn default() -> Self {
        let s = ShardConfig::default();
        StorageSection {
            cache_mb: s.cache_bytes >> 20,
            min_free_mb: s.min_free_bytes >> 20,
            checkpoint_ops: s.checkpoint_ops,
            checkpoint_interval_secs: s.checkpoint_interval.as_secs(),
            snapshot_log_mb: s.snapshot_log_bytes >> 20,
            idle_flush_ms: s.idle_flush.as_millis() as u64,
            compact_idle_secs: s.compact_idle.as_secs(),
            stored_tables: s.stored_tables,
        }
    }
}

impl Default for RouterSection {
    fn default() -> Self {
        RouterSection { shard: "http://127.0.0.1:50061".into() }
    }
}

/// Whether the listen address `addr` (`HOST:PORT`) is on loopback only.
fn loopback(addr: &str) -> bool {
    match addr.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().is_loopback(),
        Err(_) => addr.rsplit_once(':').is_some_and(|(host, _)| host == "localhost"),
    }
}

/// Flags that override the file and the environment.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigFlags {
    /// Configuration file (TOML). Env: NEARDUP_CONFIG.
    #[arg(long, env = "NEARDUP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory [default: ./neardup-data].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Listen address [default: 127.0.0.1:50051].
    #[arg(long)]
    pub listen: Option<String>,
    /// Prometheus /metrics address; "" for none [default: 127.0.0.1:9464].
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Table design [default: 8c2: largest k 6, for verified admission; docs/quality.md].
    #[arg(long)]
    pub design: Option<String>,
    /// Any key, as section.key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print the configuration in force and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// The cluster flags of `neardup serve`; each overrides its `[cluster]` key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterFlags {
    /// This node's id in the cluster (not 0); only needed the first time: a restart takes
    /// the id stored in the data directory.
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Internal listener of a cluster node: Raft, the admin API, the shard service
    /// [default: 127.0.0.1:50061].
    #[arg(long)]
    pub internal_listen: Option<String>,
    /// Start a new cluster with this node as its only voter.
    #[arg(long, conflicts_with = "join")]
    pub bootstrap: bool,
    /// Join a cluster through a member's internal address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub join: Option<String>,
    /// Let a cluster node listen beyond loopback without TLS. Anyone who can reach its
    /// ports can then read every document, write and delete, and join or remove nodes;
    /// tokens travel in the clear. For a trusted private network only.
    #[arg(long)]
    pub insecure: bool,
}

fn scalar(raw: &str) -> toml::Value {
    match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.into()),
    }
}

fn set_path(table: &mut toml::Table, path: &[&str], value: toml::Value) -> Result<(), String> {
    match path {
        [] => Err("empty key".into()),
        [key] => {
            table.insert(key.to_string(), value);
            Ok(())
        }
        [section, rest @ ..] => {
            let entry = table
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            match entry {
                toml::Value::Table(t) => set_path(t, rest, value),
                _ => Err(format!("{section} is not a section")),
            }
        }
    }
}

impl Config {
    /// Loads defaults < file < environment (`vars`) < flags.
    pub fn load(
        flags: &ConfigFlags,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, CliError> {
        let table = match &flags.config {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|source| CliError::File {
                    action: "read config file",
                    path: path.display().to_string(),
                    source,
                })?
                .parse::<toml::Table>()
                .map_err(|e| CliError::Config(format!("config file {}: {e}", path.display())))?,
            None => toml::Table::new(),
        };
        Config::layer(table, flags, vars).map_err(CliError::Config)
    }

    /// The file's `table` < environment < flags, checked.
    fn layer(
        mut table: toml::Table,
        flags: &ConfigFlags,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, String> {
        // Only variables naming a key or section of the configuration apply: the NEARDUP_
        // namespace is shared with the client (NEARDUP_SERVER) and with tools and tests. A
        // wrong key inside a known section is still an error.
        let known: toml::Table =
            toml::from_str(&Config::default().to_toml()).map_err(|e| e.to_string())?;
        for (k, v) in vars {
            let Some(rest) = k.strip_prefix("NEARDUP_") else { continue };
            let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
            if rest == "CONFIG" || !known.contains_key(&path[0]) {
                continue;
            }
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            set_path(&mut table, &path, scalar(&v)).map_err(|e| format!("{k}: {e}"))?;
        }
        let mut set = |key: &str, v: toml::Value| set_path(&mut table, &[key], v);
        if let Some(d) = &flags.data {
            set("data", toml::Value::String(d.display().to_string()))?;
        }
        if let Some(l) = &flags.listen {
            set("listen", toml::Value::String(l.clone()))?;
        }
        if let Some(m) = &flags.metrics_listen {
            set("metrics_listen", toml::Value::String(m.clone()))?;
        }
        if let Some(d) = &flags.design {
            set_path(&mut table, &["index", "design"], toml::Value::String(d.clone()))?;
        }
        for kv in &flags.set {
            let (k, v) =
                kv.split_once('=').ok_or_else(|| format!("--set {kv}: expected KEY=VALUE"))?;
            let path: Vec<&str> = k.split('.').collect();
            set_path(&mut table, &path, scalar(v)).map_err(|e| format!("--set {kv}: {e}"))?;
        }
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| format!("configuration: {e}"))?;
        config.check()?;
        Ok(config)
    }

    /// Applies the cluster flags of `serve` over the loaded configuration, checked again.
    pub fn with_cluster_flags(mut self, flags: &ClusterFlags) -> Result<Config, CliError> {
        let c = &mut self.cluster;
        if let Some(id) = flags.node_id {
            c.node_id = id;
        }
        if let Some(l) = &flags.internal_listen {
            c.internal_listen = l.clone();
        }
        if flags.bootstrap {
            c.bootstrap = true;
        }
        if let Some(j) = &flags.join {
            c.join = j.clone();
        }
        if flags.insecure {
            c.insecure = true;
        }
        self.check().map_err(CliError::Config)?;
        Ok(self)
    }

    /// Checks what deserialisation cannot.
    fn check(&self) -> Result<(), String> {
        if !matches!(self.log_format.as_str(), "text" | "json") {
            return Err(format!("log_format = {:?}: expected text or json", self.log_format));
        }
        self.index_config_text()?.validate().map_err(|e| format!("[index]: {e}"))?;
        let c = &self.cluster;
        if c.bootstrap && !c.join.is_empty() {
            return Err("[cluster] bootstrap and join exclude each other: a node either starts \
                        a new cluster or joins one"
                .into());
        }
        if c.tick_ms == 0 || c.election_ticks <= c.heartbeat_ticks || c.heartbeat_ticks == 0 {
            return Err(format!(
                "[cluster] tick_ms = {}, election_ticks = {}, heartbeat_ticks = {}: expected a \
                 tick above 0 and 0 < heartbeat_ticks < election_ticks",
                c.tick_ms, c.election_ticks, c.heartbeat_ticks
            ));
        }
        if c.max_voters == 0 {
            return Err("[cluster] max_voters = 0: expected at least 1".into());
        }
        let given = [&c.tls_ca_file, &c.tls_cert_file, &c.tls_key_file].map(|f| !f.is_empty());
        if given.iter().any(|&g| g) && !given.iter().all(|&g| g) {
            return Err("[cluster] tls_ca_file, tls_cert_file and tls_key_file go together: give \
                        all three or none"
                .into());
        }
        self.verify.validate().map_err(|e| format!("[verify]: {e}"))?;
        Ok(())
    }

    /// The index configuration.
    pub fn index_config(&self) -> Result<IndexConfig, CliError> {
        self.index_config_text().map_err(CliError::Config)
    }

    fn index_config_text(&self) -> Result<IndexConfig, String> {
        let design = Design::parse(&self.index.design)
            .map_err(|e| format!("[index] design {:?}: {e}", self.index.design))?;
        let codec = self.index.codec.parse().map_err(|e| format!("[index] codec: {e}"))?;
        let layout = self.index.layout.parse().map_err(|e| format!("[index] layout: {e}"))?;
        Ok(IndexConfig {
            design,
            tables: TableOptions {
                block_bytes: self.index.block_bytes,
                codec,
                layout,
                ..TableOptions::default()
            },
            buffer_docs: self.index.buffer_docs,
            merge_fanout: self.index.merge_fanout,
            max_runs: self.index.max_runs,
            auto_merge: false,
            ..IndexConfig::default()
        })
    }

    /// The shard configuration.
    pub fn shard_config(&self) -> Result<ShardConfig, CliError> {
        let s = &self.storage;
        Ok(ShardConfig {
            index: self.index_config()?,
            max_id_bytes: self.limits.max_id_bytes,
            checkpoint_ops: s.checkpoint_ops,
            checkpoint_interval: Duration::from_secs(s.checkpoint_interval_secs),
            idle_flush: Duration::from_millis(s.idle_flush_ms),
            compact_idle: Duration::from_secs(s.compact_idle_secs),
            snapshot_log_bytes: s.snapshot_log_mb << 20,
            stored_tables: s.stored_tables,
            cache_bytes: s.cache_mb << 20,
            min_free_bytes: s.min_free_mb << 20,
            ..ShardConfig::default()
        })
    }

    /// The token check of the public and admin APIs, with its file watched for changes
    /// (every 2 s, and on SIGHUP); `None` when `auth.tokens_file` is empty. Needs a tokio
    /// runtime.
    pub fn access(&self) -> Result<Option<Arc<Access>>, CliError> {
        if self.auth.tokens_file.is_empty() {
            return Ok(None);
        }
        let access = Access::new(AccessConfig {
            tokens_file: PathBuf::from(&self.auth.tokens_file),
            close_health: self.auth.close_health,
            close_reflection: self.auth.close_reflection,
        })
        .map_err(CliError::Config)?;
        tracing::info!(
            file = %self.auth.tokens_file,
            tokens = access.tokens(),
            "API tokens checked"
        );
        // Detached: it watches as long as the process runs.
        drop(access.watch(Duration::from_secs(2)));
        Ok(Some(access))
    }

    /// The token `/metrics` asks for, its file watched for changes (every 2 s, and on
    /// SIGHUP); `None` when `auth.metrics_token_file` is empty. Needs a tokio runtime.
    pub fn metrics_token(&self) -> Result<Option<Arc<MetricsToken>>, CliError> {
        if self.auth.metrics_token_file.is_empty() {
            return Ok(None);
        }
        let token = MetricsToken::new(PathBuf::from(&self.auth.metrics_token_file))
            .map_err(CliError::Config)?;
        drop(token.watch(Duration::from_secs(2)));
        Ok(Some(token))
    }

    /// TLS on the public API, its files watched for changes (every 2 s, and on SIGHUP);
    /// `None` when `tls.cert_file` and `tls.key_file` are empty. Needs a tokio runtime.
    pub fn tls(&self) -> Result<Option<Arc<Tls>>, CliError> {
        let t = &self.tls;
        match (t.cert_file.is_empty(), t.key_file.is_empty()) {
            (true, true) => return Ok(None),
            (false, false) => {}
            _ => {
                return Err(CliError::Config(
                    "tls.cert_file and tls.key_file go together: give both or neither".into(),
                ));
            }
        }
        let files = TlsFiles {
            cert_file: PathBuf::from(&t.cert_file),
            key_file: PathBuf::from(&t.key_file),
            client_ca_file: None,
        };
        let tls = Tls::new(files).map_err(CliError::Config)?;
        tracing::info!(cert = %t.cert_file, "TLS on the public API");
        // Detached: it watches as long as the process runs.
        drop(tls.watch(Duration::from_secs(2)));
        Ok(Some(tls))
    }

    /// Mutual TLS between the nodes of the cluster, its files watched for changes (every 2 s,
    /// and on SIGHUP); `None` when `cluster.tls_*` are empty. Needs a tokio runtime.
    pub fn cluster_tls(&self) -> Result<Option<Arc<ClusterTls>>, CliError> {
        let c = &self.cluster;
        if c.tls_ca_file.is_empty() {
            return Ok(None);
        }
        let tls = ClusterTls::new(ClusterTlsFiles {
            ca_file: PathBuf::from(&c.tls_ca_file),
            cert_file: PathBuf::from(&c.tls_cert_file),
            key_file: PathBuf::from(&c.tls_key_file),
        })
        .map_err(CliError::Config)?;
        tracing::info!(cert = %c.tls_cert_file, ca = %c.tls_ca_file, "mutual TLS between nodes");
        drop(tls.watch(Duration::from_secs(2)));
        Ok(Some(tls))
    }

    /// Refuses a cluster node that would listen beyond loopback without TLS (the public
    /// port without `[tls]`, the internal one without `cluster.tls_*`), unless
    /// `cluster.insecure` is set. Checked on the configured addresses, before binding.
    pub fn check_exposure(&self) -> Result<(), CliError> {
        if self.cluster.insecure {
            return Ok(());
        }
        let public_tls = !self.tls.cert_file.is_empty();
        let internal_tls = !self.cluster.tls_ca_file.is_empty();
        let ports = [
            (&self.listen, public_tls, "the public API", "[tls] cert_file and key_file"),
            (
                &self.cluster.internal_listen,
                internal_tls,
                "the internal API",
                "[cluster] tls_ca_file, tls_cert_file and tls_key_file",
            ),
        ];
        for (addr, tls, what, keys) in ports {
            if !tls && !loopback(addr) {
                return Err(CliError::Config(format!(
                    "a cluster node listening on {addr} ({what}) beyond loopback needs TLS: set \
                     {keys} (see docs/security.md), or accept plaintext with --insecure"
                )));
            }
        }
        Ok(())
    }

    /// The configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the configuration serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_node_beyond_loopback_needs_tls_or_insecure() {
        assert!(loopback("127.0.0.1:1") && loopback("[::1]:1") && loopback("localhost:1"));
        assert!(!loopback("0.0.0.0:1") && !loopback("10.0.0.2:1") && !loopback("node1:1"));
        let mut c = Config::default();
        c.check_exposure().unwrap();
        c.listen = "0.0.0.0:50051".into();
        let e = c.check_exposure().unwrap_err().to_string();
        assert!(e.contains("public API") && e.contains("--insecure"), "{e}");
        c.tls.cert_file = "s.pem".into();
        c.tls.key_file = "s.key".into();
        c.check_exposure().unwrap();
        c.cluster.internal_listen = "node1:50061".into();
        let e = c.check_exposure().unwrap_err().to_string();
        assert!(e.contains("internal API") && e.contains("tls_ca_file"), "{e}");
        c.cluster.tls_ca_file = "ca.pem".into();
        c.check_exposure().unwrap();
        c.cluster.tls_ca_file.clear();
        c.cluster.insecure = true;
        c.check_exposure().unwrap();
        // Half the cluster's TLS keys is refused.
        let half =
            ConfigFlags { set: vec!["cluster.tls_ca_file=ca.pem".into()], ..Default::default() };
        let e = Config::load(&half, std::iter::empty()).unwrap_err().to_string();
        assert!(e.contains("go together"), "{e}");
    }

    #[test]
    fn layers_override_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("n.toml");
        std::fs::write(
            &file,
            "listen = \"0.0.0.0:1\"\n[storage]\ncache_mb = 7\ncheckpoint_ops = 9\n",
        )
        .unwrap();
        let flags = ConfigFlags {
            config: Some(file),
            listen: Some("127.0.0.1:2".into()),
            set: vec!["index.buffer_docs=128".into()],
            ..Default::default()
        };
        let env = vec![
            ("NEARDUP_STORAGE__CACHE_MB".to_string(), "8".to_string()),
            ("NEARDUP_LOG_FORMAT".to_string(), "json".to_string()),
            ("OTHER".to_string(), "x".to_string()),
            ("NEARDUP_SERVER".to_string(), "http://elsewhere:1".to_string()),
            ("NEARDUP_EVAL_SMALL".to_string(), "/some/file".to_string()),
        ];
        let c = Config::load(&flags, env.into_iter()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:2", "flag over file");
        assert_eq!(c.storage.cache_mb, 8, "env over file");
        assert_eq!(c.storage.checkpoint_ops, 9, "file over default");
        assert_eq!(c.log_format, "json");
        assert_eq!(c.index.buffer_docs, 128);
        assert_eq!(c.data, PathBuf::from("./neardup-data"), "default");
        let round: Config = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(round, c);
    }

    #[test]
    fn the_deployed_file_holds_the_defaults() {
        let text = include_str!("../../deploy/neardup.toml");
        let deployed: Config = toml::from_str(text).unwrap();
        let defaults = Config { data: PathBuf::from("/var/lib/neardup"), ..Config::default() };
        assert_eq!(deployed, defaults, "deploy/neardup.toml must hold every default");
    }

    #[test]
    fn mistakes_are_reported() {
        let bad = |set: &str| {
            let flags = ConfigFlags { set: vec![set.into()], ..Default::default() };
            Config::load(&flags, std::iter::empty()).unwrap_err().to_string()
        };
        assert!(bad("storage.cache_mbb=1").contains("unknown field"));
        assert!(bad("storage.cache_mb=many").contains("cache_mb"));
        assert!(bad("index.design=7c9").contains("design"));
        assert!(bad("log_format=xml").contains("log_format"));
        assert!(bad("cluster.heartbeat_ticks=10").contains("heartbeat_ticks"));
        assert!(bad("cluster.max_voters=0").contains("max_voters"));
        let both = ClusterFlags { bootstrap: true, join: Some("h:1".into()), ..Default::default() };
        let e = Config::default().with_cluster_flags(&both).unwrap_err().to_string();
        assert!(e.contains("bootstrap and join"), "{e}");
        let typo = vec![("NEARDUP_STORAGE__CACHE_MBB".to_string(), "1".to_string())];
        let e = Config::load(&ConfigFlags::default(), typo.into_iter()).unwrap_err().to_string();
        assert!(e.contains("unknown field"), "{e}");
    }
}
