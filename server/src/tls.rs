//! TLS on a port: the server's certificate chain and key from PEM files, read again on
//! SIGHUP and when they change (new connections take the new ones; open connections keep
//! theirs). HTTP/2 is negotiated by ALPN (`h2`). rustls with the ring provider.
//!
//! Between the nodes of a cluster, TLS is mutual ([`ClusterTls`]): every connection to a
//! node's internal port presents a certificate signed by the cluster's CA, and a node's own
//! certificate names it: a URI SAN `urn:neardup:node:ID` ([`node_uri`]). The internal port
//! learns who calls from it ([`PeerCert`]) and admits only members (see
//! `crate::node::serve_cluster`). Operators' certificates (for `neardup cluster`) carry no
//! node id.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use neardup_cluster::NodeId;
use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Where a port's certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM, the server's own first.
    pub cert_file: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// With a CA here, PEM: every client must present a certificate it signed (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// A port's TLS: the configuration new connections are accepted with.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Reads the certificate and key; an error naming the file at fault.
    pub fn new(files: TlsFiles) -> Result<Arc<Tls>, String> {
        let config = load(&files)?;
        Ok(Arc::new(Tls { files, current: RwLock::new(Arc::new(config)) }))
    }

    /// The acceptor of a new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().clone())
    }

    /// Reads the certificate and key again; on an error the ones in force stay.
    pub fn reload(&self) -> Result<(), String> {
        let config = load(&self.files)?;
        *self.current.write() = Arc::new(config);
        Ok(())
    }

    /// Reads them again on SIGHUP and whenever one changes (looked at every `every`), until
    /// the returned task is aborted.
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let tls = self.clone();
        let mut files = vec![self.files.cert_file.clone(), self.files.key_file.clone()];
        files.extend(self.files.client_ca_file.clone());
        crate::reload::watch_files("the TLS certificate and key", files, every, move || {
            tls.reload().map(|()| tls.files.cert_file.display().to_string())
        })
    }
}

/// The server configuration of `files`.
fn load(files: &TlsFiles) -> Result<ServerConfig, String> {
    let cert = files.cert_file.display();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("the TLS certificate file {cert}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("the TLS certificate file {cert} holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key_file)
        .map_err(|e| format!("the TLS key file {}: {e}", files.key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(root_store(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("the TLS certificate {cert} and its key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The certificates of the PEM file `ca`, as trust roots; an error when it holds none.
fn root_store(ca: &std::path::Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
    for cert in certs {
        roots.add(cert).map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("the CA file {} holds no certificate", ca.display()));
    }
    Ok(roots)
}

/// The URI SAN naming node `id` in its certificate: `urn:neardup:node:ID`.
pub fn node_uri(id: NodeId) -> String {
    format!("{NODE_URI_PREFIX}{id}")
}

const NODE_URI_PREFIX: &str = "urn:neardup:node:";

/// What a certificate names, for messages: `node ID` or `no node`.
pub fn named(node: Option<NodeId>) -> String {
    node.map_or("no node".into(), |n| format!("node {n}"))
}

/// Who is at the other end of a mutually authenticated connection, from its certificate
/// (already verified against the CA by the handshake).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// The node its certificate names (`urn:neardup:node:ID`); `None` for another client
    /// (an operator's certificate).
    pub node: Option<NodeId>,
    /// The certificate's subject common name, for logs and errors (empty when it has none).
    pub name: String,
}

impl PeerCert {
    /// Reads the leaf certificate `der`; an error when it does not parse or names more than
    /// one node.
    pub fn from_der(der: &[u8]) -> Result<PeerCert, String> {
        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| format!("unreadable certificate: {e}"))?;
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string();
        let mut node = None;
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for general in &san.value.general_names {
                let GeneralName::URI(uri) = general else { continue };
                let Some(id) = uri.strip_prefix(NODE_URI_PREFIX) else { continue };
                let id: NodeId = id
                    .parse()
                    .ok()
                    .filter(|&id| id != 0)
                    .ok_or_else(|| format!("certificate {name:?}: bad node URI {uri:?}"))?;
                if node.is_some_and(|n| n != id) {
                    return Err(format!("certificate {name:?} names more than one node"));
                }
                node = Some(id);
            }
        }
        Ok(PeerCert { node, name })
    }

    /// The peer of a TLS connection, when it presented a certificate.
    pub fn of_connection(conn: &rustls::ServerConnection) -> Option<PeerCert> {
        let leaf = conn.peer_certificates()?.first()?;
        match PeerCert::from_der(leaf) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::debug!(error = %e, "peer certificate not understood");
                Some(PeerCert { node: None, name: String::new() })
            }
        }
    }
}

