//! Simhash fingerprints of text (specified in `docs/fingerprint.md`).
