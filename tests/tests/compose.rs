//! The Compose cluster of `deploy/compose.yaml`, run for real: the two images are built from
//! the repository (`deploy/docker/build`, `deploy/docker/build-prometheus`), three nodes come
//! up healthy with TLS and tokens, documents go in through one node, a node's container is
//! killed (SIGKILL) and started again. Every answer, through every node, is checked against
//! brute force over the acknowledged documents; Prometheus must scrape all three nodes.
//! Skipped, saying so, where Docker or Compose is missing (`.ci/run` runs it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, ClientTls, Target, Token, doc};
use neardup_tests::{brute_ids as brute, query_ids as query};
use neardup_tests::{
    build_image, command_output, docker, docker_running, free_port, http_body, http_get, repo_root,
    skip_without,
};
use serde_json::Value;

/// The Compose command here: `docker compose` (v2) or `docker-compose` (v1.29 and later).
fn compose_command() -> Option<Vec<&'static str>> {
    let works = |cmd: &str, args: &[&str]| {
        Command::new(cmd).args(args).output().is_ok_and(|o| o.status.success())
    };
    if works("docker", &["compose", "version"]) {
        Some(vec!["docker", "compose"])
    } else if works("docker-compose", &["version"]) {
        Some(vec!["docker-compose"])
    } else {
        None
    }
}

/// A Compose project of the test: its name, environment and command; taken down (volumes
/// and images too) when the test ends, passed or not.
struct Project {
    compose: Vec<&'static str>,
    file: PathBuf,
    name: String,
    env: Vec<(String, String)>,
    images: Vec<String>,
    ports: [u16; 3],
    prometheus_port: u16,
}

impl Project {
    fn run(&self, args: &[&str]) -> Result<String, String> {
        let file = self.file.to_str().unwrap();
        let args = [&["-f", file, "-p", self.name.as_str()][..], args].concat();
        command_output(&self.compose, &args, &self.env)
    }

    /// The container of `service`.
    fn container(&self, service: &str) -> String {
        self.run(&["ps", "-q", service]).unwrap()
    }

    /// The health Docker reports for `service`'s container (`healthy`, `starting`...).
    fn health(&self, service: &str) -> String {
        let c = self.container(service);
        docker(&["inspect", "--format", "{{if .State.Health}}{{.State.Health.Status}}{{end}}", &c])
            .unwrap_or_default()
    }

