//! The sync loop's connections to Redis, opened here rather than by the `redis` crate so that
//! every byte read goes through a budget: before each exchange the loop says how much its
//! replies may take (`ratelimit_core::fleet_round::reply_bytes_bound`), and a connection that
//! reads more fails at once (dropped, its buffers freed). Without it, one hostile reply (an
//! array header of two billion elements followed by megabytes of small integers) made the
//! client allocate about 14 bytes for each byte received until the round's timeout.
//!
//! TCP and, for `rediss://`, TLS (rustls with the trust settings read at config time, the same
//! for a Cluster's nodes); then the `redis` crate's multiplexed connection on top, which does
//! the handshake (AUTH, SELECT) and the pipelining.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::shared::SyncError;

/// How many more bytes a connection may read, and whether it read more than that.
#[derive(Clone, Default)]
pub struct ReadBudget {
    left: Arc<AtomicI64>,
    exceeded: Arc<AtomicBool>,
}

impl ReadBudget {
    /// The next exchange's replies may take `bytes` bytes.
    pub fn allow(&self, bytes: usize) {
        self.left
            .store(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Release);
    }

    /// Whether the connection was cut off for reading more than it was allowed.
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Acquire)
    }
}

/// A stream whose reads are charged to a [`ReadBudget`].
struct Bounded<S> {
    inner: S,
    budget: ReadBudget,
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.budget.exceeded() {
            return Poll::Ready(Err(too_large()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            let read = i64::try_from(read).unwrap_or(i64::MAX);
            if self.budget.left.fetch_sub(read, Ordering::AcqRel) < read {
                self.budget.exceeded.store(true, Ordering::Release);
                return Poll::Ready(Err(too_large()));
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn too_large() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "reply larger than the exchange allows",
    )
}

/// The TLS client settings of `rediss://` URLs, built once per loop from the files read at
/// config time: `tls_ca=` (or the system's bundle) as roots, `tls_cert=`/`tls_key=` as the
/// client's certificate.
#[derive(Clone)]
pub struct Tls {
    verified: Arc<rustls::ClientConfig>,
    /// For `#insecure` URLs: no certificate is verified.
    unverified: Arc<rustls::ClientConfig>,
}

impl Tls {
    /// `None` when the settings cannot be used (they were checked at config time, so only a
    /// provider problem gets here).
    pub fn new(certificates: Option<&TlsCertificates>) -> Option<Tls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = certificates.and_then(|c| c.root_cert.as_deref()) {
            for certificate in CertificateDer::pem_slice_iter(pem).flatten() {
                let _ = roots.add(certificate);
            }
        }
        let client = || {
            let client = certificates.and_then(|c| c.client_tls.as_ref())?;
            let chain = CertificateDer::pem_slice_iter(&client.client_cert)
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(&client.client_key).ok()?;
            Some((chain, key))
        };
        let builder = || {
            rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .ok()
        };
        let verified = builder()?.with_root_certificates(roots);
        let verified = match client() {
            Some((chain, key)) => verified.with_client_auth_cert(chain, key).ok()?,
            None => verified.with_no_client_auth(),
        };
        let unverified = builder()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider.clone())));
        let unverified = match client() {
            Some((chain, key)) => unverified.with_client_auth_cert(chain, key).ok()?,
            None => unverified.with_no_client_auth(),
        };
        Some(Tls {
            verified: Arc::new(verified),
            unverified: Arc::new(unverified),
        })
    }
}

