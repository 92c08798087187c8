//! `neardup dedup` on what a crawl's corpus really holds: pages in legacy encodings,
//! oversized documents, things in a corpus directory that are not files (FIFOs, a link to
//! `/dev/zero`), and ids used twice.

mod dedup_common;
use dedup_common as common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};

/// Runs the binary with `args` and no stdin, killing it and failing the test if it has not
/// finished within `limit` (a guard against hangs, not a measurement).
fn run_bounded(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("poll the child").is_some() {
            return child.wait_with_output().expect("collect the output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect the output");
            panic!(
                "{args:?} did not finish in {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn summary_of(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("summary written")).expect("summary JSON")
}

/// Output records by id.
fn by_id(out: &Output) -> HashMap<String, serde_json::Value> {
    records(&out.stdout)
        .into_iter()
        .map(|r| (r["id"].as_str().expect("a path id").to_string(), r))
        .collect()
}

fn fingerprint(text: &str) -> String {
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    format!("{:016x}", f.fingerprint_doc(text).unwrap().simhash)
}

/// A French sentence with accents in both Latin-1 and windows-1252.
const FRENCH: &str = "Le café crème de la façade était déjà froid à Noël; la naïve sœur \
    répéta qu'elle préférait l'été, les crêpes brûlées et le goût âcre du thé où flottait \
    une pêche. Même à l'hôpital, on célébrait la fête avec élégance et gaîté.";

/// Encodes `text` (Latin-1 and windows-1252 characters only) to windows-1252.
fn windows_1252(text: &str) -> Vec<u8> {
    text.chars()
        .map(|c| match c {
            '“' => 0x93,
            '”' => 0x94,
            '…' => 0x85,
            '’' => 0x92,
            'œ' => 0x9c,
            c if (c as u32) < 0x100 => c as u8,
            c => panic!("{c} is not in the test's windows-1252 table"),
        })
        .collect()
}

fn page(charset_meta: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html><head>{charset_meta}<title>Page</title></head>\
         <body><p>{body}</p></body></html>"
    )
}

#[test]
fn legacy_encodings_decode_to_the_fingerprint_of_the_same_text_in_utf8() {
    let dir = TempDir::new("encodings");
    let docs = dir.path("docs");
    std::fs::create_dir_all(&docs).unwrap();
    let french = FRENCH.replace('œ', "oe");
    let quotes = "He said “this is the word” and left… it’s in the “quotes”, œuvre \
                  and all, written in a Windows editor long ago by a careful clerk.";
    let japanese = "東京は日本の首都です。多くの人々がこの大きな都市に住んでいて、\
                    毎日電車で会社に通っています。";
    let shift_jis: &[u8] = b"\x93\x8c\x8b\x9e\x82\xcd\x93\xfa\x96\x7b\x82\xcc\x8e\xf1\x93\x73\
        \x82\xc5\x82\xb7\x81\x42\x91\xbd\x82\xad\x82\xcc\x90\x6c\x81\x58\x82\xaa\x82\xb1\x82\xcc\
        \x91\xe5\x82\xab\x82\xc8\x93\x73\x8e\x73\x82\xc9\x8f\x5a\x82\xf1\x82\xc5\x82\xa2\x82\xc4\
        \x81\x41\x96\x88\x93\xfa\x93\x64\x8e\xd4\x82\xc5\x89\xef\x8e\xd0\x82\xc9\x92\xca\x82\xc1\
        \x82\xc4\x82\xa2\x82\xdc\x82\xb7\x81\x42";
    let utf16 = "Ein Text in UTF-16 mit Umlauten: Größe, Übermaß, Ärger und Öl, \
                 geschrieben von einem Programm unter Windows.";
    let utf8_meta = "<meta charset=\"utf-8\">";
    let mut files: Vec<(&str, Vec<u8>, String)> = vec![
        // (name, bytes, the same text as a UTF-8 document)
        (
            "latin1-meta.html",
            windows_1252(&page("<meta charset=\"ISO-8859-1\">", &french)),
            page(utf8_meta, &french),
        ),
        (
            "latin1-meta-late.html",
            windows_1252(&page(
                "<meta name=viewport content=\"width=device-width\"><META CHARSET=latin1>",
                &french,
            )),
            page(utf8_meta, &french),
        ),
        ("latin1-nometa.html", windows_1252(&page("", &french)), page("", &french)),
        ("latin1-nometa.txt", windows_1252(&french), french.clone()),
        (
            "cp1252-http-equiv.html",
            windows_1252(&page(
                "<meta http-equiv=\"Content-Type\" content=\"text/html; charset=windows-1252\">",
                quotes,
            )),
            page(utf8_meta, quotes),
        ),
        // Guessed: without `œ`, which windows-1250 reads as `ś`; on this little text the
        // guess cannot tell the two apart by that one byte (a declaration can).
        ("cp1252-nometa.txt", windows_1252(&quotes.replace("œuvre ", "")), quotes.replace("œuvre ", "")),
        (
            "sjis-meta.html",
            [
                &b"<html><head><meta http-equiv=content-type content='text/html;charset=Shift_JIS'>\
                   </head><body><p>"[..],
                shift_jis,
                b"</p></body></html>",
            ]
            .concat(),
            format!("<html><body><p>{japanese}</p></body></html>"),
        ),
    ];
    let le: Vec<u8> =
        [0xFF, 0xFE].into_iter().chain(utf16.encode_utf16().flat_map(u16::to_le_bytes)).collect();
    let be: Vec<u8> =
        [0xFE, 0xFF].into_iter().chain(utf16.encode_utf16().flat_map(u16::to_be_bytes)).collect();
    files.push(("utf16le-bom.txt", le, utf16.to_string()));
    files.push(("utf16be-bom.txt", be, utf16.to_string()));
    let page16 = page("", utf16);
    let le_page: Vec<u8> =
        [0xFF, 0xFE].into_iter().chain(page16.encode_utf16().flat_map(u16::to_le_bytes)).collect();
    files.push(("utf16le-bom-page.html", le_page, page16.clone()));
    for (name, bytes, utf8) in &files {
        std::fs::write(docs.join(name), bytes).unwrap();
        std::fs::write(docs.join(format!("{name}.utf8")), utf8).unwrap();
    }
    let summary = dir.path("summary.json");
    let d = docs.to_str().unwrap();
    let out = run_ok(&["dedup", d, "--summary", summary.to_str().unwrap()], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let got = by_id(&out);
    for (name, _, utf8) in &files {
        let id = format!("{d}/{name}");
        let reference = format!("{d}/{name}.utf8");
        let (Some(a), Some(b)) = (got.get(&id), got.get(&reference)) else {
            panic!("{name}: not in the output; stderr:\n{stderr}");
        };
        assert_eq!(a["fingerprint"], b["fingerprint"], "{name}: same text, same fingerprint");
        if !name.ends_with(".html") {
            assert_eq!(a["fingerprint"], fingerprint(utf8), "{name}: the core's fingerprint");
        }
    }
    let s = summary_of(&summary);
    assert_eq!(s["skipped"], 0, "{stderr}");
    assert_eq!(s["documents"], 2 * files.len());
    assert_eq!(s["non_utf8_documents"], files.len(), "{s}");
    let enc = &s["encodings"];
    assert_eq!(enc["UTF-8"], files.len(), "{s}");
    assert_eq!(enc["Shift_JIS"], 1, "{s}");
    assert_eq!(enc["UTF-16LE"], 2, "{s}");
    assert_eq!(enc["UTF-16BE"], 1, "{s}");
    assert_eq!(enc["windows-1252"], 6, "{s}");
    // The three without a BOM or a declaration were guessed.
    assert_eq!(s["detected_encodings"], 3, "{s}");
    assert!(stderr.contains("decoded from other encodings: 10"), "{stderr}");
}

#[test]
fn utf8_documents_keep_their_fingerprint() {
    let dir = TempDir::new("utf8-kept");
    let text = "\u{feff}Größe café 東京 — plain UTF-8, with a byte order mark";
    let path = dir.path("bom.txt");
    std::fs::write(&path, text).unwrap();
    let plain = dir.path("plain.txt");
    std::fs::write(&plain, &text[3..]).unwrap();
    let out = run_ok(&["dedup", path.to_str().unwrap(), plain.to_str().unwrap()], None);
    let recs = records(&out.stdout);
    assert_eq!(recs[0]["fingerprint"], fingerprint(text));
    assert_eq!(recs[1]["fingerprint"], fingerprint(&text[3..]));
    // A page declaring UTF-8 that is not: the declaration wins, bad bytes become U+FFFD.
    let bad = dir.path("bad.html");
    std::fs::write(&bad, b"<meta charset=utf-8><p>caf\xe9 au lait, mais pas de sucre</p>").unwrap();
    let summary = dir.path("summary.json");
    run_ok(&["dedup", bad.to_str().unwrap(), "--summary", summary.to_str().unwrap()], None);
    let s = summary_of(&summary);
    assert_eq!((s["documents"].as_u64(), s["malformed_documents"].as_u64()), (Some(1), Some(1)));
}

#[test]
fn oversized_documents_are_skipped_and_the_rest_processed() {
    let dir = TempDir::new("oversized");
    let docs = dir.path("docs");
    std::fs::create_dir_all(&docs).unwrap();
    let small = "a small document about the weather in the mountains";
    std::fs::write(docs.join("small.txt"), small).unwrap();
    std::fs::write(docs.join("big.txt"), "word ".repeat(2000)).unwrap();
    let jsonl = dir.path("in.jsonl");
    let big_line = serde_json::json!({"id": "big", "text": "word ".repeat(2000)});
    std::fs::write(
        &jsonl,
        format!(
            "{}\n{big_line}\n{}\n",
            serde_json::json!({"id": "a", "text": small}),
            serde_json::json!({"id": "b", "text": "another text entirely, on rivers"}),
        ),
    )
    .unwrap();
    let summary = dir.path("summary.json");
    let (d, j) = (docs.to_str().unwrap(), jsonl.to_str().unwrap());
    let args = ["dedup", j, d, "--max-doc-bytes", "1000", "--summary", summary.to_str().unwrap()];
    let out = run_ok(&args, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for location in [format!("{j}:2"), format!("{d}/big.txt")] {
        assert!(
            stderr.lines().any(|l| l.contains(&format!("skipped {location}: "))
                && l.contains("larger than --max-doc-bytes 1000")),
            "no message for {location} in:\n{stderr}"
        );
    }
    let ids: Vec<String> =
        records(&out.stdout).iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, ["a", "b", &format!("{d}/small.txt")]);
    let s = summary_of(&summary);
    assert_eq!(s["skipped_by_reason"], serde_json::json!({"too_large": 2}));
    // Verification re-reads the input past the long line and finds the same records.
    assert_eq!(s["documents"], 3);

    // The same from stdin, as JSONL and as one document.
    let input = std::fs::read(&jsonl).unwrap();
    let out = run_ok(&["dedup", "--max-doc-bytes", "1000"], Some(&input));
    assert_eq!(records(&out.stdout).len(), 2);
    let big = "word ".repeat(2000);
    let out = run_ok(
        &["dedup", "--input-format", "text", "--max-doc-bytes", "1000"],
        Some(big.as_bytes()),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipped <stdin>: "));
    assert!(records(&out.stdout).is_empty());
}

#[test]
fn a_fifo_in_a_corpus_directory_is_skipped_not_waited_on() {
    let dir = TempDir::new("fifo");
    let docs = dir.path("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("a.txt"), "a document that is a plain regular file").unwrap();
    let fifo = docs.join("pipe.txt");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let summary = dir.path("summary.json");
    let d = docs.to_str().unwrap();
    let out =
        run_bounded(&["dedup", d, "--summary", summary.to_str().unwrap()], Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("skipped {d}/pipe.txt: not a regular file (a FIFO)")),
        "{stderr}"
    );
    assert_eq!(records(&out.stdout).len(), 1);
    assert_eq!(summary_of(&summary)["skipped_by_reason"], serde_json::json!({"not_a_file": 1}));
}

#[test]
fn a_link_to_dev_zero_in_a_corpus_directory_is_skipped() {
    let dir = TempDir::new("devzero");
    let docs = dir.path("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("a.txt"), "a document that is a plain regular file").unwrap();
    std::os::unix::fs::symlink("/dev/zero", docs.join("zero.txt")).unwrap();
    // A link to a regular file is followed; a link loop is reported, not followed forever.
    std::os::unix::fs::symlink(docs.join("a.txt"), docs.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(docs.join("loop1"), docs.join("loop2")).unwrap();
    std::os::unix::fs::symlink(docs.join("loop2"), docs.join("loop1")).unwrap();
    let summary = dir.path("summary.json");
    let d = docs.to_str().unwrap();
    let out =
        run_bounded(&["dedup", d, "--summary", summary.to_str().unwrap()], Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("skipped {d}/zero.txt: not a regular file (a character device)")),
        "{stderr}"
    );
    for l in ["loop1", "loop2"] {
        assert!(stderr.contains(&format!("skipped {d}/{l}: cannot read: ")), "{stderr}");
    }
    let ids: Vec<String> =
        records(&out.stdout).iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, [format!("{d}/a.txt"), format!("{d}/link.txt")]);
    assert_eq!(
        summary_of(&summary)["skipped_by_reason"],
        serde_json::json!({"not_a_file": 1, "unreadable": 2})
    );
    // Named on the command line, it is skipped the same way.
    let zero = docs.join("zero.txt");
    let out = run_bounded(&["dedup", zero.to_str().unwrap()], Duration::from_secs(60));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
}

#[test]
fn duplicate_ids_are_warned_about_and_counted() {
    let dir = TempDir::new("dup-ids");
    let jsonl = dir.path("in.jsonl");
    let mut lines = Vec::new();
    for (i, id) in ["\"a\"", "\"b\"", "\"a\"", "1", "\"1\"", "\"\\u0061\"", "1"].iter().enumerate()
    {
        lines.push(format!(r#"{{"id": {id}, "text": "document number {i} about topic {i}"}}"#));
    }
    // 25 more ids used twice: warnings stop at a cap, the count goes on.
    for i in 0..25 {
        for _ in 0..2 {
            lines.push(format!(r#"{{"id": "x{i}", "text": "words of x{i} here"}}"#));
        }
    }
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let summary = dir.path("summary.json");
    let j = jsonl.to_str().unwrap();
    let out = run_ok(&["dedup", j, "--summary", summary.to_str().unwrap()], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> =
        stderr.lines().filter(|l| l.contains("warning: duplicate id")).collect();
    assert!(
        warnings.iter().any(|l| l.contains(r#"duplicate id "a""#)
            && l.contains(&format!("{j}:1"))
            && l.contains(&format!("{j}:3"))),
        "{stderr}"
    );
    assert_eq!(warnings.iter().filter(|l| l.contains(r#"id "a""#)).count(), 1, "{stderr}");
    assert!(warnings.iter().any(|l| l.contains("duplicate id 1 ")), "{stderr}");
    assert_eq!(warnings.len(), 20, "{stderr}");
    assert!(stderr.contains("... and 7 more ids used more than once"), "{stderr}");
    let s = summary_of(&summary);
    // "a" twice more, 1 once more, each x once more; "1" (a string) is not 1.
    assert_eq!(s["duplicate_ids"], 3 + 25, "{s}");
    assert_eq!(s["documents"], lines.len());
    assert!(stderr.contains("duplicate ids:"), "{stderr}");
}
