//! The words of `rate_limit_sync`:
//!
//! ```text
//! rate_limit_sync redis://[user:password@]host:port[/db] [redis://…]… [cluster]
//!                 [interval=100ms] [timeout=50ms] [prefix=rl:] [on_failure=local_share|open|closed]
//!                 [tls_ca=ca.pem] [tls_cert=client.pem tls_key=client.key];
//! rate_limit_sync redis-sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[/db]
//!                 [sentinel_password=…] [interval=…]…;
//! ```
//!
//! `tls_*=` go with `rediss://` (and `rediss-sentinel://`) URLs only; the module reads the
//! files (at config time).
//!
//! `redis://` URLs are only recognised here by their scheme; the module checks them with the
//! Redis client, which knows every form it accepts. A Sentinel URL is parsed here
//! ([`SentinelSpec`]): the client has no form for it.

use thiserror::Error;

/// What happens once the store has been unreachable for [`SyncSpec::FAILED_AFTER_ROUNDS`]
/// intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Each instance enforces `1 / N̂` of the limit, `N̂` the instances last seen alive.
    LocalShare,
    /// Each instance enforces the whole limit alone.
    Open,
    /// Every request of a sync zone is rejected.
    Closed,
}

impl OnFailure {
    /// The name used in the configuration and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::LocalShare => "local_share",
            OnFailure::Open => "open",
            OnFailure::Closed => "closed",
        }
    }
}

/// An invalid `rate_limit_sync` word; each message quotes it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SyncSpecError {
    /// `invalid parameter "intervall=1s", did you mean "interval="?`: the word, then
    /// [`crate::hint::parameter_hint`].
    #[error("invalid parameter \"{0}\"{1}")]
    InvalidParameter(String, String),
    /// A word that is no parameter and no `redis://` URL, such as `127.0.0.1:6379`.
    #[error(
        "invalid Redis URL \"{0}\": it must be redis://[user:password@]host:port[/db] \
         (rediss:// for TLS)"
    )]
    InvalidUrl(String),
    /// `invalid interval "interval=0"`
    #[error("invalid interval \"{0}\": it must be from 10ms to 60s")]
    InvalidInterval(String),
    /// `invalid timeout "timeout=5m"`
    #[error("invalid timeout \"{0}\": it must be from 1ms up to the interval")]
    InvalidTimeout(String),
    /// `invalid prefix "prefix="`
    #[error("invalid prefix \"{0}\"")]
    InvalidPrefix(String),
    /// `invalid on_failure "on_failure=maybe"`
    #[error("invalid on_failure \"{0}\": it must be local_share, open or closed")]
    InvalidOnFailure(String),
    /// `tls_ca=`, `tls_cert=` or `tls_key=` with an empty path.
    #[error("invalid {0} \"{1}\": it needs a file")]
    InvalidTlsFile(&'static str, String),
    /// A `tls_*=` word with a `redis://` URL: `"tls_ca=ca.pem" needs a rediss:// URL, not "redis://a"`.
    #[error("\"{0}\" needs a rediss:// URL, not \"{1}\"")]
    TlsWithoutTls(String, String),
    /// `tls_cert=` without `tls_key=` or the other way round.
    #[error("\"{0}\" needs \"{1}=\" too")]
    TlsPairMissing(String, &'static str),
    /// `tls_ca=` with a URL whose `#insecure` turns every check off.
    #[error("\"{0}\" has no effect with \"{1}\", which verifies no certificate")]
    TlsCaInsecure(String, String),
    /// Seeds of one cluster with and without TLS.
    #[error("invalid Redis URL \"{0}\": redis:// and rediss:// URLs cannot be mixed")]
    MixedSchemes(String),
    /// No URL at all.
    #[error("\"rate_limit_sync\" must have a redis:// URL")]
    MissingUrl,
    /// A `redis-sentinel://` URL that does not parse, and why.
    #[error(
        "invalid Redis Sentinel URL \"{0}\": {1}; it must be \
         redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] \
         (rediss-sentinel:// for TLS)"
    )]
    InvalidSentinelUrl(String, &'static str),
    /// A Sentinel URL beside another URL, or with `cluster`.
    #[error("\"{0}\" cannot be used with a Sentinel URL: list every sentinel in one URL, separated by commas")]
    SentinelNotAlone(String),
    /// `sentinel_password=` with nothing after it.
    #[error("invalid sentinel_password \"{0}\": it needs a password")]
    EmptySentinelPassword(String),
    /// `sentinel_password=` with a URL that is not a Sentinel one.
    #[error("\"{0}\" needs a redis-sentinel:// URL")]
    SentinelPasswordWithoutSentinel(String),
}

