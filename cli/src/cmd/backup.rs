//! `neardup backup` and `neardup restore`: a copy of every document of a running server (a
//! single node, or a whole cluster through any of its nodes) into a directory, and back into
//! a fresh server (`neardup.admin.v1.Backup`, the admin role; docs/operations.md).
//!
//! # The directory
//! - `docs-NNNNNN.frames`: the documents, in frames of at most 10,000: a frame is the
//!   payload's length and its CRC-32 (each a little-endian u32), then the payload, a
//!   `RestoreRequest` holding the documents (what the restore sends as it is). A file ends
//!   at a frame boundary past [`FILE_BYTES`].
//! - `removed.u64`: ids (little-endian u64) the snapshot sent but that were deleted or
//!   replaced before its point: the restore leaves them out.
//! - `BACKUP.json` ([`Manifest`]): what the backup is from, and every file's length and
//!   CRC-32. Written last: a directory without it is not a backup.
//!
//! A restore checks every file, frame and count against the manifest before it sends
//! anything, so a damaged backup is refused with the target untouched.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use neardup_client::{BackupDoc, RestoreRequest, RestoreStart, SnapshotInfo};
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::cmd::common::{self, ServerArgs};
use crate::error::CliError;

/// The format [`Manifest::format`] names.
pub const FORMAT: u32 = 1;

/// A documents file is closed at the first frame boundary past this many bytes.
pub const FILE_BYTES: u64 = 256 << 20;

/// Largest frame payload a restore accepts (a frame holds at most 10,000 documents of at
/// most a 1,024-byte id and a 1,092-byte sketch each).
const MAX_FRAME_BYTES: u32 = 32 << 20;

/// The manifest's file name.
pub const MANIFEST: &str = "BACKUP.json";

/// The removed ids' file name.
const REMOVED: &str = "removed.u64";

/// `BACKUP.json`: what a backup holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// `node` (a single node) or `cluster`.
    pub kind: String,
    /// The table design of the server it came from.
    pub design: String,
    /// A cluster's document partitions; 0 for a single node.
    pub partitions: u32,
    /// Documents in the files (those in `removed` included).
    pub documents: u64,
    /// Documents a restore stores: those in the files, less the removed.
    pub restores: u64,
    /// Ids in `removed.u64`.
    pub removed: u64,
    /// CRC-32 of `removed.u64`.
    pub removed_crc32: u32,
    /// Largest document id in the files.
    pub max_id: u64,
    /// A single node's log sequence the backup is the state at; 0 for a cluster.
    pub seq: u64,
    /// The version of the `neardup` that wrote it.
    pub version: String,
    /// When the snapshot began and ended, ms since the Unix epoch.
    pub started_ms: i64,
    /// See `started_ms`.
    pub finished_ms: i64,
    /// The documents files, in order.
    pub files: Vec<DocsFile>,
}

/// One documents file of a backup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DocsFile {
    /// Its name in the directory.
    pub name: String,
    /// Its length.
    pub bytes: u64,
    /// CRC-32 of the whole file.
    pub crc32: u32,
    /// Frames in it.
    pub frames: u64,
    /// Documents in it.
    pub docs: u64,
}

/// Options of `neardup backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The directory to write the backup into: it must not exist, or be empty.
    #[arg(long)]
    to: PathBuf,
}

/// Options of `neardup restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The backup's directory, as `neardup backup --to` wrote it.
    #[arg(long)]
    from: PathBuf,
    /// Go on with a restore that stopped halfway: the server may hold documents already
    /// (those of the backup it holds are skipped).
    #[arg(long)]
    resume: bool,
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CliError {
    let path = path.display().to_string();
    move |source| CliError::File { action, path, source }
}

/// Writes documents files, frame by frame.
struct Writer {
    dir: PathBuf,
    files: Vec<DocsFile>,
    current: Option<(BufWriter<File>, crc32fast::Hasher, DocsFile)>,
}

