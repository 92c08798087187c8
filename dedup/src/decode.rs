//! Bytes to text: the encoding of a document file from its byte order mark, its
//! `<meta charset>` declaration or, failing both, a guess.
//!
//! A crawl's pages are not all UTF-8: Latin-1, windows-1252, Shift_JIS, GBK, UTF-16 with a
//! byte order mark are common. Fingerprints are defined over text (`docs/fingerprint.md`),
//! so a page must be read in its own encoding to give the fingerprint of the same text in
//! UTF-8, and must not be dropped. The order is the HTML standard's: a BOM, then (for HTML)
//! the declaration in the first 1024 bytes ([`crate::html::declared_encoding`]), then, for
//! bytes that are not valid UTF-8, a guess by `chardetng` (the detector Firefox uses for
//! unlabelled pages). Decoding itself is `encoding_rs` (the WHATWG Encoding Standard): the
//! labels, the BOMs and the decoders are the ones browsers use.
//!
//! Valid UTF-8 without a declaration of another encoding is taken as it is, byte for byte,
//! so the fingerprints of UTF-8 input do not change. JSONL records are JSON, which is
//! UTF-8, and are not decoded here.

use std::borrow::Cow;

use chardetng::{EncodingDetector, Iso2022JpDetection, Utf8Detection};
use encoding_rs::{Encoding, UTF_8};

use crate::html;

/// How a document's encoding was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// A byte order mark.
    Bom,
    /// A `<meta charset>` or `<meta http-equiv="Content-Type">` declaration.
    Declared,
    /// Neither, and the bytes are valid UTF-8.
    Utf8,
    /// Neither, and the bytes are not UTF-8: guessed.
    Detected,
}

/// What decoding a document did, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decoding {
    /// The encoding read (its WHATWG name: `UTF-8`, `windows-1252`, `Shift_JIS`...).
    pub encoding: &'static Encoding,
    /// How it was found.
    pub found: Found,
    /// Some bytes were not valid in that encoding and became U+FFFD.
    pub malformed: bool,
}

/// Decodes a document file. `html` says whether it is HTML (so a `<meta charset>` counts);
/// `None` decides by [`html::looks_like_html`].
pub(crate) fn decode(bytes: &[u8], html: Option<bool>) -> (Cow<'_, str>, Decoding) {
    if let Some((encoding, bom)) = Encoding::for_bom(bytes) {
        // A UTF-8 page with a BOM is kept whole, BOM included, as before decoding existed.
        if encoding == UTF_8
            && let Ok(text) = std::str::from_utf8(bytes)
        {
            let d = Decoding { encoding, found: Found::Bom, malformed: false };
            return (Cow::Borrowed(text), d);
        }
        return with(encoding, &bytes[bom..], Found::Bom);
    }
    if html.unwrap_or_else(|| html::looks_like_html(bytes))
        && let Some(encoding) = html::declared_encoding(bytes)
    {
        return with(encoding, bytes, Found::Declared);
    }
    if let Ok(text) = std::str::from_utf8(bytes) {
        return (
            Cow::Borrowed(text),
            Decoding { encoding: UTF_8, found: Found::Utf8, malformed: false },
        );
    }
    let mut detector = EncodingDetector::new(Iso2022JpDetection::Allow);
    detector.feed(bytes, true);
    with(detector.guess(None, Utf8Detection::Deny), bytes, Found::Detected)
}

fn with<'a>(
    encoding: &'static Encoding,
    bytes: &'a [u8],
    found: Found,
) -> (Cow<'a, str>, Decoding) {
    let (text, malformed) = encoding.decode_without_bom_handling(bytes);
    (text, Decoding { encoding, found, malformed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(bytes: &[u8], html: Option<bool>) -> (String, &'static str, Found) {
        let (text, d) = decode(bytes, html);
        (text.into_owned(), d.encoding.name(), d.found)
    }

    #[test]
    fn precedence_bom_declaration_detection() {
        // A BOM wins over a declaration.
        let mut le = vec![0xFF, 0xFE];
        le.extend("<meta charset=latin1>é".encode_utf16().flat_map(u16::to_le_bytes));
        assert_eq!(
            name(&le, Some(true)),
            ("<meta charset=latin1>é".into(), "UTF-16LE", Found::Bom)
        );
        // The declaration wins over the bytes.
        let page = b"<html><meta charset=windows-1252>\x93q\x94";
        assert_eq!(
            name(page, None),
            ("<html><meta charset=windows-1252>“q”".into(), "windows-1252", Found::Declared)
        );
        // Not for plain text.
        assert_eq!(name(b"<meta charset=koi8-r> ok", Some(false)).1, "UTF-8");
        // Valid UTF-8 stays, BOM included.
        let bom = "\u{feff}caf\u{e9}";
        assert_eq!(name(bom.as_bytes(), None), (bom.into(), "UTF-8", Found::Bom));
        assert_eq!(name("café".as_bytes(), None), ("café".into(), "UTF-8", Found::Utf8));
        // Otherwise a guess.
        let (text, enc, found) =
            name(b"Le caf\xe9 cr\xe8me de la fa\xe7ade \xe9tait d\xe9j\xe0 froid", None);
        assert_eq!((enc, found), ("windows-1252", Found::Detected));
        assert_eq!(text, "Le café crème de la façade était déjà froid");
    }

    #[test]
    fn malformed_bytes_in_the_declared_encoding_are_replaced() {
        let (text, d) = decode(b"<meta charset=utf-8>caf\xe9", Some(true));
        assert_eq!(text, "<meta charset=utf-8>caf\u{fffd}");
        assert!(d.malformed);
        assert_eq!(d.found, Found::Declared);
    }
}
