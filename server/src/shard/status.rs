//! Whether the shard answers requests, and the refusal a request gets when it does not.
//!
//! The status has one home, a watch channel: [`Shard::status`] reads it, health reporting
//! follows its changes ([`Shard::watch_status`]), and every request checks it first.

use tokio::sync::watch;

use super::Shard;
use crate::error::{Error, Result};

/// Whether a shard answers requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Loading runs and replaying the log; requests are refused (retry later).
    Recovering,
    /// Answering requests.
    Serving,
    /// A tablet could not be loaded; nothing is served. The message says what is damaged.
    Corrupt(String),
    /// A sync of the store failed: records appended before it may be lost whatever later
    /// syncs report, so nothing is acknowledged or served until the shard is restarted and
    /// recovers from what the disk holds. The message is the storage error.
    Failed(String),
    /// Shutting down; requests are refused.
    ShuttingDown,
}

impl Shard {
    /// The current status.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Status changes, for health reporting.
    pub fn watch_status(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    pub(super) fn set_status(&self, s: Status) {
        self.status.send_replace(s);
    }

    /// Ok while serving; otherwise the error a request gets.
    #[inline]
    pub(super) fn check_serving(&self) -> Result<()> {
        match &*self.status.borrow() {
            Status::Serving => Ok(()),
            Status::Recovering => Err(Error::Recovering),
            Status::Corrupt(m) => Err(Error::CorruptTablet(m.clone())),
            Status::Failed(m) => Err(Error::SyncFailed(m.clone())),
            Status::ShuttingDown => Err(Error::ShuttingDown),
        }
    }
}
