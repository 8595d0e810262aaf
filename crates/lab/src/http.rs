//! A small HTTP/1.1 client for fanin's own node endpoints (run control, the burst
//! trigger): one request per connection (`Connection: close`), an answer of at most
//! `MAX_REPLY` bytes read until the node (or a proxy) closes it or its length is in.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context;

/// The most bytes of an answer read (run control answers are a line of JSON).
const MAX_REPLY: u64 = 1 << 20;

/// A node's answer: the status code and the body.
pub struct Answer {
    pub code: u16,
    pub body: String,
}

/// `METHOD path` to the node `who` ("ICN", "EPN") at `addr`, with the bearer token if
/// any; errors name the node.
pub fn request(
    who: &str,
    addr: SocketAddr,
    (method, path): (&str, &str),
    token: Option<&str>,
    body: &[u8],
) -> anyhow::Result<Answer> {
    let t = Duration::from_secs(10);
    let mut s = TcpStream::connect_timeout(&addr, t).with_context(|| format!("{who} at {addr}"))?;
    s.set_read_timeout(Some(t))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .with_context(|| format!("{who} at {addr}"))?;
    let reply = read_reply(&mut s).with_context(|| format!("{who} at {addr}"))?;
    let (head, body) = reply;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{who} at {addr}: not an HTTP reply"))?;
    Ok(Answer { code, body })
}

/// The answer's head and body: read until the server closes or the body's
/// `Content-Length` bytes are in (a server that keeps the connection open is not waited
/// for once its answer is whole). An error when the answer is over `MAX_REPLY` bytes,
/// chunked, or cut short of its length.
fn read_reply(s: &mut TcpStream) -> anyhow::Result<(String, String)> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let whole = loop {
        let n = s.read(&mut chunk).context("no reply")?;
        got.extend_from_slice(&chunk[..n]);
        let split = got.windows(4).position(|w| w == b"\r\n\r\n");
        let want = split.map(|i| (i, content_length(&String::from_utf8_lossy(&got[..i]))));
        match want {
            Some((i, Some(len))) if got.len() >= i + 4 + len => break Some((i, len)),
            _ if n == 0 => break split.map(|i| (i, got.len() - i - 4)),
            _ => anyhow::ensure!(
                (got.len() as u64) < MAX_REPLY,
                "an answer over {MAX_REPLY} bytes"
            ),
        }
    };
    let Some((i, len)) = whole else {
        anyhow::bail!("not an HTTP reply (no end of its head)");
    };
    let head = String::from_utf8_lossy(&got[..i]).into_owned();
    anyhow::ensure!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "a chunked answer (fanin's nodes send a length; a proxy must pass it on)"
    );
    if let Some(want) = content_length(&head) {
        anyhow::ensure!(len >= want, "the answer ended {} bytes short", want - len);
    }
    let body = String::from_utf8_lossy(&got[i + 4..i + 4 + len]).into_owned();
    Ok((head, body))
}

/// The `Content-Length` of an answer's head, if it has one.
fn content_length(head: &str) -> Option<usize> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    /// A server that keeps the connection open after a whole answer (a keep-alive
    /// proxy) is not waited for: the answer is in once its Content-Length is.
    #[test]
    fn an_answer_is_whole_at_its_length_even_on_a_connection_left_open() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 1024];
            let n = s.read(&mut req).unwrap();
            let req = String::from_utf8_lossy(&req[..n]).into_owned();
            assert!(req.contains("Connection: close"), "{req}");
            let body = r#"{"ok": true}"#;
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            s.write_all((head + body + "trailing bytes of nothing").as_bytes())
                .unwrap();
            std::thread::sleep(std::time::Duration::from_secs(30)); // never closes first
            req
        });
        // Waiting for the close, it would fail at its 10 s read time-out.
        let a = super::request("ICN", addr, ("POST", "/ctl/stop"), None, b"").unwrap();
        assert_eq!((a.code, a.body.as_str()), (200, r#"{"ok": true}"#));
        drop(server); // detached: its sleep ends with the test binary
    }
}
