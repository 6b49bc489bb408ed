//! A small WebDriver client (W3C protocol: HTTP + JSON) driving Debian's headless chromium
//! through `chromedriver`, for the dashboard test. Only what that test needs: sessions,
//! navigation, elements, clicks, typing, screenshots and the browser's console log.
//!
//! Chromium and chromedriver are required (CI installs them); when missing, [`Browser::start`]
//! panics saying so, it does not skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{send, Request};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The W3C name of an element reference in JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long to wait for chromedriver to listen, or for a page to show something.
pub const WAIT: Duration = Duration::from_secs(30);

/// One chromedriver process with one chromium session; both end on drop.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    profile: PathBuf,
}

/// An element of the current page.
#[derive(Clone, Debug)]
pub struct Element(String);

impl Browser {
    /// Start chromedriver on a free port and open a headless chromium session with a fresh
    /// profile directory.
    pub fn start() -> Browser {
        for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: the dashboard test drives a real browser; \
                 install it with `apt-get install chromium chromium-driver` (.ci/run does) \
                 [package {package}]"
            );
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}"));
        let profile =
            std::env::temp_dir().join(format!("ratelimit-chromium-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            profile,
        };
        browser.wait_ready();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    format!("--user-data-dir={}", browser.profile.display()),
                ]
            }
        }}});
        let created = browser.call("POST", "/session", Some(capabilities));
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id: {created}"))
            .to_string();
        browser
    }

    /// chromedriver answers `GET /status` with `ready` once it listens.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!("{CHROMEDRIVER} exited at start: {status}");
            }
            let ready = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && self.call("GET", "/status", None)["ready"] == json!(true);
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{CHROMEDRIVER} not ready after {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One WebDriver command; its `value`. A WebDriver error fails the test with its message.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let mut request = Request::new(method, path);
        if let Some(body) = body {
            request = request.json(&body.to_string());
        }
        let response = send(self.port, &request);
        let answer: Value = serde_json::from_slice(&response.body).unwrap_or_else(|e| {
            panic!(
                "chromedriver {method} {path}: not JSON ({e}): {}",
                response.text()
            )
        });
        let value = answer["value"].clone();
        assert!(
            response.status == 200,
            "chromedriver {method} {path}: {} {}",
            response.status,
            value
        );
        value
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn goto(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    /// Every element matching a CSS selector, in document order.
    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let found = self.session_call(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        found
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|e| e[ELEMENT_KEY].as_str())
                    .map(|id| Element(id.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The one element matching `css` (the first, when several do); fails if none does.
    pub fn find(&self, css: &str) -> Element {
        self.find_all(css)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no element matches {css:?}"))
    }

    /// The rendered text of every element matching `css` (white space runs as one space),
    /// read in one script run, so that the page cannot redraw them between two reads.
    pub fn texts(&self, css: &str) -> Vec<String> {
        let script = json!({
            "script": "return [...document.querySelectorAll(arguments[0])]\
                .map(e => e.innerText.replace(/\\s+/g, ' ').trim())",
            "args": [css],
        });
        let texts = self.session_call("POST", "/execute/sync", Some(script));
        texts
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|text| text.as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn text(&self, element: &Element) -> String {
        let text = self.session_call("GET", &format!("/element/{}/text", element.0), None);
        text.as_str().unwrap_or_default().to_string()
    }

    pub fn attribute(&self, element: &Element, name: &str) -> Option<String> {
        let path = format!("/element/{}/attribute/{name}", element.0);
        self.session_call("GET", &path, None)
            .as_str()
            .map(str::to_string)
    }

    /// Run JavaScript in the page (as a function body) and return its value.
    pub fn script(&self, body: &str) -> Value {
        let script = json!({"script": body, "args": []});
        self.session_call("POST", "/execute/sync", Some(script))
    }

    pub fn click(&self, element: &Element) {
        self.session_call(
            "POST",
            &format!("/element/{}/click", element.0),
            Some(json!({})),
        );
    }

    /// Clicks the first element matching `css`, found and clicked in one script of the page's:
    /// for an element the page's poll re-renders (a table row's button), which a separate find
    /// and click could meet between a render and the next (a stale element).
    pub fn click_on(&self, css: &str) {
        let script = json!({
            "script": "const e = document.querySelector(arguments[0]); if (!e) return false; e.click(); return true;",
            "args": [css],
        });
        let clicked = self.session_call("POST", "/execute/sync", Some(script));
        assert_eq!(clicked, Value::Bool(true), "nothing matches {css} to click");
    }

    /// Replace an input's value by typing `text`.
    pub fn type_into(&self, element: &Element, text: &str) {
        self.session_call(
            "POST",
            &format!("/element/{}/clear", element.0),
            Some(json!({})),
        );
        let path = format!("/element/{}/value", element.0);
        self.session_call("POST", &path, Some(json!({ "text": text })));
    }

    /// Wait until `check` returns `Some`, reading the page again and again (the page polls the
    /// API every second); fail with `what` after [`WAIT`].
    pub fn wait_for<T>(&self, what: &str, mut check: impl FnMut(&Browser) -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(found) = check(self) {
                return found;
            }
            if Instant::now() >= deadline {
                let errors = self.console_errors();
                let body = self.script("return document.body.innerText");
                panic!(
                    "the page never showed {what}; console errors {errors:?}; page text: {body}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Save a PNG screenshot of the window.
    pub fn screenshot(&self, path: &Path) {
        let encoded = self.session_call("GET", "/screenshot", None);
        let png = base64_decode(encoded.as_str().unwrap_or_default());
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("create the screenshot directory");
        }
        std::fs::write(path, png).expect("write the screenshot");
    }

    /// The console messages of level SEVERE (errors, failed loads) since the last call.
    pub fn console_errors(&self) -> Vec<String> {
        let log = self.session_call("POST", "/se/log", Some(json!({"type": "browser"})));
        log.as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|entry| entry["level"] == "SEVERE")
                    .map(|entry| entry["message"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.call("DELETE", &path, None)
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
    listener.local_addr().expect("bound socket").port()
}

/// Standard base64 (with padding), as WebDriver sends screenshots.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0);
    for sextet in text.bytes().filter_map(value) {
        bits = bits << 6 | u32::from(sextet);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}
