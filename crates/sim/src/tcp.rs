//! TCP NewReno, byte-counted: slow start, congestion avoidance, fast retransmit and
//! recovery (RFC 6582 partial ACKs), RFC 6298 RTO with a configurable minimum. Pure.

use std::collections::BTreeMap;

use crate::engine::{Time, MS, SEC};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TcpParams {
    /// Payload bytes per segment.
    pub mss: u32,
    /// Lower bound of the retransmission time-out.
    pub min_rto: Time,
    /// RTO before the first RTT sample.
    pub initial_rto: Time,
    pub max_rto: Time,
    /// Initial congestion window in segments.
    pub initial_cwnd: u32,
    /// RFC 5681 §4.1: after more than an RTO without sending, restart from the
    /// initial window (NS-2's `slow_start_restart_`, Linux's `tcp_slow_start_after_idle`).
    pub slow_start_restart: bool,
}

impl Default for TcpParams {
    fn default() -> Self {
        TcpParams {
            mss: 1460,
            min_rto: 200 * MS,
            initial_rto: SEC,
            max_rto: 60 * SEC,
            initial_cwnd: 2,
            slow_start_restart: true,
        }
    }
}

/// What the sender asks the network to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Send bytes [seq, seq + len).
    Send { seq: u64, len: u32, retx: bool },
    /// (Re)arm the retransmission timer to fire at this time.
    Arm(Time),
    /// No data outstanding: stop the timer.
    Disarm,
}

#[derive(Debug, Clone)]
pub struct Sender {
    p: TcpParams,
    /// Bytes the application has written.
    app_end: u64,
    snd_una: u64,
    snd_nxt: u64,
    /// Highest byte ever sent (snd_nxt goes back after a time-out).
    snd_max: u64,
    cwnd: f64,
    ssthresh: f64,
    dupacks: u32,
    /// NewReno: recovery ends when this is acknowledged.
    recover: u64,
    in_recovery: bool,
    srtt: Option<f64>,
    rttvar: f64,
    rto: Time,
    /// Segment timed for an RTT sample: (its end, sent at).
    timing: Option<(u64, Time)>,
    /// When a segment was last sent.
    last_send: Option<Time>,
    pub segments_sent: u64,
    pub segments_retransmitted: u64,
    pub timeouts: u64,
}

