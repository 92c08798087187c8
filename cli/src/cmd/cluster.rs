//! `neardup cluster`: the operator's side of the admin API (`neardup.admin.v1`) of a
//! cluster node, reached on its internal listener. Each command prints one JSON object.
//!
//! - `status`: leader, term, epoch, applied index, nodes and tablets, as the node sees them;
//! - `add`, `remove NODE`, `transfer-leader NODE`, `rebalance`: a change, sent to any member
//!   (a member that is not the leader forwards it); prints the epoch it was applied at
//!   (`rebalance` also the replicas then filling: the moves it started, and any under way).

use std::path::PathBuf;
use std::time::Duration;

use neardup_client::{Auth, ClientError, Token};
use neardup_proto::admin::admin_client::AdminClient;
use neardup_proto::admin::{
    AddNodeRequest, ChangeResponse, Design, Node, NodeState, Partition, RebalanceRequest,
    RemoveNodeRequest, Role, StatusRequest, StatusResponse, Tablet, TabletState,
    TransferLeaderRequest,
};
use neardup_server::tls::{ClusterTls, ClusterTlsFiles, peer_endpoint};
use serde_json::{Value, json};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::cmd::common::{self, TokenArgs, hex};
use crate::error::CliError;

/// Options of `neardup cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// What to ask.
    #[command(subcommand)]
    pub command: ClusterCommand,
}

/// Where the admin API is.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminAddr {
    /// A member's internal address (its `--internal-listen`), HOST:PORT or http://HOST:PORT.
    #[arg(long, env = "NEARDUP_ADMIN", default_value = "127.0.0.1:50061")]
    pub addr: String,
    /// Deadline of the call, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// An admin token, when the cluster checks tokens.
    #[command(flatten)]
    pub token: TokenArgs,
    /// Mutual TLS: the cluster CA's certificate (PEM), when the nodes' internal ports take
    /// TLS; with --tls-cert and --tls-key, a certificate it signed.
    #[arg(long, env = "NEARDUP_CLUSTER_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// Mutual TLS: this client's certificate (PEM), signed by the cluster CA.
    #[arg(long, env = "NEARDUP_CLUSTER_TLS_CERT", requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    /// Mutual TLS: its key (PEM).
    #[arg(long, env = "NEARDUP_CLUSTER_TLS_KEY", requires = "tls_ca")]
    pub tls_key: Option<PathBuf>,
}

impl AdminAddr {
    /// A client of the admin API this names.
    fn client(&self) -> Result<Admin, CliError> {
        let tls = match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), Some(cert), Some(key)) => Some(
                ClusterTls::new(ClusterTlsFiles {
                    ca_file: ca.clone(),
                    cert_file: cert.clone(),
                    key_file: key.clone(),
                })
                .map_err(CliError::Config)?,
            ),
            _ => None,
        };
        let timeout = Duration::from_millis(self.timeout_ms);
        admin_client(&self.addr, timeout, self.token.token()?, tls.as_deref())
    }
}

/// A client of the admin API, with its token.
pub type Admin = AdminClient<InterceptedService<Channel, Auth>>;

/// The `cluster` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// The cluster as one member sees it (one JSON object).
    Status {
        /// The member to ask.
        #[command(flatten)]
        admin: AdminAddr,
    },
    /// Add a node (it joins as a learner, and is promoted to voter once caught up).
    Add {
        /// The member to ask.
        #[command(flatten)]
        admin: AdminAddr,
        /// The new node's id (not 0).
        #[arg(long)]
        node_id: u64,
        /// Its public address, HOST:PORT.
        #[arg(long)]
        public: String,
        /// Its internal address, HOST:PORT.
        #[arg(long)]
        internal: String,
    },
    /// Remove a node (drained first).
    Remove {
        /// The node's id.
        node: u64,
        /// The member to ask.
        #[command(flatten)]
        admin: AdminAddr,
    },
    /// Hand leadership to another voter.
    TransferLeader {
        /// The voter to lead.
        node: u64,
        /// The member to ask.
        #[command(flatten)]
        admin: AdminAddr,
    },
    /// Place every tablet and partition again (units a manual placement put aside go back
    /// to balance); the moves fill in the background, and `status` shows them.
    Rebalance {
        /// The member to ask.
        #[command(flatten)]
        admin: AdminAddr,
    },
}

