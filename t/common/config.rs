//! nginx configs for the tests, from one builder: [`config`] gives the module loaded, one
//! worker, `error_log` at `info` and one server on `%%PORT%%`; each setter changes one part.
//!
//! ```text
//! let nginx = config()
//!     .http("rate_limit_zone $http_x_key zone=one:1m rate=1r/m;")
//!     .locations("location / { rate_limit zone=one nodelay; }")
//!     .start();
//! ```

use super::Nginx;

#[derive(Clone, Debug)]
pub struct Config {
    /// The `load_module` lines' paths, in order; [`MODULE`] stands for this module's.
    load: Vec<String>,
    workers: Option<usize>,
    error_log: &'static str,
    connections: usize,
    main: String,
    access_log: String,
    http: String,
    server: Option<String>,
    reuseport: bool,
    locations: String,
    /// Whether the config has an `http` block (a stream-only config has none).
    http_block: bool,
}

/// This module's path in [`Config::load_order`] (the harness puts the built module there).
pub const MODULE: &str = "%%MODULE%%";

/// The module loaded, one worker, `error_log logs/error.log info`, `access_log off`, and one
/// server listening on `%%PORT%%` (root `html/`, with its `index.html`).
pub fn config() -> Config {
    Config {
        load: vec![MODULE.to_string()],
        workers: None,
        error_log: "info",
        connections: 64,
        main: String::new(),
        access_log: "access_log off;".to_string(),
        http: String::new(),
        server: Some(String::new()),
        reuseport: false,
        locations: String::new(),
        http_block: true,
    }
}

impl Config {
    /// `worker_processes N` (and room for 256 connections each).
    pub fn workers(mut self, workers: usize) -> Config {
        self.workers = Some(workers);
        self.connections = 256;
        self
    }

    /// `worker_connections N` (64 unless [`Config::workers`] set 256).
    pub fn worker_connections(mut self, connections: usize) -> Config {
        self.connections = connections;
        self
    }

    /// `listen ... reuseport`: the kernel spreads new connections over the workers.
    pub fn reuseport(mut self) -> Config {
        self.reuseport = true;
        self
    }

    pub fn error_log(mut self, level: &'static str) -> Config {
        self.error_log = level;
        self
    }

    /// Another module's `load_module` line, before this module's.
    pub fn load(mut self, path: &str) -> Config {
        let at = self
            .load
            .iter()
            .position(|p| p == MODULE)
            .unwrap_or(self.load.len());
        self.load.insert(at, path.to_string());
        self
    }

    /// The `load_module` lines in this order ([`MODULE`] for this module).
    pub fn load_order(mut self, paths: &[&str]) -> Config {
        self.load = paths.iter().map(|path| path.to_string()).collect();
        self
    }

    /// nginx alone, without this module (limit_req baselines).
    pub fn without_module(mut self) -> Config {
        self.load.retain(|path| path != MODULE);
        self
    }

    /// Lines of the main context (after `error_log`).
    pub fn main(mut self, text: &str) -> Config {
        self.main += text;
        self.main.push('\n');
        self
    }

    /// The `http` block's logging line(s) in place of `access_log off;`.
    pub fn access_log(mut self, text: &str) -> Config {
        self.access_log = text.to_string();
        self
    }

    /// Lines of the `http` block, before the server.
    pub fn http(mut self, text: &str) -> Config {
        self.http += text;
        self.http.push('\n');
        self
    }

    /// Lines of the server block, before its locations.
    pub fn server(mut self, text: &str) -> Config {
        let server = self.server.get_or_insert_with(String::new);
        *server += text;
        server.push('\n');
        self
    }

    /// No server block: the `http` lines say everything (`nginx -t` cases).
    pub fn no_server(mut self) -> Config {
        self.server = None;
        self
    }

    /// No `http` block at all (a stream-only config): the `http` lines, server and locations
    /// are left out.
    pub fn without_http(mut self) -> Config {
        self.http_block = false;
        self
    }

    /// The server's locations.
    pub fn locations(mut self, text: &str) -> Config {
        self.locations += text;
        self.locations.push('\n');
        self
    }

    /// The config's text, placeholders (`%%PORT%%`, `%%MODULE%%`) left for the harness.
    pub fn build(&self) -> String {
        let mut text = String::new();
        for path in &self.load {
            text += &format!("load_module {path};\n");
        }
        if let Some(workers) = self.workers {
            text += &format!("worker_processes {workers};\n");
        }
        text += &format!("error_log logs/error.log {};\n", self.error_log);
        text += &self.main;
        text += &format!("events {{ worker_connections {}; }}\n", self.connections);
        if !self.http_block {
            return text;
        }
        text += &format!("http {{\n{}\n{}", self.access_log, self.http);
        if let Some(server) = &self.server {
            let reuseport = if self.reuseport { " reuseport" } else { "" };
            text += &format!(
                "server {{\nlisten 127.0.0.1:%%PORT%%{reuseport};\nroot html;\n{server}{}}}\n",
                self.locations
            );
        }
        text += "}\n";
        text
    }

    /// nginx started with this config.
    pub fn start(&self) -> Nginx {
        Nginx::start(&self.build())
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.build())
    }
}
