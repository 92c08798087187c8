//! Every example in `README.md` works as written, and shows what it prints.
//!
//! The README's `console` blocks are transcripts: a line `$ COMMAND` is run with `sh -c`
//! and the lines after it, up to the next `$`, are what it must print (a line `...` stands
//! for any number of lines). They run in order, in a fresh directory holding a link to the
//! repository's `proto/`, against one `neardup serve` this test starts, with the binary
//! under test first on `PATH` and `NEARDUP_SERVER` naming the server. What the harness
//! does in place of a command, and only these:
//! - `export PATH=...`: the binary under test is already on `PATH`;
//! - `pip install ...`: not run; the Python example needs `grpc_tools` installed already;
//! - `cargo run ... --example NAME`: runs the example binary `cargo test` built;
//! - `grpcurl ... 127.0.0.1:50051 ...`: the address becomes the test server's; where grpcurl
//!   is not installed, `tests/python/grpcurl_standin.py` takes its place (same JSON in and
//!   out, through the stubs generated from `proto/`).
//!
//! The ```` ```rust ```` block must be `client/examples/quickstart.rs` to the byte, and the
//! ```` ```python ```` block is written to `example.py` before anything runs. The
//! `roles` block of `docs/service.md` (the router and shard as two processes) is run too,
//! on the addresses it names.
//!
//! A command whose tool is missing (Python without `grpc_tools`) is skipped with
//! a message, unless `NEARDUP_TESTS_STRICT` is set (`.ci/run` sets it), where it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use neardup_tests::{Node, binary, has_python_grpc, skip_without};

/// A fenced block of a Markdown file.
struct Block {
    /// The info string (`console`, `rust`, ...).
    lang: String,
    body: String,
    /// 1-based line of the opening fence, for messages.
    line: usize,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open =
                    Some(Block { lang: info.trim().to_string(), body: String::new(), line: i + 1 })
            }
            (Some(_), Some("")) => out.push(open.take().unwrap()),
            (Some(b), _) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

/// One `$ COMMAND` of a transcript and the lines it must print.
struct Step {
    command: String,
    expected: Vec<String>,
}

fn steps(transcript: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    // The end marker of a here-document the last command opened (`cat > f <<'EOF'`): its
    // lines belong to the command, not to what it prints.
    let mut here_doc: Option<String> = None;
    for line in transcript.lines() {
        if let Some(end) = &here_doc {
            let step = out.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
            if line == end {
                here_doc = None;
            }
        } else if let Some(cmd) = line.strip_prefix("$ ") {
            here_doc =
                cmd.split_once("<<'").map(|(_, rest)| rest.trim_end_matches('\'').to_string());
            out.push(Step { command: cmd.to_string(), expected: Vec::new() });
        } else {
            let step = out.last_mut().expect("a transcript starts with `$ `");
            step.expected.push(line.trim_end().to_string());
        }
    }
    assert!(here_doc.is_none(), "an unclosed here-document");
    out
}

