//! The ICN's live page in a real browser: headless Chromium (Debian's `chromium`,
//! installed by scripts/test) loads it during a run; its numbers move between loads.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium without a display, sandbox, GPU or /dev/shm (as root in a container).
const HEADLESS: [&str; 4] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
];

/// The page's DOM after its scripts ran (Chromium's virtual time: 2 s).
fn dom(url: &str) -> String {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: run scripts/test, which installs Debian's chromium"
    );
    run_ok(Command::new(CHROMIUM).args(HEADLESS).args([
        "--virtual-time-budget=2000",
        "--dump-dom",
        url,
    ]))
}

/// The number in the row `<td>name</td><td>N</td>` of the page.
fn cell(dom: &str, name: &str) -> u64 {
    let key = format!("<td>{name}</td><td>");
    let rest = dom
        .split(&key)
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in {dom}"));
    rest.split('<').next().unwrap().trim().parse().unwrap()
}

#[test]
fn the_live_page_shows_the_run_and_its_numbers_move() {
    let dir = tempfile::tempdir().unwrap();
    // A run that lasts until the test stops it (however long two browser starts take).
    let toml = "[run]\nflps = 1\nepns = 2\nrate_hz = 100\nduration_s = 600\nstf_size = \"64KiB\"\n";
    let mut icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let _epns: Vec<Proc> = (0..2)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    icn.wait_issued(100);
    let url = format!("http://{}/", icn.metrics);
    let first = dom(&url);
    assert!(
        first.contains("<span id=\"state\">RUNNING</span> (<span id=\"phase\">running</span>)"),
        "{first}"
    );
    for epn in 0..2 {
        // "<td>0</td><td>1024 / 0</td>": free MiB / building, numbers.
        let key = format!("<td>{epn}</td><td>");
        let cell = first.split(&key).nth(1).expect(&first);
        let (free, rest) = cell.split_once(" / ").expect(&first);
        assert!(
            free.parse::<u64>().is_ok(),
            "EPN {epn}'s free buffer: {first}"
        );
        assert!(
            rest.split('<').next().unwrap().parse::<u64>().is_ok(),
            "{first}"
        );
    }
    assert!(first.contains("&lt;= "), "the latency histogram: {first}");
    let before = cell(&first, "completed");
    std::thread::sleep(Duration::from_millis(1500));
    let second = dom(&url);
    assert!(
        second.contains("<span id=\"state\">RUNNING</span> (<span id=\"phase\">running</span>)"),
        "{second}"
    );
    let after = cell(&second, "completed");
    assert!(
        after > before,
        "completed TFs must move: {before} then {after}"
    );
    icn.proc.signal(libc::SIGINT);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert!(u(&s, "completed") >= after);
    assert_eq!(s["invariant_ok"], true, "{s}");
}

/// A page in headless Chromium, driven over the DevTools protocol (a WebSocket).
struct Browser {
    _chromium: Proc,
    ws: tungstenite::WebSocket<std::net::TcpStream>,
    next_id: u64,
}

