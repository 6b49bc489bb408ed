//! One panic policy for every `extern "C"` entry (src/glue/guard.rs): a panic fails the
//! request (500) or the session (closed) and logs one line naming the entry; the worker goes
//! on serving. Provoked with `RATE_LIMIT_PANIC_AT` in the environment nginx starts with (this
//! binary's one test sets it for each nginx in turn: the environment is the process's).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use common::{config, get};

/// nginx started with `RATE_LIMIT_PANIC_AT=entry`.
fn start_provoking(entry: &str, config: &common::Config) -> common::Nginx {
    std::env::set_var("RATE_LIMIT_PANIC_AT", entry);
    let nginx = config.start();
    std::env::remove_var("RATE_LIMIT_PANIC_AT");
    nginx
}

#[test]
fn a_panic_in_an_entry_fails_its_request_or_session_and_the_worker_lives() {
    http_preaccess_handler();
    stream_preaccess_handler();
}

fn http_preaccess_handler() {
    let config = config()
        .http("rate_limit_zone $binary_remote_addr zone=one:1m rate=100r/s;")
        // `return` answers in the rewrite phase, before the preaccess handler runs.
        .locations(
            "location / { rate_limit zone=one nodelay; }\n\
             location /alive { return 200 alive; }",
        );
    let nginx = start_provoking("handler::preaccess_handler", &config);
    let workers = nginx.worker_pids();
    for _ in 0..3 {
        assert_eq!(get(nginx.port(), "/").status, 500);
        assert_eq!(get(nginx.port(), "/alive").status, 200);
    }
    assert_eq!(nginx.worker_pids(), workers, "the same worker serves on");
    let errors = nginx.error_log();
    let lines: Vec<&str> = errors
        .lines()
        .filter(|line| line.contains("panicked"))
        .collect();
    assert_eq!(lines.len(), 3, "one line per panic:\n{errors}");
    assert!(
        lines[0].contains("[alert]")
            && lines[0].contains(
                "rate_limit: handler::preaccess_handler panicked (panicked at src/glue/guard.rs"
            )
            && lines[0].contains("RATE_LIMIT_PANIC_AT=handler::preaccess_handler)")
            && lines[0].contains("it failed instead of ending the worker"),
        "{}",
        lines[0]
    );
    assert!(!errors.contains("exited on signal"), "{errors}");
}

fn stream_preaccess_handler() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an upstream");
    let upstream = listener.local_addr().expect("upstream address").port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.write_all(b"hello\n");
        }
    });
    let mut config = config().without_http();
    if let Some(module) = common::stream_module_path() {
        config = config.load(&module);
    }
    let config = config.main(&format!(
        "stream {{ rate_limit_zone $binary_remote_addr zone=s:1m rate=100r/s;\n\
             server {{ listen 127.0.0.1:%%PORT2%%; rate_limit zone=s nodelay;\n\
             proxy_pass 127.0.0.1:{upstream}; }} }}"
    ));
    let nginx = start_provoking("stream::preaccess_handler", &config);
    let workers = nginx.worker_pids();
    let read = |port: u16| {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nginx");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        reply
    };
    // Every session passes through the handler, so every one is closed; the worker that
    // closes them stays.
    for _ in 0..3 {
        assert_eq!(read(nginx.port_n(2)), b"", "the session is closed");
    }
    assert_eq!(nginx.worker_pids(), workers, "the same worker serves on");
    let errors = nginx.error_log();
    let panics = errors
        .lines()
        .filter(|line| line.contains("rate_limit: stream::preaccess_handler panicked"))
        .count();
    assert_eq!(panics, 3, "{errors}");
    assert!(!errors.contains("exited on signal"), "{errors}");
}
