//! The JSON admin API (`rate_limit_admin`): a front door. What the API does is decided in the
//! `ratelimit-admin` crate, which has no nginx in it; the zones it sees, and every change it
//! makes, are the control layer's (`crate::control::zones`). Here: `request` reads requests
//! and sends answers, `errors` answers nginx's own refusals of admin requests in JSON.

mod errors;
mod request;

pub use request::admin_handler;

/// Once the `http` block is read: put the filters that answer nginx's own 413/414 of admin
/// requests in JSON.
pub fn postconfiguration() {
    errors::install();
}
