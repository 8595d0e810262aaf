//! Run control: the one state machine of every long-lived node (IDLE -> CONFIGURED ->
//! RUNNING <-> PAUSED -> (stop) CONFIGURED -> ... -> EXIT) and which commands it takes.

pub use fanin_proto::RunState;

/// What run control asks of the ICN (`fanin ctl`, the HTTP API, the live page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// New run parameters (the body: an experiment file or a config.toml).
    Configure,
    Start,
    Pause,
    Resume,
    /// End the run: stop issuing, drain, write its results; back to CONFIGURED.
    Stop,
    /// End the session: every long-lived node exits.
    Exit,
}

impl Command {
    pub const ALL: [Command; 6] = [
        Command::Configure,
        Command::Start,
        Command::Pause,
        Command::Resume,
        Command::Stop,
        Command::Exit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Command::Configure => "configure",
            Command::Start => "start",
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Stop => "stop",
            Command::Exit => "exit",
        }
    }

    /// Its endpoint on the ICN's HTTP port (`POST`).
    pub fn path(self) -> &'static str {
        match self {
            Command::Configure => "/ctl/configure",
            Command::Start => "/ctl/start",
            Command::Pause => "/ctl/pause",
            Command::Resume => "/ctl/resume",
            Command::Stop => "/ctl/stop",
            Command::Exit => "/ctl/exit",
        }
    }

    pub fn parse(s: &str) -> Option<Command> {
        Command::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// The state `cmd` leads to from `state`, or why it is refused (one line).
pub fn next(state: RunState, cmd: Command) -> Result<RunState, String> {
    use Command as C;
    use RunState as S;
    let to = match (state, cmd) {
        (S::Idle | S::Configured, C::Configure) => S::Configured,
        (S::Configured, C::Start) => S::Running,
        (S::Running, C::Pause) => S::Paused,
        (S::Paused, C::Resume) => S::Running,
        (S::Running | S::Paused, C::Stop) => S::Configured,
        (S::Idle | S::Configured, C::Exit) => S::Exit,
        (S::Idle, C::Start) => return Err("no run is configured: configure first".into()),
        (S::Running | S::Paused, C::Configure | C::Exit) => {
            return Err(format!("a run is {}: stop it first", state.name()))
        }
        (S::Exit, _) => return Err("the session has ended".into()),
        _ => {
            return Err(format!(
                "{} is not possible in state {}",
                cmd.name(),
                state.name()
            ))
        }
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (state, command) pair: the legal ones lead where the diagram says, every
    /// other one is refused with a reason and changes nothing.
    #[test]
    fn the_transition_table() {
        use Command as C;
        use RunState as S;
        let legal = [
            (S::Idle, C::Configure, S::Configured),
            (S::Configured, C::Configure, S::Configured),
            (S::Configured, C::Start, S::Running),
            (S::Running, C::Pause, S::Paused),
            (S::Paused, C::Resume, S::Running),
            (S::Running, C::Stop, S::Configured),
            (S::Paused, C::Stop, S::Configured),
            (S::Idle, C::Exit, S::Exit),
            (S::Configured, C::Exit, S::Exit),
        ];
        for s in RunState::ALL {
            for c in Command::ALL {
                let want = legal.iter().find(|(a, b, _)| (*a, *b) == (s, c));
                match (next(s, c), want) {
                    (Ok(to), Some((_, _, w))) => assert_eq!(to, *w, "{s:?} {c:?}"),
                    (Err(why), None) => {
                        assert!(!why.is_empty() && !why.contains('\n'), "{s:?} {c:?}")
                    }
                    (got, want) => panic!("{s:?} {c:?}: got {got:?}, want {want:?}"),
                }
            }
        }
        assert_eq!(
            next(S::Running, C::Start).unwrap_err(),
            "start is not possible in state RUNNING"
        );
    }

    #[test]
    fn commands_parse_by_name() {
        for c in Command::ALL {
            assert_eq!(Command::parse(c.name()), Some(c));
        }
        assert_eq!(Command::parse("launch"), None);
    }
}