/// A client of the admin API at `addr`, sending `token` with every call, over mutual TLS
/// with `tls`, connecting on first use (a refused connection is the first call's error).
pub fn admin_client(
    addr: &str,
    timeout: Duration,
    token: Option<Token>,
    tls: Option<&ClusterTls>,
) -> Result<Admin, CliError> {
    let endpoint = peer_endpoint(addr, tls)
        .map_err(|reason| CliError::Connect { server: addr.to_string(), reason })?
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .timeout(timeout);
    let auth = Auth::new(token.as_ref()).map_err(|e| CliError::Config(e.to_string()))?;
    Ok(AdminClient::with_interceptor(endpoint.connect_lazy(), auth))
}

/// Runs `neardup cluster`.
pub async fn run(args: ClusterArgs) -> Result<(), CliError> {
    let value = match args.command {
        ClusterCommand::Status { admin } => {
            let mut c = admin.client()?;
            let r = c.status(StatusRequest {}).await.map_err(|s| failed(&admin, s))?;
            status_json(&r.into_inner())
        }
        ClusterCommand::Add { admin, node_id, public, internal } => {
            let mut c = admin.client()?;
            let req = AddNodeRequest { node_id, public_addr: public, internal_addr: internal };
            let r = c.add_node(req).await.map_err(|s| failed(&admin, s))?;
            change_json(&r.into_inner())
        }
        ClusterCommand::Remove { node, admin } => {
            let mut c = admin.client()?;
            let r = c
                .remove_node(RemoveNodeRequest { node_id: node })
                .await
                .map_err(|s| failed(&admin, s))?;
            change_json(&r.into_inner())
        }
        ClusterCommand::TransferLeader { node, admin } => {
            let mut c = admin.client()?;
            let r = c
                .transfer_leader(TransferLeaderRequest { node_id: node })
                .await
                .map_err(|s| failed(&admin, s))?;
            change_json(&r.into_inner())
        }
        ClusterCommand::Rebalance { admin } => {
            let mut c = admin.client()?;
            let r = c.rebalance(RebalanceRequest {}).await.map_err(|s| failed(&admin, s))?;
            let mut value = change_json(&r.into_inner());
            // The replicas filling once it applied: the moves it started, and any before.
            let s = c.status(StatusRequest {}).await.map_err(|s| failed(&admin, s))?.into_inner();
            let filling: usize = s.tablets.iter().map(|t| t.filling.len()).sum::<usize>()
                + s.partitions.iter().map(|p| p.filling.len()).sum::<usize>();
            value["filling"] = json!(filling);
            value
        }
    };
    common::print(&value);
    Ok(())
}

fn failed(admin: &AdminAddr, s: tonic::Status) -> CliError {
    CliError::client(&admin.addr, ClientError::Status(s))
}

/// A change's answer as JSON.
pub fn change_json(r: &ChangeResponse) -> Value {
    let ChangeResponse { epoch, index, leader } = r;
    json!({ "epoch": epoch, "index": index, "leader": leader })
}

fn role_name(role: i32) -> &'static str {
    match Role::try_from(role) {
        Ok(Role::Voter) => "voter",
        Ok(Role::Learner) => "learner",
        _ => "unknown",
    }
}

fn state_name(state: i32) -> &'static str {
    match NodeState::try_from(state) {
        Ok(NodeState::Joining) => "joining",
        Ok(NodeState::Active) => "active",
        Ok(NodeState::Draining) => "draining",
        Ok(NodeState::Down) => "down",
        _ => "unknown",
    }
}

fn tablet_state_name(state: i32) -> &'static str {
    match TabletState::try_from(state) {
        Ok(TabletState::Active) => "active",
        Ok(TabletState::Moving) => "moving",
        _ => "unknown",
    }
}

