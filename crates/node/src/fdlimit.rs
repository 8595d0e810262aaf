//! The process's open-file limit: raised to its hard limit at start (a node holds one
//! socket per peer), and the share of it that connections still proving themselves get.

/// Raises the soft open-file limit to the hard one (at most 1 Mi files); the soft limit
/// now. A failure leaves the limit as it was.
pub fn raise() -> u64 {
    let Some((soft, hard)) = limits() else {
        return 1024;
    };
    let want = hard.min(1 << 20);
    if want > soft {
        let new = libc::rlimit {
            rlim_cur: want,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads the struct we pass; no memory is shared.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return want;
        }
    }
    soft
}

/// The soft open-file limit now (1024 if it cannot be read).
pub fn soft() -> u64 {
    limits().map_or(1024, |(soft, _)| soft)
}

/// Places one listener's handshake pool may take: a quarter of the open files (at least
/// 16), so a flood of connections that never prove themselves cannot use up the
/// process's files before the pool starts evicting them.
pub fn pending_room() -> usize {
    (soft() / 4).max(16) as usize
}

fn limits() -> Option<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    ok.then_some((r.rlim_cur, r.rlim_max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_rises_to_the_hard_one_and_the_pool_gets_a_quarter() {
        let (_, hard) = limits().unwrap();
        let now = raise();
        assert_eq!(now, soft());
        assert_eq!(now, hard.min(1 << 20).max(now));
        assert_eq!(pending_room(), ((now / 4).max(16)) as usize);
    }
}
