//! TLS with rustls: the node's certificate, key and CA files (PEM), loaded once, and the
//! configurations built from them — AMQPS (RabbitMQ's `listeners.ssl` with
//! `ssl_options.verify` / `fail_if_no_peer_cert`) and mutual TLS on the cluster port
//! (every node presents its certificate and checks its peer's against the CA; quorumqctl
//! does the same). `deploy/gen-certs.sh` makes a test CA and certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;

/// Errors loading TLS files or building a configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or held nothing usable.
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    /// rustls refused the certificate, key or CA.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The node's TLS files, loaded.
#[derive(Clone)]
pub struct TlsFiles {
    /// The node's certificate chain, leaf first.
    pub certs: Vec<CertificateDer<'static>>,
    /// The node's private key.
    pub key: Arc<PrivateKeyDer<'static>>,
    /// The CA certificates that sign clients' and peers' certificates (empty: none).
    pub ca: Vec<CertificateDer<'static>>,
    /// The PEM text of the files (tonic takes PEM).
    pem: Pem,
}

#[derive(Clone)]
struct Pem {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        path: path.to_owned(),
        why: e.to_string(),
    })
}

fn certs_of(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::File {
            path: path.to_owned(),
            why: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::File {
            path: path.to_owned(),
            why: "no certificate in the file".into(),
        });
    }
    Ok(certs)
}

impl TlsFiles {
    /// Loads the certificate chain, key and (optional) CA bundle, all PEM.
    ///
    /// Errors: a file unreadable, or without a certificate / key.
    pub fn load(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<TlsFiles, TlsError> {
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        let certs = certs_of(cert, &cert_pem)?;
        let parsed_key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::File {
            path: key.to_owned(),
            why: format!("no PEM private key: {e}"),
        })?;
        let (ca_certs, ca_pem) = match ca {
            Some(p) => {
                let pem = read(p)?;
                (certs_of(p, &pem)?, Some(pem))
            }
            None => (Vec::new(), None),
        };
        Ok(TlsFiles {
            certs,
            key: Arc::new(parsed_key),
            ca: ca_certs,
            pem: Pem {
                cert: cert_pem,
                key: key_pem,
                ca: ca_pem,
            },
        })
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in &self.ca {
            roots
                .add(c.clone())
                .map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
        }
        Ok(Arc::new(roots))
    }

    /// The AMQPS server configuration. `verify_peer`: ask for a client certificate and
    /// check it against the CA (RabbitMQ `ssl_options.verify = verify_peer`);
    /// `fail_if_no_peer_cert`: refuse a client without one. A verified certificate's
    /// common name is the user of the EXTERNAL mechanism.
    ///
    /// Errors: `verify_peer` without a CA file; rustls refuses the key or certificates.
    pub fn amqps_config(
        &self,
        verify_peer: bool,
        fail_if_no_peer_cert: bool,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = if verify_peer {
            if self.ca.is_empty() {
                return Err(TlsError::Config(
                    "tls_verify_peer needs tls_ca_file (the CA of client certificates)".into(),
                ));
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                self.roots()?,
                provider,
            );
            let v = if fail_if_no_peer_cert {
                v
            } else {
                v.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(
                v.build()
                    .map_err(|e| TlsError::Config(format!("client verifier: {e}")))?,
            )
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(format!("certificate and key: {e}")))?;
        config.alpn_protocols.clear();
        Ok(Arc::new(config))
    }

    /// The cluster listener's TLS: the node's certificate, and every client (peer node or
    /// quorumqctl) must present one signed by the CA.
    ///
    /// Errors: no CA file.
    pub fn cluster_server(&self) -> Result<tonic::transport::ServerTlsConfig, TlsError> {
        let ca = self.pem.ca.clone().ok_or_else(|| {
            TlsError::Config("cluster TLS needs tls_ca_file (the CA of node certificates)".into())
        })?;
        Ok(tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &self.pem.cert,
                &self.pem.key,
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(ca)))
    }

    /// A client's TLS toward the cluster port of another node: the node's certificate as
    /// client identity, the peer's checked against the CA.
    ///
    /// Errors: no CA file.
    pub fn cluster_client(&self) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
        cluster_client_config(
            self.pem.ca.clone(),
            Some((self.pem.cert.clone(), self.pem.key.clone())),
        )
    }
}

/// A client TLS configuration toward a cluster port: the CA that signs node certificates
/// and the client's own certificate and key (PEM). quorumqctl builds it from its flags.
///
/// Errors: no CA.
pub fn cluster_client_config(
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
    let ca = ca.ok_or_else(|| TlsError::Config("cluster TLS needs a CA certificate".into()))?;
    let mut c = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    if let Some((cert, key)) = identity {
        c = c.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    Ok(c)
}

/// The user a verified client certificate names for the EXTERNAL mechanism: its subject's
/// common name (RabbitMQ `ssl_cert_login_from = common_name`); None when it has none.
pub fn certificate_user(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
}
