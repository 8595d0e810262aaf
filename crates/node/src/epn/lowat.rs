//! The EPN's receive wake-ups: SO_RCVLOWAT set to what an STF's payload still needs, so
//! the kernel wakes the reader once per chunk of a large STF, not once per segment.

use std::os::fd::RawFd;

/// Payloads missing this many bytes or fewer are read as they come. Measured with
/// `fanin bench transport` (docs/performance.md): waiting for 256 KiB STFs was slower.
const MIN_WAIT: usize = 256 * 1024;
/// The most one wake-up waits for: 512 KiB beat 128 KiB, 256 KiB, 1 MiB and 2 MiB at
/// 4 and 16 MiB STFs (the reader's copy overlaps the next chunk's arrival).
const MAX_WAIT: usize = 512 * 1024;

/// One data connection's low-water mark, set only when it changes.
pub struct RecvLowat {
    fd: RawFd,
    current: usize,
    /// A refused raise is logged once; after it the connection reads as bytes come.
    failed: bool,
}

impl RecvLowat {
    pub fn new(fd: RawFd) -> RecvLowat {
        RecvLowat {
            fd,
            current: 1,
            failed: false,
        }
    }

    /// Before waiting for `missing` more payload bytes (0: the payload is complete and
    /// the next header, of unknown size, comes next). Never above `missing`, so the
    /// reader is always woken by the bytes the FLP still owes it; an error if the mark
    /// could not be lowered (the connection must end, or it could wait forever).
    pub fn expect(&mut self, missing: usize) -> std::io::Result<()> {
        let want = match missing > MIN_WAIT {
            true => missing.min(MAX_WAIT),
            false => 1,
        };
        if want == self.current || (self.failed && want > self.current) {
            return Ok(());
        }
        match set_lowat(self.fd, want) {
            Ok(()) => self.current = want,
            Err(e) if want > self.current => {
                // Reading as bytes come is always safe: go on without raising it again.
                tracing::warn!("SO_RCVLOWAT {want} refused ({e}); reading as bytes come");
                self.failed = true;
            }
            Err(e) => return Err(e),
        }
        debug_assert!(self.current == 1 || self.current <= missing);
        Ok(())
    }
}

fn set_lowat(fd: RawFd, bytes: usize) -> std::io::Result<()> {
    let v = bytes as libc::c_int;
    // SAFETY: a plain setsockopt of one int on a socket the caller owns.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn lowat_of(fd: RawFd) -> i32 {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads one int into `v`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        v
    }

    #[test]
    fn waits_for_at_most_what_is_owed_and_resets_for_the_header() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let mut w = RecvLowat::new(s.as_raw_fd());
        w.expect(4 << 20).unwrap();
        assert_eq!(lowat_of(s.as_raw_fd()), MAX_WAIT as i32);
        w.expect(300 * 1024).unwrap();
        assert_eq!(lowat_of(s.as_raw_fd()), 300 * 1024);
        w.expect(MIN_WAIT).unwrap();
        assert_eq!(
            lowat_of(s.as_raw_fd()),
            1,
            "small remainders read as they come"
        );
        w.expect(1 << 20).unwrap();
        w.expect(0).unwrap();
        assert_eq!(
            lowat_of(s.as_raw_fd()),
            1,
            "the next header has no known size"
        );
    }
}
