//! The membership registry's shared vocabulary: roles, members, membership snapshots and
//! their `diff`, the registry error type and the `zk://HOST:PORT[,HOST:PORT]/PATH` URL parser.
//!
//! Backends: [`zk::ZkRegistry`] (ZooKeeper). [`zk_server::ZkServer`] starts a private
//! ZooKeeper server for tests (std only; nothing of it runs unless a test calls it).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

pub mod runtime;
pub mod zk;
pub mod zk_server;

pub use zk::{Leadership, ZkRegistry};

/// The role a registered node plays in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Flp,
    Epn,
}

impl Role {
    /// Both roles, in the order snapshots and diffs list them.
    pub const ALL: [Role; 2] = [Role::Epn, Role::Flp];

    /// The name of the role's directory under `/PATH/<run>/` (`epn` or `flp`).
    pub fn dir(self) -> &'static str {
        match self {
            Role::Flp => "flp",
            Role::Epn => "epn",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Flp => "FLP",
            Role::Epn => "EPN",
        })
    }
}

/// A node as it registers itself: role, id within the role, and the address it is
/// reached at (control or data address; stored as the znode's data, UTF-8).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    pub role: Role,
    pub id: u32,
    pub addr: String,
}

impl Member {
    pub fn new(role: Role, id: u32, addr: impl Into<String>) -> Member {
        Member {
            role,
            id,
            addr: addr.into(),
        }
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} at {}", self.role, self.id, self.addr)
    }
}

/// One registered node as seen by a watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The address stored in the node's znode.
    pub addr: String,
    /// Which registration this is: the ZooKeeper zxid that created the znode. A node that
    /// died and registered again under the same id (even with the same address) has a new
    /// incarnation, so a snapshot tells a restarted node from one that never left.
    pub incarnation: i64,
}

/// A full snapshot of a run's registered members (both roles).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    pub epns: BTreeMap<u32, Registered>,
    pub flps: BTreeMap<u32, Registered>,
}

impl Membership {
    /// The registered members of one role, by id.
    pub fn of(&self, role: Role) -> &BTreeMap<u32, Registered> {
        match role {
            Role::Epn => &self.epns,
            Role::Flp => &self.flps,
        }
    }

    /// Mutable access to one role's members (for backends and tests).
    pub fn of_mut(&mut self, role: Role) -> &mut BTreeMap<u32, Registered> {
        match role {
            Role::Epn => &mut self.epns,
            Role::Flp => &mut self.flps,
        }
    }

    /// The address of a registered member, if it is registered.
    pub fn addr(&self, role: Role, id: u32) -> Option<&str> {
        self.of(role).get(&id).map(|r| r.addr.as_str())
    }

    /// Every registered member, EPNs first, by id.
    pub fn members(&self) -> impl Iterator<Item = Member> + '_ {
        Role::ALL.into_iter().flat_map(move |role| {
            self.of(role)
                .iter()
                .map(move |(&id, r)| Member::new(role, id, r.addr.clone()))
        })
    }

    pub fn is_empty(&self) -> bool {
        self.epns.is_empty() && self.flps.is_empty()
    }
}

/// One membership change between two snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Joined(Member),
    Left(Member),
}

/// The changes from `old` to `new`: every `Left` first, then every `Joined` (EPNs before
/// FLPs, by id within each). A member present in both with a different address or a new
/// incarnation (it restarted, or left and joined again between two snapshots) is reported
/// as `Left` (old address) and `Joined` (new address).
pub fn diff(old: &Membership, new: &Membership) -> Vec<Change> {
    let mut left = Vec::new();
    let mut joined = Vec::new();
    for role in Role::ALL {
        let (before, after) = (old.of(role), new.of(role));
        for (&id, was) in before {
            match after.get(&id) {
                Some(now) if now == was => {}
                _ => left.push(Change::Left(Member::new(role, id, was.addr.clone()))),
            }
        }
        for (&id, now) in after {
            match before.get(&id) {
                Some(was) if was == now => {}
                _ => joined.push(Change::Joined(Member::new(role, id, now.addr.clone()))),
            }
        }
    }
    left.extend(joined);
    left
}

/// Errors of the registry. Every message is one line naming the server(s) and znode path
/// (or the URL part) at fault.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry URL `{url}`: {reason}")]
    Url { url: String, reason: String },
    #[error("invalid {what} `{value}`: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("ZooKeeper {servers}: cannot connect: {reason}")]
    Connect { servers: String, reason: String },
    #[error("ZooKeeper {servers}: {op} {path}: {source}")]
    Zk {
        servers: String,
        op: &'static str,
        path: String,
        #[source]
        source: zookeeper_client::Error,
    },
    #[error("ZooKeeper {servers}: {path} is held by live session {owner:#x} (address `{addr}`) for more than {waited_s:.1} s: is another node running with this id?")]
    IdTaken {
        servers: String,
        path: String,
        owner: i64,
        addr: String,
        waited_s: f64,
    },
    #[error("ZooKeeper {servers}: {path} holds `{value}`, not a TF id")]
    Corrupt {
        servers: String,
        path: String,
        value: String,
    },
    #[error("ZooKeeper {servers}: {what}")]
    Other { servers: String, what: String },
    #[error("ZooKeeper {servers}: registry closed")]
    Closed { servers: String },
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

