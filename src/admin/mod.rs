//! The JSON admin API (`rate_limit_admin`). Not implemented yet: the admin issue fills this in.

use ngx::core::Status;
use ngx::ffi::{ngx_conf_t, ngx_cycle_t, ngx_http_request_t, ngx_int_t};
use ngx::http::{HttpModuleLocationConf, NgxHttpCoreModule};

use crate::conf::ZoneConf;

/// Make the current location answer with the admin API.
pub fn install_content_handler(cf: &mut ngx_conf_t) -> Result<(), ()> {
    let clcf = NgxHttpCoreModule::location_conf_mut(cf).ok_or(())?;
    clcf.handler = Some(admin_handler);
    Ok(())
}

/// Called in each worker at start.
pub extern "C" fn init_process(_cycle: *mut ngx_cycle_t) -> ngx_int_t {
    Status::NGX_OK.into()
}

/// Called in the master when a zone's shared memory is ready (fresh or adopted).
pub fn zone_ready(_zone_conf: &mut ZoneConf) {}

unsafe extern "C" fn admin_handler(_r: *mut ngx_http_request_t) -> ngx_int_t {
    nginx_sys::NGX_HTTP_NOT_IMPLEMENTED as ngx_int_t
}
