//! `fanin ctl`: run control of a long-lived ICN (`fanin icn --session`) over its HTTP API:
//! configure, start, pause, resume, stop, status, exit; one line each, or `--json`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use fanin_node::auth::Secret;
use fanin_node::runctl::Command;
use serde_json::Value;

#[derive(Args)]
pub struct CtlArgs {
    /// The ICN's HTTP address (`fanin icn --metrics`).
    #[arg(long)]
    pub icn: SocketAddr,
    /// The session's run secret (default: $FANIN_SECRET); the API refuses others.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Print the ICN's JSON answer instead of one line.
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: CtlCmd,
}

#[derive(Subcommand)]
pub enum CtlCmd {
    /// Send a run's parameters (an experiment file or a config.toml): IDLE or
    /// CONFIGURED -> CONFIGURED.
    Configure {
        file: PathBuf,
        /// The run's number (default: one above the last).
        #[arg(long)]
        run: Option<u64>,
    },
    /// CONFIGURED -> RUNNING, once every node of the run is ready (waits that long).
    Start {
        #[arg(long, default_value_t = 60.0, value_parser = wait_secs)]
        wait_s: f64,
    },
    /// RUNNING -> PAUSED: no TF is issued until resume.
    Pause,
    /// PAUSED -> RUNNING.
    Resume,
    /// RUNNING or PAUSED -> CONFIGURED: drain, write the run's results (waits for them).
    Stop {
        #[arg(long, default_value_t = 600.0, value_parser = wait_secs)]
        wait_s: f64,
    },
    /// The state, the run and its counts.
    Status,
    /// IDLE or CONFIGURED -> EXIT: every long-lived node exits.
    Exit,
    /// The live page's address, with the run-control token for its buttons.
    Url,
}

/// Runs one `fanin ctl` command; returns the line (or JSON) to print.
pub fn run(a: &CtlArgs) -> anyhow::Result<String> {
    let secret = Secret::load(a.secret_file.as_deref())?;
    let api = Api {
        icn: a.icn,
        token: (!secret.is_empty()).then(|| secret.ctl_token()),
    };
    let answer = match &a.cmd {
        CtlCmd::Configure { file, run } => {
            let body = std::fs::read(file).with_context(|| format!("{}", file.display()))?;
            let path = match run {
                Some(n) => format!("{}?run={n}", Command::Configure.path()),
                None => Command::Configure.path().to_string(),
            };
            api.command(&path, &body)?
        }
        CtlCmd::Start { wait_s } => api.start(*wait_s)?,
        CtlCmd::Pause => api.command(Command::Pause.path(), &[])?,
        CtlCmd::Resume => api.command(Command::Resume.path(), &[])?,
        CtlCmd::Stop { wait_s } => api.stop(*wait_s)?,
        CtlCmd::Exit => api.command(Command::Exit.path(), &[])?,
        CtlCmd::Status => {
            let st = api.status()?;
            return Ok(match a.json {
                true => st.to_string(),
                false => status_line(&st),
            });
        }
        CtlCmd::Url => {
            let token = api.token.as_deref().map(|t| format!("#token={t}"));
            return Ok(format!("http://{}/{}", a.icn, token.unwrap_or_default()));
        }
    };
    Ok(match a.json {
        true => answer.to_string(),
        false => answer["message"].as_str().unwrap_or_default().to_string(),
    })
}

/// The ICN's HTTP API, with the token of the run secret.
struct Api {
    icn: SocketAddr,
    token: Option<String>,
}

impl Api {
    /// A command: its JSON answer, or an error with the ICN's reason.
    fn command(&self, path: &str, body: &[u8]) -> anyhow::Result<Value> {
        let (code, v) = self.call("POST", path, body)?;
        let what = path.trim_start_matches("/ctl/");
        anyhow::ensure!(
            code == 200,
            "ICN {}: {what} refused: {}",
            self.icn,
            v["error"].as_str().unwrap_or("no reason given")
        );
        Ok(v)
    }

    fn status(&self) -> anyhow::Result<Value> {
        let (code, v) = self.call("GET", "/status", &[])?;
        anyhow::ensure!(code == 200, "ICN {}: status: HTTP {code}", self.icn);
        Ok(v)
    }

