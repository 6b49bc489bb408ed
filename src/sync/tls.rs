//! `rediss://` for the sync loop: rustls with the `ring` provider, through the loop's own
//! connections (`super::link`). The trust settings were read with the configuration
//! (`crate::conf::sync`); the loop's TLS settings, the cluster's nodes included, are built
//! from their bytes, so the system's store is never read again on the loop's thread. Here:
//! telling a TLS failure apart in the client's errors.

use redis::RedisError;

use super::shared::SyncError;

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
