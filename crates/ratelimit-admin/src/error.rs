//! Every way a request can fail, with its HTTP status. Messages follow nginx's wording
//! (lowercase, the bad token quoted) and become the `{"error": "..."}` body.

/// A refused request. Nothing was changed when one of these is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 404: not one of the API's paths.
    #[error(
        "unknown path \"{0}\": the API serves zones, zones/NAME, zones/NAME/keys/KEY, \
         zones/NAME/overrides, zones/NAME/overrides/KEY, zones/NAME/top, zones/NAME/history, \
         zones/NAME/blocked, zones/NAME/blocked/KEY, metrics and dashboard"
    )]
    UnknownPath(String),
    /// 400: a `%` not followed by two hex digits.
    #[error("invalid percent-encoding \"{0}\" in path")]
    BadPercentEncoding(String),
    /// 405, with an `Allow` header.
    #[error("method {method} is not allowed here, use {allow}")]
    MethodNotAllowed { method: String, allow: &'static str },
    /// 403: a write on a location without `write=on`.
    #[error("this location is read-only: \"rate_limit_admin write=on\" allows changes")]
    ReadOnly,
    /// 404: `unknown zone "NAME": the zones are "a" and "b"`, with the zone meant first when
    /// the name is a typo of one (`unknown zone "perclient", did you mean "per_client"? ...`).
    #[error("unknown zone \"{name}\"{hint}")]
    UnknownZone { name: String, hint: String },
    /// 404: `GET`/`DELETE zones/NAME/keys/KEY` for a key without state.
    #[error("key \"{key}\" is not tracked in zone \"{zone}\"")]
    KeyNotTracked { zone: String, key: String },
    /// 404: `GET`/`DELETE zones/NAME/overrides/KEY` for a key without override.
    #[error("key \"{key}\" has no override in zone \"{zone}\"")]
    NoOverride { zone: String, key: String },
    /// 413
    #[error("request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// 400: the body is not JSON, or not the expected object (wrong types, unknown fields).
    #[error("{0}")]
    BadBody(String),
    /// 400: a value the zone cannot take (a rate a sliding algorithm cannot count, a burst for
    /// an algorithm without one...).
    #[error("{0}")]
    BadValue(String),
    /// 400: an empty key in `PUT zones/NAME/overrides/KEY`.
    #[error("empty key")]
    EmptyKey,
    /// 507: the zone's override table is full.
    #[error("zone \"{zone}\" has no room for another override ({capacity} at most)")]
    OverridesFull { zone: String, capacity: usize },
    /// 507: the zone's shared memory has no room left for the override's key.
    #[error(
        "zone \"{zone}\" has no memory left for the key of another override ({key_bytes} \
         bytes): its {size} bytes are in use; a larger zone size holds more"
    )]
    OverrideKeyNoMemory {
        zone: String,
        key_bytes: usize,
        size: u64,
    },
    /// 400: a bad parameter of `GET zones/NAME/top`.
    #[error("{0}")]
    BadQuery(String),
    /// 404: a zone without `block=`.
    #[error("zone \"{0}\" has no penalty box: \"block=DURATION\" on its rate_limit_zone keeps blocked keys")]
    NoBlocks(String),
    /// 404: the key is not blocked.
    #[error("key \"{key}\" is not blocked in zone \"{zone}\"")]
    NotBlocked { zone: String, key: String },
    /// 507: the block table has no record to give.
    #[error("zone \"{0}\" has no room for another blocked key")]
    BlocksFull(String),
    /// 404: a zone too small to keep top keys.
    #[error("zone \"{0}\" keeps no top keys: it needs 256k of shared memory at least")]
    NoTopKeys(String),
    /// 404: a zone that keeps no history (a zone of a module built before it kept one).
    #[error("zone \"{0}\" keeps no history")]
    NoHistory(String),
}

impl ApiError {
    /// 404 for `name`, naming the zone meant (if any) and listing the zones there are.
    pub fn unknown_zone(name: &str, zones: &[&str]) -> ApiError {
        let list = ratelimit_core::hint::zone_list(zones);
        let hint = match ratelimit_core::hint::nearest_zone(name, zones) {
            Some(meant) => format!(", did you mean \"{meant}\"? {list}"),
            None => format!(": {list}"),
        };
        ApiError::UnknownZone {
            name: name.to_string(),
            hint,
        }
    }

    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::UnknownPath(_)
            | ApiError::UnknownZone { .. }
            | ApiError::KeyNotTracked { .. }
            | ApiError::NoOverride { .. }
            | ApiError::NoTopKeys(_)
            | ApiError::NoHistory(_)
            | ApiError::NoBlocks(_)
            | ApiError::NotBlocked { .. } => 404,
            ApiError::BadPercentEncoding(_)
            | ApiError::BadBody(_)
            | ApiError::BadValue(_)
            | ApiError::EmptyKey
            | ApiError::BadQuery(_) => 400,
            ApiError::MethodNotAllowed { .. } => 405,
            ApiError::ReadOnly => 403,
            ApiError::BodyTooLarge { .. } => 413,
            ApiError::OverridesFull { .. }
            | ApiError::OverrideKeyNoMemory { .. }
            | ApiError::BlocksFull(_) => 507,
        }
    }

    /// The `Allow` header a 405 carries.
    pub fn allow(&self) -> Option<&'static str> {
        match self {
            ApiError::MethodNotAllowed { allow, .. } => Some(allow),
            _ => None,
        }
    }
}
