//! What the ICN prints on stdout for its launcher (`fanin icn --progress`), parsed in
//! one place: its addresses, the run's start, and progress counts.

/// One line of the ICN's stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IcnLine {
    /// `listening control=ADDR metrics=ADDR|-`: the ICN is up (a standby: elected).
    Listening {
        control: String,
        metrics: Option<String>,
    },
    /// `STARTED UNIX_US`: the run started at this wall-clock time.
    Started { unix_us: u64 },
    /// `PROGRESS ISSUED ENDED TOTAL`: TFs issued and ended so far (TOTAL 0: unknown).
    Progress { issued: u64, ended: u64, total: u64 },
    /// Anything else (a table, a message).
    Other,
}

impl IcnLine {
    pub fn parse(line: &str) -> IcnLine {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["listening", rest @ ..] => {
                let field = |k: &str| {
                    rest.iter()
                        .find_map(|x| x.strip_prefix(k))
                        .filter(|v| !v.is_empty() && *v != "-")
                        .map(str::to_string)
                };
                match field("control=") {
                    Some(control) => IcnLine::Listening {
                        control,
                        metrics: field("metrics="),
                    },
                    None => IcnLine::Other,
                }
            }
            ["STARTED", t] => t
                .parse()
                .map(|unix_us| IcnLine::Started { unix_us })
                .unwrap_or(IcnLine::Other),
            ["PROGRESS", i, e, t] => match (i.parse(), e.parse(), t.parse()) {
                (Ok(issued), Ok(ended), Ok(total)) => IcnLine::Progress {
                    issued,
                    ended,
                    total,
                },
                _ => IcnLine::Other,
            },
            _ => IcnLine::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_kind_parses() {
        assert_eq!(
            IcnLine::parse("listening control=127.0.0.1:7000 metrics=-"),
            IcnLine::Listening {
                control: "127.0.0.1:7000".into(),
                metrics: None
            }
        );
        assert_eq!(
            IcnLine::parse("listening control=[::1]:1 metrics=127.0.0.1:9"),
            IcnLine::Listening {
                control: "[::1]:1".into(),
                metrics: Some("127.0.0.1:9".into())
            }
        );
        assert_eq!(
            IcnLine::parse("STARTED 17"),
            IcnLine::Started { unix_us: 17 }
        );
        assert_eq!(
            IcnLine::parse("PROGRESS 10 8 100"),
            IcnLine::Progress {
                issued: 10,
                ended: 8,
                total: 100
            }
        );
    }

    #[test]
    fn malformed_lines_are_other() {
        for l in [
            "",
            "STARTED x",
            "PROGRESS 1 2",
            "PROGRESS a b c",
            "listening metrics=1",
        ] {
            assert_eq!(IcnLine::parse(l), IcnLine::Other, "{l:?}");
        }
    }
}
