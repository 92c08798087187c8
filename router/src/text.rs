//! Fingerprints of texts sent to the service, computed as `neardup_core::fingerprint`
//! specifies (one [`Fingerprinter`] per thread: it reuses its buffers).

use std::cell::RefCell;

use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use neardup_core::sketch::Sketch;

use crate::error::{Result, RouterError};

thread_local! {
    static FINGERPRINTER: RefCell<Option<Fingerprinter>> = const { RefCell::new(None) };
}

/// The simhash of `text` with the default fingerprint configuration; INVALID_ARGUMENT when
/// the text has no words.
pub fn fingerprint(text: &str) -> Result<u64> {
    FINGERPRINTER.with(|f| {
        let mut f = f.borrow_mut();
        let fp = match f.as_mut() {
            Some(fp) => fp,
            None => f.insert(
                Fingerprinter::new(FingerprintConfig::default())
                    .map_err(|e| RouterError::Internal(e.to_string()))?,
            ),
        };
        fp.fingerprint(text).map_err(|e| match e {
            neardup_core::Error::EmptyDocument => {
                RouterError::invalid("the text has no words or characters to fingerprint")
            }
            e => RouterError::from(e),
        })
    })
}

/// The simhash and the sketch of `text`; INVALID_ARGUMENT when the text has no words.
pub fn fingerprint_and_sketch(text: &str) -> Result<(u64, Sketch)> {
    let fp = fingerprint(text)?;
    FINGERPRINTER.with(|f| {
        let mut f = f.borrow_mut();
        let f = f.as_mut().ok_or_else(|| RouterError::Internal("no fingerprinter".into()))?;
        Ok((fp, Sketch::of_text(f, text)?))
    })
}

/// Texts at least this long in total are fingerprinted on the blocking pool.
pub const BLOCKING_TEXT_BYTES: usize = 64 << 10;