impl Writer {
    fn frame(&mut self, docs: Vec<BackupDoc>) -> Result<(), CliError> {
        if self.current.is_none() {
            let name = format!("docs-{:06}.frames", self.files.len());
            let path = self.dir.join(&name);
            let f = File::create_new(&path).map_err(io_error("create", &path))?;
            let entry = DocsFile { name, bytes: 0, crc32: 0, frames: 0, docs: 0 };
            self.current =
                Some((BufWriter::with_capacity(1 << 20, f), crc32fast::Hasher::new(), entry));
        }
        let Some((w, crc, entry)) = self.current.as_mut() else { unreachable!("opened above") };
        entry.docs += docs.len() as u64;
        let payload = RestoreRequest { start: None, docs }.encode_to_vec();
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        head[4..].copy_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        let path = self.dir.join(&entry.name);
        w.write_all(&head).map_err(io_error("write", &path))?;
        w.write_all(&payload).map_err(io_error("write", &path))?;
        crc.update(&head);
        crc.update(&payload);
        entry.bytes += (head.len() + payload.len()) as u64;
        entry.frames += 1;
        if entry.bytes >= FILE_BYTES {
            self.close()?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), CliError> {
        if let Some((w, crc, mut entry)) = self.current.take() {
            let path = self.dir.join(&entry.name);
            let f = w.into_inner().map_err(|e| io_error("write", &path)(e.into_error()))?;
            f.sync_all().map_err(io_error("sync", &path))?;
            entry.crc32 = crc.finalize();
            self.files.push(entry);
        }
        Ok(())
    }
}

/// Writes `bytes` to `dir/name` durably: a temporary file synced, renamed, the directory
/// synced.
fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CliError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let mut f = File::create(&tmp).map_err(io_error("create", &tmp))?;
    f.write_all(bytes).map_err(io_error("write", &tmp))?;
    f.sync_all().map_err(io_error("sync", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_error("rename", &tmp))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error("sync", dir))
}

/// Runs `neardup backup`: prints what it wrote.
pub async fn run_backup(args: BackupArgs) -> Result<(), CliError> {
    let dir = &args.to;
    std::fs::create_dir_all(dir).map_err(io_error("create", dir))?;
    if std::fs::read_dir(dir).map_err(io_error("read", dir))?.next().is_some() {
        return Err(CliError::Backup(format!(
            "the backup directory {} is not empty: give a new or empty one",
            dir.display()
        )));
    }
    let began = Instant::now();
    let started_ms = common::now_ms();
    let client = args.server.client().await?;
    let mut stream = client.snapshot().await.map_err(|e| args.server.error(e))?;
    let incomplete = |why: String| {
        CliError::Backup(format!("{why}; {} holds no complete backup", dir.display()))
    };
    let mut info: Option<SnapshotInfo> = None;
    let mut writer = Writer { dir: dir.clone(), files: Vec::new(), current: None };
    let (mut documents, mut max_id) = (0u64, 0u64);
    let end = loop {
        let chunk = match stream.message().await {
            Ok(Some(c)) => c,
            Ok(None) => return Err(incomplete("the server ended the snapshot early".into())),
            Err(s) => return Err(args.server.error(s.into())),
        };
        if let Some(i) = chunk.info {
            info = Some(i);
        }
        if !chunk.docs.is_empty() {
            if info.is_none() {
                return Err(incomplete(
                    "the server sent documents before the snapshot's info".into(),
                ));
            }
            documents += chunk.docs.len() as u64;
            max_id = chunk.docs.iter().fold(max_id, |m, d| m.max(d.id));
            writer.frame(chunk.docs)?;
        }
        if let Some(end) = chunk.end {
            break end;
        }
    };
    let info = info.ok_or_else(|| incomplete("the server sent no snapshot info".into()))?;
    writer.close()?;
    let removed: Vec<u8> = end.removed.iter().flat_map(|id| id.to_le_bytes()).collect();
    write_durably(dir, REMOVED, &removed)?;
    let manifest = Manifest {
        format: FORMAT,
        kind: info.kind,
        design: info.design,
        partitions: info.partitions,
        documents,
        restores: end.documents,
        removed: end.removed.len() as u64,
        removed_crc32: crc32fast::hash(&removed),
        max_id,
        seq: end.seq,
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_ms,
        finished_ms: common::now_ms(),
        files: writer.files,
    };
    let text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| CliError::Backup(format!("cannot encode the manifest: {e}")))?;
    write_durably(dir, MANIFEST, &text)?;
    let bytes: u64 = manifest.files.iter().map(|f| f.bytes).sum();
    common::print(&json!({
        "backup": dir.display().to_string(),
        "kind": manifest.kind,
        "documents": manifest.restores,
        "removed": manifest.removed,
        "files": manifest.files.len(),
        "bytes": bytes,
        "seconds": began.elapsed().as_secs_f64(),
    }));
    Ok(())
}