/// Where a cluster node's TLS material is: the cluster's CA, and the node's certificate
/// (naming it, see [`node_uri`]) and key, used both to serve its internal port and to call
/// its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTlsFiles {
    /// The cluster CA's certificate, PEM.
    pub ca_file: PathBuf,
    /// The node's certificate chain, PEM.
    pub cert_file: PathBuf,
    /// Its key, PEM.
    pub key_file: PathBuf,
}

/// Mutual TLS between the nodes of a cluster: the internal port's server side (clients must
/// present a certificate of the CA) and the client side every call to a peer uses. Both are
/// read again on SIGHUP and when a file changes; connections to peers opened after that use
/// the new certificate.
#[derive(Debug)]
pub struct ClusterTls {
    files: ClusterTlsFiles,
    server: Arc<Tls>,
    /// The client configuration and how many times it was read (channels made under an
    /// older one are made again).
    client: RwLock<(u64, ClientTlsConfig)>,
    node: Option<NodeId>,
}

impl ClusterTls {
    /// Reads the files; an error naming the one at fault.
    pub fn new(files: ClusterTlsFiles) -> Result<Arc<ClusterTls>, String> {
        let server = Tls::new(TlsFiles {
            cert_file: files.cert_file.clone(),
            key_file: files.key_file.clone(),
            client_ca_file: Some(files.ca_file.clone()),
        })?;
        let (client, node) = client_config(&files)?;
        Ok(Arc::new(ClusterTls { files, server, client: RwLock::new((0, client)), node }))
    }

    /// The node id the certificate names, if any.
    pub fn node(&self) -> Option<NodeId> {
        self.node
    }

    /// The server side, for the internal port.
    pub fn server(&self) -> Arc<Tls> {
        self.server.clone()
    }

    /// How many times the client side was read again; a channel made under an older
    /// generation should be made again.
    pub fn generation(&self) -> u64 {
        self.client.read().0
    }

    /// `endpoint` (an `https://` URI) with the client side of mutual TLS.
    pub fn client_endpoint(&self, endpoint: Endpoint) -> Result<Endpoint, String> {
        let config = self.client.read().1.clone();
        endpoint.tls_config(config).map_err(|e| format!("TLS: {e}"))
    }

    /// Reads every file again; on an error what is in force stays.
    pub fn reload(&self) -> Result<(), String> {
        let (client, node) = client_config(&self.files)?;
        if node != self.node {
            return Err(format!(
                "the certificate {} names {}, not {} as before; the one in force stays",
                self.files.cert_file.display(),
                named(node),
                named(self.node)
            ));
        }
        self.server.reload()?;
        let mut c = self.client.write();
        *c = (c.0 + 1, client);
        Ok(())
    }

    /// Reads them again on SIGHUP and whenever one changes (looked at every `every`).
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let tls = self.clone();
        let f = &self.files;
        let files = vec![f.ca_file.clone(), f.cert_file.clone(), f.key_file.clone()];
        crate::reload::watch_files("the cluster's TLS files", files, every, move || {
            tls.reload().map(|()| tls.files.cert_file.display().to_string())
        })
    }
}