/// The status as one JSON object: leader (null when none is known), term, epoch, applied
/// index, nodes and tablets.
pub fn status_json(r: &StatusResponse) -> Value {
    let StatusResponse {
        node_id,
        leader,
        leader_addr,
        term,
        epoch,
        applied,
        committed,
        cluster_id,
        design,
        nodes,
        tablets,
        partitions,
        replicas,
        split_bits,
        removed,
    } = r;
    // Only the leader tracks its followers' progress: elsewhere "caught up" is unknown (null).
    let is_leader = *leader != 0 && leader == node_id;
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let Node { id, public_addr, internal_addr, role, state, caught_up, lost } = n;
            let caught_up = is_leader.then_some(*caught_up);
            json!({
                "id": id,
                "public_addr": public_addr,
                "internal_addr": internal_addr,
                "role": role_name(*role),
                "state": state_name(*state),
                "caught_up": caught_up,
                "lost": lost,
            })
        })
        .collect();
    let tablets: Vec<Value> = tablets
        .iter()
        .map(|t| {
            let Tablet { table, start, end, nodes, state, filling } = t;
            json!({
                "table": table,
                "start": hex(*start),
                "end": hex(*end),
                "nodes": nodes,
                "filling": filling,
                "state": tablet_state_name(*state),
            })
        })
        .collect();
    let partitions: Vec<Value> = partitions
        .iter()
        .map(|p| {
            let Partition { index, nodes, filling } = p;
            json!({ "index": index, "nodes": nodes, "filling": filling })
        })
        .collect();
    let design = design.as_ref().map(|d| {
        let Design { name, tables, max_k } = d;
        json!({ "name": name, "tables": tables, "max_k": max_k })
    });
    let redundancy = redundancy(r);
    json!({
        "node_id": node_id,
        "leader": if *leader == 0 { Value::Null } else { json!(leader) },
        "leader_addr": leader_addr,
        "term": term,
        "epoch": epoch,
        "applied": applied,
        "committed": committed,
        "cluster_id": cluster_id,
        "design": design,
        "nodes": nodes,
        "tablets": tablets,
        "partitions": partitions,
        "replicas": replicas,
        "split_bits": split_bits,
        "removed": removed,
        "redundancy": redundancy,
    })
}

/// How far the cluster is from full redundancy: the units, those with their full count of
/// serving replicas on nodes up, and the replicas filling (copies under way, whether for a
/// node back, a node added or a lost node's units rebuilt).
fn redundancy(r: &StatusResponse) -> Value {
    let down = NodeState::Down as i32;
    let up = |n: &u64| r.nodes.iter().any(|x| x.id == *n && x.state != down);
    let active = NodeState::Active as i32;
    let usable = r.nodes.iter().filter(|n| n.state == active || (n.state == down && !n.lost));
    let want = (r.replicas as usize).min(usable.count()).max(1);
    let units = r
        .tablets
        .iter()
        .map(|t| (&t.nodes, &t.filling))
        .chain(r.partitions.iter().map(|p| (&p.nodes, &p.filling)));
    let (mut total, mut full, mut filling) = (0, 0, 0);
    for (nodes, fill) in units {
        total += 1;
        full += usize::from(nodes.iter().filter(|n| up(n)).count() >= want);
        filling += fill.len();
    }
    json!({ "units": total, "fully_replicated": full, "replicas_filling": filling })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_one_object_with_every_part() {
        let r = StatusResponse {
            node_id: 2,
            leader: 1,
            leader_addr: "127.0.0.1:7001".into(),
            term: 3,
            epoch: 5,
            applied: 9,
            committed: 9,
            cluster_id: "c".into(),
            design: Some(Design { name: "paper-10".into(), tables: 10, max_k: 3 }),
            nodes: vec![Node {
                id: 1,
                public_addr: "127.0.0.1:7000".into(),
                internal_addr: "127.0.0.1:7001".into(),
                role: Role::Voter as i32,
                state: NodeState::Active as i32,
                caught_up: true,
                lost: false,
            }],
            tablets: vec![Tablet {
                table: 0,
                start: 0,
                end: u64::MAX,
                nodes: vec![1],
                state: TabletState::Active as i32,
                filling: vec![2],
            }],
            partitions: vec![Partition { index: 0, nodes: vec![1], filling: vec![2] }],
            replicas: 2,
            split_bits: 2,
            removed: vec![4],
        };
        let v = status_json(&r);
        assert_eq!(v["removed"], json!([4]));
        // One node usable: both units have their one serving replica; node 2 fills two.
        assert_eq!(
            v["redundancy"],
            json!({ "units": 2, "fully_replicated": 2, "replicas_filling": 2 })
        );
        assert_eq!(v["nodes"][0]["lost"], false);
        assert_eq!(v["leader"], 1);
        assert_eq!(v["epoch"], 5);
        assert_eq!(v["applied"], 9);
        assert_eq!(v["nodes"][0]["role"], "voter");
        assert_eq!(v["nodes"][0]["state"], "active");
        assert!(v["nodes"][0]["caught_up"].is_null(), "node 2 is not the leader: unknown");
        let from_leader = status_json(&StatusResponse { node_id: 1, ..r.clone() });
        assert_eq!(from_leader["nodes"][0]["caught_up"], true);
        assert_eq!(v["tablets"][0]["end"], "0xffffffffffffffff");
        assert_eq!(v["tablets"][0]["nodes"][0], 1);
        assert_eq!(v["tablets"][0]["filling"][0], 2);
        assert_eq!(v["partitions"][0]["filling"][0], 2);
        assert_eq!(v["replicas"], 2);
        let none = status_json(&StatusResponse::default());
        assert!(none["leader"].is_null());
    }
}
