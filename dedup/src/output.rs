//! Writing the per-document records: JSONL (with the input's other fields copied through)
//! or CSV.
//!
//! Records come out in input order, one per document that was not skipped. JSONL input
//! fields other than `id` and `text` are copied after neardup's own fields, as raw JSON in
//! their original order, by re-reading the input (texts are not kept); an input field with
//! the name of one of neardup's fields is left out, with one warning on stderr.

use std::io::Write;

use crate::error::DedupError;
use crate::input::OrderedFields;

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// One JSON object per line.
    #[default]
    Jsonl,
    /// Comma-separated values with a header line (no fields copied through).
    Csv,
}

/// neardup's fields, in output order.
pub(crate) const FIELDS: [&str; 9] = [
    "id",
    "fingerprint",
    "cluster",
    "original",
    "is_original",
    "nearest",
    "distance",
    "exact_duplicate_of",
    "jaccard",
];

/// One document's output values. Ids are raw JSON (a string or an integer).
pub(crate) struct Row<'a> {
    pub id: &'a str,
    pub fingerprint: u64,
    pub cluster: u32,
    pub original: &'a str,
    pub is_original: bool,
    pub nearest: Option<&'a str>,
    pub distance: Option<u32>,
    pub exact_duplicate_of: Option<&'a str>,
    /// `Some` with `--verify`: the Jaccard similarity to `nearest` (or `None` without one).
    pub jaccard: Option<Option<f64>>,
}

/// Writes rows in one format.
pub(crate) struct RowWriter<W: Write> {
    out: W,
    format: OutputFormat,
    keep_text: bool,
    warned_collision: bool,
    buf: Vec<u8>,
}

impl<W: Write> RowWriter<W> {
    pub fn new(
        out: W,
        format: OutputFormat,
        keep_text: bool,
        verify: bool,
    ) -> Result<Self, DedupError> {
        let mut w = RowWriter { out, format, keep_text, warned_collision: false, buf: Vec::new() };
        if format == OutputFormat::Csv {
            let n = if verify { FIELDS.len() } else { FIELDS.len() - 1 };
            w.buf.extend_from_slice(FIELDS[..n].join(",").as_bytes());
            w.buf.push(b'\n');
        }
        Ok(w)
    }

    /// Writes one row; `line` is the document's JSONL line, whose other fields are copied.
    pub fn row(&mut self, row: &Row<'_>, line: Option<&[u8]>) -> Result<(), DedupError> {
        match self.format {
            OutputFormat::Jsonl => self.jsonl(row, line)?,
            OutputFormat::Csv => self.csv(row),
        }
        if self.buf.len() >= 1 << 16 {
            self.flush_buf()?;
        }
        Ok(())
    }

