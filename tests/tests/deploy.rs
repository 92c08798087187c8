//! What `deploy/` holds must agree with the binary it deploys:
//! - the Kubernetes manifests: parsed, and their ports, probes, flags, paths and names
//!   checked against the configuration the binary reads from them and against a running
//!   node;
//! - the systemd unit: `systemd-analyze verify` and its security exposure, where systemd's
//!   tools are installed;
//! - the Prometheus configuration and alert rules: `promtool check`, where promtool is (or
//!   can be taken from Debian's package), and every metric they name must be one a cluster
//!   node exports; so must the Grafana dashboard's.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use neardup_tests::cluster::Member;
use neardup_tests::{Node, binary, free_port, http_get, repo_root, run, skip_without};
use serde_json::{Value, json};
use yaml_rust2::{Yaml, YamlLoader};

fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

/// A YAML value as JSON (maps with string keys, as manifests have).
fn to_json(y: &Yaml) -> Value {
    match y {
        Yaml::Real(r) => r.parse::<f64>().map_or(Value::Null, |f| json!(f)),
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        other => format!("{other:?}"),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

/// Every document of every YAML file in `dir`.
fn manifests(dir: &Path) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(f).unwrap();
        let parsed =
            YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        docs.extend(parsed.iter().map(to_json));
    }
    docs
}

/// The one manifest of `kind` named `name`.
fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<_> =
        docs.iter().filter(|d| d["kind"] == kind && d["metadata"]["name"] == name).collect();
    assert_eq!(found.len(), 1, "one {kind} {name}");
    found[0]
}

