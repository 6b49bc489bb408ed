//! `rate_limit_sync`: the fleet's Redis, read into a [`SyncConf`], and the instance's sync
//! record's shared memory zone added (laid out by `crate::store::sync_record`).

use core::ffi::{c_char, c_void};

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{ngx_command_t, ngx_conf_t};
use ratelimit_core::sync_spec::SyncSpec;

use super::ext::ConfExt;
use super::{add_shared_zone, main_conf, tls, ConfError};
use crate::store::sync_record::{self, SHM_NAME, SHM_SIZE};

/// `rate_limit_sync` as configured.
pub struct SyncConf {
    pub spec: SyncSpec,
    /// The files of `tls_ca=`, `tls_cert=`/`tls_key=`, read at config time.
    pub tls: Option<redis::TlsCertificates>,
}

/// `rate_limit_sync redis://… [cluster] [interval=] [timeout=] [prefix=] [on_failure=]
/// [tls_ca=] [tls_cert= tls_key=];`, or with a `redis-sentinel://` URL [sentinel_password=].
pub extern "C" fn cmd_rate_limit_sync(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::sync::cmd_rate_limit_sync",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx calls directive handlers with a valid configuration context.
            let cf = unsafe { &mut *cf };
            match rate_limit_sync(cf) {
                Ok(()) => NGX_CONF_OK,
                Err(error) => cf.fail(&error),
            }
        },
    )
}

fn rate_limit_sync(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let words = cf.words(1)?;
    let spec = SyncSpec::parse_words(&words)?;
    // A Sentinel URL was parsed whole with the spec; the client has no form for it.
    for url in spec.urls.iter().filter(|_| spec.sentinel.is_none()) {
        if let Err(error) = redis::Client::open(url.as_str()) {
            return Err(ConfError::InvalidRedisUrl {
                url: url.clone(),
                reason: error.to_string(),
            });
        }
    }
    let tls = tls::load(&spec, &conf_prefix(cf))?;
    if spec.urls.len() > 1 && !spec.cluster {
        return Err(ConfError::UrlsNeedCluster(spec.urls[1].clone()));
    }
    let mcf = main_conf(cf).ok_or(ConfError::Logged)?;
    if mcf.sync.is_some() {
        return Err(ConfError::Duplicate("rate_limit_sync"));
    }
    let interval_ns = cf.alloc(spec.interval_ms * 1_000_000)?;
    let shm_zone = add_shared_zone(cf, SHM_NAME, SHM_SIZE)?;
    shm_zone.init = Some(sync_record::init_zone);
    shm_zone.noreuse = 0;
    // The interval reaches the shared record through the zone's data.
    shm_zone.data = interval_ns.cast();
    mcf.sync = Some(SyncConf { spec, tls });
    Ok(())
}

/// The directory of nginx.conf, against which relative `tls_*=` paths are read.
fn conf_prefix(cf: &ngx_conf_t) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: `cf.cycle` is the cycle being configured; its `conf_prefix` is set before any
    // directive is read.
    let prefix = unsafe { (*cf.cycle).conf_prefix.as_bytes() };
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(prefix))
}
