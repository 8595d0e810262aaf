//! The ICN watched while an FLP connects to its EPNs: a run stopped meanwhile (RunStop)
//! or an ICN gone ends the connecting at once, not after an EPN's time-out.

use std::future::Future;

use fanin_proto::{FrameHeader, Message, MsgType, HEADER_LEN, MAX_CONTROL_BODY};
use tokio::io::BufReader;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

use crate::conn::read_frame;
use crate::metrics::Metrics;

/// How connecting to one EPN ended.
pub enum Heard {
    /// The attempt finished (any other frame waits, read after Ready as before).
    Connected(anyhow::Result<TcpStream>),
    /// Run control stopped the run first (its RunStop is left unread).
    RunStop,
    /// The ICN closed the control connection.
    Closed,
}

/// What waits at the front of the control connection.
#[derive(Debug, PartialEq)]
enum Front {
    RunStop,
    /// A whole RunState frame: read, its gauge set, and watched on.
    RunState,
    /// Part of a frame: more is coming.
    Partial,
    Other,
}

/// Runs `connect` while watching the control connection without consuming what the
/// run loop reads later: only RunState frames are taken (they set a gauge).
pub async fn connect_watching(
    rd: &mut BufReader<OwnedReadHalf>,
    metrics: &Metrics,
    connect: impl Future<Output = anyhow::Result<TcpStream>>,
) -> Heard {
    tokio::pin!(connect);
    loop {
        let front = match rd.buffer().is_empty() {
            false => front(rd.buffer()),
            true => tokio::select! {
                r = &mut connect => return Heard::Connected(r),
                f = peek(rd.get_mut()) => match f {
                    Some(f) => f,
                    None => return Heard::Closed,
                },
            },
        };
        match front {
            Front::RunStop => return Heard::RunStop,
            Front::RunState => match read_frame(rd, MAX_CONTROL_BODY).await {
                Ok(Some(Message::RunState { state, run_number })) => {
                    metrics.set_run_state(state, run_number)
                }
                _ => return Heard::Closed,
            },
            Front::Partial if rd.buffer().is_empty() => tokio::select! {
                r = &mut connect => return Heard::Connected(r),
                _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
            },
            Front::Partial | Front::Other => return Heard::Connected(connect.await),
        }
    }
}

/// The front of the socket's queue, unread (None: closed or failed).
async fn peek(rd: &mut OwnedReadHalf) -> Option<Front> {
    let mut buf = [0u8; 64];
    match rd.peek(&mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(front(&buf[..n])),
    }
}

fn front(bytes: &[u8]) -> Front {
    if bytes.len() < HEADER_LEN {
        return Front::Partial;
    }
    let Ok(h) = FrameHeader::decode(bytes, MAX_CONTROL_BODY) else {
        return Front::Other; // the run loop reads it and names the fault
    };
    match h.msg_type {
        t if t == MsgType::RunStop as u8 => Front::RunStop,
        t if t == MsgType::RunState as u8 => match bytes.len() >= HEADER_LEN + h.length as usize {
            true => Front::RunState,
            false => Front::Partial,
        },
        _ => Front::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanin_proto::RunState;

    #[test]
    fn only_a_whole_run_state_is_taken_and_run_stop_is_seen() {
        let state = Message::RunState {
            state: RunState::Exit,
            run_number: 3,
        }
        .encode();
        assert_eq!(front(&state), Front::RunState);
        assert_eq!(front(&state[..state.len() - 1]), Front::Partial);
        assert_eq!(front(&state[..5]), Front::Partial);
        assert_eq!(
            front(&Message::RunStop { run_id: 3 }.encode()),
            Front::RunStop
        );
        let start = Message::RunStart {
            run_id: 3,
            elapsed_us: 0,
        };
        assert_eq!(front(&start.encode()), Front::Other);
    }
}
