//! A small HTTP/1.1 client for fanin's own node endpoints (run control, the burst
//! trigger): one request per connection, the answer read until the node closes it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context;

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
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .with_context(|| format!("{who} at {addr}"))?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .with_context(|| format!("{who} at {addr}: no reply"))?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{who} at {addr}: not an HTTP reply"))?;
    Ok(Answer {
        code,
        body: body.to_string(),
    })
}
