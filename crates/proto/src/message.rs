//! Message bodies: every frame type exchanged by ICN, FLP and EPN, with its encoding.
//! Type numbers and field layouts are documented in docs/protocol.md; keep them in step.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::frame::{FrameHeader, HEADER_LEN};
use crate::wire::{Reader, Writer};

/// Node role on the control connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Flp = 1,
    Epn = 2,
}

impl Role {
    fn from_u8(v: u8) -> Result<Role, DecodeError> {
        match v {
            1 => Ok(Role::Flp),
            2 => Ok(Role::Epn),
            _ => Err(DecodeError::InvalidValue {
                field: "role",
                value: v as u64,
            }),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Role::Flp => "FLP",
            Role::Epn => "EPN",
        }
    }
}

/// Final status of a TF as reported by an EPN or decided by the ICN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TfStatus {
    Complete = 1,
    Incomplete = 2,
    Dropped = 3,
}

impl TfStatus {
    fn from_u8(v: u8) -> Result<TfStatus, DecodeError> {
        match v {
            1 => Ok(TfStatus::Complete),
            2 => Ok(TfStatus::Incomplete),
            3 => Ok(TfStatus::Dropped),
            _ => Err(DecodeError::InvalidValue {
                field: "status",
                value: v as u64,
            }),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TfStatus::Complete => "complete",
            TfStatus::Incomplete => "incomplete",
            TfStatus::Dropped => "dropped",
        }
    }
}

macro_rules! reasons {
    ($($variant:ident = $num:literal => $name:literal),* $(,)?) => {
        /// Why a TF was not built complete, or why an STF was dropped. Every loss in
        /// fanin carries one of these; the names appear in metrics and result files.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason { $($variant = $num),* }
        impl Reason {
            pub const ALL: &'static [Reason] = &[$(Reason::$variant),*];
            pub fn from_u8(v: u8) -> Result<Reason, DecodeError> {
                match v {
                    $($num => Ok(Reason::$variant),)*
                    _ => Err(DecodeError::InvalidValue { field: "reason", value: v as u64 }),
                }
            }
            pub fn name(self) -> &'static str {
                match self { $(Reason::$variant => $name),* }
            }
        }
    };
}

reasons! {
    None = 0 => "none",
    FlpBufferFull = 1 => "flp_buffer_full",
    EpnBufferFull = 2 => "epn_buffer_full",
    EpnLost = 3 => "epn_lost",
    NoEpn = 4 => "no_epn",
    Unacknowledged = 5 => "unacknowledged",
    IcnInflightLimit = 6 => "icn_inflight_limit",
    FlpQueueFull = 7 => "flp_queue_full",
    BuildTimeout = 8 => "build_timeout",
    CrcError = 9 => "crc_error",
    RunStopped = 10 => "run_stopped",
    EpnSlotLimit = 11 => "epn_slot_limit",
    FlpLost = 12 => "flp_lost",
    SendFailed = 13 => "send_failed",
    Split = 14 => "split",
    NoEpnBuffer = 15 => "no_epn_buffer",
    EpnsBusy = 16 => "epns_busy",
    SinkFailed = 17 => "sink_failed",
    SinkRefused = 18 => "sink_refused",
    OrderGivenUp = 19 => "order_given_up",
    StfStale = 20 => "stf_stale",
    IcnLost = 21 => "icn_lost",
}

/// STF size distribution as sent on the wire; `fanin_sched::workload` interprets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeWire {
    pub kind: u8,
    pub a: u64,
    pub b: u64,
    pub c: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    pub role: Role,
    /// Requested id; `None` lets the ICN assign one.
    pub node_id: Option<u32>,
    /// EPN: the address FLPs connect to for STFs. FLP: empty.
    pub data_addr: String,
    /// HMAC-SHA256 under the run secret of the listener's challenge and the fields above
    /// (see docs/protocol.md, "Admission").
    pub proof: Proof,
}

/// A nonce a listener sends as its challenge.
pub type Nonce = [u8; 16];
/// HMAC-SHA256 of a challenge and the message's fields under the run secret.
pub type Proof = [u8; 32];

