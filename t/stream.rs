//! `rate_limit_zone` / `rate_limit` in nginx's `stream {}` against a real nginx: a new TCP
//! connection (or UDP session) is charged in the stream preaccess phase, closed over the
//! limit, delayed to the rate with `burst` and no `nodelay`; a concurrency zone holds a slot
//! for the whole session, given back however it ends (a killed worker's by the sweep); the
//! same `nginx -t` errors as in http; `$rate_limit_status` in the stream log; the admin API
//! shows and changes stream zones.
//!
//! The upstreams are echo servers written here on `std::net` (TCP and UDP, free loopback
//! ports). Against an nginx whose stream module is dynamic (Debian's), its module is loaded
//! first, from the binary's `--modules-path`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    check_config, config, nginx_binary, send, stream_module_path, Config, Nginx, Request,
};
use serde_json::Value;

/// A TCP echo server on a free loopback port: every connection gets back what it sends.
fn tcp_echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a TCP echo server");
    let port = listener.local_addr().expect("echo address").port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            thread::spawn(move || {
                let mut buffer = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A UDP echo server on a free loopback port: every datagram is sent back.
fn udp_echo() -> u16 {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP echo server");
    let port = socket.local_addr().expect("echo address").port();
    thread::spawn(move || {
        let mut buffer = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buffer) {
            let _ = socket.send_to(&buffer[..n], from);
        }
    });
    port
}

/// `config()` with the stream module loaded first when it is dynamic, and `stream` as the
/// stream block's body (`%%PORT2%%` and on are free for it; `%%PORT%%` is the http server).
fn with_stream(stream: &str) -> Config {
    let mut config = config();
    if let Some(path) = stream_module_path() {
        config = config.load(&path);
    }
    config.main(&format!("stream {{\n{stream}\n}}"))
}

/// Connect, send a line, read its echo: `Some(elapsed)` when it came back, `None` when nginx
/// closed the connection instead.
fn echo_once(port: u16) -> Option<Duration> {
    let start = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    if stream.write_all(b"ping\n").is_err() {
        return None;
    }
    let mut reply = [0u8; 5];
    match stream.read_exact(&mut reply) {
        Ok(()) => {
            assert_eq!(&reply, b"ping\n", "the echo upstream's reply");
            Some(start.elapsed())
        }
        Err(error)
            if error.kind() == ErrorKind::WouldBlock || error.kind() == ErrorKind::TimedOut =>
        {
            panic!("no reply and no close within 10 s on port {port}")
        }
        Err(_) => None,
    }
}

/// Whether connections pass (`true`) or are closed, in order.
fn passes(port: u16, count: usize) -> Vec<bool> {
    (0..count).map(|_| echo_once(port).is_some()).collect()
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn directives_are_checked_as_in_http() {
    let cases = [
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=fast;",
            "invalid rate \"rate=fast\"",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
             server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=b; proxy_pass 127.0.0.1:1; }",
            "unknown zone \"b\"",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
             server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=a global=a; proxy_pass 127.0.0.1:1; }",
            "\"global=\" is not available in the stream block",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
             server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=a usage=openai; proxy_pass 127.0.0.1:1; }",
            "\"usage=\" is not available in the stream block",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
             server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=a cost=$server_port; proxy_pass 127.0.0.1:1; }",
            "\"cost=$variable\" is not available in the stream block",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
             server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=a headers=off; proxy_pass 127.0.0.1:1; }",
            "\"headers=off\" is not available in the stream block",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
             rate_limit_zone $server_port zone=a:1m rate=1r/s;",
            "duplicate zone \"a\"",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s algorithm=sliding_window;\n\
             server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=a burst=3; proxy_pass 127.0.0.1:1; }",
            "\"burst\" is not used by sliding_window (zone \"a\")",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m algorithm=concurrency limit=2;\n\
             server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=a burst=3; proxy_pass 127.0.0.1:1; }",
            "\"burst=\" is not available in the stream block: a session over a concurrency",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s sync;",
            "stream zone \"a\" has \"sync\" but no \"rate_limit_sync\"",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:8k rate=1r/s;",
            "zone \"a\" is too small",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m algorithm=concurrency limit=adaptive;",
            "\"limit=adaptive\" is not available in the stream block: it follows the \
             upstream's response times",
        ),
        (
            "rate_limit_state_file a.json; rate_limit_state_file b.json;",
            "\"rate_limit_state_file\" directive is duplicate",
        ),
    ];
    for (stream, expected) in cases {
        let (ok, output) = check_config(&with_stream(stream).to_string());
        assert!(!ok, "nginx -t accepted:\n{stream}");
        assert!(
            output.contains(expected),
            "nginx -t on\n{stream}\nsaid:\n{output}\nexpected: {expected}"
        );
    }
    // A stream zone named like an http zone: refused, with the reason.
    let clash = with_stream("rate_limit_zone $binary_remote_addr zone=same:1m rate=1r/s;")
        .http("rate_limit_zone $binary_remote_addr zone=same:1m rate=1r/s;");
    let (ok, output) = check_config(&clash.to_string());
    assert!(
        !ok,
        "nginx -t accepted a stream and an http zone of one name"
    );
    assert!(
        output.contains("zone \"same\" is already declared in the \"stream\" block"),
        "{output}"
    );
    // Every stream variable may be a key; a good config passes.
    let good = with_stream(
        "rate_limit_zone $binary_remote_addr zone=a:1m rate=10r/s;\n\
         rate_limit_zone $server_port zone=b:1m rate=600r/m algorithm=token_bucket;\n\
         rate_limit_zone \"$remote_addr:$server_port\" zone=c:1m rate=1r/s burst=5;\n\
         rate_limit_zone $binary_remote_addr zone=d:1m algorithm=concurrency limit=3;\n\
         server { listen 127.0.0.1:%%PORT2%%; rate_limit zone=a burst=5 nodelay;\n\
         rate_limit zone=b; rate_limit zone=c delay=2; rate_limit zone=d;\n\
         rate_limit_dry_run off; rate_limit_log_level warn; proxy_pass 127.0.0.1:1; }",
    );
    let (ok, output) = check_config(&good.to_string());
    assert!(ok, "nginx -t refused:\n{output}");
    // One state file per configuration, in either block.
    let twice = with_stream("rate_limit_state_file a.json;").http("rate_limit_state_file b.json;");
    let (ok, output) = check_config(&twice.to_string());
    assert!(!ok, "nginx -t accepted a state file in both blocks");
    assert!(
        output.contains("\"rate_limit_state_file\" directive is duplicate"),
        "{output}"
    );
}

