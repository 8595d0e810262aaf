//! Free loopback ports for servers the lab and its tests start, below the kernel's
//! ephemeral range (32768 and up).
//!
//! A port the system hands out (`:0`) is free only until some `connect` takes it as its
//! own, which other programs' loopback connections (a node retrying its ICN, a test
//! beside this one) do while the server starts; ports below that range no connect takes.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

/// A port in `range` no one listens on now, checked with a bind. Processes start at
/// different places (their pid), so two of them rarely walk the same ports at once.
pub fn free_loopback_port(range: Range<u16>) -> anyhow::Result<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let width = u32::from(range.end.saturating_sub(range.start)).max(1);
    for _ in 0..width {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port =
            range.start + (std::process::id().wrapping_mul(37).wrapping_add(n) % width) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free loopback port in {range:?}")
}
