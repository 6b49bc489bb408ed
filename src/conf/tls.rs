//! The trust settings of `rediss://` (`tls_ca=`, else the system's CA bundle;
//! `tls_cert=`/`tls_key=`), read when the configuration is: by the master, as root (a key
//! readable by root only still works), so that `nginx -t` names a file that cannot be read
//! or holds no PEM, and a reload reads them again. The sync loop gets their bytes and builds
//! every client with them.

use std::path::{Path, PathBuf};

use ratelimit_core::sync_spec::SyncSpec;
use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use thiserror::Error;

/// A `tls_*=` file that cannot be used; each message names the parameter and the path.
#[derive(Debug, Error)]
pub enum TlsFileError {
    /// `cannot read tls_ca "/etc/ca.pem": No such file or directory (os error 2)`
    #[error("cannot read {0} \"{1}\": {2}")]
    Read(&'static str, String, std::io::Error),
    /// `tls_ca "/etc/ca.pem" holds no PEM certificate`
    #[error("{0} \"{1}\" holds no PEM certificate")]
    NoCertificate(&'static str, String),
    /// `tls_key "/etc/c.key" holds no PEM private key`
    #[error("tls_key \"{0}\" holds no PEM private key")]
    NoKey(String),
    /// A key that is not the client certificate's, or that cannot sign.
    #[error("tls_key \"{0}\" cannot be used with tls_cert \"{1}\": {2}")]
    KeyMismatch(String, String, String),
    /// A certificate that does not parse, or cannot be a trust anchor.
    #[error("{0} \"{1}\" holds an invalid certificate: {2}")]
    BadCertificate(&'static str, String, String),
    /// `rediss://` without `tls_ca=` on a system with no CA bundle.
    #[error("no system CA bundle found for rediss://: name the CA with \"tls_ca=\"")]
    NoSystemRoots,
}

/// The trust settings of `rediss://` URLs, read and checked: `tls_ca=`, else the system's CA
/// bundle (found as OpenSSL finds it), and `tls_cert=`/`tls_key=`. `None` for `redis://`.
/// Relative paths are taken from `conf_prefix` (the directory of nginx.conf), as
/// `ssl_certificate` does.
pub fn load(spec: &SyncSpec, conf_prefix: &Path) -> Result<Option<TlsCertificates>, TlsFileError> {
    if !spec.is_tls() {
        return Ok(None);
    }
    let insecure = spec.urls.iter().all(|url| url.ends_with("#insecure"));
    let root_cert = match &spec.tls_ca {
        Some(path) => Some(read_ca("tls_ca", path, conf_prefix)?),
        // No URL verifies anything: no roots are needed.
        None if insecure => None,
        None => {
            let bundle = openssl_probe::probe()
                .cert_file
                .ok_or(TlsFileError::NoSystemRoots)?;
            Some(read_ca(
                "the system's CA bundle",
                &bundle.display().to_string(),
                conf_prefix,
            )?)
        }
    };
    let client_tls = match &spec.tls_client {
        Some((cert, key)) => Some(read_client(cert, key, conf_prefix)?),
        None => None,
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

fn read(name: &'static str, path: &str, conf_prefix: &Path) -> Result<Vec<u8>, TlsFileError> {
    let full: PathBuf = conf_prefix.join(path);
    std::fs::read(&full).map_err(|error| TlsFileError::Read(name, path.to_string(), error))
}

/// Every certificate of the file must parse and be a usable trust anchor (the client refuses
/// the whole file otherwise), and there must be one at least: an empty trust store would
/// refuse every server.
fn read_ca(name: &'static str, path: &str, conf_prefix: &Path) -> Result<Vec<u8>, TlsFileError> {
    let pem = read(name, path, conf_prefix)?;
    let mut store = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        let certificate = certificate
            .map_err(|error| TlsFileError::BadCertificate(name, path.into(), error.to_string()))?;
        store
            .add(certificate)
            .map_err(|error| TlsFileError::BadCertificate(name, path.into(), error.to_string()))?;
    }
    if store.is_empty() {
        return Err(TlsFileError::NoCertificate(name, path.into()));
    }
    Ok(pem)
}

/// The chain must parse, the key too, and be the key of the chain's first certificate, in a
/// type the provider can sign with: what the client checks when it connects, checked here.
fn read_client(cert: &str, key: &str, conf_prefix: &Path) -> Result<ClientTlsConfig, TlsFileError> {
    let client_cert = read("tls_cert", cert, conf_prefix)?;
    let chain = CertificateDer::pem_slice_iter(&client_cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| {
            TlsFileError::BadCertificate("tls_cert", cert.into(), error.to_string())
        })?;
    if chain.is_empty() {
        return Err(TlsFileError::NoCertificate("tls_cert", cert.into()));
    }
    let client_key = read("tls_key", key, conf_prefix)?;
    let Ok(private_key) = PrivateKeyDer::from_pem_slice(&client_key) else {
        return Err(TlsFileError::NoKey(key.into()));
    };
    let provider = rustls::crypto::ring::default_provider();
    if let Err(error) = CertifiedKey::from_der(chain, private_key, &provider) {
        return Err(TlsFileError::KeyMismatch(
            key.into(),
            cert.into(),
            error.to_string(),
        ));
    }
    Ok(ClientTlsConfig {
        client_cert,
        client_key,
    })
}
