//! `neardup insert`: stores one document from flags, or many from JSON lines.

use std::io::BufRead;

use neardup_client::{Document, doc, text_doc_with_sketch};
use serde_json::{Value, json};

use crate::cmd::common::{self, ServerArgs, parse_fingerprint};
use crate::error::CliError;

/// Options of `neardup insert`.
#[derive(Debug, clap::Args)]
pub struct InsertArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The document's id (typically its URL).
    #[arg(long, required_unless_present = "jsonl")]
    id: Option<String>,
    /// Its fingerprint (0x-hex or decimal).
    #[arg(long, value_parser = parse_fingerprint, conflicts_with_all = ["text", "jsonl"])]
    fingerprint: Option<u64>,
    /// Its text, for the server to fingerprint.
    #[arg(long, conflicts_with = "jsonl")]
    text: Option<String>,
    /// Its timestamp, ms since the Unix epoch [default: now].
    #[arg(long)]
    timestamp_ms: Option<i64>,
    /// Read documents from a JSON-lines file ("-": stdin), one object per line with `id`,
    /// `fingerprint` (number or 0x-hex string) or `text`, and optional `timestamp_ms`; any
    /// other field is an error.
    #[arg(long)]
    jsonl: Option<String>,
    /// Documents per stream message.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
}

/// The fields of an `--jsonl` line.
const JSONL_FIELDS: [&str; 5] = ["id", "fingerprint", "text", "timestamp_ms", "sketch"];

fn parse_line(line: &str, n: usize) -> Result<Document, CliError> {
    let bad = |reason: String| CliError::Input { line: n, reason };
    let v: Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
    // An unknown field is refused, not ignored: a typo, or dedup's `timestamp`, would
    // otherwise silently become "now".
    if let Some(fields) = v.as_object()
        && let Some(unknown) = fields.keys().find(|k| !JSONL_FIELDS.contains(&k.as_str()))
    {
        return Err(bad(format!(
            "unknown field {unknown:?} (the fields are {})",
            JSONL_FIELDS.join(", ")
        )));
    }
    let id = v["id"].as_str().ok_or_else(|| bad("no string \"id\"".into()))?;
    let ts = match &v["timestamp_ms"] {
        Value::Null => common::now_ms(),
        t => t.as_i64().ok_or_else(|| bad("\"timestamp_ms\" must be an integer".into()))?,
    };
    let sketch = match &v["sketch"] {
        Value::Null => Vec::new(),
        Value::String(h) => common::parse_hex(h).map_err(bad)?,
        _ => return Err(bad("\"sketch\" must be a hex string".into())),
    };
    let mut d = match (&v["fingerprint"], &v["text"]) {
        (Value::Number(x), Value::Null) => {
            doc(id, x.as_u64().ok_or_else(|| bad("bad fingerprint".into()))?, ts)
        }
        (Value::String(s), Value::Null) => doc(id, parse_fingerprint(s).map_err(bad)?, ts),
        (Value::Null, Value::String(t)) => {
            text_doc_with_sketch(id, t.clone(), ts).map_err(|e| bad(e.to_string()))?
        }
        _ => return Err(bad("exactly one of \"fingerprint\" and \"text\" is needed".into())),
    };
    if !sketch.is_empty() {
        d.sketch = sketch;
    }
    Ok(d)
}

/// Runs `neardup insert`.
pub async fn run(args: InsertArgs) -> Result<(), CliError> {
    let client = args.server.client().await?;
    let ts = args.timestamp_ms.unwrap_or_else(common::now_ms);
    let docs = match (&args.jsonl, &args.id) {
        (Some(path), _) => {
            let reader: Box<dyn BufRead> = if path == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                Box::new(std::io::BufReader::new(std::fs::File::open(path).map_err(|source| {
                    CliError::File { action: "open", path: path.clone(), source }
                })?))
            };
            let mut docs = Vec::new();
            for (i, line) in reader.lines().enumerate() {
                let line = line.map_err(|source| CliError::File {
                    action: "read",
                    path: path.clone(),
                    source,
                })?;
                if !line.trim().is_empty() {
                    docs.push(parse_line(&line, i + 1)?);
                }
            }
            docs
        }
        (None, Some(id)) => match (args.fingerprint, &args.text) {
            (Some(fp), None) => vec![doc(id.clone(), fp, ts)],
            (None, Some(t)) => vec![
                text_doc_with_sketch(id.clone(), t.clone(), ts)
                    .map_err(|e| args.server.error(e))?,
            ],
            _ => {
                return Err(CliError::Usage("give exactly one of --fingerprint and --text".into()));
            }
        },
        (None, None) => {
            return Err(CliError::Usage(
                "give --id (with --fingerprint or --text) or --jsonl".into(),
            ));
        }
    };
    let r = if docs.len() == 1 {
        client.insert(docs).await
    } else {
        client.insert_all(&docs, args.batch).await
    }
    .map_err(|e| args.server.error(e))?;
    common::print(&json!({ "inserted": r.inserted, "replaced": r.replaced }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jsonl_line_with_an_unknown_field_is_refused() {
        let ok = parse_line(r#"{"id": "a", "fingerprint": 7, "timestamp_ms": 5}"#, 1).unwrap();
        assert_eq!(ok.timestamp_ms, 5);
        // dedup's name for the field, which used to become "now" silently.
        let e = parse_line(r#"{"id": "a", "text": "x y", "timestamp": 5}"#, 2).unwrap_err();
        assert!(e.to_string().contains("unknown field \"timestamp\""), "{e}");
        let e = parse_line(r#"{"id": "a", "text": "x y", "timestamp_ms": "5"}"#, 3).unwrap_err();
        assert!(e.to_string().contains("integer"), "{e}");
    }
}
