//! Harness shared by the integration tests in `t/`: start a real nginx with a config, talk
//! HTTP/1.1 to it, send timelines of requests.
//!
//! - [`nginx`]: [`Nginx`] runs one nginx (master + workers) in a fresh prefix on free loopback
//!   ports, and kills it on drop; [`check_config`] runs `nginx -t`.
//! - [`config`]: the tests' nginx configs, from one builder; [`admin`]: the configs the
//!   admin API, top keys and dashboard tests share.
//! - [`http`]: a small HTTP/1.1 client on `std::net::TcpStream`.
//! - [`timeline`]: requests sent at fixed offsets from one start instant.
//! - [`redis`]: real `redis-server`s (single, Cluster, TLS with a throwaway PKI);
//!   [`fake_redis`]: a scripted Redis that answers out-of-range values, garbage, huge arrays;
//!   [`fleet`]: nginx instances sharing a limit through them, and paced traffic.
//! - [`upstream`]: an upstream whose requests wait until the test releases them.
//! - [`skip`]: a test that cannot run here says so in `cargo test`'s output.
//!
//! Every test binary compiles this module but uses only part of it, hence the `allow`s.
#![allow(dead_code)]

pub mod admin;
pub mod config;
pub mod fake_redis;
pub mod fleet;
pub mod http;
pub mod llm;
pub mod nginx;
pub mod redis;
pub mod skip;
pub mod state_file;
pub mod timeline;
pub mod upstream;
pub mod workers;

#[allow(unused_imports)]
pub use config::{config, Config};
#[allow(unused_imports)]
pub use http::{
    get, key_statuses, send, start_request, statuses, Connection, PendingRequest, Request, Response,
};
#[allow(unused_imports)]
pub use nginx::{check_config, is_running, module_path, nginx_binary, stream_module_path, Nginx};
#[allow(unused_imports)]
pub use timeline::{describe, run_timeline, Outcome, Step};
