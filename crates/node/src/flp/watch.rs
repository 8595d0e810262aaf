//! The ICN watched while an FLP connects to its EPNs: a run stopped meanwhile (RunStop)
//! or an ICN gone ends the connecting at once, not after an EPN's time-out.

use std::future::Future;

use fanin_proto::{FrameHeader, Message, MsgType, HEADER_LEN, MAX_ICN_BODY};
use tokio::io::BufReader;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

use crate::conn::{read_frame, ConnError};
use crate::metrics::Metrics;

/// How connecting to one EPN ended.
pub enum Heard {
    /// The attempt finished (any other frame waits, read after Ready as before).
    Connected(anyhow::Result<TcpStream>),
    /// Run control stopped the run first (its RunStop was read).
    RunStop,
    /// The ICN closed the control connection.
    Closed,
    /// The control connection failed, or sent a frame that does not decode.
    Failed(ConnError),
}

/// What waits at the front of the control connection.
#[derive(Debug, PartialEq)]
enum Front {
    /// A whole RunStop or RunState frame: read, and acted on.
    Whole(MsgType),
    /// Part of a frame: more is coming.
    Partial,
    Other,
}

/// Runs `connect` while watching the control connection without consuming what the
/// run loop reads later: only RunState frames (a gauge) and RunStop are read.
pub async fn connect_watching(
    rd: &mut BufReader<OwnedReadHalf>,
    metrics: &Metrics,
    connect: impl Future<Output = anyhow::Result<TcpStream>>,
) -> Heard {
    tokio::pin!(connect);
    loop {
        let front = match front(rd.buffer()) {
            Front::Partial => tokio::select! {
                r = &mut connect => return Heard::Connected(r),
                f = peek(rd) => match f {
                    Ok(Some(f)) => f,
                    Ok(None) => return Heard::Closed,
                    Err(e) => return Heard::Failed(e),
                },
            },
            f => f,
        };
        match front {
            Front::Whole(_) => match read_frame(rd, MAX_ICN_BODY).await {
                Ok(Some(Message::RunState { state, run_number })) => {
                    metrics.set_run_state(state, run_number)
                }
                Ok(Some(Message::RunStop { .. })) => return Heard::RunStop,
                Ok(Some(other)) => unreachable!("{:?} is not watched", other.msg_type()),
                Ok(None) => return Heard::Closed,
                Err(e) => return Heard::Failed(e),
            },
            Front::Partial => tokio::select! {
                r = &mut connect => return Heard::Connected(r),
                _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
            },
            Front::Other => return Heard::Connected(connect.await),
        }
    }
}

/// The front of the connection, unread: the reader's buffered bytes, then the
/// socket's (None: closed).
async fn peek(rd: &mut BufReader<OwnedReadHalf>) -> Result<Option<Front>, ConnError> {
    let mut bytes = rd.buffer().to_vec();
    let mut buf = [0u8; 64];
    match rd.get_mut().peek(&mut buf).await? {
        0 => Ok(None),
        n => {
            bytes.extend_from_slice(&buf[..n]);
            Ok(Some(front(&bytes)))
        }
    }
}

fn front(bytes: &[u8]) -> Front {
    if bytes.len() < HEADER_LEN {
        return Front::Partial;
    }
    let Ok(h) = FrameHeader::decode(bytes, MAX_ICN_BODY) else {
        return Front::Other; // the run loop reads it and names the fault
    };
    let whole = bytes.len() >= HEADER_LEN + h.length as usize;
    match h.msg_type {
        t if t == MsgType::RunStop as u8 && whole => Front::Whole(MsgType::RunStop),
        t if t == MsgType::RunState as u8 && whole => Front::Whole(MsgType::RunState),
        t if t == MsgType::RunStop as u8 || t == MsgType::RunState as u8 => Front::Partial,
        _ => Front::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanin_proto::RunState;

    #[test]
    fn only_whole_run_state_and_run_stop_frames_are_taken() {
        let state = Message::RunState {
            state: RunState::Exit,
            run_number: 3,
        }
        .encode();
        assert_eq!(front(&state), Front::Whole(MsgType::RunState));
        assert_eq!(front(&state[..state.len() - 1]), Front::Partial);
        assert_eq!(front(&state[..5]), Front::Partial);
        let stop = Message::RunStop { run_id: 3 }.encode();
        assert_eq!(front(&stop), Front::Whole(MsgType::RunStop));
        assert_eq!(front(&stop[..stop.len() - 1]), Front::Partial);
        let start = Message::RunStart {
            run_id: 3,
            elapsed_us: 0,
        };
        assert_eq!(front(&start.encode()), Front::Other);
    }
}
