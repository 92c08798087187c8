//! raft-rs logs through `slog`; this drain hands its records to `tracing` (target
//! `neardup_cluster::raft`), with the record's key-values appended to the message.

use std::fmt::Write as _;

use slog::{Drain, KV, Key, OwnedKVList, Record, Serializer};

/// A slog drain that emits every record as a tracing event.
pub struct TracingDrain;

struct Collect(String);

impl Serializer for Collect {
    fn emit_arguments(&mut self, key: Key, val: &std::fmt::Arguments) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut kv = Collect(String::new());
        let _ = record.kv().serialize(record, &mut kv);
        let _ = values.serialize(record, &mut kv);
        let msg = record.msg();
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "neardup_cluster::raft", "{msg}{}", kv.0)
            }
            slog::Level::Warning => {
                tracing::warn!(target: "neardup_cluster::raft", "{msg}{}", kv.0)
            }
            slog::Level::Info => tracing::info!(target: "neardup_cluster::raft", "{msg}{}", kv.0),
            slog::Level::Debug => tracing::debug!(target: "neardup_cluster::raft", "{msg}{}", kv.0),
            slog::Level::Trace => tracing::trace!(target: "neardup_cluster::raft", "{msg}{}", kv.0),
        }
        Ok(())
    }
}

/// A logger for raft-rs that writes through `tracing`, tagged with the node id.
pub fn raft_logger(node_id: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!("raft_id" => node_id))
}

/// A logger that drops everything (simulations).
pub fn discard_logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}