#[test]
fn tcp_connections_over_the_limit_are_closed() {
    let upstream = tcp_echo();
    let nginx = with_stream(&format!(
        "log_format s \"$remote_addr $rate_limit_status $status\";\n\
         access_log logs/stream.log s;\n\
         rate_limit_zone $binary_remote_addr zone=tcp:1m rate=1r/m burst=2;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=tcp nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}\n\
         server {{ listen 127.0.0.1:%%PORT3%%; proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .start();
    let port = nginx.port_n(2);
    // One at once plus a burst of 2, nothing refills within the test (1 a minute).
    assert_eq!(passes(port, 5), [true, true, true, false, false]);
    // The server without rate_limit is not limited.
    assert_eq!(passes(nginx.port_n(3), 3), [true, true, true]);
    let log = nginx.prefix().join("logs/stream.log");
    wait_for("the stream access log", Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.lines().count() >= 8)
    });
    let text = std::fs::read_to_string(&log).expect("stream log");
    let lines: Vec<&str> = text.lines().collect();
    let passed = lines.iter().filter(|l| l.ends_with(" PASSED 200")).count();
    let rejected = lines
        .iter()
        .filter(|l| l.ends_with(" REJECTED 503"))
        .count();
    let unlimited = lines.iter().filter(|l| l.ends_with(" - 200")).count();
    assert_eq!(
        (passed, rejected, unlimited),
        (3, 2, 3),
        "stream log:\n{text}"
    );
    let errors = nginx.error_log();
    assert!(
        errors.contains("limiting connections, excess: ") && errors.contains(" by zone \"tcp\""),
        "{errors}"
    );
}

