//! The backup service (`neardup.admin.v1.Backup`) on the public port: snapshots of every
//! document and restores of them, for a single node and for a cluster alike, through
//! [`ShardApi::snapshot`] and [`ShardApi::restore`].
//!
//! A backup keeps documents, not index files: each document's id, name, fingerprint,
//! timestamp, cluster and sketch. A restore stores them under the same ids, so clusters and
//! "first stored" answers come back as they were, and rebuilds the index from them.

use std::sync::Arc;

use neardup_proto::admin::backup_server::Backup;
use neardup_proto::admin::{
    BackupDoc, RestoreRequest, RestoreResponse, SnapshotChunk, SnapshotEnd, SnapshotInfo,
    SnapshotRequest,
};
use neardup_server::{DocInfo, Shard};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::shard::ShardApi;

/// Most documents in one message of a snapshot or a restore.
pub const MAX_CHUNK_DOCS: usize = 10_000;

/// Bytes of documents after which a snapshot's chunk is sent (each document counts its
/// name, sketch and 40 bytes).
pub const CHUNK_BYTES: usize = 2 << 20;

/// A document for the wire.
pub fn doc_to_wire(d: DocInfo) -> BackupDoc {
    let DocInfo { gid, name, fp, ts_ms, cluster, sketch } = d;
    BackupDoc {
        id: gid,
        name,
        fingerprint: fp,
        timestamp_ms: ts_ms,
        cluster,
        sketch: sketch.unwrap_or_default(),
    }
}

/// A document from the wire; an id of 0 is refused.
pub fn doc_from_wire(d: BackupDoc) -> Result<DocInfo, Status> {
    let BackupDoc { id, name, fingerprint, timestamp_ms, cluster, sketch } = d;
    if id == 0 {
        return Err(Status::invalid_argument(format!("document {name:?} has id 0")));
    }
    Ok(DocInfo {
        gid: id,
        name,
        fp: fingerprint,
        ts_ms: timestamp_ms,
        cluster,
        sketch: (!sketch.is_empty()).then_some(sketch),
    })
}

/// Bytes a document counts for in a chunk.
fn doc_bytes(d: &DocInfo) -> usize {
    d.name.len() + d.sketch.as_ref().map_or(0, Vec::len) + 40
}

/// Cuts `docs` into chunks of at most [`MAX_CHUNK_DOCS`] and about [`CHUNK_BYTES`].
pub fn chunks(docs: Vec<DocInfo>) -> Vec<Vec<BackupDoc>> {
    let mut out = Vec::new();
    let (mut cur, mut bytes) = (Vec::new(), 0);
    for d in docs {
        bytes += doc_bytes(&d);
        cur.push(doc_to_wire(d));
        if cur.len() >= MAX_CHUNK_DOCS || bytes >= CHUNK_BYTES {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A single node's snapshot ([`Shard::backup`]) into `tx`, on a blocking thread: `info`
/// first, the document table, the documents the log put meanwhile, and the end. Stops when
/// the receiver is gone.
pub fn node_snapshot(
    shard: &Arc<Shard>,
    info: SnapshotInfo,
    tx: &mpsc::Sender<Result<SnapshotChunk, Status>>,
) {
    let send = |c: SnapshotChunk| tx.blocking_send(Ok(c)).is_ok();
    let send_docs = |docs: Vec<DocInfo>| {
        chunks(docs).into_iter().all(|docs| send(SnapshotChunk { docs, ..Default::default() }))
    };
    let fail = |e: neardup_server::Error| {
        let _ = tx.blocking_send(Err(Status::from(neardup_server::DataError::from(e))));
    };
    let mut copy = match shard.backup() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if !send(SnapshotChunk { info: Some(info), ..Default::default() }) {
        return;
    }
    loop {
        match copy.next_docs(4096) {
            Ok(Some(docs)) => {
                if !send_docs(docs) {
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => return fail(e),
        }
    }
    let tail = match copy.finish() {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if !send_docs(tail.puts) {
        return;
    }
    let end = SnapshotEnd { removed: tail.removed, seq: tail.seq, documents: tail.documents };
    send(SnapshotChunk { end: Some(end), ..Default::default() });
}

/// The backup service over a router's shard.
pub struct BackupService {
    shard: Arc<dyn ShardApi>,
}

impl BackupService {
    /// Serves backups of `shard` (the router's: a single node's shard or the cluster).
    pub fn new(shard: Arc<dyn ShardApi>) -> Self {
        BackupService { shard }
    }
}

#[tonic::async_trait]
impl Backup for BackupService {
    type SnapshotStream = ReceiverStream<Result<SnapshotChunk, Status>>;

    async fn snapshot(
        &self,
        _req: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let shard = self.shard.clone();
        tokio::spawn(async move { shard.snapshot(tx).await });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn restore(
        &self,
        req: Request<Streaming<RestoreRequest>>,
    ) -> Result<Response<RestoreResponse>, Status> {
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("a restore needs at least one message"))?;
        let start = first.start.clone().ok_or_else(|| {
            Status::invalid_argument("the first message of a restore must carry `start`")
        })?;
        let (tx, rx) = mpsc::channel(4);
        // The messages, checked and converted, go to the shard as they arrive; a bad one
        // or a broken stream aborts the restore.
        let reader = tokio::spawn(async move {
            let mut next = Some(first);
            let mut index = 0usize;
            while let Some(m) = next {
                let docs = if index > 0 && m.start.is_some() {
                    Err(Status::invalid_argument(format!(
                        "message {index} of the restore carries `start`: only the first may"
                    )))
                } else if m.docs.len() > MAX_CHUNK_DOCS {
                    Err(Status::invalid_argument(format!(
                        "message {index} of the restore holds {} documents, more than \
                         {MAX_CHUNK_DOCS}",
                        m.docs.len()
                    )))
                } else {
                    m.docs.into_iter().map(doc_from_wire).collect::<Result<Vec<_>, _>>()
                };
                let failed = docs.is_err();
                if tx.send(docs).await.is_err() || failed {
                    return;
                }
                index += 1;
                next = match stream.message().await {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
            }
        });
        let restored = self.shard.restore(start, rx).await;
        reader.abort();
        Ok(Response::new(RestoreResponse { restored: restored? }))
    }
}