/// The port number of `address` (HOST:PORT).
fn port_of(address: &str) -> i64 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// A container environment with Kubernetes' `$(VAR)` references expanded, for pod `pod`.
fn pod_env(container: &Value, pod: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = match e["value"].as_str() {
            Some(v) => {
                let mut v = v.to_string();
                for (k, val) in &env {
                    v = v.replace(&format!("$({k})"), val);
                }
                v
            }
            None if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" => pod.to_string(),
            None => panic!("env {name}: only values and the pod's name are expanded here"),
        };
        env.push((name, value));
    }
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_manifests_agree_with_the_binary() {
    let dir = deploy_dir().join("kubernetes");
    let docs = manifests(&dir);
    let sts = find(&docs, "StatefulSet", "neardup");
    let spec = &sts["spec"];
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(spec["selector"]["matchLabels"], *labels);
    let container = &pod["containers"][0];

    // The image is the one deploy/docker/build tags.
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(container["image"], format!("neardup:{version}"));

    // The configuration the pods read: the ConfigMap's file, with the StatefulSet's
    // environment for pod neardup-1, as the binary loads it.
    let cm = find(&docs, "ConfigMap", "neardup");
    let tmp = tempfile::tempdir().unwrap();
    let config_file = tmp.path().join("neardup.toml");
    std::fs::write(&config_file, cm["data"]["neardup.toml"].as_str().unwrap()).unwrap();
    let args: Vec<&str> =
        container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let at = args.iter().position(|a| *a == "--config").unwrap() + 1;
    let config_arg = args[at];
    assert_eq!(args[0], "serve");
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mount = |name: &str| mounts.iter().find(|m| m["name"] == name).unwrap();
    assert_eq!(
        mount("config")["mountPath"],
        config_arg,
        "the config is mounted where --config reads"
    );
    let env = pod_env(container, "neardup-1");
    // The file's path is this test's copy.
    let mut local_args = args.clone();
    local_args[at] = config_file.to_str().unwrap();
    let out = Command::new(binary())
        .args(&local_args)
        .arg("--print-config")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let cluster = config["cluster"].as_table().unwrap();

    // Ports: the container's named ports are the addresses the node listens on.
    let ports = container["ports"].as_array().unwrap();
    let port = |name: &str| {
        ports.iter().find(|p| p["name"] == name).unwrap()["containerPort"].as_i64().unwrap()
    };
    assert_eq!(port("grpc"), port_of(config["listen"].as_str().unwrap()));
    assert_eq!(port("internal"), port_of(cluster["internal_listen"].as_str().unwrap()));
    assert_eq!(port("metrics"), port_of(config["metrics_listen"].as_str().unwrap()));
    // The data directory is the volume claimed for each pod.
    assert_eq!(mount("data")["mountPath"], config["data"].as_str().unwrap());
    assert_eq!(spec["volumeClaimTemplates"][0]["metadata"]["name"], "data");

    // The headless Service names the pods, the StatefulSet uses it, and every node joins
    // through the first pod's name there (which starts the cluster: it joins through itself).
    let headless = find(&docs, "Service", "neardup");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(spec["serviceName"], "neardup");
    assert!(cluster["node_id_from_hostname"].as_bool().unwrap());
    assert_eq!(
        cluster["join"].as_str().unwrap(),
        format!("neardup-0.neardup:{}", port("internal")),
        "pods join through neardup-0 on the internal port"
    );
    assert_eq!(
        cluster["advertise_internal"].as_str().unwrap(),
        format!("neardup-1.neardup:{}", port("internal"))
    );
    for svc in ["neardup", "neardup-public"] {
        let s = find(&docs, "Service", svc);
        assert_eq!(s["spec"]["selector"], *labels, "{svc} selects the pods");
        for p in s["spec"]["ports"].as_array().unwrap() {
            let target = p["targetPort"].as_str().unwrap();
            assert_eq!(p["port"].as_i64().unwrap(), port(target), "{svc} {target}");
        }
    }
    let pdb = find(&docs, "PodDisruptionBudget", "neardup");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], *labels);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);

    // The Secret's files, as docs/operations.md makes them with `neardup secrets`, are the
    // ones the configuration names.
    let secrets = tmp.path().join("secrets");
    let hosts: Vec<String> = (0..spec["replicas"].as_i64().unwrap())
        .map(|i| format!("--node={}=neardup-{i}.neardup,neardup-public", i + 1))
        .collect();
    let mut secret_args = vec!["secrets", "--out", secrets.to_str().unwrap()];
    secret_args.extend(hosts.iter().map(String::as_str));
    secret_args.extend(["--token=admin=admin", "--metrics-token"]);
    let made = run(&secret_args);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let mount_path = mount("secrets")["mountPath"].as_str().unwrap().to_string();
    let files = [
        config["tls"]["cert_file"].as_str().unwrap(),
        config["tls"]["key_file"].as_str().unwrap(),
        config["auth"]["tokens_file"].as_str().unwrap(),
        config["auth"]["metrics_token_file"].as_str().unwrap(),
        cluster["tls_ca_file"].as_str().unwrap(),
        cluster["tls_cert_file"].as_str().unwrap(),
        cluster["tls_key_file"].as_str().unwrap(),
        cluster["join_token_file"].as_str().unwrap(),
    ];
    for f in files {
        let name = f.strip_prefix(&format!("{mount_path}/")).unwrap_or_else(|| panic!("{f}"));
        assert!(secrets.join(name).exists(), "{f}: neardup secrets makes no {name}");
    }
    assert_eq!(
        pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "secrets").unwrap()["secret"]
            ["secretName"],
        "neardup-secrets"
    );

    // Probes: readiness runs `neardup health` (its flags and its environment), liveness and
    // startup a TCP connect to the public port. Run here against a real node.
    let ready = &container["readinessProbe"]["exec"]["command"];
    let ready: Vec<&str> = ready.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(ready[0], "/usr/bin/neardup");
    for probe in ["livenessProbe", "startupProbe"] {
        assert_eq!(container[probe]["tcpSocket"]["port"], "grpc", "{probe}");
    }
    let env_names: BTreeSet<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    assert!(env_names.contains("NEARDUP_SERVER") && env_names.contains("NEARDUP_TLS_CA"));
    let mut node = Node::serve_in(tmp.path(), &[]).await;
    let server = format!("http://{}", node.addr);
    let probe = || {
        Command::new(binary()).args(&ready[1..]).env("NEARDUP_SERVER", &server).output().unwrap()
    };
    let up = probe();
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    assert!(String::from_utf8_lossy(&up.stdout).contains("SERVING"));
    node.terminate();
    assert!(!probe().status.success(), "the probe passes with the node down");

    // The kustomization lists every manifest.
    let kust = docs.iter().find(|d| d["kind"] == "Kustomization").unwrap();
    let listed: BTreeSet<&str> =
        kust["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    for f in std::fs::read_dir(&dir).unwrap() {
        let name = f.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            assert!(listed.contains(name.as_str()), "kustomization.yaml omits {name}");
        }
    }
}

