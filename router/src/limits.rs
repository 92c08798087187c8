//! The documented limits of the public API, and the checks that enforce them before a
//! request changes anything.

use std::time::Duration;

use neardup_proto::v1::{Document, QueryTarget, document, query_target};
use neardup_server::transport::Http2Limits;

use crate::error::{Result, RouterError};

/// Limits on requests. The defaults are the ones `proto/neardup/v1/neardup.proto`
/// documents. It is also the `[limits]` section of the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Most documents, queries, ids or texts in one message.
    pub max_batch: usize,
    /// Longest document id, in bytes.
    pub max_id_bytes: usize,
    /// Longest text, in bytes.
    pub max_text_bytes: usize,
    /// Largest `limit` a query may ask for.
    pub max_limit: u32,
    /// `limit` when a query says 0.
    pub default_limit: u32,
    /// Largest encoded message the server decodes (bigger ones: OUT_OF_RANGE, from gRPC).
    pub max_message_bytes: usize,
    /// Most requests in flight at once (more: RESOURCE_EXHAUSTED).
    pub max_in_flight: usize,
    /// Most matches in one response, over all its queries (the shard's bound, 100,000, is
    /// also the most this may be). Past it, later results hold fewer matches, marked
    /// `truncated`.
    pub max_response_matches: usize,
    /// Most bytes of matches in one response (each counted as its id's length plus 40; at
    /// most the shard's bound, 3 MiB, which keeps a full answer under the 4 MiB gRPC
    /// clients accept by default).
    pub max_response_bytes: usize,
    /// Most streams (requests) one connection may have open at once, so a few connections
    /// cannot take every in-flight slot.
    pub max_streams_per_connection: u32,
    /// A client stream (InsertStream, QueryBatch) that sends no message for this many
    /// seconds is ended with DEADLINE_EXCEEDED, releasing its slot; 0: never.
    pub stream_idle_secs: u64,
    /// An HTTP/2 keepalive ping after this many seconds without a frame from the peer (a
    /// connection that does not answer within 20 s is closed); 0: none.
    pub keepalive_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_batch: 10_000,
            max_id_bytes: 1024,
            max_text_bytes: 4 << 20,
            max_limit: 10_000,
            default_limit: 100,
            max_message_bytes: 64 << 20,
            max_in_flight: 4096,
            max_response_matches: 100_000,
            max_response_bytes: 3 << 20,
            max_streams_per_connection: 100,
            stream_idle_secs: 30,
            keepalive_secs: 30,
        }
    }
}

/// What a document or query carries: a fingerprint or a text to fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content<'a> {
    /// A fingerprint.
    Fingerprint(u64),
    /// A text.
    Text(&'a str),
}

impl Limits {
    /// The listener's HTTP/2 limits.
    pub fn http2(&self) -> Http2Limits {
        Http2Limits {
            max_streams_per_connection: self.max_streams_per_connection,
            keepalive: (self.keepalive_secs > 0).then(|| Duration::from_secs(self.keepalive_secs)),
            ..Http2Limits::default()
        }
    }

    /// How long a client stream may stay silent, if bounded.
    pub fn stream_idle(&self) -> Option<Duration> {
        (self.stream_idle_secs > 0).then(|| Duration::from_secs(self.stream_idle_secs))
    }

    /// Checks a batch's size.
    pub fn batch(&self, what: &str, n: usize) -> Result<()> {
        if n == 0 {
            return Err(RouterError::invalid(format!("the request has no {what}")));
        }
        if n > self.max_batch {
            return Err(RouterError::invalid(format!(
                "{n} {what} in one message, more than the limit of {}",
                self.max_batch
            )));
        }
        Ok(())
    }

    /// Checks a document id.
    pub fn id(&self, id: &str) -> Result<()> {
        if id.is_empty() {
            return Err(RouterError::invalid("a document id must not be empty"));
        }
        if id.len() > self.max_id_bytes {
            return Err(RouterError::invalid(format!(
                "document id is {} bytes, more than the limit of {}",
                id.len(),
                self.max_id_bytes
            )));
        }
        Ok(())
    }

    /// Checks a text's size.
    pub fn text<'a>(&self, text: &'a str) -> Result<Content<'a>> {
        if text.len() > self.max_text_bytes {
            return Err(RouterError::invalid(format!(
                "text is {} bytes, more than the limit of {}",
                text.len(),
                self.max_text_bytes
            )));
        }
        Ok(Content::Text(text))
    }

    /// The content of a document: exactly one of fingerprint or text.
    pub fn document<'a>(&self, d: &'a Document) -> Result<Content<'a>> {
        self.id(&d.id)?;
        match &d.content {
            Some(document::Content::Fingerprint(fp)) => Ok(Content::Fingerprint(*fp)),
            Some(document::Content::Text(t)) => self.text(t),
            None => Err(RouterError::invalid(format!(
                "document {:?} has neither a fingerprint nor a text (exactly one is needed)",
                d.id
            ))),
        }
    }

    /// The content of a query target.
    pub fn target<'a>(&self, t: Option<&'a QueryTarget>) -> Result<Content<'a>> {
        match t.and_then(|t| t.target.as_ref()) {
            Some(query_target::Target::Fingerprint(fp)) => Ok(Content::Fingerprint(*fp)),
            Some(query_target::Target::Text(t)) => self.text(t),
            None => {
                Err(RouterError::invalid("a query needs a fingerprint or a text (exactly one)"))
            }
        }
    }

    /// The k to use: the design's maximum when unset; refused above it.
    pub fn k(&self, k: Option<u32>, max_k: u32) -> Result<u32> {
        match k {
            None => Ok(max_k),
            Some(k) if k <= max_k => Ok(k),
            Some(k) => Err(RouterError::invalid(format!(
                "k = {k} is out of range: this index answers exactly for k <= {max_k}"
            ))),
        }
    }

    /// The limit to use: the default for 0; refused above the maximum.
    pub fn limit(&self, limit: u32) -> Result<u32> {
        match limit {
            0 => Ok(self.default_limit),
            l if l <= self.max_limit => Ok(l),
            l => Err(RouterError::invalid(format!(
                "limit = {l} is more than the maximum of {}",
                self.max_limit
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule() {
        let l = Limits::default();
        assert!(l.batch("documents", 0).is_err());
        assert!(l.batch("documents", 10_001).is_err());
        assert!(l.batch("documents", 10_000).is_ok());
        assert!(l.id("").is_err() && l.id(&"a".repeat(1025)).is_err());
        assert!(l.id(&"a".repeat(1024)).is_ok());
        assert_eq!(l.k(None, 3).unwrap(), 3);
        assert!(l.k(Some(4), 3).is_err());
        assert_eq!(l.limit(0).unwrap(), 100);
        assert!(l.limit(10_001).is_err());
        let d = Document { id: "x".into(), content: None, timestamp_ms: 0, ..Default::default() };
        assert!(l.document(&d).is_err());
        assert!(l.target(None).is_err());
        let big = "a".repeat((4 << 20) + 1);
        assert!(l.text(&big).is_err());
    }
}