    /// START, tried again while the run's nodes are not all ready, for `wait_s`.
    fn start(&self, wait_s: f64) -> anyhow::Result<Value> {
        let until = Instant::now() + Duration::from_secs_f64(wait_s.max(0.0));
        loop {
            match self.command(Command::Start.path(), &[]) {
                Err(e) if e.to_string().contains("not ready") && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                r => return r,
            }
        }
    }

    /// STOP, then wait until the run's results are written; the answer names them. A
    /// run that already ended by itself (the session is CONFIGURED again) is no error:
    /// the answer names that run's results, so a script's stop after a timed run works.
    fn stop(&self, wait_s: f64) -> anyhow::Result<Value> {
        let st = self.status()?;
        let n = st["run_number"].as_u64().unwrap_or(0);
        if let Some(done) = self.ended_already(&st) {
            return done;
        }
        if let Err(e) = self.command(Command::Stop.path(), &[]) {
            // The run may have ended between the status and the STOP.
            return self.ended_already(&self.status()?).unwrap_or(Err(e));
        }
        let until = Instant::now() + Duration::from_secs_f64(wait_s.max(0.0));
        loop {
            let st = self.status()?;
            if st["last_run"]["run_number"].as_u64() == Some(n) {
                return self.ended(&st["last_run"], "");
            }
            anyhow::ensure!(
                Instant::now() < until,
                "ICN {}: run {n} did not end within {wait_s} s (state {})",
                self.icn,
                st["state"]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The answer for the run just before the configured one when it ended by itself
    /// (the session is CONFIGURED again with the next number), else None.
    fn ended_already(&self, st: &Value) -> Option<anyhow::Result<Value>> {
        let last = &st["last_run"];
        let next = last["run_number"].as_u64().map(|n| n + 1);
        let after_it = st["state"] == "CONFIGURED" && next == st["run_number"].as_u64();
        after_it.then(|| self.ended(last, " (it had ended already)"))
    }

    /// The answer for a run that ended (`last` from the status): its counts and where
    /// its results are, or its error.
    fn ended(&self, last: &Value, note: &str) -> anyhow::Result<Value> {
        let n = last["run_number"].as_u64().unwrap_or(0);
        if let Some(e) = last["error"].as_str() {
            anyhow::bail!("ICN {}: run {n} ended, but: {e}", self.icn);
        }
        let line = format!(
            "run {n} ended{note}: issued {} completed {} incomplete {} dropped {} invariant_ok {}; results in {}",
            last["issued"], last["completed"], last["incomplete"], last["dropped"],
            last["invariant_ok"], last["dir"].as_str().unwrap_or("?")
        );
        // A broken accounting invariant fails the command, as it fails `fanin icn`.
        anyhow::ensure!(last["invariant_ok"] != false, "ICN {}: {line}", self.icn);
        Ok(serde_json::json!({"ok": true, "message": line, "run": last}))
    }

    /// One request: (status code, JSON body).
    fn call(&self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<(u16, Value)> {
        let token = self.token.as_deref();
        let a = crate::http::request("ICN", self.icn, (method, path), token, body)?;
        let v = serde_json::from_str(&a.body).with_context(|| {
            let text = a.body.trim();
            format!(
                "ICN at {}: {path} answered HTTP {}: {text}",
                self.icn, a.code
            )
        })?;
        Ok((a.code, v))
    }
}

/// `RUNNING run 5 (running): issued 1200 completed 1190 ... 200.0 TF/s`.
fn status_line(st: &Value) -> String {
    let mut line = format!(
        "{} run {}",
        st["state"].as_str().unwrap_or("?"),
        st["run_number"]
    );
    if let Some(p) = st["phase"].as_str() {
        line += &format!(
            " ({p}): issued {} completed {} incomplete {} dropped {} in flight {}, {:.1} TF/s",
            st["issued"],
            st["completed"],
            st["incomplete"],
            st["dropped"],
            st["in_flight"],
            st["rate_hz"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(n) = st["last_run"]["run_number"].as_u64() {
        line += &format!(
            "; last run {n} in {}",
            st["last_run"]["dir"].as_str().unwrap_or("?")
        );
    }
    line
}

/// `--wait-s`: seconds to wait, at most a day.
fn wait_secs(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(format!("`{v}` is not within 0..=86400 seconds")),
    }
}