/// A parsed `zk://HOST:PORT[,HOST:PORT...]/PATH` registry URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryUrl {
    /// `(host, port)` of every server, in the URL's order.
    pub servers: Vec<(String, u16)>,
    /// The base znode path, absolute, without a trailing slash (e.g. `/fanin`).
    pub path: String,
}

/// One `HOST:PORT` of a registry URL (a host may be a bracketed IPv6 address), or why not.
fn parse_server(server: &str) -> std::result::Result<(String, u16), String> {
    let (host, port) = server
        .rsplit_once(':')
        .ok_or_else(|| format!("server `{server}` has no port (expected HOST:PORT)"))?;
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner
            .strip_suffix(']')
            .is_some_and(|h| !h.is_empty() && h.contains(':'))
    } else {
        !host.is_empty() && !host.contains(['[', ']', ':', '@'])
    };
    if !host_ok {
        return Err(format!("server `{server}` has an invalid host `{host}`"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((host.to_string(), p)),
        _ => Err(format!(
            "server `{server}`: port `{port}` is not a number 1-65535"
        )),
    }
}

/// A registry URL's znode path (without a trailing slash): absolute, no empty or
/// relative segment, outside ZooKeeper's own `/zookeeper`.
fn check_path(path: &str) -> std::result::Result<(), String> {
    if path.is_empty() {
        return Err(
            "no path (expected zk://HOST:PORT/PATH, e.g. zk://127.0.0.1:2181/fanin)".into(),
        );
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return Err(format!("path `{path}` has an empty segment"));
        }
        if segment == "." || segment == ".." {
            return Err(format!("path `{path}` has a relative segment `{segment}`"));
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err(format!(
            "path `{path}` is under ZooKeeper's reserved /zookeeper"
        ));
    }
    Ok(())
}

impl RegistryUrl {
    pub fn parse(url: &str) -> Result<RegistryUrl> {
        let bad = |reason: String| RegistryError::Url {
            url: url.to_string(),
            reason,
        };
        let rest = url.strip_prefix("zk://").ok_or_else(|| {
            bad("scheme must be `zk://` (expected zk://HOST:PORT[,HOST:PORT]/PATH)".into())
        })?;
        if let Some(c) = rest
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || *c == '?' || *c == '#')
        {
            return Err(bad(format!("character {c:?} is not allowed")));
        }
        let (hosts, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if hosts.is_empty() {
            return Err(bad(
                "no server (expected zk://HOST:PORT[,HOST:PORT]/PATH)".into()
            ));
        }
        let servers = hosts
            .split(',')
            .map(|server| parse_server(server).map_err(&bad))
            .collect::<Result<Vec<_>>>()?;
        let path = path.trim_end_matches('/');
        check_path(path).map_err(bad)?;
        Ok(RegistryUrl {
            servers,
            path: path.to_string(),
        })
    }

    /// The servers as a ZooKeeper connect string: `HOST:PORT,HOST:PORT`.
    pub fn connect_string(&self) -> String {
        self.servers
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl FromStr for RegistryUrl {
    type Err = RegistryError;
    fn from_str(s: &str) -> Result<RegistryUrl> {
        RegistryUrl::parse(s)
    }
}

impl fmt::Display for RegistryUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "zk://{}{}", self.connect_string(), self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(addr: &str, incarnation: i64) -> Registered {
        Registered {
            addr: addr.into(),
            incarnation,
        }
    }

    fn snap(epns: &[(u32, &str, i64)], flps: &[(u32, &str, i64)]) -> Membership {
        let mut m = Membership::default();
        for &(id, a, i) in epns {
            m.epns.insert(id, reg(a, i));
        }
        for &(id, a, i) in flps {
            m.flps.insert(id, reg(a, i));
        }
        m
    }

    fn joined(role: Role, id: u32, addr: &str) -> Change {
        Change::Joined(Member::new(role, id, addr))
    }

    fn left(role: Role, id: u32, addr: &str) -> Change {
        Change::Left(Member::new(role, id, addr))
    }

    #[test]
    fn diff_of_equal_snapshots_is_empty() {
        let a = snap(&[(1, "a", 10)], &[(0, "f", 11)]);
        assert!(diff(&a, &a.clone()).is_empty());
        assert!(diff(&Membership::default(), &Membership::default()).is_empty());
    }

    #[test]
    fn diff_reports_joins() {
        let old = snap(&[(1, "a", 10)], &[]);
        let new = snap(&[(1, "a", 10), (2, "b", 12)], &[(0, "f", 13)]);
        assert_eq!(
            diff(&old, &new),
            vec![joined(Role::Epn, 2, "b"), joined(Role::Flp, 0, "f")]
        );
    }

    #[test]
    fn diff_reports_leaves() {
        let old = snap(&[(1, "a", 10), (2, "b", 12)], &[(0, "f", 13)]);
        let new = snap(&[(2, "b", 12)], &[]);
        assert_eq!(
            diff(&old, &new),
            vec![left(Role::Epn, 1, "a"), left(Role::Flp, 0, "f")]
        );
    }

    #[test]
    fn diff_reports_a_join_and_a_leave_in_one_event() {
        let old = snap(&[(1, "a", 10)], &[]);
        let new = snap(&[(2, "b", 12)], &[]);
        assert_eq!(
            diff(&old, &new),
            vec![left(Role::Epn, 1, "a"), joined(Role::Epn, 2, "b")]
        );
    }

    #[test]
    fn diff_reports_a_restart_with_a_new_address_as_left_then_joined() {
        let old = snap(&[(3, "10.0.0.3:5555", 10)], &[]);
        let new = snap(&[(3, "10.0.0.3:6666", 20)], &[]);
        assert_eq!(
            diff(&old, &new),
            vec![
                left(Role::Epn, 3, "10.0.0.3:5555"),
                joined(Role::Epn, 3, "10.0.0.3:6666")
            ]
        );
    }

    #[test]
    fn diff_reports_a_restart_with_the_same_address_by_its_new_incarnation() {
        let old = snap(&[], &[(1, "f1", 10)]);
        let new = snap(&[], &[(1, "f1", 11)]);
        assert_eq!(
            diff(&old, &new),
            vec![left(Role::Flp, 1, "f1"), joined(Role::Flp, 1, "f1")]
        );
    }

    #[test]
    fn same_id_in_both_roles_is_two_members() {
        let old = snap(&[(1, "e", 10)], &[]);
        let new = snap(&[(1, "e", 10)], &[(1, "f", 11)]);
        assert_eq!(diff(&old, &new), vec![joined(Role::Flp, 1, "f")]);
        let members: Vec<Member> = new.members().collect();
        assert_eq!(
            members,
            vec![
                Member::new(Role::Epn, 1, "e"),
                Member::new(Role::Flp, 1, "f")
            ]
        );
        assert_eq!(new.addr(Role::Flp, 1), Some("f"));
        assert_eq!(new.addr(Role::Flp, 2), None);
    }

    #[test]
    fn url_parses_servers_and_path() {
        let u = RegistryUrl::parse("zk://127.0.0.1:2181/fanin").unwrap();
        assert_eq!(u.servers, vec![("127.0.0.1".to_string(), 2181)]);
        assert_eq!(u.path, "/fanin");
        assert_eq!(u.connect_string(), "127.0.0.1:2181");
        assert_eq!(u.to_string(), "zk://127.0.0.1:2181/fanin");

        let u: RegistryUrl = "zk://zk1:2181,zk2:2182,[::1]:2183/a/b/".parse().unwrap();
        assert_eq!(u.servers.len(), 3);
        assert_eq!(u.servers[2], ("[::1]".to_string(), 2183));
        assert_eq!(u.path, "/a/b");
        assert_eq!(u.connect_string(), "zk1:2181,zk2:2182,[::1]:2183");
    }

    #[test]
    fn url_errors_name_the_bad_part() {
        let cases = [
            ("http://h:1/p", "scheme must be `zk://`"),
            ("zk:///p", "no server"),
            ("zk://h/p", "server `h` has no port"),
            ("zk://h:x/p", "server `h:x`: port `x` is not a number"),
            ("zk://h:0/p", "port `0` is not a number"),
            ("zk://h:70000/p", "port `70000`"),
            ("zk://h:1,:2/p", "server `:2` has an invalid host ``"),
            ("zk://h:1", "no path"),
            ("zk://h:1/", "no path"),
            ("zk://h:1/a//b", "path `/a//b` has an empty segment"),
            ("zk://h:1/a/../b", "relative segment `..`"),
            ("zk://h:1/zookeeper/x", "reserved"),
            ("zk://h:1/a b", "' ' is not allowed"),
        ];
        for (url, want) in cases {
            let err = RegistryUrl::parse(url).unwrap_err().to_string();
            assert!(err.contains(want), "{url}: got `{err}`, want `{want}`");
            assert!(err.starts_with(&format!("registry URL `{url}`")), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
