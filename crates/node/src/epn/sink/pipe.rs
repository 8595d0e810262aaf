//! Zero-copy hand-off into a pipe: a TF's headers and payloads are spliced into the pipe
//! with vmsplice(2) (the pages are lent, not copied), and the TF counts as taken only
//! once the reader has read all of it, so its buffers may then be reused.
//!
//! Linux only, as the rest of fanin; `fanin bench sink` measures what it saves.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use fanin_proto::tf_record::{StfRecordHeader, STF_RECORD_HEADER_LEN, TF_HEADER_LEN};

use super::TfView;

/// Bytes of pipe buffer asked for (Linux lets any user have 1 MiB).
pub const PIPE_BYTES: usize = 1 << 20;

/// Asks for a 1 MiB pipe instead of 64 KiB: fewer wake-ups per TF. Best effort.
pub fn grow(fd: &impl AsRawFd) {
    // SAFETY: fcntl on a descriptor we own; F_SETPIPE_SZ only resizes the pipe's buffer.
    let rc = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETPIPE_SZ,
            PIPE_BYTES as libc::c_int,
        )
    };
    if rc < 0 {
        tracing::debug!("pipe size unchanged: {}", io::Error::last_os_error());
    }
}

/// Sends `tf` as one TF record and returns once the reader has taken every byte of it
/// (an error when the reader is gone).
pub fn send(fd: &impl AsRawFd, tf: &TfView) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    let mut heads = Vec::with_capacity(TF_HEADER_LEN + tf.stfs.len() * STF_RECORD_HEADER_LEN);
    heads.extend_from_slice(&tf.header().encode());
    for (flp, p) in tf.stfs {
        heads.extend_from_slice(&StfRecordHeader::of(*flp, p).encode());
    }
    let mut iov = Vec::with_capacity(1 + 2 * tf.stfs.len());
    iov.push(&heads[..TF_HEADER_LEN]);
    for (i, (_, p)) in tf.stfs.iter().enumerate() {
        let h = TF_HEADER_LEN + i * STF_RECORD_HEADER_LEN;
        iov.push(&heads[h..h + STF_RECORD_HEADER_LEN]);
        if !p.is_empty() {
            iov.push(p.as_slice());
        }
    }
    splice_all(fd, &mut iov)?;
    // The pipe still points into `heads` and the payloads: wait until they are read.
    drained(fd)
}

/// vmsplice until every slice is in the pipe (blocking while it is full).
fn splice_all(fd: RawFd, bufs: &mut [&[u8]]) -> io::Result<()> {
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
        // SAFETY: every iovec points into a live slice; without SPLICE_F_GIFT the kernel
        // only reads the pages, and `send` keeps them alive until the reader took them.
        let n = unsafe { libc::vmsplice(fd, iov.as_ptr(), iov.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut n = n as usize;
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
    }
    Ok(())
}

/// Waits until the pipe holds no unread byte; broken pipe once no reader is left.
fn drained(fd: RawFd) -> io::Result<()> {
    let mut nap = Duration::from_micros(20);
    loop {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int; it works on either end of a pipe.
        if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut unread) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if unread == 0 {
            return Ok(());
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

    #[test]
    fn a_spliced_tf_reads_back_as_its_record_and_waits_for_the_reader() {
        let stfs: Vec<(u32, Vec<u8>)> = (0..3).map(|f| (f, vec![f as u8; 300_000])).collect();
        let tf = TfView {
            run_id: 1,
            epn: 0,
            tf: 9,
            stfs: &stfs,
            bytes: 900_000,
        };
        let want = tf.record();
        let (mut rd, wr) = std::io::pipe().unwrap();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut got = Vec::new();
            rd.read_to_end(&mut got).unwrap();
            got
        });
        send(&wr, &tf).unwrap();
        drop(wr);
        assert!(reader.join().unwrap() == want);
    }

    #[test]
    fn a_reader_gone_is_a_broken_pipe() {
        let (rd, wr) = std::io::pipe().unwrap();
        drop(rd);
        let stfs = vec![(0u32, vec![1u8; 10])];
        let tf = TfView {
            run_id: 1,
            epn: 0,
            tf: 1,
            stfs: &stfs,
            bytes: 10,
        };
        assert_eq!(
            send(&wr, &tf).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}