/// The parameters of `rate_limit_sync` after its URLs, for the error that quotes an unknown
/// one.
pub const SYNC_PARAMETERS: &[&str] = &[
    "cluster",
    "interval=",
    "timeout=",
    "prefix=",
    "on_failure=",
    "tls_ca=",
    "tls_cert=",
    "tls_key=",
    "sentinel_password=",
];

/// Where a Sentinel URL's sentinels listen when it names no port (Sentinel's own default).
pub const SENTINEL_DEFAULT_PORT: u16 = 26379;

/// A parsed `redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db]`
/// (`rediss-sentinel://` for TLS, `#insecure` at the end as for `rediss://`).
///
/// The URL's credentials and database are the master's; the sentinels are asked with
/// `sentinel_password=` (AUTH with the default user), or with no AUTH when it is not given.
///
/// ```
/// use ratelimit_core::sync_spec::SentinelSpec;
///
/// let url = "redis-sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2/orders/2";
/// let sentinel = SentinelSpec::parse(url).unwrap();
/// assert_eq!(sentinel.sentinels, [("10.0.0.1".to_string(), 26379), ("10.0.0.2".to_string(), 26379)]);
/// assert_eq!((sentinel.master_name.as_str(), sentinel.db), ("orders", 2));
/// assert_eq!(sentinel.username.as_deref(), Some("app"));
/// assert_eq!(sentinel.password.as_deref(), Some("s@cret"));
/// assert!(!sentinel.tls);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelSpec {
    /// The sentinels, asked in this order (host, port).
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under (`sentinel monitor NAME ...`).
    pub master_name: String,
    /// The master's database (`SELECT`).
    pub db: i64,
    /// The master's ACL user, when the URL names one.
    pub username: Option<String>,
    /// The master's password, when the URL has one (percent-decoded).
    pub password: Option<String>,
    /// `sentinel_password=`: AUTH for the sentinels.
    pub sentinel_password: Option<String>,
    /// `rediss-sentinel://`: TLS to the sentinels and to the master.
    pub tls: bool,
    /// `#insecure`: no certificate is verified (a test bench only).
    pub insecure: bool,
}