    fn jsonl(&mut self, r: &Row<'_>, line: Option<&[u8]>) -> Result<(), DedupError> {
        let b = &mut self.buf;
        let opt = |v: Option<&str>| v.unwrap_or("null").to_string();
        let _ = write!(
            b,
            "{{\"id\":{},\"fingerprint\":\"{:016x}\",\"cluster\":{},\"original\":{},\"is_original\":{},\
             \"nearest\":{},\"distance\":{},\"exact_duplicate_of\":{}",
            r.id,
            r.fingerprint,
            r.cluster,
            r.original,
            r.is_original,
            opt(r.nearest),
            r.distance.map_or("null".to_string(), |d| d.to_string()),
            opt(r.exact_duplicate_of),
        );
        if let Some(j) = r.jaccard {
            let _ = write!(b, ",\"jaccard\":{}", j.map_or("null".to_string(), fmt_f64));
        }
        if let Some(line) = line {
            let fields: OrderedFields<'_> = serde_json::from_slice(line).map_err(|e| {
                DedupError::Usage(format!("the input changed while it was read: {e}"))
            })?;
            for (key, value) in &fields.0 {
                if key == "id" || (key == "text" && !self.keep_text) {
                    continue;
                }
                if FIELDS.contains(&key.as_ref()) {
                    if !self.warned_collision {
                        eprintln!(
                            "neardup: warning: input field {key:?} has the name of an output field; \
                             input fields with these names are left out: {}",
                            FIELDS.join(", ")
                        );
                        self.warned_collision = true;
                    }
                    continue;
                }
                let k = serde_json::to_string(key.as_ref()).unwrap_or_default();
                let _ = write!(b, ",{k}:{}", value.get());
            }
        }
        b.extend_from_slice(b"}\n");
        Ok(())
    }

    fn csv(&mut self, r: &Row<'_>) {
        let b = &mut self.buf;
        csv_field(b, &plain_id(r.id));
        let _ = write!(b, ",{:016x},{},", r.fingerprint, r.cluster);
        csv_field(b, &plain_id(r.original));
        let _ = write!(b, ",{},", r.is_original);
        if let Some(n) = r.nearest {
            csv_field(b, &plain_id(n));
        }
        b.push(b',');
        if let Some(d) = r.distance {
            let _ = write!(b, "{d}");
        }
        b.push(b',');
        if let Some(x) = r.exact_duplicate_of {
            csv_field(b, &plain_id(x));
        }
        if let Some(j) = r.jaccard {
            b.push(b',');
            if let Some(j) = j {
                b.extend_from_slice(fmt_f64(j).as_bytes());
            }
        }
        b.push(b'\n');
    }

    fn flush_buf(&mut self) -> Result<(), DedupError> {
        self.out.write_all(&self.buf).map_err(|e| DedupError::io("output", e))?;
        self.buf.clear();
        Ok(())
    }

    /// Writes what is buffered and flushes.
    pub fn finish(mut self) -> Result<(), DedupError> {
        self.flush_buf()?;
        self.out.flush().map_err(|e| DedupError::io("output", e))
    }
}

fn fmt_f64(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0');
    s.strip_suffix('.').map_or(s.to_string(), |t| format!("{t}.0"))
}

/// A raw JSON id as plain text: the string's contents, or the integer.
fn plain_id(raw: &str) -> String {
    if raw.starts_with('"') {
        serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_string())
    } else {
        raw.to_string()
    }
}

/// A CSV field, quoted when it holds a comma, quote or line break (RFC 4180).
fn csv_field(b: &mut Vec<u8>, s: &str) {
    if s.contains([',', '"', '\n', '\r']) {
        b.push(b'"');
        b.extend_from_slice(s.replace('"', "\"\"").as_bytes());
        b.push(b'"');
    } else {
        b.extend_from_slice(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>() -> Row<'a> {
        Row {
            id: "\"a,\\\"b\"",
            fingerprint: 0xab,
            cluster: 3,
            original: "7",
            is_original: false,
            nearest: Some("7"),
            distance: Some(2),
            exact_duplicate_of: None,
            jaccard: None,
        }
    }

    #[test]
    fn csv_quotes() {
        let mut w = RowWriter::new(Vec::new(), OutputFormat::Csv, false, false).unwrap();
        w.row(&row(), None).unwrap();
        let text = String::from_utf8(w.buf.clone()).unwrap();
        assert_eq!(
            text,
            "id,fingerprint,cluster,original,is_original,nearest,distance,exact_duplicate_of\n\
             \"a,\"\"b\",00000000000000ab,3,7,false,7,2,\n"
        );
    }

    #[test]
    fn jsonl_passes_fields_through() {
        let mut w = RowWriter::new(Vec::new(), OutputFormat::Jsonl, false, true).unwrap();
        let mut r = row();
        r.jaccard = Some(Some(0.5));
        w.row(&r, Some(br#"{"id":"x","text":"t","url":"u","meta":{"a":[1]},"cluster":9}"#))
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&w.buf).unwrap();
        assert_eq!(v["id"], "a,\"b");
        assert_eq!(v["fingerprint"], "00000000000000ab");
        assert_eq!(v["cluster"], 3);
        assert_eq!(v["original"], 7);
        assert_eq!(v["nearest"], 7);
        assert_eq!(v["distance"], 2);
        assert_eq!(v["exact_duplicate_of"], serde_json::Value::Null);
        assert_eq!(v["jaccard"], 0.5);
        assert_eq!(v["url"], "u");
        assert_eq!(v["meta"]["a"][0], 1);
        assert!(v.get("text").is_none());
        assert_eq!(fmt_f64(1.0), "1.0");
        assert_eq!(fmt_f64(0.8333333333), "0.833333");
    }
}
