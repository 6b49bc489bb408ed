//! A small HTTP/1.1 client on `std::net::TcpStream`, enough for tests against 127.0.0.1:
//! one-shot requests, keep-alive connections, requests left pending (or abandoned) while the
//! server delays them, any method, headers and body.
//!
//! Network failures panic with the request in the message: a test has nothing better to do.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// How long a response may take before the test fails (rate limit delays are far shorter).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(15);

/// An HTTP/1.1 request; `Host: localhost` and `Content-Length` are added when sent.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            method: method.to_string(),
            path: path.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }

    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// A JSON body with its `Content-Type`.
    pub fn json(self, json: &str) -> Request {
        self.header("Content-Type", "application/json").body(json)
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }

    fn encode(&self, keep_alive: bool) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        if !self.has_header("Host") {
            head.push_str("Host: localhost\r\n");
        }
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        let method_has_body = matches!(self.method.as_str(), "POST" | "PUT" | "PATCH");
        if (method_has_body || !self.body.is_empty()) && !self.has_header("Content-Length") {
            head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        if !self.has_header("Connection") {
            head.push_str(if keep_alive {
                "Connection: keep-alive\r\n"
            } else {
                "Connection: close\r\n"
            });
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }

    fn describe(&self, port: u16) -> String {
        format!("{} http://127.0.0.1:{port}{}", self.method, self.path)
    }
}

/// A complete response and how long it took, from writing the request to its last byte.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub elapsed: Duration,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_all(name).into_iter().next()
    }

    /// Every header called `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `X-Pid` header as a number: configs add `add_header X-Pid $pid always;` to show
    /// which worker answered.
    pub fn worker_pid(&self) -> u32 {
        self.header("X-Pid")
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("response has no numeric X-Pid header: {self:?}"))
    }
}

fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{port}: {e}"));
    stream.set_nodelay(true).expect("set_nodelay");
    stream
        .set_read_timeout(Some(RESPONSE_TIMEOUT))
        .expect("set_read_timeout");
    stream
        .set_write_timeout(Some(RESPONSE_TIMEOUT))
        .expect("set_write_timeout");
    stream
}

/// Something that came back with an HTTP status: a [`Response`], a timeline's outcome.
pub trait Answer {
    fn status(&self) -> u16;
}

impl Answer for Response {
    fn status(&self) -> u16 {
        self.status
    }
}

/// The status of each answer, in order.
pub fn statuses<A: Answer>(answers: &[A]) -> Vec<u16> {
    answers.iter().map(Answer::status).collect()
}

/// The statuses of `count` GETs of `path` with `X-Key: key`, each on a new connection (so
/// that any worker may answer it).
pub fn key_statuses(port: u16, path: &str, key: &str, count: usize) -> Vec<u16> {
    let request = Request::get(path).header("X-Key", key);
    (0..count).map(|_| send(port, &request).status).collect()
}

/// `GET path` on a new connection.
pub fn get(port: u16, path: &str) -> Response {
    send(port, &Request::get(path))
}

/// Sends `request` on a new connection (`Connection: close`) and reads the response.
pub fn send(port: u16, request: &Request) -> Response {
    start_request(port, request).finish()
}

/// Writes `request` on a new connection and returns without waiting for the response: finish
/// it later, check whether it was answered yet, or abandon it (the client disconnects).
pub fn start_request(port: u16, request: &Request) -> PendingRequest {
    let mut stream = connect(port);
    let started = Instant::now();
    stream
        .write_all(&request.encode(false))
        .unwrap_or_else(|e| panic!("cannot send {}: {e}", request.describe(port)));
    PendingRequest {
        reader: BufReader::new(stream),
        method: request.method.clone(),
        description: request.describe(port),
        started,
    }
}

/// A request written to its own connection, whose response has not been read yet.
pub struct PendingRequest {
    reader: BufReader<TcpStream>,
    method: String,
    description: String,
    started: Instant,
}

impl PendingRequest {
    /// Reads the whole response; `elapsed` counts from when the request was written.
    pub fn finish(mut self) -> Response {
        let mut response = read_response(&mut self.reader, &self.method)
            .unwrap_or_else(|e| panic!("no complete response to {}: {e}", self.description));
        response.elapsed = self.started.elapsed();
        response
    }

    /// Whether the server started answering (or closed the connection) within `wait`.
    pub fn answered_within(&mut self, wait: Duration) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let stream = self.reader.get_ref();
        stream
            .set_read_timeout(Some(wait))
            .expect("set_read_timeout");
        let answered = match stream.peek(&mut [0u8; 1]) {
            Ok(_) => true,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(e) => panic!("connection for {} failed: {e}", self.description),
        };
        stream
            .set_read_timeout(Some(RESPONSE_TIMEOUT))
            .expect("set_read_timeout");
        answered
    }

    /// Closes the connection without reading the response (a client that gives up).
    pub fn abandon(self) {
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }
}

/// Several requests, one after another, on one keep-alive connection.
pub struct Connection {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl Connection {
    pub fn open(port: u16) -> Connection {
        Connection {
            reader: BufReader::new(connect(port)),
            port,
        }
    }

    /// Sends `request` (`Connection: keep-alive`) and reads its response.
    pub fn send(&mut self, request: &Request) -> Response {
        self.try_send(request).unwrap_or_else(|e| {
            panic!(
                "no complete response to {}: {e}",
                request.describe(self.port)
            )
        })
    }

    pub fn get(&mut self, path: &str) -> Response {
        self.send(&Request::get(path))
    }

    /// Like [`Connection::send`], but returns the error, e.g. when the server closed the
    /// connection.
    pub fn try_send(&mut self, request: &Request) -> io::Result<Response> {
        let started = Instant::now();
        self.reader.get_mut().write_all(&request.encode(true))?;
        let mut response = read_response(&mut self.reader, &request.method)?;
        response.elapsed = started.elapsed();
        Ok(response)
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before the response was complete",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_response(reader: &mut impl BufRead, method: &str) -> io::Result<Response> {
    let status_line = read_line(reader)?;
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid(format!("bad status line {status_line:?}")))?;

    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| invalid(format!("bad header line {line:?}")))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
        elapsed: Duration::ZERO,
    };

    if method == "HEAD" || status < 200 || status == 204 || status == 304 {
        return Ok(response);
    }
    if response
        .header("Transfer-Encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        response.body = read_chunked(reader)?;
    } else if let Some(length) = response.header("Content-Length") {
        let length: usize = length
            .parse()
            .map_err(|_| invalid(format!("bad Content-Length {length:?}")))?;
        response.body = vec![0; length];
        reader.read_exact(&mut response.body)?;
    } else {
        reader.read_to_end(&mut response.body)?;
    }
    Ok(response)
}

fn read_chunked(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(reader)?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("bad chunk size line {line:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(reader)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        read_line(reader)?;
    }
}