impl SentinelSpec {
    /// Whether `word` is meant as a Sentinel URL (a scheme naming Sentinel).
    pub fn is_sentinel_url(word: &str) -> bool {
        word.find("://").is_some_and(|at| {
            let scheme = &word[..at];
            scheme.contains("sentinel")
                && scheme
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || b"+-.".contains(&byte))
        })
    }

    /// Parse a `redis-sentinel://` or `rediss-sentinel://` URL.
    pub fn parse(url: &str) -> Result<SentinelSpec, SyncSpecError> {
        let bad = |reason: &'static str| SyncSpecError::InvalidSentinelUrl(url.into(), reason);
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis-sentinel://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss-sentinel://") {
            (true, rest)
        } else {
            return Err(bad("unknown scheme"));
        };
        let (rest, insecure) = match rest.strip_suffix("#insecure") {
            Some(rest) if tls => (rest, true),
            Some(_) => return Err(bad("#insecure needs rediss-sentinel://")),
            None => (rest, false),
        };
        if rest.contains(['#', '?']) {
            return Err(bad("it takes no query and no fragment but #insecure"));
        }
        let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no master name"))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let user = percent_decode(user).ok_or_else(|| bad("bad percent-encoding"))?;
                let password =
                    percent_decode(password).ok_or_else(|| bad("bad percent-encoding"))?;
                (
                    Some(user).filter(|user| !user.is_empty()),
                    Some(password).filter(|password| !password.is_empty()),
                )
            }
        };
        let mut sentinels = Vec::new();
        for host_port in hosts.split(',') {
            sentinels.push(host_and_port(host_port).ok_or_else(|| bad("bad host:port"))?);
        }
        let (master_name, db) = match path.split_once('/') {
            Some((name, "")) => (name, 0),
            Some((name, db)) => (
                name,
                db.parse::<i64>()
                    .ok()
                    .filter(|db| (0..=1_000_000).contains(db))
                    .ok_or_else(|| bad("bad database number"))?,
            ),
            None => (path, 0),
        };
        let master_name = percent_decode(master_name).ok_or_else(|| bad("bad percent-encoding"))?;
        if master_name.is_empty() || !master_name.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(bad("no master name"));
        }
        Ok(SentinelSpec {
            sentinels,
            master_name,
            db,
            username,
            password,
            sentinel_password: None,
            tls,
            insecure,
        })
    }
}

/// `host:port`, `host` (Sentinel's port), `[v6]:port` or `[v6]`.
fn host_and_port(text: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(bracketed) = text.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let valid = |byte: u8| byte.is_ascii_alphanumeric() || b".-_:".contains(&byte);
    if host.is_empty() || !host.bytes().all(valid) {
        return None;
    }
    let port = match port {
        None => SENTINEL_DEFAULT_PORT,
        Some(port) if port.bytes().all(|byte| byte.is_ascii_digit()) => {
            port.parse().ok().filter(|&port| port != 0)?
        }
        Some(_) => return None,
    };
    Some((host.to_string(), port))
}