/// Why a Register or DataHello was refused: tells the node whether to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum RejectCode {
    Other = 0,
    /// The proof does not match the run secret.
    BadProof = 1,
    /// An id the run does not have (FLP or EPN beyond its counts).
    UnknownId = 2,
    /// The id is held by a live node (or its old connection has not closed yet).
    IdInUse = 3,
    /// Every expected node of that role has registered.
    RunFull = 4,
    /// The run is not taking registrations now (preparing, stopping).
    WrongPhase = 5,
    /// The listener is busy admitting others: try again.
    Busy = 6,
    /// A DataHello for another run.
    WrongRun = 7,
    /// Run control: no run is configured yet (IDLE); a long-lived node waits.
    Idle = 8,
    /// Run control: the session has ended (EXIT); a long-lived node exits.
    SessionOver = 9,
    /// The run is stopping or done: a node of it has nothing left to join.
    RunOver = 10,
}

impl RejectCode {
    pub fn from_u8(v: u8) -> RejectCode {
        match v {
            1 => RejectCode::BadProof,
            2 => RejectCode::UnknownId,
            3 => RejectCode::IdInUse,
            4 => RejectCode::RunFull,
            5 => RejectCode::WrongPhase,
            6 => RejectCode::Busy,
            7 => RejectCode::WrongRun,
            8 => RejectCode::Idle,
            9 => RejectCode::SessionOver,
            10 => RejectCode::RunOver,
            _ => RejectCode::Other,
        }
    }

    /// May the same node succeed by trying again later?
    pub fn transient(self) -> bool {
        matches!(
            self,
            RejectCode::IdInUse | RejectCode::Busy | RejectCode::Idle
        )
    }
}

/// The run-control state machine's states (ANTARES RunControl, FairMQ devices):
/// IDLE -> CONFIGURED -> RUNNING <-> PAUSED -> (stop) CONFIGURED -> ... -> EXIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RunState {
    Idle = 1,
    Configured = 2,
    Running = 3,
    Paused = 4,
    Exit = 5,
}

impl RunState {
    pub const ALL: [RunState; 5] = [
        RunState::Idle,
        RunState::Configured,
        RunState::Running,
        RunState::Paused,
        RunState::Exit,
    ];

    pub fn from_u8(v: u8) -> Result<RunState, DecodeError> {
        RunState::ALL
            .into_iter()
            .find(|s| *s as u8 == v)
            .ok_or(DecodeError::InvalidValue {
                field: "run_state.state",
                value: v as u64,
            })
    }

    /// The name operators see (`fanin ctl status`, the live page, logs).
    pub fn name(self) -> &'static str {
        match self {
            RunState::Idle => "IDLE",
            RunState::Configured => "CONFIGURED",
            RunState::Running => "RUNNING",
            RunState::Paused => "PAUSED",
            RunState::Exit => "EXIT",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    pub run_id: u64,
    /// FLP ids taking part are 0..flps.
    pub flps: u32,
    pub build_timeout_ms: u32,
    pub crc: bool,
    pub size: SizeWire,
    pub seed: u64,
    /// FLPs keep each STF until the ICN releases its TF, to re-send it if its EPN dies.
    pub retain: bool,
    /// Timer: the ICN issues TF ids; on-data: FLPs announce the STFs their sources made.
    pub schedule: Schedule,
    /// On-data, synthetic source: the detector clock's TF rate in mHz (0: as fast as the
    /// send buffer allows) ...
    pub rate_mhz: u64,
    /// ... and how many TFs it makes (0: until the run stops).
    pub tfs: u64,
    /// Pull mode: the ICN tells each FLP when to send each STF (transfer tokens), and
    /// FLPs say when each send ended (`StfSent`).
    pub pull: bool,
}

/// Who decides when a TF exists: the ICN's clock, or the data (FLPs' announcements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Schedule {
    #[default]
    Timer = 0,
    OnData = 1,
}

