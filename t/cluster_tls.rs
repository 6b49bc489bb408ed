//! `rate_limit_sync` over TLS (`rediss://`): real `redis-server`s that speak TLS only
//! (`--port 0 --tls-port P`), with a CA and certificates made at test time by the `openssl`
//! CLI, real nginx instances sharing one limit through them, and what nginx says when the
//! trust settings are wrong.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::fleet::{
    assert_one_limit, offer, ports, sync_config, sync_state, wait_mode, LIMIT_PER_SEC, ZONE,
};
use common::redis::{assert_keys_spread, redis_cluster_tls, Pki, Redis};
use common::{check_config, Nginx, Request};

/// `rediss://127.0.0.1:PORT` with `tls_ca=` the test CA.
fn tls_urls(pki: &Pki, redis: &Redis) -> String {
    format!(
        "rediss://127.0.0.1:{} tls_ca={}",
        redis.port,
        pki.file("ca.pem")
    )
}

/// Polls (bounded by `within`) until the error log holds `text`; returns the log.
fn wait_log(nginx: &Nginx, text: &str, within: Duration) -> String {
    let started = Instant::now();
    loop {
        let log = nginx.error_log();
        if log.contains(text) {
            return log;
        }
        assert!(started.elapsed() < within, "{text:?} not in {log}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// 10x the limit spread over two instances for 3 s through a TLS-only Redis: the fleet admits
/// about L t (at most 1.05 L t + burst + one interval ahead), far below the 2 L t two
/// instances alone would, and most of L t passes.
fn assert_fleet_shares_one_limit(fleet: &[Nginx]) {
    let span = Duration::from_secs(3);
    let answers = offer(&ports(fleet), 10.0 * LIMIT_PER_SEC / 2.0, span, "k");
    assert_one_limit(&answers, span);
}

/// Two instances with `rediss://… tls_ca=` share one limit; the admin API shows them
/// connected and synced, two instances seen.
#[test]
fn two_instances_share_one_limit_over_tls() {
    let pki = Pki::new();
    let redis = Redis::start_tls(&pki, &[]);
    let config = sync_config(
        &tls_urls(&pki, &redis),
        "interval=100ms timeout=100ms",
        ZONE,
    );
    let fleet: Vec<Nginx> = (0..2).map(|_| Nginx::start(&config)).collect();
    redis.wait_instances(2);
    assert_fleet_shares_one_limit(&fleet);
    for instance in &fleet {
        let state = sync_state(instance);
        eprintln!("sync state over TLS: {state}");
        assert_eq!(state["mode"], "synced", "{state}");
        assert_eq!(state["connected"], true, "{state}");
        assert_eq!(state["instances"], 2, "{state}");
        let log = instance.error_log();
        assert!(!log.contains("TLS"), "{log}");
    }
}

/// A CA the server's certificate does not chain to, the system's roots (which do not hold
/// the test CA), and a server that does not speak TLS: nginx starts and serves, logs the TLS
/// problem once, and the failure mode applies; no worker dies. `#insecure` (no verification
/// at all, documented as unsafe) does connect.
#[test]
fn tls_failures_are_logged_and_apply_the_failure_mode() {
    let pki = Pki::new();
    let redis = Redis::start_tls(&pki, &[]);
    let plain = Redis::start();
    let with_urls = |urls: String| {
        Nginx::start(&sync_config(
            &urls,
            "interval=100ms timeout=100ms on_failure=closed",
            ZONE,
        ))
    };
    let wrong_ca = with_urls(format!(
        "rediss://127.0.0.1:{} tls_ca={}",
        redis.port,
        pki.file("other-ca.pem")
    ));
    let system_roots = with_urls(format!("rediss://127.0.0.1:{}", redis.port));
    let not_tls = with_urls(format!(
        "rediss://127.0.0.1:{} tls_ca={}",
        plain.port,
        pki.file("ca.pem")
    ));
    let insecure = with_urls(format!("rediss://127.0.0.1:{}/#insecure", redis.port));
    let untrusted = "TLS handshake failed: the server's certificate is not trusted (see tls_ca=)";
    for (instance, expected) in [
        (&wrong_ca, untrusted),
        (&system_roots, untrusted),
        (
            &not_tls,
            "TLS handshake failed: no TLS answer (does the server speak TLS on this port?)",
        ),
    ] {
        // Three missed intervals of 100 ms: well within 3 s even on a loaded machine (a
        // handshake takes about 3 ms in a debug build, the timeout is 100 ms). The error is
        // logged from the first missed round, the failure mode from the third.
        wait_mode(instance, "closed", Duration::from_secs(3));
        let log = wait_log(
            instance,
            "on_failure=closed in force",
            Duration::from_secs(3),
        );
        assert_eq!(
            log.matches(expected).count(),
            1,
            "{expected:?} once in {log}"
        );
        assert!(!log.contains("exited on signal"), "{log}");
        // nginx still answers: `closed` rejects every request of the sync zone.
        let response = common::send(
            instance.port(),
            &Request::get("/index.html").header("X-Key", "k"),
        );
        assert_eq!(response.status, 429);
    }
    assert!(!not_tls.error_log().contains("not trusted"));
    wait_mode(&insecure, "synced", Duration::from_secs(3));
    assert_eq!(sync_state(&insecure)["connected"], true);
}

/// The TLS files are read again on reload: an instance started with the wrong CA, reloaded
/// with the right one, syncs; the files are read by the master (as root), so a client key
/// readable by its owner only still works though workers run as `nobody`.
#[test]
fn reload_reads_the_tls_files_again() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let redis = Redis::start_tls(&pki, &["--tls-auth-clients", "yes"]);
    std::fs::set_permissions(
        pki.path("client.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("cannot chmod the client key");
    let urls = |ca: &str| {
        format!(
            "rediss://127.0.0.1:{} tls_ca={} tls_cert={} tls_key={}",
            redis.port,
            pki.file(ca),
            pki.file("client.pem"),
            pki.file("client.key")
        )
    };
    let words = "interval=100ms timeout=100ms on_failure=closed";
    let mut instance = Nginx::start(&sync_config(&urls("other-ca.pem"), words, ZONE));
    wait_mode(&instance, "closed", Duration::from_secs(3));
    instance.reload_with(&sync_config(&urls("ca.pem"), words, ZONE));
    wait_mode(&instance, "synced", Duration::from_secs(3));
    let response = common::send(
        instance.port(),
        &Request::get("/index.html").header("X-Key", "k"),
    );
    assert_eq!(response.status, 200);
}

/// A server that asks for client certificates (`--tls-auth-clients yes`): an instance with
/// `tls_cert=`/`tls_key=` (signed by the server's CA) syncs; one without is refused, logs
/// the failed handshake once and stays in the failure mode.
#[test]
fn client_certificate_for_tls_auth_clients() {
    let pki = Pki::new();
    let redis = Redis::start_tls(&pki, &["--tls-auth-clients", "yes"]);
    let client = format!(
        "{} tls_cert={} tls_key={}",
        tls_urls(&pki, &redis),
        pki.file("client.pem"),
        pki.file("client.key")
    );
    let with_cert = Nginx::start(&sync_config(&client, "interval=100ms timeout=100ms", ZONE));
    let without = Nginx::start(&sync_config(
        &tls_urls(&pki, &redis),
        "interval=100ms timeout=100ms on_failure=closed",
        ZONE,
    ));
    wait_mode(&with_cert, "synced", Duration::from_secs(3));
    wait_mode(&without, "closed", Duration::from_secs(3));
    // The server refuses the handshake with an alert (certificate required).
    let log = wait_log(
        &without,
        "on_failure=closed in force",
        Duration::from_secs(3),
    );
    assert_eq!(log.matches("TLS handshake failed").count(), 1, "{log}");
    assert!(!log.contains("not trusted"), "{log}");
    let response = common::send(
        with_cert.port(),
        &Request::get("/index.html").header("X-Key", "k"),
    );
    assert_eq!(response.status, 200);
}

/// `nginx -t` names each bad TLS setting: a file that cannot be read, one with no PEM
/// certificate or key, `tls_*=` with a `redis://` URL, a certificate without its key,
/// `tls_ca=` with `#insecure`, mixed schemes. A relative path is read from the directory of
/// nginx.conf. Good settings pass.
#[test]
fn config_errors_name_the_tls_problem() {
    let pki = Pki::new();
    let base = |sync: &str| {
        format!(
            r#"
load_module %%MODULE%%;
events {{ }}
http {{
    rate_limit_sync {sync};
    rate_limit_zone $binary_remote_addr zone=api:1m rate=1r/s sync;
    server {{ listen 127.0.0.1:%%PORT%%; location / {{ rate_limit zone=api; }} }}
}}
"#
        )
    };
    let missing = pki.file("missing.pem");
    let not_pem = pki.file("server.ext");
    let (ca, cert, key) = (
        pki.file("ca.pem"),
        pki.file("client.pem"),
        pki.file("client.key"),
    );
    let dir = pki.dir.display().to_string();
    let server_key = pki.file("server.key");
    #[rustfmt::skip]
    let rows: Vec<(String, String)> = vec![
        (format!("rediss://127.0.0.1:1 tls_ca={missing}"),
            format!("cannot read tls_ca \"{missing}\": No such file or directory")),
        (format!("rediss://127.0.0.1:1 tls_ca={dir}"),
            format!("cannot read tls_ca \"{dir}\": Is a directory")),
        (format!("rediss://127.0.0.1:1 tls_ca={not_pem}"),
            format!("tls_ca \"{not_pem}\" holds no PEM certificate")),
        // Relative: nginx.conf is there (not PEM), `missing.pem` is not.
        ("rediss://127.0.0.1:1 tls_ca=nginx.conf".into(),
            "tls_ca \"nginx.conf\" holds no PEM certificate".into()),
        (format!("redis://127.0.0.1:1 tls_ca={ca}"),
            format!("\"tls_ca={ca}\" needs a rediss:// URL, not \"redis://127.0.0.1:1\"")),
        (format!("rediss://127.0.0.1:1 tls_cert={cert}"),
            format!("\"tls_cert={cert}\" needs \"tls_key=\" too")),
        (format!("rediss://127.0.0.1:1 tls_cert={cert} tls_key={cert}"),
            format!("tls_key \"{cert}\" holds no PEM private key")),
        (format!("rediss://127.0.0.1:1 tls_cert={cert} tls_key={server_key}"),
            format!("tls_key \"{server_key}\" cannot be used with tls_cert \"{cert}\"")),
        (format!("rediss://127.0.0.1:1 tls_cert={key} tls_key={key}"),
            format!("tls_cert \"{key}\" holds no PEM certificate")),
        (format!("rediss://127.0.0.1:1/#insecure tls_ca={ca}"),
            format!("\"tls_ca={ca}\" has no effect with \"rediss://127.0.0.1:1/#insecure\"")),
        ("rediss://127.0.0.1:1 redis://127.0.0.1:2 cluster".into(),
            "invalid Redis URL \"redis://127.0.0.1:2\": redis:// and rediss:// URLs cannot be mixed".into()),
    ];
    for (sync, expected) in &rows {
        let (ok, stderr) = check_config(&base(sync));
        assert!(!ok, "accepted: {sync}");
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
    for sync in [
        "rediss://127.0.0.1:1".to_string(),
        "rediss://127.0.0.1:1/#insecure".to_string(),
        format!("rediss://127.0.0.1:1 tls_ca={ca}"),
        format!("rediss://u:p@127.0.0.1:1/2 tls_ca={ca} tls_cert={cert} tls_key={key}"),
        format!("rediss://127.0.0.1:1 rediss://127.0.0.1:2 cluster tls_ca={ca}"),
    ] {
        let (ok, stderr) = check_config(&base(&sync));
        assert!(ok, "{sync}: {stderr}");
    }
}

/// A Redis Cluster of three TLS-only masters (`--tls-cluster yes`): the nodes named by
/// `CLUSTER SLOTS` are reached with TLS and the seed's `tls_ca=`; two instances share one
/// limit and the zone's keys spread over the nodes.
#[test]
fn redis_cluster_over_tls_shares_one_limit() {
    let pki = Pki::new();
    let nodes = redis_cluster_tls(&pki);
    let config = sync_config(
        &tls_urls(&pki, &nodes[0]),
        "cluster interval=100ms timeout=100ms",
        ZONE,
    );
    let fleet: Vec<Nginx> = (0..2).map(|_| Nginx::start(&config)).collect();
    nodes[0].wait_instances(2);
    for key in 0..24 {
        let response = common::send(
            fleet[0].port(),
            &Request::get("/index.html").header("X-Key", &format!("spread-{key}")),
        );
        assert_eq!(response.status, 200);
    }
    assert_fleet_shares_one_limit(&fleet);
    for instance in &fleet {
        assert_eq!(
            sync_state(instance)["mode"],
            "synced",
            "{}",
            instance.error_log()
        );
    }
    assert_keys_spread(&nodes);
}
