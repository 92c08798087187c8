//! TLS on a port: the server's certificate chain and key from PEM files, read again on
//! SIGHUP and when they change (new connections take the new ones; open connections keep
//! theirs). HTTP/2 is negotiated by ALPN (`h2`). rustls with the ring provider.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Where a port's certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM, the server's own first.
    pub cert_file: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
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
        let files = vec![self.files.cert_file.clone(), self.files.key_file.clone()];
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
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("the TLS certificate {cert} and its key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
