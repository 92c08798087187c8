//! A data directory that cannot be used gives a clear error at start, and the process
//! exits with a failure instead of serving.

use neardup_tests::run;

fn start_error(args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--listen", "127.0.0.1:0", "--metrics-listen", ""]);
    let out = run(&all);
    assert!(!out.status.success(), "started although it should not: {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unusable_data_directories_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let f = file.to_str().unwrap();

    let e = start_error(&["serve", "--data", f]);
    assert!(e.contains("plain-file") && e.contains("not a directory"), "{e}");

    let below = file.join("data");
    let e = start_error(&["serve", "--data", below.to_str().unwrap()]);
    assert!(e.contains("cannot be created"), "{e}");

    // Full: less free space than the configured minimum.
    let ok = dir.path().join("data");
    let e = start_error(&[
        "serve",
        "--data",
        ok.to_str().unwrap(),
        "--set",
        "storage.min_free_mb=1000000000000",
    ]);
    assert!(e.contains("full") && e.contains("bytes free"), "{e}");

    // Unwritable: permissions (root ignores them, so only checked as another user).
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.path().join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let e = start_error(&["serve", "--data", ro.to_str().unwrap()]);
        assert!(e.contains("not writable"), "{e}");
    }

    // The shard role checks the same way.
    let e = start_error(&["shard", "--data", f]);
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn bad_configuration_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let e = start_error(&["serve", "--data", data.to_str().unwrap(), "--set", "index.design=9c9"]);
    assert!(e.contains("design"), "{e}");
    let e =
        start_error(&["serve", "--data", data.to_str().unwrap(), "--set", "storage.cache_mbb=1"]);
    assert!(e.contains("unknown field"), "{e}");
}

/// A data directory in use by a running node is refused in words, without the OS error's
/// debug form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_in_use_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = neardup_tests::Node::serve_in(dir.path(), &[]).await;
    let data = dir.path().join("data");
    let e =
        tokio::task::block_in_place(|| start_error(&["serve", "--data", data.to_str().unwrap()]));
    assert!(e.contains("in use by another process"), "{e}");
    assert!(!e.contains("Os {") && !e.contains("kind:"), "{e}");
    node.terminate();
}