/// The manifest of the backup in `dir`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, CliError> {
    let path = dir.join(MANIFEST);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CliError::Backup(format!(
                "{} holds no {MANIFEST}: not a backup, or one that did not finish",
                dir.display()
            )));
        }
        Err(e) => return Err(io_error("read", &path)(e)),
    };
    let m: Manifest = serde_json::from_slice(&text)
        .map_err(|e| CliError::Backup(format!("{} is damaged: {e}", path.display())))?;
    if m.format != FORMAT {
        return Err(CliError::Backup(format!(
            "{} is of format {}; this neardup reads format {FORMAT}",
            path.display(),
            m.format
        )));
    }
    Ok(m)
}

/// Reads the frames of one documents file, calling `each` with every decoded frame.
fn read_frames(
    dir: &Path,
    file: &DocsFile,
    mut each: impl FnMut(RestoreRequest) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let path = dir.join(&file.name);
    let damaged = |why: String| CliError::Backup(format!("{} is damaged: {why}", path.display()));
    let f = File::open(&path).map_err(io_error("open", &path))?;
    let len = f.metadata().map_err(io_error("read", &path))?.len();
    if len != file.bytes {
        return Err(damaged(format!("{len} bytes, the manifest says {}", file.bytes)));
    }
    let mut r = BufReader::with_capacity(1 << 20, f);
    let (mut crc, mut frames, mut docs, mut at) = (crc32fast::Hasher::new(), 0u64, 0u64, 0u64);
    let mut payload = Vec::new();
    while at < len {
        let mut head = [0u8; 8];
        r.read_exact(&mut head).map_err(|e| damaged(format!("frame {frames}: {e}")))?;
        let n = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let want = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if n > MAX_FRAME_BYTES || at + 8 + u64::from(n) > len {
            return Err(damaged(format!("frame {frames} claims {n} bytes")));
        }
        payload.resize(n as usize, 0);
        r.read_exact(&mut payload).map_err(|e| damaged(format!("frame {frames}: {e}")))?;
        if crc32fast::hash(&payload) != want {
            return Err(damaged(format!("frame {frames} fails its CRC-32")));
        }
        crc.update(&head);
        crc.update(&payload);
        let msg = RestoreRequest::decode(payload.as_slice())
            .map_err(|e| damaged(format!("frame {frames} does not decode: {e}")))?;
        docs += msg.docs.len() as u64;
        each(msg)?;
        frames += 1;
        at += 8 + u64::from(n);
    }
    if crc.finalize() != file.crc32 || frames != file.frames || docs != file.docs {
        return Err(damaged(format!(
            "{frames} frames of {docs} documents, or its CRC-32, differ from the manifest"
        )));
    }
    Ok(())
}