/// The client side of `files`, and the node its certificate names.
fn client_config(files: &ClusterTlsFiles) -> Result<(ClientTlsConfig, Option<NodeId>), String> {
    let read = |path: &PathBuf, what: &str| {
        std::fs::read(path).map_err(|e| format!("the {what} file {}: {e}", path.display()))
    };
    let (ca, cert, key) = (
        read(&files.ca_file, "CA")?,
        read(&files.cert_file, "TLS certificate")?,
        read(&files.key_file, "TLS key")?,
    );
    let leaf = CertificateDer::pem_slice_iter(&cert)
        .next()
        .ok_or_else(|| {
            format!("the TLS certificate file {} holds none", files.cert_file.display())
        })?
        .map_err(|e| format!("the TLS certificate file {}: {e}", files.cert_file.display()))?;
    let peer = PeerCert::from_der(&leaf)
        .map_err(|e| format!("the TLS certificate file {}: {e}", files.cert_file.display()))?;
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .identity(Identity::from_pem(cert, key));
    Ok((config, peer.node))
}

/// An endpoint for the internal port at `addr` (`HOST:PORT` or a URI): `https` with the
/// client side of `tls`, `http` without.
pub fn peer_endpoint(addr: &str, tls: Option<&ClusterTls>) -> Result<Endpoint, String> {
    let hostport = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{hostport}"))
        .map_err(|e| format!("bad address {addr:?}: {e}"))?;
    match tls {
        Some(t) => t.client_endpoint(endpoint),
        None => Ok(endpoint),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::string::Ia5String;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

    /// A CA's PEM and its issuer.
    fn ca() -> (String, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), Issuer::new(params, key))
    }

    /// A certificate `issuer` signs for 127.0.0.1, naming `node` when given: (cert, key) PEM.
    fn leaf(issuer: &Issuer<'_, KeyPair>, node: Option<NodeId>) -> (String, String) {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "leaf");
        if let Some(id) = node {
            params.subject_alt_names.push(SanType::URI(Ia5String::try_from(node_uri(id)).unwrap()));
        }
        let key = KeyPair::generate().unwrap();
        (params.signed_by(&key, issuer).unwrap().pem(), key.serialize_pem())
    }

    fn write(files: &ClusterTlsFiles, ca: &str, (cert, key): &(String, String)) {
        std::fs::write(&files.ca_file, ca).unwrap();
        std::fs::write(&files.cert_file, cert).unwrap();
        std::fs::write(&files.key_file, key).unwrap();
    }

    #[test]
    fn a_certificate_names_its_node() {
        let (_, issuer) = ca();
        for node in [Some(7), None] {
            let (cert, _) = leaf(&issuer, node);
            let der = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
            let peer = PeerCert::from_der(&der).unwrap();
            assert_eq!(peer, PeerCert { node, name: "leaf".into() });
        }
        assert!(PeerCert::from_der(b"not a certificate").is_err());
    }

    #[test]
    fn cluster_tls_reloads_and_keeps_its_node() {
        let dir = tempfile::tempdir().unwrap();
        let files = ClusterTlsFiles {
            ca_file: dir.path().join("ca.pem"),
            cert_file: dir.path().join("node.pem"),
            key_file: dir.path().join("node.key"),
        };
        let (ca_pem, issuer) = ca();
        write(&files, &ca_pem, &leaf(&issuer, Some(3)));
        let tls = ClusterTls::new(files.clone()).unwrap();
        assert_eq!((tls.node(), tls.generation()), (Some(3), 0));
        // A renewed certificate of the same node: taken, and channels are to be made again.
        write(&files, &ca_pem, &leaf(&issuer, Some(3)));
        tls.reload().unwrap();
        assert_eq!(tls.generation(), 1);
        // One naming another node is refused, and what is in force stays.
        write(&files, &ca_pem, &leaf(&issuer, Some(4)));
        let e = tls.reload().unwrap_err();
        assert!(e.contains("names node 4, not node 3"), "{e}");
        assert_eq!((tls.node(), tls.generation()), (Some(3), 1));
        // A key that is not the certificate's is refused at start.
        let (cert, _) = leaf(&issuer, Some(3));
        let (_, other_key) = leaf(&issuer, Some(3));
        write(&files, &ca_pem, &(cert, other_key));
        assert!(ClusterTls::new(files.clone()).is_err());
        // An empty CA file too.
        write(&files, "", &leaf(&issuer, Some(3)));
        let e = ClusterTls::new(files).unwrap_err();
        assert!(e.contains("holds no certificate"), "{e}");
    }
}