/// `%XX` escapes decoded (the URL form of a password holding `@`, `:` or `/`).
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = text.get(at + 1..at + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A parsed `rate_limit_sync`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncSpec {
    /// The `redis://` / `rediss://` URLs, as written.
    pub urls: Vec<String>,
    /// `cluster`: the URLs are seed nodes of a Redis Cluster.
    pub cluster: bool,
    /// `interval=`: how often the fleet state is exchanged.
    pub interval_ms: u64,
    /// `timeout=`: how long one exchange may take before it counts as missed.
    pub timeout_ms: u64,
    /// `prefix=`: the start of every Redis key.
    pub prefix: String,
    /// `on_failure=`.
    pub on_failure: OnFailure,
    /// `tls_ca=`: a PEM file of the CA(s) to trust instead of the system's roots.
    pub tls_ca: Option<String>,
    /// `tls_cert=` and `tls_key=`: a client certificate (PEM chain) and its key.
    pub tls_client: Option<(String, String)>,
    /// A `redis-sentinel://` URL (then `urls` holds it alone): the master is asked of the
    /// sentinels.
    pub sentinel: Option<SentinelSpec>,
}

impl SyncSpec {
    /// Missed intervals after which the failure mode applies.
    pub const FAILED_AFTER_ROUNDS: u32 = 3;

    /// Parse the directive's arguments (without its name).
    ///
    /// ```
    /// use ratelimit_core::sync_spec::{OnFailure, SyncSpec};
    ///
    /// let spec = SyncSpec::parse_words(&["redis://127.0.0.1:6379", "interval=50ms"]).unwrap();
    /// assert_eq!((spec.interval_ms, spec.timeout_ms), (50, 25));
    /// assert_eq!(spec.on_failure, OnFailure::LocalShare);
    /// assert_eq!(spec.prefix, "rl:");
    /// ```
    pub fn parse_words(words: &[&str]) -> Result<SyncSpec, SyncSpecError> {
        let mut spec = SyncSpec {
            urls: Vec::new(),
            cluster: false,
            interval_ms: 100,
            timeout_ms: 0,
            prefix: "rl:".to_string(),
            on_failure: OnFailure::LocalShare,
            tls_ca: None,
            tls_client: None,
            sentinel: None,
        };
        let mut timeout = None;
        let mut sentinel_password = None;
        let (mut tls_cert, mut tls_key) = (None, None);
        for &word in words {
            if word.starts_with("redis://") || word.starts_with("rediss://") {
                spec.urls.push(word.to_string());
            } else if SentinelSpec::is_sentinel_url(word) {
                if spec.sentinel.is_some() {
                    return Err(SyncSpecError::SentinelNotAlone(word.into()));
                }
                spec.sentinel = Some(SentinelSpec::parse(word)?);
                spec.urls.push(word.to_string());
            } else if let Some(value) = word.strip_prefix("sentinel_password=") {
                if value.is_empty() {
                    return Err(SyncSpecError::EmptySentinelPassword(word.into()));
                }
                sentinel_password = Some((word, value));
            } else if word == "cluster" {
                spec.cluster = true;
            } else if let Some(value) = word.strip_prefix("interval=") {
                spec.interval_ms = parse_ms(value)
                    .filter(|ms| (10..=60_000).contains(ms))
                    .ok_or_else(|| SyncSpecError::InvalidInterval(word.into()))?;
            } else if let Some(value) = word.strip_prefix("timeout=") {
                timeout = Some((word, parse_ms(value)));
            } else if let Some(value) = word.strip_prefix("prefix=") {
                let printable = value.bytes().all(|byte| byte.is_ascii_graphic());
                if value.is_empty() || value.len() > 64 || !printable {
                    return Err(SyncSpecError::InvalidPrefix(word.into()));
                }
                spec.prefix = value.to_string();
            } else if let Some(value) = word.strip_prefix("on_failure=") {
                spec.on_failure = match value {
                    "local_share" => OnFailure::LocalShare,
                    "open" => OnFailure::Open,
                    "closed" => OnFailure::Closed,
                    _ => return Err(SyncSpecError::InvalidOnFailure(word.into())),
                };
            } else if let Some(value) = word.strip_prefix("tls_ca=") {
                spec.tls_ca = Some(tls_file("tls_ca", word, value)?);
            } else if let Some(value) = word.strip_prefix("tls_cert=") {
                tls_cert = Some((word, tls_file("tls_cert", word, value)?));
            } else if let Some(value) = word.strip_prefix("tls_key=") {
                tls_key = Some((word, tls_file("tls_key", word, value)?));
            } else if !word.contains('=') && word.contains([':', '/', '.']) {
                // `127.0.0.1:6379`, `http://host`: a URL without its scheme, or another one.
                return Err(SyncSpecError::InvalidUrl(word.into()));
            } else {
                let hint = crate::hint::parameter_hint(word, SYNC_PARAMETERS);
                return Err(SyncSpecError::InvalidParameter(word.into(), hint));
            }
        }
        spec.timeout_ms = match timeout {
            None => (spec.interval_ms / 2).max(1),
            Some((word, ms)) => ms
                .filter(|&ms| ms >= 1 && ms <= spec.interval_ms)
                .ok_or_else(|| SyncSpecError::InvalidTimeout(word.into()))?,
        };
        if spec.urls.is_empty() {
            return Err(SyncSpecError::MissingUrl);
        }
        spec.tls_client = match (tls_cert, tls_key) {
            (None, None) => None,
            (Some((_, cert)), Some((_, key))) => Some((cert, key)),
            (Some((word, _)), None) => {
                return Err(SyncSpecError::TlsPairMissing(word.into(), "tls_key"))
            }
            (None, Some((word, _))) => {
                return Err(SyncSpecError::TlsPairMissing(word.into(), "tls_cert"))
            }
        };
        spec.check_sentinel(words, sentinel_password)?;
        spec.check_tls(words)?;
        Ok(spec)
    }

    /// Whether the URLs are `rediss://` (all of them: they cannot be mixed), or the Sentinel
    /// URL is `rediss-sentinel://`.
    pub fn is_tls(&self) -> bool {
        match &self.sentinel {
            Some(sentinel) => sentinel.tls,
            None => self.urls[0].starts_with("rediss://"),
        }
    }

    /// A Sentinel URL stands alone (no other URL, no `cluster`); `sentinel_password=` needs
    /// one.
    fn check_sentinel(
        &mut self,
        words: &[&str],
        password: Option<(&str, &str)>,
    ) -> Result<(), SyncSpecError> {
        let Some(sentinel) = &mut self.sentinel else {
            return match password {
                Some((word, _)) => Err(SyncSpecError::SentinelPasswordWithoutSentinel(word.into())),
                None => Ok(()),
            };
        };
        if let Some(other) = self
            .urls
            .iter()
            .find(|url| !SentinelSpec::is_sentinel_url(url))
        {
            return Err(SyncSpecError::SentinelNotAlone(other.clone()));
        }
        if let Some(word) = words.iter().find(|&&word| word == "cluster") {
            return Err(SyncSpecError::SentinelNotAlone(word.to_string()));
        }
        sentinel.sentinel_password = password.map(|(_, value)| value.to_string());
        Ok(())
    }

    /// `tls_*=` need `rediss://` URLs; `tls_ca=` contradicts `#insecure`.
    fn check_tls(&self, words: &[&str]) -> Result<(), SyncSpecError> {
        let tls = self.is_tls();
        if let Some(url) = self
            .urls
            .iter()
            .find(|url| self.sentinel.is_none() && url.starts_with("rediss://") != tls)
        {
            return Err(SyncSpecError::MixedSchemes(url.clone()));
        }
        let tls_word = words.iter().find(|word| word.starts_with("tls_"));
        if let (false, Some(word)) = (tls, tls_word) {
            return Err(SyncSpecError::TlsWithoutTls(
                word.to_string(),
                self.urls[0].clone(),
            ));
        }
        let ca_word = words.iter().find(|word| word.starts_with("tls_ca="));
        let insecure = self.urls.iter().find(|url| url.ends_with("#insecure"));
        if let (Some(word), Some(url)) = (ca_word, insecure) {
            return Err(SyncSpecError::TlsCaInsecure(word.to_string(), url.clone()));
        }
        Ok(())
    }
}

/// The path of a `tls_*=` word: not empty.
fn tls_file(name: &'static str, word: &str, value: &str) -> Result<String, SyncSpecError> {
    if value.is_empty() {
        return Err(SyncSpecError::InvalidTlsFile(name, word.into()));
    }
    Ok(value.to_string())
}

/// `100ms`, `1s` or a bare number of milliseconds.
fn parse_ms(text: &str) -> Option<u64> {
    let (digits, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1000)
    } else {
        (text, 1)
    };
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        let spec = SyncSpec::parse_words(&[
            "redis://a:1",
            "redis://b:2",
            "cluster",
            "interval=1s",
            "timeout=200",
            "prefix=x:",
            "on_failure=closed",
        ])
        .unwrap();
        assert_eq!(spec.urls, ["redis://a:1", "redis://b:2"]);
        assert!(spec.cluster);
        assert_eq!((spec.interval_ms, spec.timeout_ms), (1000, 200));
        assert_eq!(
            (spec.prefix.as_str(), spec.on_failure),
            ("x:", OnFailure::Closed)
        );
        assert_eq!(
            (spec.is_tls(), spec.tls_ca, spec.tls_client),
            (false, None, None)
        );
    }

    #[test]
    fn tls_words() {
        let spec = SyncSpec::parse_words(&[
            "rediss://a:1",
            "tls_ca=/etc/ca.pem",
            "tls_cert=c.pem",
            "tls_key=c.key",
        ])
        .unwrap();
        assert!(spec.is_tls());
        assert_eq!(spec.tls_ca.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(
            spec.tls_client,
            Some(("c.pem".to_string(), "c.key".to_string()))
        );
        // System roots, and no verification at all (documented as unsafe).
        assert!(SyncSpec::parse_words(&["rediss://a:1"]).is_ok());
        assert!(SyncSpec::parse_words(&["rediss://a:1/#insecure"]).is_ok());
    }

    #[test]
    fn sentinel_urls() {
        let spec = SyncSpec::parse_words(&[
            "redis-sentinel://:pw@127.0.0.1:26379,[::1]:26380,sentinel.local/mymaster",
            "sentinel_password=sp",
            "interval=50ms",
        ])
        .unwrap();
        let sentinel = spec.sentinel.as_ref().unwrap();
        assert_eq!(
            sentinel.sentinels,
            [
                ("127.0.0.1".to_string(), 26379),
                ("::1".to_string(), 26380),
                ("sentinel.local".to_string(), SENTINEL_DEFAULT_PORT)
            ]
        );
        assert_eq!(sentinel.master_name, "mymaster");
        assert_eq!(
            (sentinel.username.as_deref(), sentinel.password.as_deref()),
            (None, Some("pw"))
        );
        assert_eq!(sentinel.sentinel_password.as_deref(), Some("sp"));
        assert!(!spec.is_tls() && !spec.cluster);
        let tls = SyncSpec::parse_words(&[
            "rediss-sentinel://u:p@h:1/m/3#insecure",
            "tls_cert=c.pem",
            "tls_key=c.key",
        ])
        .unwrap();
        let sentinel = tls.sentinel.as_ref().unwrap();
        assert!(tls.is_tls() && sentinel.insecure && sentinel.tls);
        assert_eq!((sentinel.db, sentinel.username.as_deref()), (3, Some("u")));
        assert_eq!(
            SyncSpec::parse_words(&["redis://a:1"]).unwrap().sentinel,
            None
        );
    }

    #[test]
    fn errors_quote_the_word() {
        #[rustfmt::skip]
        let rows: &[(&[&str], &str)] = &[
            (&["redis://a", "interval=5ms"], "invalid interval \"interval=5ms\": it must be from 10ms to 60s"),
            (&["redis://a", "interval=abc"], "invalid interval \"interval=abc\": it must be from 10ms to 60s"),
            (&["redis://a", "timeout=200ms"], "invalid timeout \"timeout=200ms\": it must be from 1ms up to the interval"),
            (&["redis://a", "on_failure=maybe"], "invalid on_failure \"on_failure=maybe\": it must be local_share, open or closed"),
            (&["redis://a", "prefix="], "invalid prefix \"prefix=\""),
            (&["redis://a", "http://b"], "invalid Redis URL \"http://b\": it must be redis://[user:password@]host:port[/db] (rediss:// for TLS)"),
            (&["127.0.0.1:6379"], "invalid Redis URL \"127.0.0.1:6379\": it must be redis://[user:password@]host:port[/db] (rediss:// for TLS)"),
            (&["redis://a", "clustre"], "invalid parameter \"clustre\", did you mean \"cluster\"?"),
            (&["redis://a", "intervall=1s"], "invalid parameter \"intervall=1s\", did you mean \"interval=\"?"),
            (&["redis://a", "onfailure=open"], "invalid parameter \"onfailure=open\", did you mean \"on_failure=\"?"),
            (&["redis://a", "bogus"], "invalid parameter \"bogus\": it must be cluster, interval=, timeout=, prefix=, on_failure=, tls_ca=, tls_cert=, tls_key= or sentinel_password="),
            (&["redis://a", "db=2"], "invalid parameter \"db=2\": it must be cluster, interval=, timeout=, prefix=, on_failure=, tls_ca=, tls_cert=, tls_key= or sentinel_password="),
            (&["interval=1s"], "\"rate_limit_sync\" must have a redis:// URL"),
            (&["redis://a:1", "tls_ca=/ca.pem"], "\"tls_ca=/ca.pem\" needs a rediss:// URL, not \"redis://a:1\""),
            (&["tls_key=k", "tls_cert=c", "redis://a:1"], "\"tls_key=k\" needs a rediss:// URL, not \"redis://a:1\""),
            (&["rediss://a:1", "tls_ca="], "invalid tls_ca \"tls_ca=\": it needs a file"),
            (&["rediss://a:1", "tls_cert=c.pem"], "\"tls_cert=c.pem\" needs \"tls_key=\" too"),
            (&["rediss://a:1", "tls_key=c.key"], "\"tls_key=c.key\" needs \"tls_cert=\" too"),
            (&["rediss://a:1/#insecure", "tls_ca=c"], "\"tls_ca=c\" has no effect with \"rediss://a:1/#insecure\", which verifies no certificate"),
            (&["rediss://a:1", "redis://b:2", "cluster"], "invalid Redis URL \"redis://b:2\": redis:// and rediss:// URLs cannot be mixed"),
            (&["redis-sentinel://a:1"], "invalid Redis Sentinel URL \"redis-sentinel://a:1\": no master name; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["redis-sentinel://a:1/"], "invalid Redis Sentinel URL \"redis-sentinel://a:1/\": no master name; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["redis-sentinel://a:x/m"], "invalid Redis Sentinel URL \"redis-sentinel://a:x/m\": bad host:port; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["redis-sentinel://a:1,,b:2/m"], "invalid Redis Sentinel URL \"redis-sentinel://a:1,,b:2/m\": bad host:port; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["redis-sentinel://a:70000/m"], "invalid Redis Sentinel URL \"redis-sentinel://a:70000/m\": bad host:port; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["redis-sentinel://a:1/m/x"], "invalid Redis Sentinel URL \"redis-sentinel://a:1/m/x\": bad database number; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["redis-sentinel://a:1/m#insecure"], "invalid Redis Sentinel URL \"redis-sentinel://a:1/m#insecure\": #insecure needs rediss-sentinel://; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["sentinel://a:1/m"], "invalid Redis Sentinel URL \"sentinel://a:1/m\": unknown scheme; it must be redis-sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] (rediss-sentinel:// for TLS)"),
            (&["redis-sentinel://a:1/m", "redis://b:2"], "\"redis://b:2\" cannot be used with a Sentinel URL: list every sentinel in one URL, separated by commas"),
            (&["redis-sentinel://a:1/m", "redis-sentinel://b:2/m"], "\"redis-sentinel://b:2/m\" cannot be used with a Sentinel URL: list every sentinel in one URL, separated by commas"),
            (&["redis-sentinel://a:1/m", "cluster"], "\"cluster\" cannot be used with a Sentinel URL: list every sentinel in one URL, separated by commas"),
            (&["redis-sentinel://a:1/m", "sentinel_password="], "invalid sentinel_password \"sentinel_password=\": it needs a password"),
            (&["redis://a:1", "sentinel_password=x"], "\"sentinel_password=x\" needs a redis-sentinel:// URL"),
            (&["redis-sentinel://a:1/m", "tls_ca=c"], "\"tls_ca=c\" needs a rediss:// URL, not \"redis-sentinel://a:1/m\""),
        ];
        for (words, message) in rows {
            let error = SyncSpec::parse_words(words).unwrap_err();
            assert_eq!(error.to_string(), *message, "{words:?}");
        }
    }
}