impl Schedule {
    pub fn from_u8(v: u8) -> Result<Schedule, DecodeError> {
        match v {
            0 => Ok(Schedule::Timer),
            1 => Ok(Schedule::OnData),
            _ => Err(DecodeError::InvalidValue {
                field: "prepare.schedule",
                value: v as u64,
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Schedule::Timer => "timer",
            Schedule::OnData => "on-data",
        }
    }
}

/// One STF an FLP's source produced: its TF and its payload size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StfInfo {
    pub tf_id: u64,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpnEntry {
    pub epn_id: u32,
    pub addr: String,
}

/// Fixed part of an STF frame; the payload follows it in the same frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StfHeader {
    pub run_id: u64,
    pub tf_id: u64,
    pub flp_id: u32,
    /// The EPN the FLP was told to send this STF to.
    pub epn_id: u32,
    /// CRC32C of the payload, when the run enables it.
    pub crc: Option<u32>,
    pub payload_len: u32,
}

pub const STF_HEADER_LEN: usize = 8 + 8 + 4 + 4 + 1 + 4 + 4;

impl StfHeader {
    pub fn encode_into(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.run_id.to_le_bytes());
        out[8..16].copy_from_slice(&self.tf_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.flp_id.to_le_bytes());
        out[20..24].copy_from_slice(&self.epn_id.to_le_bytes());
        out[24] = u8::from(self.crc.is_some());
        out[25..29].copy_from_slice(&self.crc.unwrap_or(0).to_le_bytes());
        out[29..33].copy_from_slice(&self.payload_len.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Result<StfHeader, DecodeError> {
        let mut r = Reader::new(b);
        let run_id = r.u64("stf.run_id")?;
        let tf_id = r.u64("stf.tf_id")?;
        let flp_id = r.u32("stf.flp_id")?;
        let epn_id = r.u32("stf.epn_id")?;
        let flags = r.u8("stf.flags")?;
        if flags > 1 {
            return Err(DecodeError::InvalidValue {
                field: "stf.flags",
                value: flags as u64,
            });
        }
        let crc_raw = r.u32("stf.crc")?;
        let payload_len = r.u32("stf.payload_len")?;
        Ok(StfHeader {
            run_id,
            tf_id,
            flp_id,
            epn_id,
            crc: (flags == 1).then_some(crc_raw),
            payload_len,
        })
    }

    /// Frame header plus STF header, ready to be followed by `payload_len` bytes.
    pub fn encode_frame_prefix(&self) -> [u8; HEADER_LEN + STF_HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN + STF_HEADER_LEN];
        let fh = FrameHeader {
            msg_type: MsgType::Stf as u8,
            length: (STF_HEADER_LEN as u32).saturating_add(self.payload_len),
        };
        out[..HEADER_LEN].copy_from_slice(&fh.encode());
        self.encode_into(&mut out[HEADER_LEN..]);
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfReport {
    pub tf_id: u64,
    pub status: TfStatus,
    pub reason: Reason,
    /// STFs the EPN held for this TF when it decided.
    pub stfs: u32,
    pub bytes: u64,
}

impl TfReport {
    pub fn complete(tf_id: u64, stfs: u32, bytes: u64) -> TfReport {
        TfReport {
            tf_id,
            status: TfStatus::Complete,
            reason: Reason::None,
            stfs,
            bytes,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStats {
    pub role: Role,
    pub node_id: u32,
    pub counters: Vec<(String, u64)>,
}

/// Message type numbers (the header's `type` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgType {
    Register = 1,
    RegisterAck = 2,
    Reject = 3,
    Prepare = 4,
    EpnList = 5,
    Ready = 6,
    RunStart = 7,
    Assign = 8,
    Stf = 9,
    TfReport = 10,
    StfDropped = 11,
    RunStop = 12,
    NodeStats = 13,
    DataHello = 14,
    DataHelloAck = 15,
    Abandon = 16,
    Release = 17,
    LoadReport = 18,
    EpnReachable = 19,
    Challenge = 20,
    RunState = 21,
    StfAnnounce = 22,
    SourceEnded = 23,
    StfsHeld = 24,
    TfsHeld = 25,
    StfSent = 26,
    StfReceived = 27,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Register(Register),
    RegisterAck {
        node_id: u32,
        run_id: u64,
        /// This ICN took over the run `run_id` from a failed one: a node that was in it
        /// keeps what it holds and says so (`StfsHeld`, `TfsHeld`) before its Ready.
        resume: bool,
    },
    Reject {
        code: RejectCode,
        reason: String,
    },
    Prepare(Prepare),
    EpnList(Vec<EpnEntry>),
    Ready {
        role: Role,
        node_id: u32,
        /// FLP: number of EPN data connections confirmed.
        connected: u32,
    },
    RunStart {
        run_id: u64,
        /// Microseconds since the run started (0 at its start; a node that joins
        /// mid-run learns how far it is: a source's clock starts there).
        elapsed_us: u64,
    },
    Assign {
        tf_id: u64,
        epn_id: u32,
    },
    Stf {
        header: StfHeader,
        payload: Bytes,
    },
    TfReport(TfReport),
    StfDropped {
        tf_id: u64,
        flp_id: u32,
        reason: Reason,
    },
    RunStop {
        run_id: u64,
    },
    NodeStats(NodeStats),
    DataHello {
        run_id: u64,
        flp_id: u32,
        proof: Proof,
    },
    DataHelloAck {
        epn_id: u32,
    },
    /// The ICN ended this TF (e.g. an FLP could not send its STF): free what you hold.
    Abandon {
        tf_id: u64,
        reason: Reason,
    },
    /// ICN -> FLP: this TF has ended (any status); free the STF kept for a re-send.
    Release {
        tf_id: u64,
    },
    /// EPN -> ICN: free build-buffer bytes and TFs in building (buffer-aware policies).
    LoadReport {
        free_bytes: u64,
        building: u32,
    },
    /// FLP -> ICN: a data connection to an EPN that joined mid-run is up (or failed).
    EpnReachable {
        epn_id: u32,
        ok: bool,
    },
    /// ICN or EPN -> the connecting node: the first frame on every connection; the
    /// node's Register or DataHello proves the run secret over this nonce.
    Challenge {
        nonce: Nonce,
    },
    /// ICN -> FLP/EPN: the run-control state and the run number, after RegisterAck and
    /// on every transition; `Exit` ends a long-lived node.
    RunState {
        state: RunState,
        run_number: u64,
    },
    /// FLP -> ICN (on-data scheduling): STFs its source produced, oldest first.
    StfAnnounce(Vec<StfInfo>),
    /// FLP -> ICN: its source ended (`ok`) or failed; `detail` is the one-line reason.
    SourceEnded {
        ok: bool,
        detail: String,
    },
    /// FLP -> a resuming ICN: the STFs it holds (oldest first, in frames of at most
    /// `HELD_BATCH`), each with the EPN it was last queued for.
    StfsHeld(Vec<HeldStf>),
    /// EPN -> a resuming ICN: the TFs it is building, and the reports it sent that the
    /// ICN has not released yet (they may have died with the failed ICN).
    TfsHeld {
        building: Vec<u64>,
        reports: Vec<TfReport>,
    },
    /// FLP -> ICN, pull mode: its send of the STF of `tf_id` to EPN `epn_id` ended
    /// without the STF arriving (the send failed, or there was nothing to send): the
    /// transfer's tokens are free again.
    StfSent {
        tf_id: u64,
        epn_id: u32,
    },
    /// EPN -> ICN, pull mode: the STF of `tf_id` from FLP `flp_id` arrived whole (kept
    /// or read away): the transfer's tokens are free again.
    StfReceived {
        tf_id: u64,
        flp_id: u32,
    },
}

/// One STF an FLP holds, as it tells a resuming ICN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldStf {
    pub tf_id: u64,
    pub size: u64,
    /// The EPN it was last queued for (None: not sent yet).
    pub epn: Option<u32>,
}

/// Entries in one `StfsHeld` or `TfsHeld` frame at most (well inside a control frame).
pub const HELD_BATCH: usize = 2048;

impl Message {
    pub fn msg_type(&self) -> MsgType {
        match self {
            Message::Challenge { .. } => MsgType::Challenge,
            Message::Register(_) => MsgType::Register,
            Message::RegisterAck { .. } => MsgType::RegisterAck,
            Message::Reject { .. } => MsgType::Reject,
            Message::Prepare(_) => MsgType::Prepare,
            Message::EpnList(_) => MsgType::EpnList,
            Message::Ready { .. } => MsgType::Ready,
            Message::RunStart { .. } => MsgType::RunStart,
            Message::Assign { .. } => MsgType::Assign,
            Message::Stf { .. } => MsgType::Stf,
            Message::TfReport(_) => MsgType::TfReport,
            Message::StfDropped { .. } => MsgType::StfDropped,
            Message::RunStop { .. } => MsgType::RunStop,
            Message::NodeStats(_) => MsgType::NodeStats,
            Message::DataHello { .. } => MsgType::DataHello,
            Message::DataHelloAck { .. } => MsgType::DataHelloAck,
            Message::Abandon { .. } => MsgType::Abandon,
            Message::Release { .. } => MsgType::Release,
            Message::LoadReport { .. } => MsgType::LoadReport,
            Message::EpnReachable { .. } => MsgType::EpnReachable,
            Message::RunState { .. } => MsgType::RunState,
            Message::StfAnnounce(_) => MsgType::StfAnnounce,
            Message::SourceEnded { .. } => MsgType::SourceEnded,
            Message::StfsHeld(_) => MsgType::StfsHeld,
            Message::TfsHeld { .. } => MsgType::TfsHeld,
            Message::StfSent { .. } => MsgType::StfSent,
            Message::StfReceived { .. } => MsgType::StfReceived,
        }
    }

    /// Encodes the whole frame (header and body).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.buf.resize(HEADER_LEN, 0);
        let written = self.write_run_body(&mut w) || self.write_extension_body(&mut w);
        debug_assert!(written, "a body writer for {:?}", self.msg_type());
        let body_len = (w.buf.len() - HEADER_LEN) as u32;
        let header = FrameHeader {
            msg_type: self.msg_type() as u8,
            length: body_len,
        };
        w.buf[..HEADER_LEN].copy_from_slice(&header.encode());
        w.buf
    }

    /// The body of a message of types 1-13 (joining, preparing, running, the TFs); false
    /// for any other.
    fn write_run_body(&self, w: &mut Writer) -> bool {
        match self {
            Message::Register(r) => r.write(w),
            Message::RegisterAck {
                node_id,
                run_id,
                resume,
            } => {
                w.u32(*node_id);
                w.u64(*run_id);
                w.u8(u8::from(*resume));
            }
            Message::Reject { code, reason } => {
                w.u8(*code as u8);
                w.string(reason);
            }
            Message::Prepare(p) => p.write(w),
            Message::EpnList(list) => {
                w.u32(list.len() as u32);
                for e in list {
                    w.u32(e.epn_id);
                    w.string(&e.addr);
                }
            }
            Message::Ready {
                role,
                node_id,
                connected,
            } => {
                w.u8(*role as u8);
                w.u32(*node_id);
                w.u32(*connected);
            }
            Message::RunStart { run_id, elapsed_us } => {
                w.u64(*run_id);
                w.u64(*elapsed_us);
            }
            Message::RunStop { run_id } => w.u64(*run_id),
            Message::Assign { tf_id, epn_id } => {
                w.u64(*tf_id);
                w.u32(*epn_id);
            }
            Message::Stf { header, payload } => {
                let mut h = [0u8; STF_HEADER_LEN];
                header.encode_into(&mut h);
                w.buf.extend_from_slice(&h);
                w.buf.extend_from_slice(payload);
            }
            Message::TfReport(t) => w.report(t),
            Message::StfDropped {
                tf_id,
                flp_id,
                reason,
            } => {
                w.u64(*tf_id);
                w.u32(*flp_id);
                w.u8(*reason as u8);
            }
            Message::NodeStats(s) => s.write(w),
            _ => return false,
        }
        true
    }

    /// The body of a message of types 14-27 (data admission, loads, run state, on-data,
    /// take-over, pull); false for any other.
    fn write_extension_body(&self, w: &mut Writer) -> bool {
        match self {
            Message::DataHello {
                run_id,
                flp_id,
                proof,
            } => {
                w.u64(*run_id);
                w.u32(*flp_id);
                w.bytes(proof);
            }
            Message::DataHelloAck { epn_id } => w.u32(*epn_id),
            Message::Abandon { tf_id, reason } => {
                w.u64(*tf_id);
                w.u8(*reason as u8);
            }
            Message::Release { tf_id } => w.u64(*tf_id),
            Message::LoadReport {
                free_bytes,
                building,
            } => {
                w.u64(*free_bytes);
                w.u32(*building);
            }
            Message::EpnReachable { epn_id, ok } => {
                w.u32(*epn_id);
                w.u8(u8::from(*ok));
            }
            Message::Challenge { nonce } => w.bytes(nonce),
            Message::RunState { state, run_number } => {
                w.u8(*state as u8);
                w.u64(*run_number);
            }
            Message::StfAnnounce(list) => {
                w.u32(list.len() as u32);
                for s in list {
                    w.u64(s.tf_id);
                    w.u64(s.size);
                }
            }
            Message::SourceEnded { ok, detail } => {
                w.u8(u8::from(*ok));
                w.string(detail);
            }
            Message::StfsHeld(list) => {
                w.u32(list.len() as u32);
                list.iter().for_each(|h| h.write(w));
            }
            Message::TfsHeld { building, reports } => {
                w.u32(building.len() as u32);
                building.iter().for_each(|&tf| w.u64(tf));
                w.u32(reports.len() as u32);
                reports.iter().for_each(|t| w.report(t));
            }
            Message::StfSent { tf_id, epn_id } => {
                w.u64(*tf_id);
                w.u32(*epn_id);
            }
            Message::StfReceived { tf_id, flp_id } => {
                w.u64(*tf_id);
                w.u32(*flp_id);
            }
            _ => return false,
        }
        true
    }

    /// Decodes one body whose header has already been validated.
    pub fn decode(header: FrameHeader, body: &[u8]) -> Result<Message, DecodeError> {
        if body.len() != header.length as usize {
            return Err(DecodeError::Truncated {
                what: "frame body",
                need: header.length as usize,
                have: body.len(),
            });
        }
        let mut r = Reader::new(body);
        let msg = match header.msg_type {
            t @ 1..=13 => read_run_body(t, &mut r)?,
            t => read_extension_body(t, &mut r)?,
        };
        r.finish("message body")?;
        Ok(msg)
    }

    /// Decodes one whole frame from the front of `bytes`, returning the message
    /// and the number of bytes it used.
    pub fn decode_frame(bytes: &[u8], max_body: u32) -> Result<(Message, usize), DecodeError> {
        let header = FrameHeader::decode(bytes, max_body)?;
        let total = HEADER_LEN + header.length as usize;
        if bytes.len() < total {
            return Err(DecodeError::Truncated {
                what: "frame body",
                need: total,
                have: bytes.len(),
            });
        }
        let msg = Message::decode(header, &bytes[HEADER_LEN..total])?;
        Ok((msg, total))
    }
}

/// A `TfReport` body (also inside `TfsHeld`).
impl Register {
    fn write(&self, w: &mut Writer) {
        w.u8(self.role as u8);
        w.u8(u8::from(self.node_id.is_some()));
        w.u32(self.node_id.unwrap_or(0));
        w.string(&self.data_addr);
        w.bytes(&self.proof);
    }

    fn read(r: &mut Reader) -> Result<Register, DecodeError> {
        let role = Role::from_u8(r.u8("register.role")?)?;
        let has_id = r.u8("register.has_id")?;
        let id = r.u32("register.node_id")?;
        let data_addr = r.string("register.data_addr")?;
        let proof = r.array("register.proof")?;
        Ok(Register {
            role,
            node_id: match has_id {
                0 => None,
                1 => Some(id),
                v => {
                    return Err(DecodeError::InvalidValue {
                        field: "register.has_id",
                        value: v as u64,
                    })
                }
            },
            data_addr,
            proof,
        })
    }
}

impl Prepare {
    fn write(&self, w: &mut Writer) {
        w.u64(self.run_id);
        w.u32(self.flps);
        w.u32(self.build_timeout_ms);
        w.u8(u8::from(self.crc));
        w.u8(self.size.kind);
        w.u64(self.size.a);
        w.u64(self.size.b);
        w.u64(self.size.c);
        w.u64(self.seed);
        w.u8(u8::from(self.retain));
        w.u8(self.schedule as u8);
        w.u64(self.rate_mhz);
        w.u64(self.tfs);
        w.u8(u8::from(self.pull));
    }

    fn read(r: &mut Reader) -> Result<Prepare, DecodeError> {
        let run_id = r.u64("prepare.run_id")?;
        let flps = r.u32("prepare.flps")?;
        let build_timeout_ms = r.u32("prepare.build_timeout_ms")?;
        let crc = r.flag("prepare.crc")?;
        let size = SizeWire {
            kind: r.u8("prepare.size.kind")?,
            a: r.u64("prepare.size.a")?,
            b: r.u64("prepare.size.b")?,
            c: r.u64("prepare.size.c")?,
        };
        let seed = r.u64("prepare.seed")?;
        let retain = r.flag("prepare.retain")?;
        Ok(Prepare {
            run_id,
            flps,
            build_timeout_ms,
            crc,
            size,
            seed,
            retain,
            schedule: Schedule::from_u8(r.u8("prepare.schedule")?)?,
            rate_mhz: r.u64("prepare.rate_mhz")?,
            tfs: r.u64("prepare.tfs")?,
            pull: r.flag("prepare.pull")?,
        })
    }
}

impl HeldStf {
    fn write(&self, w: &mut Writer) {
        w.u64(self.tf_id);
        w.u64(self.size);
        w.u8(u8::from(self.epn.is_some()));
        w.u32(self.epn.unwrap_or(0));
    }

    fn read(r: &mut Reader) -> Result<HeldStf, DecodeError> {
        let tf_id = r.u64("stfs_held.tf_id")?;
        let size = r.u64("stfs_held.size")?;
        let queued = r.flag("stfs_held.queued")?;
        let epn = r.u32("stfs_held.epn")?;
        Ok(HeldStf {
            tf_id,
            size,
            epn: queued.then_some(epn),
        })
    }
}

impl NodeStats {
    fn write(&self, w: &mut Writer) {
        w.u8(self.role as u8);
        w.u32(self.node_id);
        w.u32(self.counters.len() as u32);
        for (k, v) in &self.counters {
            w.string(k);
            w.u64(*v);
        }
    }

    fn read(r: &mut Reader) -> Result<NodeStats, DecodeError> {
        let role = Role::from_u8(r.u8("node_stats.role")?)?;
        let node_id = r.u32("node_stats.node_id")?;
        let counters = r.list("node_stats.count", 10, |r| {
            Ok((r.string("node_stats.name")?, r.u64("node_stats.value")?))
        })?;
        Ok(NodeStats {
            role,
            node_id,
            counters,
        })
    }
}

/// The body of a message of types 1-13 (joining, preparing, running, the TFs).
fn read_run_body(t: u8, r: &mut Reader) -> Result<Message, DecodeError> {
    Ok(match t {
        1 => Message::Register(Register::read(r)?),
        2 => Message::RegisterAck {
            node_id: r.u32("register_ack.node_id")?,
            run_id: r.u64("register_ack.run_id")?,
            resume: r.flag("register_ack.resume")?,
        },
        3 => Message::Reject {
            code: RejectCode::from_u8(r.u8("reject.code")?),
            reason: r.string("reject.reason")?,
        },
        4 => Message::Prepare(Prepare::read(r)?),
        5 => Message::EpnList(r.list("epn_list.count", 6, |r| {
            Ok(EpnEntry {
                epn_id: r.u32("epn_list.epn_id")?,
                addr: r.string("epn_list.addr")?,
            })
        })?),
        6 => Message::Ready {
            role: Role::from_u8(r.u8("ready.role")?)?,
            node_id: r.u32("ready.node_id")?,
            connected: r.u32("ready.connected")?,
        },
        7 => Message::RunStart {
            run_id: r.u64("run_start.run_id")?,
            elapsed_us: r.u64("run_start.elapsed_us")?,
        },
        8 => Message::Assign {
            tf_id: r.u64("assign.tf_id")?,
            epn_id: r.u32("assign.epn_id")?,
        },
        9 => read_stf(r)?,
        10 => Message::TfReport(read_report(r)?),
        11 => Message::StfDropped {
            tf_id: r.u64("stf_dropped.tf_id")?,
            flp_id: r.u32("stf_dropped.flp_id")?,
            reason: Reason::from_u8(r.u8("stf_dropped.reason")?)?,
        },
        12 => Message::RunStop {
            run_id: r.u64("run_stop.run_id")?,
        },
        13 => Message::NodeStats(NodeStats::read(r)?),
        t => return Err(DecodeError::UnknownType(t)),
    })
}

/// The body of a message of types 14-27 (data admission, loads, run state, on-data,
/// take-over, pull).
fn read_extension_body(t: u8, r: &mut Reader) -> Result<Message, DecodeError> {
    Ok(match t {
        14 => Message::DataHello {
            run_id: r.u64("data_hello.run_id")?,
            flp_id: r.u32("data_hello.flp_id")?,
            proof: r.array("data_hello.proof")?,
        },
        15 => Message::DataHelloAck {
            epn_id: r.u32("data_hello_ack.epn_id")?,
        },
        16 => Message::Abandon {
            tf_id: r.u64("abandon.tf_id")?,
            reason: Reason::from_u8(r.u8("abandon.reason")?)?,
        },
        17 => Message::Release {
            tf_id: r.u64("release.tf_id")?,
        },
        18 => Message::LoadReport {
            free_bytes: r.u64("load_report.free_bytes")?,
            building: r.u32("load_report.building")?,
        },
        19 => Message::EpnReachable {
            epn_id: r.u32("epn_reachable.epn_id")?,
            ok: r.flag("epn_reachable.ok")?,
        },
        20 => Message::Challenge {
            nonce: r.array("challenge.nonce")?,
        },
        21 => Message::RunState {
            state: RunState::from_u8(r.u8("run_state.state")?)?,
            run_number: r.u64("run_state.run_number")?,
        },
        22 => Message::StfAnnounce(r.list("stf_announce.count", 16, |r| {
            Ok(StfInfo {
                tf_id: r.u64("stf_announce.tf_id")?,
                size: r.u64("stf_announce.size")?,
            })
        })?),
        23 => Message::SourceEnded {
            ok: r.flag("source_ended.ok")?,
            detail: r.string("source_ended.detail")?,
        },
        24 => Message::StfsHeld(r.list("stfs_held.count", 21, HeldStf::read)?),
        25 => Message::TfsHeld {
            building: r.list("tfs_held.building", 8, |r| r.u64("tfs_held.tf_id"))?,
            reports: r.list("tfs_held.reports", 22, read_report)?,
        },
        26 => Message::StfSent {
            tf_id: r.u64("stf_sent.tf_id")?,
            epn_id: r.u32("stf_sent.epn_id")?,
        },
        27 => Message::StfReceived {
            tf_id: r.u64("stf_received.tf_id")?,
            flp_id: r.u32("stf_received.flp_id")?,
        },
        t => return Err(DecodeError::UnknownType(t)),
    })
}

/// An STF frame's body: its header, then exactly the payload it declares.
fn read_stf(r: &mut Reader) -> Result<Message, DecodeError> {
    let h = r.rest();
    if h.len() < STF_HEADER_LEN {
        return Err(DecodeError::Truncated {
            what: "STF header",
            need: STF_HEADER_LEN,
            have: h.len(),
        });
    }
    let header = StfHeader::decode(&h[..STF_HEADER_LEN])?;
    let payload = &h[STF_HEADER_LEN..];
    if payload.len() != header.payload_len as usize {
        return Err(DecodeError::PayloadLength {
            declared: header.payload_len,
            actual: payload.len(),
        });
    }
    Ok(Message::Stf {
        header,
        payload: Bytes::copy_from_slice(payload),
    })
}

fn read_report(r: &mut Reader) -> Result<TfReport, DecodeError> {
    Ok(TfReport {
        tf_id: r.u64("tf_report.tf_id")?,
        status: TfStatus::from_u8(r.u8("tf_report.status")?)?,
        reason: Reason::from_u8(r.u8("tf_report.reason")?)?,
        stfs: r.u32("tf_report.stfs")?,
        bytes: r.u64("tf_report.bytes")?,
    })
}

impl Writer {
    fn report(&mut self, t: &TfReport) {
        self.u64(t.tf_id);
        self.u8(t.status as u8);
        self.u8(t.reason as u8);
        self.u32(t.stfs);
        self.u64(t.bytes);
    }
}