    /// Waits (two minutes at most) until `services` are all healthy.
    fn wait_healthy(&self, services: &[&str]) {
        let limit = Instant::now() + Duration::from_secs(120);
        while !services.iter().all(|s| self.health(s) == "healthy") {
            assert!(
                Instant::now() < limit,
                "not healthy within 2 minutes: {:?}\n{}",
                services.iter().map(|s| (s, self.health(s))).collect::<Vec<_>>(),
                self.run(&["logs", "--tail", "40"]).unwrap_or_else(|e| e)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// A file of the secrets volume, read through node 1's container.
    fn secret(&self, name: &str, dir: &Path) -> Vec<u8> {
        let c = self.container("node1");
        let to = dir.join(name);
        docker(&["cp", &format!("{c}:/etc/neardup/secrets/{name}"), to.to_str().unwrap()]).unwrap();
        std::fs::read(to).unwrap()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.run(&["logs", "--tail", "60"]).unwrap_or_else(|e| e));
        }
        let _ = self.run(&["down", "-v", "--timeout", "5"]);
        for image in &self.images {
            let _ = docker(&["rmi", "-f", image]);
        }
    }
}

/// Queries every acknowledged fingerprint through `c` at distance 0, and every 7th within 0
/// to 3, each against brute force.
async fn check_exact(c: &Client, acked: &BTreeMap<String, u64>, through: &str) {
    // Nothing acknowledged is lost: every document's own fingerprint finds it (and only
    // the documents that share it), in batches.
    let fps: Vec<u64> = acked.values().copied().collect();
    let targets: Vec<Target> = fps.iter().map(|&fp| Target::Fingerprint(fp)).collect();
    let answers = c.query_all(&targets, Some(0), 1000, 200).await.unwrap();
    for (&fp, r) in fps.iter().zip(&answers) {
        let mut ids: Vec<String> = r.matches.iter().map(|m| m.id.clone()).collect();
        ids.sort();
        assert_eq!(ids, brute(acked, fp, 0), "{through}: {fp:#x}");
    }
    for (i, &fp) in acked.values().enumerate().step_by(7) {
        let k = (i % 4) as u32;
        assert_eq!(query(c, fp, k).await, brute(acked, fp, k), "{through}: {fp:#x} within {k}");
    }
}

/// Inserts documents `range` through `c` in batches of 25, each batch retried (a minute at
/// most) until acknowledged; records them in `acked`.
async fn insert(c: &Client, range: std::ops::Range<u64>, acked: &mut BTreeMap<String, u64>) {
    let ids: Vec<u64> = range.collect();
    for batch in ids.chunks(25) {
        let docs: Vec<(String, u64)> = batch
            .iter()
            .map(|&i| {
                // Every fourth document lies near an earlier one, so queries find several.
                let base = neardup_core::sketch::mix64(i / 4 + 1);
                let fp = if i % 4 == 0 { base } else { base ^ (1 << (i % 61)) ^ (1 << (i % 13)) };
                (format!("https://compose.example/{i}"), fp)
            })
            .collect();
        let limit = Instant::now() + Duration::from_secs(60);
        loop {
            let req = docs.iter().map(|(id, fp)| doc(id, *fp, 1)).collect();
            match c.insert(req).await {
                Ok(_) => break,
                Err(e) => {
                    assert!(Instant::now() < limit, "insert not acknowledged in a minute: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        acked.extend(docs);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_compose_cluster_survives_a_killed_container() {
    if !docker_running() {
        skip_without("a running Docker Engine: the Compose cluster is not run");
        return;
    }
    let Some(compose) = compose_command() else {
        skip_without("Docker Compose (docker compose or docker-compose): the cluster is not run");
        return;
    };
    let tag = std::process::id();
    let (image, prometheus) =
        (format!("neardup-compose-test:{tag}"), format!("neardup-prometheus-test:{tag}"));
    let ports = [free_port(), free_port(), free_port()];
    let prometheus_port = free_port();
    let env = vec![
        ("NEARDUP_IMAGE".to_string(), image.clone()),
        ("PROMETHEUS_IMAGE".to_string(), prometheus.clone()),
        ("NODE1_PORT".to_string(), ports[0].to_string()),
        ("NODE2_PORT".to_string(), ports[1].to_string()),
        ("NODE3_PORT".to_string(), ports[2].to_string()),
        ("PROMETHEUS_PORT".to_string(), prometheus_port.to_string()),
    ];
    let project = Project {
        compose,
        file: repo_root().join("deploy/compose.yaml"),
        name: format!("neardup-test-{tag}"),
        env,
        images: vec![image.clone(), prometheus.clone()],
        ports,
        prometheus_port,
    };
    build_image("build", &image);
    build_image("build-prometheus", &prometheus);

    // 1. Up, healthy (grpc.health.v1 SERVING through TLS, inside each container).
    project.run(&["up", "-d"]).unwrap();
    project.wait_healthy(&["node1", "node2", "node3"]);

    let dir = tempfile::tempdir().unwrap();
    let ca_pem = project.secret("ca.pem", dir.path());
    let token = String::from_utf8(project.secret("admin.token", dir.path())).unwrap();
    let connect = |port: u16, node: &str| {
        let options = ClientOptions {
            timeout: Duration::from_secs(10),
            token: Some(Token::new(&token)),
            tls: Some(ClientTls { ca_pem: ca_pem.clone(), domain: Some(node.to_string()) }),
            ..ClientOptions::default()
        };
        let address = format!("https://127.0.0.1:{port}");
        async move { Client::connect_with(&address, options).await }
    };
    let c1 = connect(project.ports[0], "node1").await.unwrap();
    let c2 = connect(project.ports[1], "node2").await.unwrap();
    let c3 = connect(project.ports[2], "node3").await.unwrap();
    // Without the token, nothing is answered.
    let stranger = Client::connect_with(
        &format!("https://127.0.0.1:{}", project.ports[0]),
        ClientOptions {
            attempts: 1,
            tls: Some(ClientTls { ca_pem: ca_pem.clone(), domain: Some("node1".into()) }),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let refused = stranger.query(1, Some(3), 10).await.unwrap_err();
    assert_eq!(refused.code(), Some(tonic::Code::Unauthenticated), "{refused}");

    // 2. Inserts through node 1; every node answers exactly.
    let mut acked = BTreeMap::new();
    insert(&c1, 0..300, &mut acked).await;
    for (c, name) in [(&c1, "node1"), (&c2, "node2"), (&c3, "node3")] {
        check_exact(c, &acked, name).await;
    }

    // 3. Node 2's container killed: queries stay exact, writes go on, nothing is lost.
    let killed = project.container("node2");
    docker(&["kill", "--signal", "KILL", &killed]).unwrap();
    insert(&c1, 300..500, &mut acked).await;
    check_exact(&c1, &acked, "node1, node2 killed").await;
    check_exact(&c3, &acked, "node3, node2 killed").await;

    // 4. Node 2 started again on its volume: it catches up and answers exactly.
    docker(&["start", &killed]).unwrap();
    project.wait_healthy(&["node2"]);
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        let stats = c2.stats().await;
        if stats.is_ok() {
            break;
        }
        assert!(Instant::now() < limit, "node 2 does not answer after its restart: {stats:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    check_exact(&c2, &acked, "node2, restarted").await;
    insert(&c2, 500..550, &mut acked).await;
    for (c, name) in [(&c1, "node1"), (&c2, "node2"), (&c3, "node3")] {
        check_exact(c, &acked, name).await;
    }

    // Prometheus scrapes all three nodes with the metrics token.
    let prometheus = format!("127.0.0.1:{}", project.prometheus_port);
    let limit = Instant::now() + Duration::from_secs(90);
    loop {
        let body = http_get(&prometheus, "/api/v1/query?query=up%7Bjob%3D%22neardup%22%7D", None);
        let up = body
            .as_deref()
            .ok()
            .and_then(|b| serde_json::from_str::<Value>(http_body(b)).ok())
            .and_then(|v| v["data"]["result"].as_array().cloned())
            .map(|r| r.iter().filter(|s| s["value"][1] == "1").count());
        if up == Some(3) {
            break;
        }
        assert!(Instant::now() < limit, "Prometheus does not scrape the 3 nodes: {body:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let docs = http_get(&prometheus, "/api/v1/query?query=neardup_documents", None).unwrap();
    assert!(docs.contains("\"neardup_documents\""), "{docs}");
}