/// The removed ids of the backup in `dir`, checked against its manifest.
fn read_removed(dir: &Path, m: &Manifest) -> Result<HashSet<u64>, CliError> {
    let path = dir.join(REMOVED);
    let bytes = std::fs::read(&path).map_err(io_error("read", &path))?;
    if bytes.len() as u64 != m.removed * 8 || crc32fast::hash(&bytes) != m.removed_crc32 {
        return Err(CliError::Backup(format!(
            "{} is damaged: its length or CRC-32 differs from the manifest",
            path.display()
        )));
    }
    Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// Checks every file of the backup in `dir` against its manifest (lengths, CRC-32s, frames
/// and document counts), handing every frame to `each`; returns the removed ids.
pub fn verify(
    dir: &Path,
    m: &Manifest,
    mut each: impl FnMut(RestoreRequest),
) -> Result<HashSet<u64>, CliError> {
    let removed = read_removed(dir, m)?;
    let mut docs = 0u64;
    for f in &m.files {
        read_frames(dir, f, |msg| {
            docs += msg.docs.len() as u64;
            each(msg);
            Ok(())
        })?;
    }
    if docs != m.documents {
        return Err(CliError::Backup(format!(
            "{} holds {docs} documents, its manifest says {}",
            dir.display(),
            m.documents
        )));
    }
    Ok(removed)
}

/// The documents of the backup in `dir` as a restore stores them (checked against the
/// manifest; the removed left out; each id once), with the manifest.
pub fn read_backup(dir: &Path) -> Result<(Manifest, Vec<BackupDoc>), CliError> {
    let m = read_manifest(dir)?;
    let mut all = Vec::new();
    let removed = verify(dir, &m, |msg| all.extend(msg.docs))?;
    let mut seen = HashSet::new();
    all.retain(|d| !removed.contains(&d.id) && seen.insert(d.id));
    Ok((m, all))
}

/// Runs `neardup restore`: checks the whole backup, then sends it; prints what was stored.
pub async fn run_restore(args: RestoreArgs) -> Result<(), CliError> {
    let dir = args.from.clone();
    let began = Instant::now();
    let m = read_manifest(&dir)?;
    let check = dir.clone();
    let checked = m.clone();
    let removed = tokio::task::spawn_blocking(move || verify(&check, &checked, drop))
        .await
        .map_err(|e| CliError::Backup(format!("the check of the backup failed: {e}")))??;
    let client = args.server.client().await?;
    let (tx, rx) = mpsc::channel::<RestoreRequest>(8);
    let start = RestoreStart {
        info: Some(SnapshotInfo {
            kind: m.kind.clone(),
            design: m.design.clone(),
            partitions: m.partitions,
            documents: m.restores,
        }),
        max_id: m.max_id,
        resume: args.resume,
    };
    tx.send(RestoreRequest { start: Some(start), docs: Vec::new() })
        .await
        .map_err(|_| CliError::Backup("the restore stream closed at once".into()))?;
    let files = m.files.clone();
    let reader_dir = dir.clone();
    // The files were checked above; a read that fails now stops the stream, and the
    // error is reported after the server's answer.
    let reader = tokio::task::spawn_blocking(move || -> Result<u64, CliError> {
        let mut sent = 0u64;
        for f in &files {
            read_frames(&reader_dir, f, |mut msg| {
                msg.docs.retain(|d| !removed.contains(&d.id));
                sent += msg.docs.len() as u64;
                if msg.docs.is_empty() {
                    return Ok(());
                }
                tx.blocking_send(msg)
                    .map_err(|_| CliError::Backup("the server stopped taking the restore".into()))
            })?;
        }
        Ok(sent)
    });
    let answer = client.restore(ReceiverStream::new(rx)).await;
    let sent =
        reader.await.map_err(|e| CliError::Backup(format!("reading the backup failed: {e}")))?;
    let restored = answer.map_err(|e| args.server.error(e))?.restored;
    let sent = sent?;
    if restored != sent {
        return Err(CliError::Backup(format!(
            "the server stored {restored} documents of the {sent} sent; run the restore again \
             with --resume"
        )));
    }
    common::print(&json!({
        "restored": restored,
        "kind": m.kind,
        "seconds": began.elapsed().as_secs_f64(),
    }));
    Ok(())
}
