//! The container image `deploy/docker/build` makes from the repository (no base image
//! pulled): it is at most 40 MB, runs as the non-root user `neardup`, and the server in it
//! serves and stores in its data directory. Skipped, saying so, where Docker is not running.

use neardup_tests::{build_image, docker, docker_running, skip_without};

/// Removes the container and the image when the test ends, passed or not.
struct Cleanup {
    container: String,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.container]);
        let _ = docker(&["rmi", "-f", &self.image]);
    }
}

#[test]
fn the_image_is_small_runs_as_a_user_and_serves() {
    if !docker_running() {
        skip_without("a running Docker Engine: the container image is not checked");
        return;
    }
    let image = format!("neardup-test:{}", std::process::id());
    let container = format!("neardup-test-{}", std::process::id());
    let _cleanup = Cleanup { container: container.clone(), image: image.clone() };
    let made = build_image("build", &image);
    let bytes = made["bytes"].as_u64().unwrap();
    eprintln!("image {image}: {:.1} MB", bytes as f64 / 1e6);
    assert!(bytes <= 40_000_000, "the image is {bytes} bytes");
    assert_eq!(
        docker(&["image", "inspect", "--format", "{{.Config.User}}", &image]).unwrap(),
        "65532:65532"
    );
    // No network: the server listens on the container's own loopback, and the command line
    // inside it is the client.
    docker(&[
        "run",
        "-d",
        "--name",
        &container,
        "--network",
        "none",
        &image,
        "serve",
        "--config",
        "/etc/neardup/neardup.toml",
    ])
    .unwrap();
    let exec = |args: &[&str]| {
        docker(&[&["exec", container.as_str(), "/usr/bin/neardup"][..], args].concat())
    };
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while exec(&["stats"]).is_err() {
        assert!(std::time::Instant::now() < limit, "{:?}", docker(&["logs", &container]));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    exec(&["insert", "--id", "https://a.example/", "--fingerprint", "0xDEADBEEF"]).unwrap();
    let q: serde_json::Value =
        serde_json::from_str(&exec(&["query", "--fingerprint", "0xDEADBEEF", "--k", "0"]).unwrap())
            .unwrap();
    assert_eq!(q["matches"][0]["id"], "https://a.example/", "{q}");
    // It runs as `neardup`, not root, and its data is in /var/lib/neardup.
    let pid = docker(&["inspect", "--format", "{{.State.Pid}}", &container]).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
    assert!(uid.split_whitespace().skip(1).all(|u| u == "65532"), "{uid}");
    let stats: serde_json::Value = serde_json::from_str(&exec(&["stats"]).unwrap()).unwrap();
    assert_eq!(stats["documents"], 1, "{stats}");
}