#[test]
fn tcp_delay_paces_connections_and_nodelay_passes_them_at_once() {
    let upstream = tcp_echo();
    let nginx = with_stream(&format!(
        "rate_limit_zone $binary_remote_addr zone=paced:1m rate=2r/s burst=3;\n\
         rate_limit_zone $binary_remote_addr zone=quick:1m rate=2r/s burst=3;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=paced;\n\
         proxy_pass 127.0.0.1:{upstream}; }}\n\
         server {{ listen 127.0.0.1:%%PORT3%%; rate_limit zone=quick nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .start();
    for (port, delayed) in [(nginx.port_n(2), true), (nginx.port_n(3), false)] {
        let start = Instant::now();
        let clients: Vec<_> = (0..4)
            .map(|_| thread::spawn(move || echo_once(port)))
            .collect();
        let mut times: Vec<Duration> = clients
            .into_iter()
            .map(|client| {
                client
                    .join()
                    .expect("client")
                    .expect("a connection was closed")
            })
            .collect();
        times.sort();
        let all = start.elapsed();
        if delayed {
            // At 2 a second the fourth waits 1.5 s (three ahead of it in the bucket).
            assert!(times[0] < Duration::from_millis(700), "{times:?}");
            assert!(times[3] >= Duration::from_millis(1300), "{times:?}");
        } else {
            assert!(all < Duration::from_millis(1000), "nodelay: {times:?}");
        }
    }
    let errors = nginx.error_log();
    assert!(
        errors.contains("delaying connection, excess: ") && errors.contains(", by zone \"paced\""),
        "{errors}"
    );
}

/// A connection that got its echo back and stays open (holding whatever it holds).
fn open(port: u16) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream.write_all(b"hold\n").ok()?;
    let mut reply = [0u8; 5];
    stream.read_exact(&mut reply).ok()?;
    Some(stream)
}

/// Close with a reset (SO_LINGER 0): the client aborts, it does not say goodbye.
fn abort(stream: TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger value of the size given.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt(SO_LINGER)");
    drop(stream);
}

#[test]
fn concurrency_holds_a_slot_for_the_session_however_it_ends() {
    let upstream = tcp_echo();
    let nginx = with_stream(&format!(
        "rate_limit_zone $binary_remote_addr zone=conn:1m algorithm=concurrency limit=2;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=conn;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .http("rate_limit_zone $binary_remote_addr zone=unused:1m rate=1r/s;")
    .start();
    let port = nginx.port_n(2);
    let first = open(port).expect("the first session passes");
    let second = open(port).expect("the second session passes");
    assert!(open(port).is_none(), "a third session at once is closed");

    // A session that ends normally gives its slot back...
    first
        .shutdown(Shutdown::Both)
        .expect("shut the first session down");
    drop(first);
    let mut third = None;
    wait_for(
        "a slot given back by a closed session",
        Duration::from_secs(5),
        || {
            third = open(port);
            third.is_some()
        },
    );
    assert!(open(port).is_none(), "two held again");
    // ... and so does one the client aborts.
    abort(second);
    let mut fourth = None;
    wait_for(
        "a slot given back by an aborted session",
        Duration::from_secs(5),
        || {
            fourth = open(port);
            fourth.is_some()
        },
    );
    assert!(open(port).is_none(), "two held again");

    // A worker killed while its sessions hold both slots: its replacement's sweep gives them
    // back (without it, the key would stay full for good).
    let old = nginx.kill_workers();
    nginx.wait_workers_replaced(&old);
    drop((third, fourth));
    let mut held = Vec::new();
    wait_for(
        "the dead worker's slots swept",
        Duration::from_secs(5),
        || {
            if let Some(stream) = open(port) {
                held.push(stream);
            }
            held.len() == 2
        },
    );
    assert!(open(port).is_none(), "the limit holds after the sweep");
    let errors = nginx.error_log();
    assert!(
        errors.contains("limiting connections, in flight: 2 of 2 by zone \"conn\""),
        "{errors}"
    );
    assert!(
        errors.contains("gave back 2 slots and emptied queues of 0 tickets held by the process"),
        "{errors}"
    );
}

/// Send one datagram from `socket` and wait for its echo.
fn datagram(socket: &UdpSocket, port: u16, text: &str) -> bool {
    socket
        .send_to(text.as_bytes(), ("127.0.0.1", port))
        .expect("send a datagram");
    let mut buffer = [0u8; 64];
    match socket.recv_from(&mut buffer) {
        Ok((n, _)) => {
            assert_eq!(&buffer[..n], text.as_bytes(), "the UDP echo's reply");
            true
        }
        Err(_) => false,
    }
}

fn udp_socket() -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP client");
    socket
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("read timeout");
    socket
}

#[test]
fn udp_sessions_are_charged_and_datagrams_inside_one_are_free() {
    let upstream = udp_echo();
    let nginx = with_stream(&format!(
        "rate_limit_zone $binary_remote_addr zone=sessions:1m rate=1r/m burst=2;\n\
         rate_limit_zone $binary_remote_addr zone=one:1m rate=1r/m;\n\
         rate_limit_zone $binary_remote_addr zone=datagrams:1m rate=1r/m burst=2;\n\
         server {{ listen 127.0.0.1:%%PORT2%% udp; rate_limit zone=sessions nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; proxy_responses 1; }}\n\
         server {{ listen 127.0.0.1:%%PORT3%% udp; rate_limit zone=one;\n\
         proxy_pass 127.0.0.1:{upstream}; proxy_timeout 5s; }}\n\
         server {{ listen 127.0.0.1:%%PORT4%% udp; rate_limit zone=datagrams nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; proxy_requests 1; proxy_responses 1; }}"
    ))
    .start();
    // A new session per client address and port: five clients, three pass (1 + burst 2).
    let answered: Vec<bool> = (0..5)
        .map(|n| datagram(&udp_socket(), nginx.port_n(2), &format!("client {n}")))
        .collect();
    assert_eq!(answered, [true, true, true, false, false]);

    // Datagrams inside one session cost nothing more: five from one client all pass though
    // the zone admits one session a minute; a second client's session is refused.
    let client = udp_socket();
    for n in 0..5 {
        assert!(
            datagram(&client, nginx.port_n(3), &format!("datagram {n}")),
            "datagram {n}"
        );
    }
    assert!(!datagram(&udp_socket(), nginx.port_n(3), "another client"));

    // `proxy_requests 1` makes each datagram a session of its own: a rate per datagram.
    let client = udp_socket();
    let answered: Vec<bool> = (0..5)
        .map(|n| datagram(&client, nginx.port_n(4), &format!("datagram {n}")))
        .collect();
    assert_eq!(answered, [true, true, true, false, false]);
}

/// The admin API's answer to METHOD /ratelimit/PATH on the http server.
fn admin(nginx: &Nginx, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    common::admin::admin_json(nginx, method, path, body)
}

#[test]
fn the_admin_api_shows_and_changes_stream_zones_and_a_reload_keeps_them() {
    let upstream = tcp_echo();
    let mut nginx = with_stream(&format!(
        "rate_limit_zone $binary_remote_addr zone=smtp:1m rate=1r/m;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=smtp nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .workers(2)
    .http("rate_limit_zone $http_x_key zone=web:1m rate=1r/m;")
    .locations("location /ratelimit/ { rate_limit_admin write=on; }")
    .start();
    let port = nginx.port_n(2);
    assert_eq!(passes(port, 2), [true, false]);

    let (status, zones) = admin(&nginx, "GET", "zones", None);
    assert_eq!(status, 200, "{zones}");
    assert_eq!(zones["smtp"]["context"], "stream", "{zones}");
    assert_eq!(zones["smtp"]["key"], "$binary_remote_addr");
    assert_eq!(
        (
            zones["smtp"]["passed"].as_u64(),
            zones["smtp"]["rejected"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert!(
        zones["web"].get("context").is_none(),
        "an http zone has no context: {zones}"
    );
    let (_, top) = admin(&nginx, "GET", "zones/smtp/top?by=rejected", None);
    assert_eq!(top["keys"].as_array().map(Vec::len), Some(1), "{top}");
    let response = send(nginx.port(), &Request::get("/ratelimit/metrics"));
    assert!(
        response
            .text()
            .contains("rate_limit_requests_total{zone=\"smtp\",outcome=\"rejected\"} 1"),
        "{}",
        response.text()
    );

    // PATCH changes the stream zone live, in every worker: a burst of 3 lets 3 more in.
    let (status, zone) = admin(&nginx, "PATCH", "zones/smtp", Some(r#"{"burst": 3}"#));
    assert_eq!(status, 200, "{zone}");
    assert_eq!(zone["burst"], 3);
    assert_eq!(passes(port, 4), [true, true, true, false]);

    // A reload keeps the zone's state: the key is still over its limit.
    nginx.reload();
    assert_eq!(passes(port, 1), [false]);
    let (_, zone) = admin(&nginx, "GET", "zones/smtp", None);
    assert_eq!(zone["context"], "stream", "{zone}");
}

#[test]
fn a_sync_stream_zone_is_one_limit_across_the_fleet() {
    let redis = common::redis::Redis::start();
    let upstream = tcp_echo();
    // A sync stream zone needs rate_limit_sync in an http block read before the stream block.
    let instance = || {
        let mut config = config();
        if let Some(path) = stream_module_path() {
            config = config.load(&path);
        }
        let http = config
            .http(&format!(
                "rate_limit_sync redis://127.0.0.1:{};",
                redis.port
            ))
            .locations("location /ratelimit/ { rate_limit_admin; }")
            .build();
        Nginx::start(&format!(
            "{http}stream {{\n\
             rate_limit_zone $binary_remote_addr zone=fleet:1m rate=1r/m burst=4 sync;\n\
             server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=fleet nodelay;\n\
             proxy_pass 127.0.0.1:{upstream}; }}\n}}\n"
        ))
    };
    let fleet = [instance(), instance()];
    redis.wait_instances(2);
    let (_, zone) = admin(&fleet[0], "GET", "zones/fleet", None);
    assert_eq!(zone["context"], "stream", "{zone}");
    assert!(
        zone["sync"].is_object(),
        "a sync stream zone shows its sync state: {zone}"
    );
    // 30 connections from one address, alternating between the instances, 100 ms apart
    // (several sync rounds): the fleet admits one key's 1 + burst 4 once, where two
    // instances on their own would admit 5 each.
    let mut passed = [0; 2];
    for n in 0..30 {
        if echo_once(fleet[n % 2].port_n(2)).is_some() {
            passed[n % 2] += 1;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let total = passed[0] + passed[1];
    assert!((4..=6).contains(&total), "passed per instance: {passed:?}");
}

/// Debian's packages load this module before the stream module (modules-enabled/
/// 50-mod-http-rate-limit.conf sorts before 50-mod-stream.conf): the stream part finds nginx's
/// stream functions when the stream block is read, so either order works. An nginx with the
/// stream module built in (the vendored one) has no order to choose: there the same limit
/// holds with no stream module loaded at all.
#[test]
fn the_dynamic_stream_module_may_be_loaded_after_this_one() {
    let order: Vec<String> = match stream_module_path() {
        Some(stream) => vec![common::config::MODULE.to_string(), stream],
        None => {
            let output = Command::new(nginx_binary()).arg("-V").output().unwrap();
            let info = String::from_utf8_lossy(&output.stderr).into_owned();
            assert!(
                info.contains("--with-stream"),
                "the nginx under test has no stream module, built in or dynamic: {info}"
            );
            vec![common::config::MODULE.to_string()]
        }
    };
    let order: Vec<&str> = order.iter().map(String::as_str).collect();
    let upstream = tcp_echo();
    let nginx = config()
        .load_order(&order)
        .main(&format!(
            "stream {{\n\
             rate_limit_zone $binary_remote_addr zone=late:1m rate=1r/m;\n\
             server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=late nodelay;\n\
             proxy_pass 127.0.0.1:{upstream}; }}\n}}"
        ))
        .start();
    assert_eq!(passes(nginx.port_n(2), 2), [true, false]);
}

#[test]
fn block_and_dry_run_work_in_the_stream_block() {
    let upstream = tcp_echo();
    let nginx = with_stream(&format!(
        "log_format s \"$server_port $rate_limit_status $status\";\n\
         access_log logs/stream.log s;\n\
         rate_limit_zone $binary_remote_addr zone=boxed:1m rate=1r/m block=30s;\n\
         rate_limit_zone $binary_remote_addr zone=dry:1m rate=1r/m;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=boxed nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}\n\
         server {{ listen 127.0.0.1:%%PORT3%%; rate_limit zone=dry nodelay;\n\
         rate_limit_dry_run on; proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .start();
    assert_eq!(passes(nginx.port_n(2), 3), [true, false, false]);
    assert_eq!(passes(nginx.port_n(3), 3), [true, true, true]);
    let log = nginx.prefix().join("logs/stream.log");
    wait_for("the stream access log", Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.lines().count() >= 6)
    });
    let text = std::fs::read_to_string(&log).expect("stream log");
    // A session is logged when it ends: a passed one (closed by the client) may be logged
    // after the refused one that followed it, so each port's statuses are compared as a set.
    let port_statuses = |port: u16| {
        let mut statuses: Vec<&str> = text
            .lines()
            .filter_map(|line| line.split_once(' '))
            .filter(|(logged, _)| *logged == port.to_string())
            .map(|(_, rest)| rest)
            .collect();
        statuses.sort_unstable();
        statuses
    };
    assert_eq!(
        port_statuses(nginx.port_n(2)),
        ["BLOCKED 503", "PASSED 200", "REJECTED 503"],
        "{text}"
    );
    assert_eq!(
        port_statuses(nginx.port_n(3)),
        ["PASSED 200", "REJECTED_DRY_RUN 200", "REJECTED_DRY_RUN 200"],
        "{text}"
    );
    let errors = nginx.error_log();
    assert!(
        errors.contains("blocking the key for 30s, level 0 (block_max 30s), by zone \"boxed\""),
        "{errors}"
    );
    assert!(
        errors.contains("limiting connections, dry run, excess:"),
        "{errors}"
    );
}

#[test]
fn the_state_file_keeps_a_stream_zones_changes_across_a_restart() {
    let dir = std::env::temp_dir().join(format!(
        "ngx-rate-limit-stream-state-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("state dir");
    let state = dir.join("state.json");
    let upstream = tcp_echo();
    let config = with_stream(&format!(
        "rate_limit_zone $binary_remote_addr zone=kept:1m rate=1r/m;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=kept nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .main("user root;")
    .http(&format!("rate_limit_state_file {};", state.display()))
    .locations("location /ratelimit/ { rate_limit_admin write=on; }");
    let nginx = config.start();
    let (status, zone) = admin(&nginx, "PATCH", "zones/kept", Some(r#"{"burst": 3}"#));
    assert_eq!(status, 200, "{zone}");
    nginx.stop();
    let saved = std::fs::read_to_string(&state).expect("the state file");
    assert!(saved.contains("\"kept\""), "{saved}");

    let nginx = config.start();
    let (_, zone) = admin(&nginx, "GET", "zones/kept", None);
    assert_eq!(
        (zone["context"].as_str(), zone["burst"].as_u64()),
        (Some("stream"), Some(3)),
        "{zone}"
    );
    assert_eq!(passes(nginx.port_n(2), 5), [true, true, true, true, false]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sessions held open until `count` are held, within `within`.
fn hold(port: u16, count: usize, within: Duration) -> Vec<TcpStream> {
    let mut held = Vec::new();
    wait_for(&format!("{count} sessions admitted"), within, || {
        if let Some(stream) = open(port) {
            held.push(stream);
        }
        held.len() == count
    });
    held
}

#[test]
fn a_stream_only_config_sweeps_a_dead_workers_permits_and_a_reload_keeps_the_counts() {
    let upstream = tcp_echo();
    let mut nginx = with_stream(&format!(
        "rate_limit_zone $binary_remote_addr zone=conn:1m algorithm=concurrency limit=3;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=conn;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .without_http()
    .start();
    let port = nginx.port_n(2);
    let held = hold(port, 3, Duration::from_secs(5));
    assert!(open(port).is_none(), "a fourth session at once is closed");

    // The worker dies with its three permits held: its replacement's sweep gives them back.
    let old = nginx.kill_workers();
    nginx.wait_workers_replaced(&old);
    drop(held);
    let started = Instant::now();
    let held = hold(port, 3, Duration::from_secs(5));
    let swept_in = started.elapsed();
    assert!(open(port).is_none(), "the limit holds after the sweep");
    let errors = nginx.error_log();
    assert!(
        errors.contains("rate_limit zone \"conn\": gave back 3 slots"),
        "{errors}"
    );

    // A reload keeps the zone and its counts: the old worker still serves the three sessions,
    // and the new one refuses a fourth.
    nginx.reload();
    assert!(
        open(port).is_none(),
        "the three sessions of the old worker still count after a reload"
    );
    drop(held);
    let _held = hold(port, 3, Duration::from_secs(5));
    assert!(open(port).is_none(), "three held again");
    eprintln!("permits swept within {swept_in:?}");
}

#[test]
fn the_state_file_works_in_a_stream_only_config() {
    let dir = std::env::temp_dir().join(format!(
        "ngx-rate-limit-stream-only-state-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("state dir");
    let state = dir.join("state.json");
    let upstream = tcp_echo();
    let stream = format!(
        "rate_limit_state_file {};\n\
         rate_limit_zone $binary_remote_addr zone=kept:1m rate=1r/m;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=kept nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}",
        state.display()
    );
    // First with an admin API beside it, to change the zone's burst...
    let nginx = with_stream(&stream)
        .main("user root;")
        .locations("location /ratelimit/ { rate_limit_admin write=on; }")
        .start();
    let (status, zone) = admin(&nginx, "PATCH", "zones/kept", Some(r#"{"burst": 3}"#));
    assert_eq!(status, 200, "{zone}");
    nginx.stop();
    let saved = std::fs::read_to_string(&state).expect("the state file");
    assert!(saved.contains("\"kept\""), "{saved}");
    std::fs::remove_file(&state).expect("remove the state file");
    std::fs::write(&state, &saved).expect("write the state file back");
    let written = std::fs::metadata(&state).and_then(|m| m.modified()).ok();

    // ... then without an http block: the zone starts with the burst the file keeps, and the
    // first worker writes the file again from shared memory.
    let nginx = with_stream(&stream)
        .main("user root;")
        .without_http()
        .start();
    assert_eq!(passes(nginx.port_n(2), 5), [true, true, true, true, false]);
    let errors = nginx.error_log();
    assert!(
        errors.contains("zone \"kept\" restored: rate 1r/m burst 3"),
        "{errors}"
    );
    wait_for(
        "the state file rewritten by the first worker",
        Duration::from_secs(5),
        || std::fs::metadata(&state).and_then(|m| m.modified()).ok() != written,
    );
    let rewritten = std::fs::read_to_string(&state).expect("the state file");
    assert!(rewritten.contains("\"kept\""), "{rewritten}");
    nginx.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TCP upstream that counts the connections it accepts (and echoes, as [`tcp_echo`]).
fn counting_upstream() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a counting upstream");
    let port = listener.local_addr().expect("upstream address").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || {
                let mut buffer = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    (port, accepted)
}

/// How many descriptors process `pid` holds.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| entries.count())
        .unwrap_or_else(|error| panic!("read /proc/{pid}/fd: {error}"))
}

#[test]
fn a_delayed_session_ends_when_its_client_resets() {
    use std::sync::atomic::Ordering;
    let (upstream, accepted) = counting_upstream();
    let nginx = with_stream(&format!(
        "rate_limit_zone $binary_remote_addr zone=paced:1m rate=2r/s burst=600;\n\
         server {{ listen 127.0.0.1:%%PORT2%% backlog=1024; rate_limit zone=paced;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .worker_connections(1024)
    .start();
    let port = nginx.port_n(2);
    let worker = nginx.worker_pids()[0];
    let before = descriptors(worker);

    // 300 connections, each delayed (the first passes): the worker holds them all.
    let clients: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx"))
        .collect();
    wait_for(
        "the worker holding the 300 delayed sessions",
        Duration::from_secs(10),
        || descriptors(worker) >= before + 290,
    );
    // Their clients reset them: the sessions end at once, and none reaches the upstream.
    for client in clients {
        abort(client);
    }
    thread::sleep(Duration::from_secs(2));
    let held = descriptors(worker);
    let upstream_then = accepted.load(Ordering::SeqCst);
    thread::sleep(Duration::from_secs(3));
    let upstream_later = accepted.load(Ordering::SeqCst);
    assert!(
        held <= before + 20,
        "2 s after the resets the worker holds {held} descriptors ({before} before)"
    );
    assert!(
        upstream_later - upstream_then <= 2,
        "the upstream got {} connections of clients gone",
        upstream_later - upstream_then
    );
    let errors = nginx.error_log();
    assert!(
        errors.contains("while delayed"),
        "the end of a delayed session is logged: {errors}"
    );
    eprintln!(
        "descriptors: {before} before, {held} 2 s after 300 resets; upstream: {} connections in \
         the next 3 s",
        upstream_later - upstream_then
    );
}

/// The first TLS record OpenSSL's client sends (its ClientHello), with `server_name` as SNI
/// (`None`: no SNI) and `h2` offered by ALPN: captured on a listener of our own, to be sent
/// to nginx as a real client's.
fn client_hello(server_name: Option<&str>) -> Vec<u8> {
    use std::process::Stdio;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a ClientHello catcher");
    let address = listener.local_addr().expect("catcher address").to_string();
    let mut command = Command::new("openssl");
    command.args(["s_client", "-connect", &address, "-alpn", "h2"]);
    match server_name {
        Some(name) => command.args(["-servername", name]),
        None => command.arg("-noservername"),
    };
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run `openssl s_client` (package openssl)");
    let (mut stream, _) = listener.accept().expect("openssl connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).expect("a TLS record header");
    assert_eq!(header[0], 0x16, "a TLS handshake record");
    let mut body = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
    stream.read_exact(&mut body).expect("the ClientHello");
    let _ = child.kill();
    let _ = child.wait();
    [&header[..], &body].concat()
}

/// Send `hello` as a new connection's first bytes: `Some(elapsed)` when the echo upstream
/// sent them back (the session was proxied), `None` when nginx closed it.
fn tls_session(port: u16, hello: &[u8]) -> Option<Duration> {
    let start = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream.write_all(hello).ok()?;
    let mut echo = vec![0u8; hello.len()];
    match stream.read_exact(&mut echo) {
        Ok(()) => {
            assert_eq!(echo, hello, "the echo of the ClientHello");
            Some(start.elapsed())
        }
        Err(error)
            if error.kind() == ErrorKind::WouldBlock || error.kind() == ErrorKind::TimedOut =>
        {
            panic!("no echo and no close within 10 s on port {port}")
        }
        Err(_) => None,
    }
}

#[test]
fn a_connection_rate_per_tls_server_name_holds_per_name() {
    let upstream = tcp_echo();
    let nginx = with_stream(&format!(
        "rate_limit_zone $ssl_preread_server_name zone=sni:1m rate=1r/m burst=1;\n\
         rate_limit_zone $ssl_preread_alpn_protocols zone=alpn:1m rate=2r/s burst=5;\n\
         log_format sni '$ssl_preread_server_name $rate_limit_status';\n\
         server {{ listen 127.0.0.1:%%PORT2%%; ssl_preread on; rate_limit zone=sni nodelay;\n\
         access_log logs/sni.log sni; proxy_pass 127.0.0.1:{upstream}; }}\n\
         server {{ listen 127.0.0.1:%%PORT3%%; ssl_preread on; rate_limit zone=alpn;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .start();
    let port = nginx.port_n(2);
    let (a, b, none) = (
        client_hello(Some("a.example")),
        client_hello(Some("b.example")),
        client_hello(None),
    );
    let sessions: Vec<bool> = [&a, &b, &a, &b, &a, &b, &none, &none, &none]
        .iter()
        .map(|hello| tls_session(port, hello).is_some())
        .collect();
    assert_eq!(
        sessions,
        [true, true, true, true, false, false, true, true, true],
        "two sessions per server name (a, b, a, b, a, b), and a ClientHello without SNI is \
         not limited"
    );
    let errors = nginx.error_log();
    let refusals = errors
        .lines()
        .filter(|line| line.contains("limiting connections, excess: "))
        .filter(|line| line.contains("by zone \"sni\""))
        .count();
    assert_eq!(refusals, 2, "{errors}");

    // A delay decided after ssl_preread: the second session of the same ALPN list waits for
    // its turn at 2 r/s, then reaches the upstream.
    let port = nginx.port_n(3);
    let first = tls_session(port, &a).expect("the first session passes");
    let second = tls_session(port, &a).expect("the second session passes, delayed");
    assert!(
        first < Duration::from_millis(300) && second >= Duration::from_millis(300),
        "first {first:?}, second {second:?}"
    );

    // `$rate_limit_status` per session; a session whose key is empty (no SNI) had no line
    // applied: not found, `-`.
    let log_path = nginx.prefix().join("logs/sni.log");
    let mut lines = Vec::new();
    wait_for("the nine sessions logged", Duration::from_secs(10), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        lines = log.lines().map(str::to_string).collect::<Vec<_>>();
        lines.len() >= 9
    });
    lines.sort();
    assert_eq!(
        lines,
        [
            " -",
            " -",
            " -",
            "a.example PASSED",
            "a.example PASSED",
            "a.example REJECTED",
            "b.example PASSED",
            "b.example PASSED",
            "b.example REJECTED",
        ],
        "the stream access log"
    );
}

/// The `[warn]` lines of an `nginx -t` that must succeed, about keys empty without SNI.
fn no_sni_warnings(stream: &str) -> Vec<String> {
    let (ok, output) = check_config(&with_stream(stream).to_string());
    assert!(ok, "{output}");
    output
        .lines()
        .filter(|line| line.contains("[warn]") && line.contains("sends no server name"))
        .map(str::to_string)
        .collect()
}

const NO_SNI_WARNING: &str = "zone \"sni\" is keyed by $ssl_preread_server_name, which is empty \
    for a client that sends no server name (a TLS ClientHello without SNI, or a client that \
    does not speak TLS): its sessions are not limited; to limit them by address, key the zone \
    by \"$ssl_preread_server_name$no_sni_addr\" with \"map $ssl_preread_server_name \
    $no_sni_addr { \"\" $remote_addr; default \"\"; }\"";

/// A zone keyed by `$ssl_preread_server_name` alone is warned about at its line (a client
/// without SNI is not limited); one keyed by address, or by docs/stream.md's key that falls
/// back to the address, is not.
#[test]
fn nginx_t_warns_about_a_key_empty_without_sni() {
    for key in ["$ssl_preread_server_name", "${ssl_preread_server_name}"] {
        let stream = format!(
            "rate_limit_zone {key} zone=sni:1m rate=1r/m burst=1;\n\
             server {{ listen 127.0.0.1:%%PORT2%%; ssl_preread on; rate_limit zone=sni;\n\
             proxy_pass 127.0.0.1:1; }}"
        );
        let warned = no_sni_warnings(&stream);
        assert_eq!(warned.len(), 1, "{warned:?}");
        println!("{}", warned[0]);
        let expected = NO_SNI_WARNING.replace("$ssl_preread_server_name,", &format!("{key},"));
        let zone_line = with_stream(&stream)
            .to_string()
            .lines()
            .position(|line| line.starts_with("rate_limit_zone"))
            .expect("the zone's line")
            + 1;
        assert!(
            warned[0].contains(&expected)
                && warned[0].ends_with(&format!("nginx.conf:{zone_line}")),
            "{warned:?}"
        );
    }
    let quiet = [
        "rate_limit_zone $remote_addr zone=sni:1m rate=1r/m burst=1;",
        "rate_limit_zone $binary_remote_addr zone=sni:1m rate=1r/m burst=1;",
        "map $ssl_preread_server_name $no_sni_addr { \"\" $remote_addr; default \"\"; }\n\
         rate_limit_zone $ssl_preread_server_name$no_sni_addr zone=sni:1m rate=1r/m burst=1;",
        "rate_limit_zone \"$ssl_preread_server_name:$remote_addr\" zone=sni:1m rate=1r/m;",
    ];
    for zone in quiet {
        let stream = format!(
            "{zone}\nserver {{ listen 127.0.0.1:%%PORT2%%; ssl_preread on; rate_limit zone=sni;\n\
             proxy_pass 127.0.0.1:1; }}"
        );
        assert_eq!(no_sni_warnings(&stream), Vec::<String>::new(), "{zone}");
    }
}

/// docs/stream.md's key: per server name, and by address for a client without SNI (here all
/// from 127.0.0.1: two sessions, then refused), as a plain TCP client without TLS.
#[test]
fn a_key_that_falls_back_to_the_address_limits_clients_without_sni() {
    let upstream = tcp_echo();
    let nginx = with_stream(&format!(
        "map $ssl_preread_server_name $no_sni_addr {{ \"\" $remote_addr; default \"\"; }}\n\
         rate_limit_zone $ssl_preread_server_name$no_sni_addr zone=sni:1m rate=1r/m burst=1;\n\
         server {{ listen 127.0.0.1:%%PORT2%%; ssl_preread on; rate_limit zone=sni nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .start();
    let port = nginx.port_n(2);
    let (a, none) = (client_hello(Some("a.example")), client_hello(None));
    let sessions: Vec<bool> = [&none, &none, &none, &a, &a, &a]
        .iter()
        .map(|hello| tls_session(port, hello).is_some())
        .collect();
    assert_eq!(
        sessions,
        [true, true, false, true, true, false],
        "two sessions without SNI (keyed by address), then two for a.example"
    );
    // A client that does not speak TLS is keyed by its address too: that key is spent.
    assert_eq!(
        echo_once(port),
        None,
        "a plain TCP client of 127.0.0.1 is refused"
    );
}

/// Connect with a PROXY protocol header naming `client`, send a line, read its echo: whether
/// the connection passed.
fn passes_from(port: u16, client: &str) -> bool {
    let family = if client.contains(':') { "TCP6" } else { "TCP4" };
    let to = if client.contains(':') {
        "::1"
    } else {
        "127.0.0.1"
    };
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let header = format!("PROXY {family} {client} {to} 40000 {port}\r\nping\n");
    if stream.write_all(header.as_bytes()).is_err() {
        return false;
    }
    let mut reply = [0u8; 5];
    match stream.read_exact(&mut reply) {
        Ok(()) => reply == *b"ping\n",
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            panic!("no reply and no close within 10 s from {client}")
        }
        Err(_) => false,
    }
}

/// `$rate_limit_remote_net` in `stream {}`: clients named by the PROXY protocol (stream
/// real_ip), `rate_limit_remote_net ipv4=24 ipv6=64` in the server: four addresses of one
/// network share its budget of three, the next network has its own; the admin API shows the
/// key as a network.
#[test]
fn stream_sessions_are_limited_per_network() {
    let upstream = tcp_echo();
    let nginx = with_stream(&format!(
        "rate_limit_zone $rate_limit_remote_net zone=nets:1m rate=1r/m burst=2;\n\
         server {{ listen 127.0.0.1:%%PORT2%% proxy_protocol; set_real_ip_from 127.0.0.1;\n\
         rate_limit_remote_net ipv4=24 ipv6=64; rate_limit zone=nets nodelay;\n\
         proxy_pass 127.0.0.1:{upstream}; }}"
    ))
    .locations("location /ratelimit/ { rate_limit_admin; }")
    .start();
    let port = nginx.port_n(2);
    let v4: Vec<bool> = [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
    ]
    .iter()
    .map(|client| passes_from(port, client))
    .collect();
    assert_eq!(v4, [true, true, true, false]);
    assert!(passes_from(port, "198.51.101.1"));
    let v6: Vec<bool> = [
        "2001:db8:0:1::1",
        "2001:db8:0:1::2",
        "2001:db8:0:1::3",
        "2001:db8:0:1::4",
    ]
    .iter()
    .map(|client| passes_from(port, client))
    .collect();
    assert_eq!(v6, [true, true, true, false]);
    assert!(passes_from(port, "2001:db8:0:2::1"));
    let (status, key) = admin(&nginx, "GET", "zones/nets/keys/2001:db8:0:1::/64", None);
    assert_eq!(
        (status, &key["key"]),
        (200, &Value::from("2001:db8:0:1::/64")),
        "{key}"
    );
}