impl Browser {
    fn open(url: &str, profile: &std::path::Path) -> Browser {
        let port = free_port();
        let chromium = Proc::spawn(
            "chromium",
            Command::new(CHROMIUM)
                .args(HEADLESS)
                .arg(format!("--remote-debugging-port={port}"))
                .arg(format!("--user-data-dir={}", profile.display()))
                .args(["--window-size=1100,900", url])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        );
        let list = format!("127.0.0.1:{port}").parse().unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let ws_url = loop {
            let targets = devtools_targets(list);
            let page = serde_json::from_str::<serde_json::Value>(&targets)
                .ok()
                .and_then(|v| v.as_array()?.iter().find(|t| t["type"] == "page").cloned());
            if let Some(u) = page.and_then(|p| p["webSocketDebuggerUrl"].as_str().map(String::from))
            {
                break u;
            }
            assert!(
                std::time::Instant::now() < until,
                "no DevTools page: {targets}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let stream = std::net::TcpStream::connect(list).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let (ws, _) = tungstenite::client(ws_url.as_str(), stream).expect("DevTools WebSocket");
        Browser {
            _chromium: chromium,
            ws,
            next_id: 0,
        }
    }

    /// Calls a DevTools method; its result.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = serde_json::json!({"id": id, "method": method, "params": params});
        self.ws
            .send(tungstenite::Message::text(msg.to_string()))
            .unwrap();
        loop {
            let m = self.ws.read().expect("DevTools reply");
            let Ok(text) = m.to_text() else { continue };
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, js: &str) -> serde_json::Value {
        let p = serde_json::json!({"expression": js, "returnByValue": true, "awaitPromise": true});
        let r = self.call("Runtime.evaluate", p);
        r["result"]["value"].clone()
    }

    fn text(&mut self, id: &str) -> String {
        let v = self.eval(&format!(
            "document.getElementById({id:?})?.textContent ?? ''"
        ));
        v.as_str().unwrap_or_default().to_string()
    }

    /// Clicks a button as a user would (it must be enabled).
    fn click(&mut self, id: &str) {
        let js = format!(
            "(b => b && !b.disabled ? (b.click(), true) : false)(document.getElementById({id:?}))"
        );
        assert_eq!(self.eval(&js), true, "button {id} is missing or disabled");
    }

    /// Waits until `f` holds for the page (30 s), reloading nothing: the page polls.
    fn wait(&mut self, what: &str, f: impl Fn(&mut Browser) -> bool) {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !f(self) {
            let state = self.text("state");
            let msg = self.text("ctlmsg");
            assert!(
                std::time::Instant::now() < until,
                "{what}: state {state}, message {msg}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A number from the TF counts table.
    fn count(&mut self, name: &str) -> u64 {
        let js = format!("[...document.querySelectorAll('#counts tr')].find(r => r.cells[0].textContent == {name:?})?.cells[1].textContent");
        self.eval(&js)
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

#[test]
fn a_session_driven_through_the_page_buttons() {
    use common::session::*;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = start_session(dir);
    let token = ok(s.http, &s.secret, &["url"]);
    assert!(token.contains("#token="), "{token}");
    let _nodes: Vec<Proc> = [("flp", "flp-0"), ("epn", "epn-0"), ("epn", "epn-1")]
        .iter()
        .map(|(role, name)| node(dir, &s, role, name, &[]))
        .collect();
    let mut b = Browser::open(&token, &dir.join("profile"));
    b.wait("the page shows IDLE", |b| b.text("state") == "IDLE");
    let toml = "[run]\nflps = 1\nepns = 2\nrate_hz = 200\nduration_s = 600\nstf_size = \"64KiB\"\n";
    b.eval(&format!(
        "document.getElementById('config').value = {}",
        serde_json::to_string(toml).unwrap()
    ));
    b.click("configure");
    b.wait("configured", |b| {
        b.text("state") == "CONFIGURED" && b.text("phase") == "ready"
    });
    b.click("start");
    b.wait("running", |b| {
        b.text("state") == "RUNNING" && b.count("completed") > 0
    });
    let before = b.count("completed");
    b.wait("completed TFs move", |b| b.count("completed") > before + 50);
    if let Some(png) = std::env::var_os("FANIN_SCREENSHOT") {
        let shot = b.call(
            "Page.captureScreenshot",
            serde_json::json!({"format": "png"}),
        );
        let bytes = base64_decode(shot["data"].as_str().unwrap());
        std::fs::write(png, bytes).unwrap();
    }
    b.click("pause");
    b.wait("paused", |b| b.text("state") == "PAUSED");
    let issued = b.count("issued");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(b.count("issued"), issued, "TFs issued while paused");
    b.click("resume");
    b.wait("resumed", |b| {
        b.text("state") == "RUNNING" && b.count("issued") > issued
    });
    b.click("stop");
    b.wait("stopped", |b| {
        b.text("state") == "CONFIGURED" && b.text("lastrun").starts_with("last run 1:")
    });
    let last = b.text("lastrun");
    assert!(last.contains("invariant ok"), "{last}");
    let run = read_summary(&dir.join("res/run-1"));
    assert_eq!(u(&run, "issued"), u(&run, "completed"), "{run}");
    assert!(
        last.contains(&format!("completed {}", u(&run, "completed"))),
        "{last}"
    );
    // Without the token the buttons are refused, and the page says why.
    b.eval("history.replaceState(null, '', '/'); location.reload()");
    b.wait("reloaded without the token", |b| {
        b.text("state") == "CONFIGURED"
    });
    b.click("start");
    b.wait("refused", |b| {
        b.text("ctlmsg")
            .contains("start refused: run control needs the token")
    });
    cross_site_post(&mut b, s.http);
    assert_eq!(ok(s.http, &s.secret, &["exit"]), "the session ends");
}

/// The browser POSTs from this page to the ICN under another name (`localhost`, so
/// another site): it sends its `Origin`, and the ICN refuses before it looks at a token.
fn cross_site_post(b: &mut Browser, http: std::net::SocketAddr) {
    let errors = |kind: &str| {
        let m = http_get(http, "/metrics").unwrap_or_default();
        metric(
            &m,
            &["fanin_protocol_errors_total", &format!("kind=\"{kind}\"")],
        )
    };
    let unauthorized = errors("ctl_unauthorized");
    let post = format!(
        "fetch('http://localhost:{}/ctl/start', {{method: 'POST', mode: 'no-cors', body: ''}}).then(() => 'sent', e => String(e))",
        http.port()
    );
    assert_eq!(b.eval(&post), "sent");
    assert_eq!(errors("cross_origin"), 1.0, "the ICN saw the page's Origin");
    assert_eq!(errors("ctl_unauthorized"), unauthorized);
    assert_eq!(b.text("state"), "CONFIGURED");
}

/// DevTools' target list (it answers only requests whose Host is an address).
fn devtools_targets(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let req = format!("GET /json/list HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    // It keeps the connection open: read what Content-Length says, no more.
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(req.as_bytes());
    let (mut out, mut buf) = (Vec::new(), [0u8; 4096]);
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(usize::MAX);
            if body.len() >= len {
                return body.to_string();
            }
        }
        match s.read(&mut buf) {
            Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
            _ => return String::new(),
        }
    }
}

/// Standard base64 (the screenshot), without a crate for one test helper.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |a, (i, c)| a | (val(*c) as u32) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
