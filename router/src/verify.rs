//! Verification defaults: what CheckAndInsert and Query do when a request leaves
//! `verify_jaccard` or `candidate_k` unset. It is the `[verify]` section of the
//! configuration file.
//!
//! The defaults are chosen from data (`docs/quality.md`, "Verified admission"): with
//! sketches on both sides, a candidate within the design's largest k counts as a
//! near-duplicate when its estimated word 3-gram Jaccard similarity is at least 0.9.
//! Documents without sketches (stored or asked by fingerprint alone, as every client older
//! than sketches does) are decided by distance k as before, so such clients see no change.

use neardup_core::sketch::Sketch;

use crate::error::{Result, RouterError};

/// `[verify]`: the server's verification defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VerifyDefaults {
    /// Keep a candidate whose estimated Jaccard similarity reaches this (0 to 1); 0 turns
    /// verification off for requests that do not ask for it.
    pub jaccard: f64,
    /// Verify candidates within this distance; unset (or above the design's largest k):
    /// the design's largest k.
    pub candidate_k: Option<u32>,
}

impl Default for VerifyDefaults {
    fn default() -> Self {
        VerifyDefaults { jaccard: 0.9, candidate_k: None }
    }
}

impl VerifyDefaults {
    /// Checks the section: `jaccard` within 0 to 1.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.jaccard) {
            return Err(RouterError::invalid(format!(
                "verify.jaccard = {}; it must be between 0 and 1",
                self.jaccard
            )));
        }
        Ok(())
    }

    /// The verification of one request: `(jaccard, candidate_k)`, from its fields or these
    /// defaults. INVALID_ARGUMENT for a threshold outside 0 to 1 or a candidate k above
    /// `max_k`. A threshold of 0 means no verification (and candidate k 0).
    pub fn resolve(
        &self,
        jaccard: Option<f64>,
        candidate_k: Option<u32>,
        max_k: u32,
    ) -> Result<(f64, u32)> {
        let j = jaccard.unwrap_or(self.jaccard);
        if !(0.0..=1.0).contains(&j) {
            return Err(RouterError::invalid(format!(
                "verify_jaccard = {j}; it must be between 0 and 1 (0: no verification)"
            )));
        }
        let k = match candidate_k {
            None => self.candidate_k.unwrap_or(max_k).min(max_k),
            Some(k) if k <= max_k => k,
            Some(k) => {
                return Err(RouterError::invalid(format!(
                    "candidate_k = {k} is out of range: this index answers exactly for k <= \
                     {max_k}"
                )));
            }
        };
        Ok(if j > 0.0 { (j, k) } else { (0.0, 0) })
    }
}

/// A sketch sent on the wire: empty is none; otherwise it must be a valid encoding.
pub fn wire_sketch(bytes: &[u8]) -> Result<Option<Sketch>> {
    if bytes.is_empty() {
        return Ok(None);
    }
    Sketch::from_bytes(bytes).map(Some).map_err(|e| RouterError::invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution() {
        let d = VerifyDefaults::default();
        assert_eq!(d.resolve(None, None, 3).unwrap(), (0.9, 3));
        assert_eq!(d.resolve(Some(0.8), Some(2), 3).unwrap(), (0.8, 2));
        assert_eq!(d.resolve(Some(0.0), Some(2), 3).unwrap(), (0.0, 0));
        assert!(d.resolve(Some(1.5), None, 3).is_err());
        assert!(d.resolve(Some(f64::NAN), None, 3).is_err());
        assert!(d.resolve(None, Some(4), 3).is_err());
        let c = VerifyDefaults { jaccard: 0.85, candidate_k: Some(8) };
        assert_eq!(c.resolve(None, None, 3).unwrap(), (0.85, 3));
        assert_eq!(c.resolve(None, None, 10).unwrap(), (0.85, 8));
        assert!(VerifyDefaults { jaccard: -1.0, candidate_k: None }.validate().is_err());
        assert!(wire_sketch(&[]).unwrap().is_none());
        assert!(wire_sketch(&[1, 64]).is_err());
    }
}
