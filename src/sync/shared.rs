//! What the sync loop shares with the workers: the instance's sync record (data of the
//! store, `crate::store::sync_record`, named here for the loop) and the codes of the loop's
//! errors it leaves there for the workers to log.

pub use crate::store::sync_record::{Bad, Mode, SyncShared};

/// Why a sync round failed, as the workers log it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum SyncError {
    None = 0,
    Connect = 1,
    Timeout = 2,
    Auth = 3,
    Reply = 4,
    BadUrl = 5,
    Cluster = 6,
    /// The TLS handshake failed (the server does not speak TLS, no common version...).
    Tls = 7,
    /// The server's certificate is not accepted by the trust settings (`tls_ca=`, the
    /// system's roots) or does not name the address connected to.
    TlsCertificate = 8,
    /// The server did not answer the TLS handshake in TLS (or in time): a plain Redis port.
    TlsNoAnswer = 9,
    /// Nothing listens at the address (TCP connection refused).
    ConnectRefused = 10,
    /// The URL's host name does not resolve.
    ConnectDns = 11,
    /// A connection still being opened (TCP, AUTH) when the round's `timeout=` ran out.
    ConnectTimeout = 12,
    /// No route to the network or host.
    ConnectUnreachable = 13,
    /// A reply larger than the exchange allows: the connection was dropped.
    ReplyTooLarge = 14,
    /// No sentinel answered with a master for the URL's name.
    SentinelNoMaster = 15,
    /// The server the sentinels named does not say it is the master (`ROLE`).
    NotMaster = 16,
}

impl SyncError {
    const ALL: [SyncError; 17] = [
        SyncError::None,
        SyncError::Connect,
        SyncError::Timeout,
        SyncError::Auth,
        SyncError::Reply,
        SyncError::BadUrl,
        SyncError::Cluster,
        SyncError::Tls,
        SyncError::TlsCertificate,
        SyncError::TlsNoAnswer,
        SyncError::ConnectRefused,
        SyncError::ConnectDns,
        SyncError::ConnectTimeout,
        SyncError::ConnectUnreachable,
        SyncError::ReplyTooLarge,
        SyncError::SentinelNoMaster,
        SyncError::NotMaster,
    ];

    /// The error stored as `code` (`None` for anything else).
    pub fn from_code(code: u64) -> SyncError {
        SyncError::ALL
            .into_iter()
            .find(|&error| error as u64 == code)
            .unwrap_or(SyncError::None)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SyncError::None => "no error",
            SyncError::Connect => "cannot connect",
            SyncError::Timeout => "timed out",
            SyncError::Auth => "authentication failed",
            SyncError::Reply => "unexpected reply",
            SyncError::BadUrl => "invalid URL",
            SyncError::Cluster => "cluster error",
            SyncError::Tls => "TLS handshake failed",
            SyncError::TlsCertificate => {
                "TLS handshake failed: the server's certificate is not trusted (see tls_ca=)"
            }
            SyncError::TlsNoAnswer => {
                "TLS handshake failed: no TLS answer (does the server speak TLS on this port?)"
            }
            SyncError::ConnectRefused => {
                "cannot connect: connection refused (does Redis listen on that address and port?)"
            }
            SyncError::ConnectDns => "cannot connect: the host name does not resolve (DNS)",
            SyncError::ConnectTimeout => {
                "cannot connect: no answer within timeout= (packets dropped by a firewall, or \
                 a wrong address?)"
            }
            SyncError::ConnectUnreachable => "cannot connect: network or host unreachable",
            SyncError::ReplyTooLarge => "reply too large, connection dropped",
            SyncError::SentinelNoMaster => {
                "no sentinel knows a master of that name (see \"sentinel monitor\")"
            }
            SyncError::NotMaster => {
                "the server the sentinels named is not a master (a failover under way?)"
            }
        }
    }
}
