//! Deployment with Ansible (the seeds' tool) to the testbed's hosts: an sshd in each
//! network namespace, `deploy/ansible/fanin.yml` run from one of them with ansible-core
//! (from PyPI, installed by scripts/test). Needs root, like every testbed test.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

const NAME: &str = "ansb";
const HOSTS: u32 = 3;

fn ansible_playbook() -> PathBuf {
    let p = std::env::var_os("FANIN_ANSIBLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/fanin/ansible/bin")
        })
        .join("ansible-playbook");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/test, which installs ansible-core from PyPI",
        p.display()
    );
    p
}

/// The testbed (hosts h1..h3 at 192.168.1.1..3), brought down (and every sshd killed) when dropped.
struct Hosts {
    sshd: Vec<Proc>,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.sshd.clear();
        let _ = fanin().args(["testbed", "down", "--name", NAME]).output();
    }
}

fn ip(h: u32) -> String {
    format!("192.168.1.{h}")
}

/// Keys, an sshd configuration, and one sshd per host namespace.
fn hosts_with_sshd(dir: &Path) -> Hosts {
    let _ = fanin().args(["testbed", "down", "--name", NAME]).output();
    run_ok(fanin().args([
        "testbed", "up", "--name", NAME, "--hosts", "3", "--rate", "1gbit",
    ]));
    let mut hosts = Hosts { sshd: Vec::new() };
    for key in ["id", "host_key"] {
        run_ok(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", ""])
                .arg("-f")
                .arg(dir.join(key)),
        );
    }
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    let config = format!(
        "Port 22\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nSubsystem sftp internal-sftp\n",
        d = dir.display()
    );
    std::fs::write(dir.join("sshd_config"), config).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    for h in 1..=HOSTS {
        let log = std::fs::File::create(dir.join(format!("sshd-h{h}.log"))).unwrap();
        hosts.sshd.push(Proc::spawn(
            &format!("sshd h{h}"),
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &format!("{NAME}-h{h}"),
                    "/usr/sbin/sshd",
                    "-D",
                    "-e",
                    "-f",
                ])
                .arg(dir.join("sshd_config"))
                .args(["-o", &format!("ListenAddress={}", ip(h))])
                .stdout(Stdio::null())
                .stderr(log),
        ));
    }
    hosts
}

fn inventory(dir: &Path) -> PathBuf {
    let key = dir.join("id");
    let inv = format!(
        "[icn]\n{}\n[flp]\n{}\n{}\n[epn]\n{}\n{}\n[all:vars]\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\nansible_ssh_private_key_file={}\nansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'\nfanin_dir={}/hosts/{{{{ inventory_hostname }}}}\n",
        ip(1), ip(2), ip(3), ip(2), ip(3), key.display(), dir.display()
    );
    let p = dir.join("inventory.ini");
    std::fs::write(&p, inv).unwrap();
    p
}

#[test]
fn the_playbook_deploys_runs_an_experiment_and_fetches_its_results() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("FANIN_SKIP_ROOT_TESTS").is_some(),
            "this test needs root (network namespaces); run as root or set FANIN_SKIP_ROOT_TESTS=1"
        );
        eprintln!("SKIPPED: not root and FANIN_SKIP_ROOT_TESTS is set");
        return;
    }
    let playbook = ansible_playbook();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _hosts = hosts_with_sshd(dir);
    std::fs::write(dir.join("secret"), "a deployment secret\n").unwrap();
    let root = repo_root();
    let results = dir.join("fetched");
    let out = Command::new("ip")
        .args(["netns", "exec", &format!("{NAME}-h1")])
        .arg(&playbook)
        .arg("-i")
        .arg(inventory(dir))
        .arg(root.join("deploy/ansible/fanin.yml"))
        .arg("-e")
        .arg(format!("fanin_binary={}", env!("CARGO_BIN_EXE_fanin")))
        .arg("-e")
        .arg(format!(
            "fanin_secret_file={}",
            dir.join("secret").display()
        ))
        .arg("-e")
        .arg(format!(
            "fanin_experiment={}",
            root.join("examples/session/run-a.toml").display()
        ))
        .arg("-e")
        .arg(format!("fanin_results={}", results.display()))
        .args(["-e", "fanin_run_seconds=3"])
        .env("ANSIBLE_LOCAL_TEMP", dir.join("ansible-tmp"))
        .env("ANSIBLE_NOCOLOR", "1")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ansible-playbook failed:\n{log}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(log.contains("run 1 ended: issued "), "{log}");
    let s = read_summary(&results.join("run-1"));
    assert_eq!(s["invariant_ok"], true);
    assert!(u(&s, "issued") >= 200, "{s}");
    assert_eq!(u(&s, "issued"), u(&s, "completed"), "{s}");
    assert_eq!((u(&s, "flps"), u(&s, "epns")), (2, 2));
    // Each host got its own copy, and every node left with the session.
    for h in 1..=HOSTS {
        assert!(dir.join(format!("hosts/{}/bin/fanin", ip(h))).is_file());
    }
    let pattern = dir.join("hosts").display().to_string();
    let running = || {
        let out = Command::new("pgrep")
            .args(["-f", &pattern])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut still = running();
    while !still.is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(200));
        still = running();
    }
    assert!(still.is_empty(), "fanin processes left after EXIT: {still}");
}