impl Sender {
    pub fn new(p: TcpParams) -> Self {
        Sender {
            p,
            app_end: 0,
            snd_una: 0,
            snd_nxt: 0,
            snd_max: 0,
            cwnd: (p.initial_cwnd * p.mss) as f64,
            ssthresh: f64::MAX,
            dupacks: 0,
            recover: 0,
            in_recovery: false,
            srtt: None,
            rttvar: 0.0,
            rto: p.initial_rto,
            timing: None,
            last_send: None,
            segments_sent: 0,
            segments_retransmitted: 0,
            timeouts: 0,
        }
    }

    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }
    pub fn rto(&self) -> Time {
        self.rto
    }
    pub fn acked(&self) -> u64 {
        self.snd_una
    }
    fn mss(&self) -> f64 {
        self.p.mss as f64
    }
    fn flight(&self) -> u64 {
        self.snd_max - self.snd_una
    }

    /// The application writes `bytes` more.
    pub fn write(&mut self, bytes: u64, now: Time, out: &mut Vec<Act>) {
        let idle = self.snd_una == self.snd_max;
        if self.p.slow_start_restart && idle && self.last_send.is_some_and(|t| now - t > self.rto) {
            let iw = (self.p.initial_cwnd * self.p.mss) as f64;
            self.cwnd = self.cwnd.min(iw);
        }
        self.app_end += bytes;
        self.pump(now, out);
    }

    fn emit(&mut self, seq: u64, now: Time, out: &mut Vec<Act>) -> u64 {
        let len = (self.app_end - seq).min(self.p.mss as u64) as u32;
        let retx = seq < self.snd_max;
        if retx {
            self.segments_retransmitted += 1;
            // Karn: no RTT sample from a segment that may have been sent twice.
            if self.timing.is_some_and(|(end, _)| end > seq) {
                self.timing = None;
            }
        } else if self.timing.is_none() {
            self.timing = Some((seq + len as u64, now));
        }
        self.segments_sent += 1;
        self.last_send = Some(now);
        out.push(Act::Send { seq, len, retx });
        len as u64
    }

    /// Sends what the window allows.
    fn pump(&mut self, now: Time, out: &mut Vec<Act>) {
        let was_idle = self.snd_una == self.snd_max;
        let mut sent = false;
        while self.snd_nxt < self.app_end {
            // RFC 5681: never beyond snd_una + cwnd.
            let in_window = (self.snd_nxt - self.snd_una) as f64;
            let len = (self.app_end - self.snd_nxt).min(self.p.mss as u64) as f64;
            if in_window + len > self.cwnd {
                break;
            }
            let seq = self.snd_nxt;
            let len = self.emit(seq, now, out);
            self.snd_nxt += len;
            self.snd_max = self.snd_max.max(self.snd_nxt);
            sent = true;
        }
        if sent && was_idle {
            out.push(Act::Arm(now + self.rto));
        }
    }

    /// A cumulative acknowledgement up to `ack` arrived.
    pub fn on_ack(&mut self, ack: u64, now: Time, out: &mut Vec<Act>) {
        if ack > self.snd_max {
            return; // acknowledges data never sent: ignore
        }
        if ack > self.snd_una {
            let newly = (ack - self.snd_una) as f64;
            if let Some((end, at)) = self.timing {
                if ack >= end {
                    self.sample_rtt(now - at);
                    self.timing = None;
                }
            }
            self.snd_una = ack;
            self.snd_nxt = self.snd_nxt.max(ack);
            if self.in_recovery {
                if ack >= self.recover {
                    // Full acknowledgement: leave recovery, deflate the window.
                    self.in_recovery = false;
                    self.cwnd = self.ssthresh;
                } else {
                    // Partial acknowledgement: the next hole is lost too.
                    self.emit(ack, now, out);
                    self.cwnd = (self.cwnd - newly + self.mss()).max(self.mss());
                }
            } else if self.cwnd < self.ssthresh {
                self.cwnd += newly.min(self.mss());
            } else {
                self.cwnd += self.mss() * self.mss() / self.cwnd;
            }
            self.dupacks = 0;
            if self.snd_una == self.snd_max {
                out.push(Act::Disarm);
            } else {
                out.push(Act::Arm(now + self.rto));
            }
            self.pump(now, out);
        } else if ack == self.snd_una && self.flight() > 0 {
            self.dupacks += 1;
            if self.in_recovery {
                self.cwnd += self.mss();
                self.pump(now, out);
            } else if self.dupacks == 3 && ack >= self.recover {
                self.ssthresh = (self.flight() as f64 / 2.0).max(2.0 * self.mss());
                self.recover = self.snd_max;
                self.in_recovery = true;
                self.emit(ack, now, out);
                self.cwnd = self.ssthresh + 3.0 * self.mss();
                out.push(Act::Arm(now + self.rto));
            }
        }
    }

    fn sample_rtt(&mut self, r: Time) {
        let r = r as f64;
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2.0;
            }
            Some(s) => {
                self.rttvar = 0.75 * self.rttvar + 0.25 * (s - r).abs();
                self.srtt = Some(0.875 * s + 0.125 * r);
            }
        }
        let rto = self.srtt.expect("set above") + 4.0 * self.rttvar;
        self.rto = (rto as Time).clamp(self.p.min_rto, self.p.max_rto);
    }

    /// The retransmission timer fired.
    pub fn on_timeout(&mut self, now: Time, out: &mut Vec<Act>) {
        if self.snd_una == self.snd_max {
            return;
        }
        self.timeouts += 1;
        self.ssthresh = (self.flight() as f64 / 2.0).max(2.0 * self.mss());
        self.cwnd = self.mss();
        self.in_recovery = false;
        self.recover = self.snd_max;
        self.dupacks = 0;
        self.timing = None;
        self.rto = (self.rto * 2).min(self.p.max_rto);
        // Go back: resend from the first unacknowledged byte.
        self.snd_nxt = self.snd_una;
        let len = self.emit(self.snd_una, now, out);
        self.snd_nxt += len;
        out.push(Act::Arm(now + self.rto));
    }
}

/// The receiving end: cumulative ACKs, out-of-order data kept.
#[derive(Debug, Default, Clone)]
pub struct Receiver {
    rcv_nxt: u64,
    /// Out-of-order ranges start -> end.
    ooo: BTreeMap<u64, u64>,
}

impl Receiver {
    /// Data [seq, seq+len) arrived; returns the cumulative ACK to send.
    pub fn on_data(&mut self, seq: u64, len: u32) -> u64 {
        let end = seq + len as u64;
        if end > self.rcv_nxt {
            if seq <= self.rcv_nxt {
                self.rcv_nxt = end;
            } else {
                let e = self.ooo.entry(seq).or_insert(end);
                *e = (*e).max(end);
            }
            while let Some((&s, &e)) = self.ooo.first_key_value() {
                if s > self.rcv_nxt {
                    break;
                }
                self.ooo.pop_first();
                self.rcv_nxt = self.rcv_nxt.max(e);
            }
        }
        self.rcv_nxt
    }