/// `rediss://…/#insecure`: any certificate is accepted (documented as unsafe, for a test
/// bench only); the handshake's signatures are still checked with the provider.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Open a connection to `info`'s address (TLS for a `rediss://` one), do the handshake, and
/// return it with the budget its reads are charged to (allowed enough for the handshake).
pub async fn connect(
    info: &ConnectionInfo,
    tls: Option<&Tls>,
) -> Result<(MultiplexedConnection, ReadBudget), SyncError> {
    let budget = ReadBudget::default();
    budget.allow(64 * 1024);
    let (host, port, secure) = match &info.addr {
        ConnectionAddr::Tcp(host, port) => (host.as_str(), *port, None),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } => (host.as_str(), *port, Some(*insecure)),
        _ => return Err(SyncError::BadUrl),
    };
    let tcp = open_tcp(host, port).await?;
    let _ = tcp.set_nodelay(true);
    let connection = match secure {
        None => {
            let stream = Bounded {
                inner: tcp,
                budget: budget.clone(),
            };
            handshake(info, stream).await?
        }
        Some(insecure) => {
            let tls = tls.ok_or(SyncError::Tls)?;
            let config = if insecure {
                tls.unverified.clone()
            } else {
                tls.verified.clone()
            };
            let name = ServerName::try_from(host.to_string()).map_err(|_| SyncError::BadUrl)?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|error| classify_tls(&error))?;
            let stream = Bounded {
                inner: stream,
                budget: budget.clone(),
            };
            handshake(info, stream).await?
        }
    };
    Ok((connection, budget))
}

/// TCP to the first of `host`'s addresses that accepts, the failure told apart: a name that
/// does not resolve, a refusal, no route (the last address's error when none accepts).
async fn open_tcp(host: &str, port: u16) -> Result<tokio::net::TcpStream, SyncError> {
    let addresses = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| SyncError::ConnectDns)?;
    let mut last = SyncError::ConnectDns;
    for address in addresses {
        match tokio::net::TcpStream::connect(address).await {
            Ok(tcp) => return Ok(tcp),
            Err(error) => last = io_cause(&error),
        }
    }
    Err(last)
}

/// Why a connection could not be made, from its I/O error: refused, no route, other.
fn io_cause(error: &io::Error) -> SyncError {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => SyncError::ConnectRefused,
        io::ErrorKind::NetworkUnreachable | io::ErrorKind::HostUnreachable => {
            SyncError::ConnectUnreachable
        }
        _ => SyncError::Connect,
    }
}

/// The `redis` crate's connection over `stream`: AUTH and SELECT as the URL says, then its
/// driver runs on the loop's runtime until the connection is dropped.
async fn handshake<S>(info: &ConnectionInfo, stream: S) -> Result<MultiplexedConnection, SyncError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let config = redis::AsyncConnectionConfig::new();
    let (connection, driver) = MultiplexedConnection::new_with_config(&info.redis, stream, config)
        .await
        .map_err(classify)?;
    tokio::spawn(driver);
    Ok(connection)
}

/// A failed TLS handshake, told apart as `tls::classify` does for the client's errors: a
/// certificate the trust settings refuse, an answer that is not TLS (a plain Redis port
/// answers a ClientHello with an error line, or closes), or any other failure.
fn classify_tls(error: &io::Error) -> SyncError {
    if error.to_string() == "tls handshake eof" {
        return SyncError::TlsNoAnswer;
    }
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => SyncError::TlsCertificate,
        Some(rustls::Error::InvalidMessage(_)) => SyncError::TlsNoAnswer,
        Some(_) => SyncError::Tls,
        None if error.kind() == io::ErrorKind::UnexpectedEof => SyncError::TlsNoAnswer,
        None => SyncError::Tls,
    }
}

/// What the client's I/O error says of the connection: refused, no route, or another failure
/// (names are resolved and connections opened in [`open_tcp`], so no DNS failure gets here).
fn connect_cause(error: &redis::RedisError) -> SyncError {
    if error.is_connection_refusal() {
        return SyncError::ConnectRefused;
    }
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<io::Error>())
        .map_or(SyncError::Connect, io_cause)
}

/// What a client error means for the log.
pub fn classify(error: redis::RedisError) -> SyncError {
    use redis::ErrorKind;
    if let Some(tls_error) = super::tls::classify(&error) {
        return tls_error;
    }
    match error.kind() {
        ErrorKind::AuthenticationFailed => SyncError::Auth,
        ErrorKind::IoError if error.is_timeout() => SyncError::Timeout,
        ErrorKind::IoError => connect_cause(&error),
        _ if error.is_connection_refusal() => SyncError::ConnectRefused,
        _ if error.is_connection_dropped() => SyncError::Connect,
        _ => {
            if error.to_string().contains("NOAUTH") || error.to_string().contains("WRONGPASS") {
                SyncError::Auth
            } else {
                SyncError::Reply
            }
        }
    }
}
