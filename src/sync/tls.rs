//! `rediss://` for the sync loop: rustls (through the `redis` crate) with the `ring` provider.
//! The trust settings were read with the configuration (`crate::conf::sync`); every client,
//! the cluster's nodes included, is built with their bytes, so the system's store is never
//! read again on the loop's thread.

use redis::{Client, RedisError, RedisResult, TlsCertificates};

use super::shared::SyncError;

/// A client for `url`: with the trust settings for `rediss://` (there are some, see [`load`]),
/// as the URL says for `redis://`.
pub fn client(url: &str, tls: Option<&TlsCertificates>) -> RedisResult<Client> {
    match tls {
        Some(certificates) => Client::build_with_tls(url, certificates.clone()),
        None => Client::open(url),
    }
}

/// rustls takes its crypto from a process-wide provider; only `ring` is compiled in, but
/// installing it explicitly keeps a dependency that enables another one from making rustls
/// refuse to choose (it would panic). Called by the loop's thread before it connects.
pub fn install_provider() {
    // An error means that one is installed already: this one, by an earlier loop.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A TLS failure, told apart from other I/O errors: a certificate the trust settings do not
/// accept, an answer that is not TLS (a plain Redis port answers a ClientHello with an error
/// line, or closes), or any other handshake failure (no common protocol version, a client
/// certificate refused...).
pub fn classify(error: &RedisError) -> Option<SyncError> {
    let io_error =
        std::error::Error::source(error).and_then(|source| source.downcast_ref::<std::io::Error>());
    // tokio-rustls's words for a peer that closed during the handshake.
    if io_error.is_some_and(|io| io.to_string() == "tls handshake eof") {
        return Some(SyncError::TlsNoAnswer);
    }
    let rustls_error = io_error
        .and_then(|io| io.get_ref())
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(_)) => Some(SyncError::TlsCertificate),
        Some(rustls::Error::InvalidMessage(_)) => Some(SyncError::TlsNoAnswer),
        Some(_) => Some(SyncError::Tls),
        // rustls errors raised outside the handshake are flattened into text by the crate.
        None if error.to_string().starts_with("TLS error") => Some(SyncError::Tls),
        None => None,
    }
}