    /// Bytes delivered in order so far.
    pub fn delivered(&self) -> u64 {
        self.rcv_nxt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(out: &[Act]) -> Vec<(u64, u32, bool)> {
        out.iter()
            .filter_map(|a| match *a {
                Act::Send { seq, len, retx } => Some((seq, len, retx)),
                _ => None,
            })
            .collect()
    }

    fn p() -> TcpParams {
        TcpParams {
            mss: 100,
            ..TcpParams::default()
        }
    }

    #[test]
    fn slow_start_doubles_the_window_per_round_trip() {
        let mut s = Sender::new(p());
        let mut out = vec![];
        s.write(10_000, 0, &mut out);
        assert_eq!(sends(&out).len(), 2, "initial window of 2 segments");
        out.clear();
        s.on_ack(100, MS, &mut out);
        s.on_ack(200, MS, &mut out);
        assert_eq!(sends(&out).len(), 4);
        assert_eq!(s.cwnd(), 400.0);
    }

    #[test]
    fn three_duplicate_acks_retransmit_and_halve() {
        let mut s = Sender::new(p());
        let mut out = vec![];
        s.write(100_000, 0, &mut out);
        // Grow the window to 8 segments.
        for a in 1..=6 {
            s.on_ack(a * 100, MS, &mut out);
        }
        assert_eq!(s.cwnd(), 800.0);
        out.clear();
        // Segment at 600 is lost: three duplicate ACKs of 600.
        for _ in 0..3 {
            s.on_ack(600, 2 * MS, &mut out);
        }
        assert_eq!(sends(&out), vec![(600, 100, true)]);
        assert_eq!(s.segments_retransmitted, 1);
        // A full ACK ends recovery with cwnd = ssthresh = flight / 2.
        let flight_half = s.ssthresh;
        out.clear();
        s.on_ack(s.snd_max, 3 * MS, &mut out);
        assert!(!s.in_recovery);
        assert_eq!(s.cwnd(), flight_half);
    }

    #[test]
    fn a_partial_ack_retransmits_the_next_hole() {
        let mut s = Sender::new(p());
        let mut out = vec![];
        s.write(100_000, 0, &mut out);
        for a in 1..=6 {
            s.on_ack(a * 100, MS, &mut out);
        }
        for _ in 0..3 {
            s.on_ack(600, 2 * MS, &mut out);
        }
        out.clear();
        s.on_ack(800, 3 * MS, &mut out); // 600 repaired, 800 lost as well
        assert_eq!(sends(&out)[0], (800, 100, true));
        assert!(s.in_recovery);
    }

    #[test]
    fn time_out_goes_back_to_one_segment_and_backs_off() {
        let mut s = Sender::new(p());
        let mut out = vec![];
        s.write(1000, 0, &mut out);
        let rto = s.rto();
        out.clear();
        s.on_timeout(rto, &mut out);
        assert_eq!(sends(&out), vec![(0, 100, true)]);
        assert_eq!(s.cwnd(), 100.0);
        assert_eq!(s.rto(), 2 * rto);
        assert_eq!(out.last(), Some(&Act::Arm(rto + 2 * rto)));
    }

    #[test]
    fn rto_follows_rfc6298_with_its_minimum() {
        let mut s = Sender::new(TcpParams {
            mss: 100,
            min_rto: 200 * crate::engine::US,
            ..TcpParams::default()
        });
        let mut out = vec![];
        s.write(100, 0, &mut out);
        s.on_ack(100, 100 * crate::engine::US, &mut out);
        // srtt 100 us, rttvar 50 us: rto = 300 us.
        assert_eq!(s.rto(), 300 * crate::engine::US);
        let mut s = Sender::new(p()); // min 200 ms
        s.write(100, 0, &mut out);
        s.on_ack(100, 100 * crate::engine::US, &mut out);
        assert_eq!(s.rto(), 200 * MS);
    }

    #[test]
    fn an_idle_connection_restarts_from_the_initial_window() {
        let mut s = Sender::new(p());
        let mut out = vec![];
        s.write(1000, 0, &mut out);
        for a in 1..=10 {
            s.on_ack(a * 100, MS, &mut out);
        }
        assert!(s.cwnd() > 800.0);
        // Idle for less than an RTO: the window stays.
        s.write(100, MS + s.rto() / 2, &mut out);
        assert!(s.cwnd() > 800.0);
        s.on_ack(1100, 2 * MS + s.rto() / 2, &mut out);
        // Idle for more than an RTO: back to the initial window.
        let later = 10 * SEC;
        s.write(100, later, &mut out);
        assert_eq!(s.cwnd(), 200.0);
        let mut s2 = Sender::new(TcpParams {
            slow_start_restart: false,
            ..p()
        });
        s2.write(1000, 0, &mut out);
        for a in 1..=10 {
            s2.on_ack(a * 100, MS, &mut out);
        }
        let w = s2.cwnd();
        s2.write(100, later, &mut out);
        assert_eq!(s2.cwnd(), w);
    }

    #[test]
    fn receiver_acks_cumulatively_and_fills_holes() {
        let mut r = Receiver::default();
        assert_eq!(r.on_data(0, 100), 100);
        assert_eq!(r.on_data(200, 100), 100);
        assert_eq!(r.on_data(300, 100), 100);
        assert_eq!(r.on_data(100, 100), 400);
        assert_eq!(r.on_data(0, 100), 400, "duplicate");
        assert_eq!(r.delivered(), 400);
    }
}
