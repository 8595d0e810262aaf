//! Handing a TF record into a command's stdin pipe: written (copied) by default, or
//! spliced with vmsplice(2) (`--exec-zero-copy`: the pages are lent, not copied). Either
//! way a TF counts as taken once the pipe is empty: the command has read all of it.
//!
//! A command that takes nothing for `STALL` fails the TF (`sink_failed`), so a stuck
//! command never hangs the EPN.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use super::TfView;

/// Bytes of pipe buffer asked for (Linux lets any user have 1 MiB).
pub const PIPE_BYTES: usize = 1 << 20;
/// A command that takes no byte for this long has failed.
pub const STALL: Duration = Duration::from_secs(10);

/// Prepares the EPN's end of a command's stdin: a 1 MiB pipe instead of 64 KiB (fewer
/// wake-ups per TF; best effort) and non-blocking writes (for the stall limit).
pub fn prepare(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; these only resize the pipe and set a flag.
    unsafe {
        if libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) < 0 {
            tracing::debug!("pipe size unchanged: {}", io::Error::last_os_error());
        }
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sends `tf` as one TF record and returns once the reader has taken every byte of it.
/// `zero_copy` lends the pages (vmsplice): only for readers that read(2) their stdin;
/// one that splices it onward (pv, a splice to a socket) would still point into the
/// EPN's buffers after the pipe is empty.
pub fn send(fd: &impl AsRawFd, tf: &TfView, zero_copy: bool, stall: Duration) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    let mut iov = tf.slices();
    iov.retain(|s| !s.is_empty());
    push_all(fd, &mut iov, zero_copy, stall)?;
    // Lent pages are still in the pipe until read: wait until they are.
    drained(fd, stall)
}

/// Writes (or splices) every slice into the pipe, waiting while it is full.
fn push_all(fd: RawFd, bufs: &mut [&[u8]], zero_copy: bool, stall: Duration) -> io::Result<()> {
    let mut start = 0;
    while start < bufs.len() {
        let iov: Vec<libc::iovec> = bufs[start..]
            .iter()
            .take(libc::UIO_MAXIOV as usize)
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec points into a live slice. writev copies; vmsplice without
        // SPLICE_F_GIFT only reads the pages, and `send` keeps them alive until read.
        let n = unsafe {
            match zero_copy {
                true => libc::vmsplice(fd, iov.as_ptr(), iov.len(), libc::SPLICE_F_NONBLOCK),
                false => libc::writev(fd, iov.as_ptr(), iov.len() as libc::c_int),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    writable(fd, stall)?;
                    continue;
                }
                _ => return Err(e),
            }
        }
        start = advance(bufs, start, n as usize);
    }
    Ok(())
}

/// Moves past `n` bytes of `bufs` from slice `start`; the first slice not fully sent.
fn advance(bufs: &mut [&[u8]], mut start: usize, mut n: usize) -> usize {
    while n > 0 {
        let first = bufs[start].len();
        if n >= first {
            n -= first;
            start += 1;
        } else {
            bufs[start] = &bufs[start][n..];
            n = 0;
        }
    }
    while start < bufs.len() && bufs[start].is_empty() {
        start += 1;
    }
    start
}

/// Waits until the pipe has room; an error after `stall` without room, or when no
/// reader is left.
fn writable(fd: RawFd, stall: Duration) -> io::Result<()> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = stall.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one pollfd we own.
    match unsafe { libc::poll(&mut p, 1, ms) } {
        n if n < 0 => Err(io::Error::last_os_error()),
        0 => Err(stalled(stall)),
        _ if p.revents & libc::POLLERR != 0 => Err(io::ErrorKind::BrokenPipe.into()),
        _ => Ok(()),
    }
}

fn stalled(stall: Duration) -> io::Error {
    let msg = format!("the command took nothing for {:.1} s", stall.as_secs_f64());
    io::Error::new(io::ErrorKind::TimedOut, msg)
}

/// Waits until the pipe holds no unread byte; broken pipe once no reader is left, an
/// error when the reader takes nothing for `stall`.
fn drained(fd: RawFd, stall: Duration) -> io::Result<()> {
    let (mut nap, mut last, mut since) = (Duration::from_micros(20), -1, Instant::now());
    loop {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int; it works on either end of a pipe.
        if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut unread) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if unread == 0 {
            return Ok(());
        }
        if unread != last {
            (last, since) = (unread, Instant::now());
        } else if since.elapsed() >= stall {
            return Err(stalled(stall));
        }
        let mut p = libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        };
        // SAFETY: one pollfd we own, no wait.
        unsafe { libc::poll(&mut p, 1, 0) };
        if p.revents & libc::POLLERR != 0 {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        // A reader takes 1 MiB in a few hundred µs; a stalled one is not polled hard.
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn view(stfs: &[(u32, Vec<u8>)]) -> TfView<'_> {
        TfView::new(1, 0, 9, stfs)
    }

    #[test]
    fn a_tf_reads_back_as_its_record_written_or_spliced() {
        let stfs: Vec<(u32, Vec<u8>)> = (0..3).map(|f| (f, vec![f as u8; 300_000])).collect();
        let want = view(&stfs).record();
        for zero_copy in [false, true] {
            let (mut rd, wr) = std::io::pipe().unwrap();
            prepare(&wr).unwrap();
            let reader = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let mut got = Vec::new();
                rd.read_to_end(&mut got).unwrap();
                got
            });
            send(&wr, &view(&stfs), zero_copy, STALL).unwrap();
            drop(wr);
            assert!(reader.join().unwrap() == want, "zero_copy {zero_copy}");
        }
    }

    #[test]
    fn a_reader_gone_is_a_broken_pipe() {
        let (rd, wr) = std::io::pipe().unwrap();
        prepare(&wr).unwrap();
        drop(rd);
        let stfs = vec![(0u32, vec![1u8; 10])];
        let e = send(&wr, &view(&stfs), false, STALL).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_reader_that_takes_nothing_fails_the_tf_after_the_stall_limit() {
        let stall = Duration::from_millis(100);
        for (len, zero_copy) in [(3 << 20, false), (100, true)] {
            let (_rd, wr) = std::io::pipe().unwrap(); // open, never read
            prepare(&wr).unwrap();
            let stfs = vec![(0u32, vec![1u8; len])];
            let e = send(&wr, &view(&stfs), zero_copy, stall).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{len} bytes: {e}");
        }
    }

    #[test]
    fn advancing_past_sent_bytes_keeps_the_rest() {
        let (a, b) = (vec![1u8; 4], vec![2u8; 4]);
        let mut bufs = [a.as_slice(), b.as_slice()];
        assert_eq!(advance(&mut bufs, 0, 6), 1);
        assert_eq!(bufs[1], [2, 2]);
        assert_eq!(advance(&mut bufs, 1, 2), 2);
    }
}
