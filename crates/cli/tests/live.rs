//! The ICN's live page in a real browser: headless Chromium (Debian's `chromium`,
//! installed by scripts/test) loads it during a run; its numbers move between loads.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const CHROMIUM: &str = "/usr/bin/chromium";

/// The page's DOM after its scripts ran (Chromium's virtual time: 2 s).
fn dom(url: &str) -> String {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: run scripts/test, which installs Debian's chromium"
    );
    run_ok(
        Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
            ])
            .args(["--virtual-time-budget=2000", "--dump-dom", url]),
    )
}

/// The number in the row `<td>name</td><td>N</td>` of the page.
fn cell(dom: &str, name: &str) -> u64 {
    let key = format!("<td>{name}</td><td>");
    let rest = dom
        .split(&key)
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in {dom}"));
    rest.split('<').next().unwrap().trim().parse().unwrap()
}

#[test]
fn the_live_page_shows_the_run_and_its_numbers_move() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[run]\nflps = 1\nepns = 2\nrate_hz = 100\nduration_s = 15\nstf_size = \"64KiB\"\n";
    let mut icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let _epns: Vec<Proc> = (0..2)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    icn.wait_issued(100);
    let url = format!("http://{}/", icn.metrics);
    let first = dom(&url);
    assert!(
        first.contains("<span id=\"state\">running</span>"),
        "{first}"
    );
    for epn in 0..2 {
        // "<td>0</td><td>1024 / 0</td>": free MiB / building, numbers.
        let key = format!("<td>{epn}</td><td>");
        let cell = first.split(&key).nth(1).expect(&first);
        let (free, rest) = cell.split_once(" / ").expect(&first);
        assert!(
            free.parse::<u64>().is_ok(),
            "EPN {epn}'s free buffer: {first}"
        );
        assert!(
            rest.split('<').next().unwrap().parse::<u64>().is_ok(),
            "{first}"
        );
    }
    assert!(first.contains("&lt;= "), "the latency histogram: {first}");
    let before = cell(&first, "completed");
    std::thread::sleep(Duration::from_millis(1500));
    let second = dom(&url);
    assert!(
        second.contains("<span id=\"state\">running</span>"),
        "{second}"
    );
    let after = cell(&second, "completed");
    assert!(
        after > before,
        "completed TFs must move: {before} then {after}"
    );
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert!(u(&s, "completed") >= after);
}