#[test]
fn the_systemd_unit_verifies() {
    let unit = deploy_dir().join("systemd/neardup.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    // Its command line is one the binary takes, with the deployed configuration.
    let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/neardup"));
    let args: Vec<String> = words
        .map(|w| {
            w.replace(
                "/etc/neardup/neardup.toml",
                deploy_dir().join("neardup.toml").to_str().unwrap(),
            )
        })
        .collect();
    let out = Command::new(binary()).args(&args).arg("--print-config").output().unwrap();
    assert!(out.status.success(), "{exec}: {}", String::from_utf8_lossy(&out.stderr));
    let config: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let data = config["data"].as_str().unwrap();
    assert!(
        text.contains(&format!("ReadWritePaths={data}")),
        "the data directory {data} is writable"
    );
    for line in ["NoNewPrivileges=yes", "ProtectSystem=strict", "User=neardup"] {
        assert!(text.lines().any(|l| l == line), "{line}");
    }
    let sysusers = std::fs::read_to_string(deploy_dir().join("systemd/neardup.sysusers")).unwrap();
    assert!(sysusers.lines().any(|l| l.starts_with("u neardup ")), "the user is made");

    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        skip_without("systemd-analyze: the unit is not verified");
        return;
    }
    // verify checks that ExecStart exists: a copy names the binary under test.
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("neardup.service");
    std::fs::write(&copy, text.replace("/usr/local/bin/neardup", binary().to_str().unwrap()))
        .unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&copy).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
    let out = Command::new("systemd-analyze")
        // The threshold is in tenths: 30 is an exposure of 3.0 ("OK" ends at 3.9).
        .args(["security", "--offline=true", "--threshold=30"])
        .arg(&copy)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", said.lines().last().unwrap_or(""));
    assert!(out.status.success(), "exposure above 3: {said}");
}

/// promtool: on the PATH, or taken from Debian's prometheus package into `dir`.
fn promtool(dir: &Path) -> Option<PathBuf> {
    if Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some(PathBuf::from("promtool"));
    }
    let download = || {
        let got =
            Command::new("apt-get").args(["download", "prometheus"]).current_dir(dir).output();
        got.is_ok_and(|o| o.status.success())
    };
    // Package lists may be missing on a fresh machine: read them once, then try again.
    let update = || Command::new("apt-get").args(["update", "-qq"]).status();
    let got = download() || (update().is_ok_and(|s| s.success()) && download());
    if !got {
        return None;
    }
    let deb = std::fs::read_dir(dir)
        .ok()?
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))?;
    let x = dir.join("x");
    let ok = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x).status();
    let tool = x.join("usr/bin/promtool");
    (ok.is_ok_and(|s| s.success()) && tool.exists()).then_some(tool)
}

/// The metric names (`neardup_...`) `text` mentions.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("neardup_") {
        let tail = &rest[i..];
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_name_metrics_a_node_exports() {
    let prometheus = deploy_dir().join("prometheus");
    let alerts = std::fs::read_to_string(prometheus.join("alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(deploy_dir().join("grafana/neardup.json")).unwrap();
    let _: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");

    // A one-node cluster's metrics: the storage's, the RPCs' and the cluster's.
    let tmp = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut m = Member::on_loopback(1, tmp.path());
    m.start(&["--bootstrap", "--set", &format!("metrics_listen={metrics}")]);
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let exported = loop {
        let page = http_get(&metrics, "/metrics", None).unwrap_or_default();
        if page.contains("neardup_cluster_is_leader 1") {
            // A request, so that the RPC series exist.
            let _ = run(&["stats", "--server", &m.public]);
            break http_get(&metrics, "/metrics", None).unwrap();
        }
        assert!(m.running() && std::time::Instant::now() < limit, "{}", m.log_text());
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    m.terminate();
    let exported = metric_names(&exported);
    for (what, text) in [("alerts.yml", &alerts), ("grafana/neardup.json", &dashboard)] {
        for name in metric_names(text) {
            assert!(exported.contains(&name), "{what} names {name}, which no node exports");
        }
    }

    let tools = tempfile::tempdir().unwrap();
    let Some(promtool) = promtool(tools.path()) else {
        skip_without("promtool (Debian's prometheus package): the rules are not checked");
        return;
    };
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(prometheus.join("alerts.yml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    // The configuration names the container's paths: checked with them pointed here.
    let config = std::fs::read_to_string(prometheus.join("prometheus.yml")).unwrap();
    let token = tools.path().join("metrics.token");
    std::fs::write(&token, "t").unwrap();
    let local = config
        .replace("/etc/prometheus/alerts.yml", prometheus.join("alerts.yml").to_str().unwrap())
        .replace("/etc/neardup/secrets/metrics.token", token.to_str().unwrap());
    let file = tools.path().join("prometheus.yml");
    std::fs::write(&file, local).unwrap();
    let out = Command::new(&promtool).args(["check", "config"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}