/// Whether `got` is `expected`, where an expected line `...` stands for any lines.
fn matches(expected: &[String], got: &[&str]) -> bool {
    match expected.split_first() {
        None => got.is_empty(),
        Some((e, rest)) if e == "..." => (0..=got.len()).any(|i| matches(rest, &got[i..])),
        Some((e, rest)) => got.first().is_some_and(|g| g == e) && matches(rest, &got[1..]),
    }
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Sandbox {
    dir: PathBuf,
    path_var: String,
    server: String,
    root: PathBuf,
}

impl Sandbox {
    /// Runs one step as the README shows it (see the module docs for what is replaced).
    fn run(&self, step: &Step, block_line: usize) {
        let cmd = step.command.trim();
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let mut shell = cmd.to_string();
        match words.as_slice() {
            ["export", var, ..] if var.starts_with("PATH=") => return,
            [_, "-m", "pip", "install", ..] | ["pip", "install", ..] => {
                if !has_python_grpc() {
                    skip_without(
                        "the Python example needs `python3 -m pip install grpcio grpcio-tools`",
                    );
                }
                return;
            }
            ["cargo", "run", .., "--example", name] => {
                let example = examples_dir().join(name);
                assert!(
                    example.is_file(),
                    "{} is not built: run `cargo test --workspace`, which builds examples",
                    example.display()
                );
                shell = example.display().to_string();
            }
            ["grpcurl", ..] => {
                let addr = self.server.trim_start_matches("http://");
                shell = cmd.replace("127.0.0.1:50051", addr);
                if !on_path("grpcurl") {
                    if !has_python_grpc() {
                        skip_without(
                            "neither grpcurl nor Python's grpc_tools: the grpcurl example is not checked",
                        );
                        return;
                    }
                    // grpcurl cannot be installed everywhere: the stand-in sends the same
                    // JSON and prints the answer the same way.
                    eprintln!(
                        "grpcurl is not installed: its example runs through tests/python/grpcurl_standin.py"
                    );
                    let stubs = self.stubs();
                    let standin = self.root.join("tests/python/grpcurl_standin.py");
                    shell = format!(
                        "grpcurl() {{ PYTHONPATH={} python3 {} \"$@\"; }}\n{shell}",
                        stubs.display(),
                        standin.display()
                    );
                }
            }
            ["python3", ..] if !has_python_grpc() => {
                skip_without(
                    "python3 without grpcio and grpcio-tools: the Python example is not checked",
                );
                return;
            }
            _ => {}
        }
        let out = Command::new("sh")
            .args(["-c", &shell])
            .current_dir(&self.dir)
            .env("PATH", &self.path_var)
            .env("NEARDUP_SERVER", &self.server)
            .stdin(Stdio::null())
            .output()
            .expect("run sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let got: Vec<&str> = stdout.lines().map(str::trim_end).collect();
        assert!(
            out.status.success() && matches(&step.expected, &got),
            "README example (block at line {block_line}) `{cmd}`:\n{}\nexpected:\n{}\ngot:\n{}\nstderr:\n{}",
            out.status,
            step.expected.join("\n"),
            got.join("\n"),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Python stubs of the public API, generated once into the sandbox.
    fn stubs(&self) -> PathBuf {
        let stubs = self.dir.join(".stubs");
        if !stubs.exists() {
            std::fs::create_dir(&stubs).unwrap();
            let status = Command::new("python3")
                .args(["-m", "grpc_tools.protoc", "-I"])
                .arg(self.root.join("proto"))
                .arg(format!("--python_out={}", stubs.display()))
                .arg(format!("--grpc_python_out={}", stubs.display()))
                .arg("neardup/v1/neardup.proto")
                .status()
                .expect("run python3");
            assert!(status.success(), "generating Python stubs failed");
        }
        stubs
    }
}

/// Where `cargo test` puts the workspace's example binaries.
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().join("examples")
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A directory with `neardup` in it, first on `PATH`.
fn path_with_binary(dir: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(binary(), bin.join("neardup")).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_examples_work_as_written() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = blocks(&readme);
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::os::unix::fs::symlink(root.join("proto"), work.join("proto")).unwrap();

    // The Rust example is the compiled one.
    let rust: Vec<&Block> = blocks.iter().filter(|b| b.lang == "rust").collect();
    assert_eq!(rust.len(), 1, "the README has one Rust example");
    let example = std::fs::read_to_string(root.join("client/examples/quickstart.rs")).unwrap();
    assert_eq!(
        rust[0].body, example,
        "README's Rust block differs from client/examples/quickstart.rs"
    );
    for b in blocks.iter().filter(|b| b.lang == "python") {
        std::fs::write(work.join("example.py"), &b.body).unwrap();
    }

    let mut node = Node::serve_in(tmp.path(), &[]).await;
    let sandbox = Sandbox {
        path_var: path_with_binary(tmp.path()),
        server: format!("http://{}", node.addr),
        dir: work,
        root,
    };
    let transcripts: Vec<&Block> = blocks.iter().filter(|b| b.lang == "console").collect();
    assert!(transcripts.len() >= 4, "the README's transcripts were not found");
    let mut ran = 0;
    for b in transcripts {
        for step in steps(&b.body) {
            let sandbox = &sandbox;
            tokio::task::block_in_place(|| sandbox.run(&step, b.line));
            ran += 1;
        }
    }
    assert!(ran >= 8, "only {ran} README commands ran");
    node.terminate();
}

/// The two-role example of `docs/service.md`: a shard and a router as two processes, on the
/// addresses it names, answer like `serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_doc_roles_example_works_as_written() {
    let root = repo_root();
    let doc = std::fs::read_to_string(root.join("docs/service.md")).unwrap();
    let roles = blocks(&doc)
        .into_iter()
        .find(|b| b.body.contains("neardup shard") && b.body.contains("neardup router"))
        .expect("docs/service.md shows the two roles");
    let tmp = tempfile::tempdir().unwrap();
    let mut children = Vec::new();
    for line in roles.body.lines().filter(|l| l.starts_with("neardup ")) {
        let command = line.split('#').next().unwrap().trim().replace("DIR", "data");
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let log = std::fs::File::create(tmp.path().join(format!("{}.log", args[0]))).unwrap();
        children.push(
            Command::new(binary())
                .args(&args)
                .current_dir(tmp.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start a role"),
        );
    }
    assert_eq!(children.len(), 2, "two roles");
    let router = roles
        .body
        .lines()
        .find(|l| l.starts_with("neardup router"))
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "--listen").nth(1))
        .expect("the router's --listen")
        .to_string();
    // The roles take a moment to start: retry the first write for up to a minute.
    let client = neardup_client::Client::connect(&format!("http://{router}")).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let outcome = loop {
        let attempt = async {
            client.insert(vec![neardup_client::doc("roles/a", 0xF0F0, 1)]).await?;
            client.query(0xF0F1, Some(3), 10).await
        }
        .await;
        if attempt.is_ok() || std::time::Instant::now() > deadline {
            break attempt;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    for mut c in children {
        let _ = Command::new("kill").arg(c.id().to_string()).status();
        let _ = c.wait();
    }
    let logs = ["shard", "router"]
        .map(|r| std::fs::read_to_string(tmp.path().join(format!("{r}.log"))).unwrap_or_default());
    let hits =
        outcome.unwrap_or_else(|e| panic!("the roles example failed: {e}\n{}", logs.join("\n")));
    assert_eq!(hits.matches.len(), 1, "{}", logs.join("\n"));
    assert_eq!(hits.matches[0].id, "roles/a");
}
