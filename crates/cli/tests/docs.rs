//! The users' docs stay true: every `fanin` command shown in README.md,
//! experiments/README.md and docs/ is checked by `fanin --check` (its flags and files),
//! the lists in the docs (experiments, policies, subcommands, faults) match the code,
//! and every section of measured figures names its command and machine.

mod common;
use common::{fanin, run_ok};

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The markdown files a user reads.
fn doc_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string(), "experiments/README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Fenced code blocks of a markdown text: (language, first line number, lines).
fn blocks(text: &str) -> Vec<(String, usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize, Vec<String>)> = None;
    for (i, line) in text.lines().enumerate() {
        match (line.strip_prefix("```"), open.take()) {
            (Some(lang), None) => open = Some((lang.trim().to_string(), i + 1, Vec::new())),
            (Some(_), Some(b)) => out.push(b),
            (None, Some(mut b)) => {
                b.2.push(line.to_string());
                open = Some(b);
            }
            (None, None) => {}
        }
    }
    out
}

/// Words of one shell command line: quotes and a trailing `# comment` handled.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (None, '#') if !any => break,
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    words.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (_, c) => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}

/// The arguments after `fanin` of every command in the `sh` blocks, with where it is.
fn documented_commands() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for file in doc_files() {
        for (lang, first, lines) in blocks(&read(&file)) {
            if lang != "sh" {
                continue;
            }
            let joined = lines.join("\n").replace("\\\n", " ");
            for (i, line) in joined.lines().enumerate() {
                // A command ends at `&`, `;` or `|` (the rest is the shell's).
                let mut words = shell_words(line);
                if let Some(end) = words
                    .iter()
                    .position(|w| ["&", ";", "|", "&&"].contains(&w.as_str()))
                {
                    words.truncate(end);
                }
                let args = match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                    ["fanin", ..] | ["./target/release/fanin", ..] => words[1..].to_vec(),
                    ["cargo", "run", "--release", "--", ..] => words[4..].to_vec(),
                    _ => continue,
                };
                out.push((format!("{file}:{}", first + i + 1), args));
            }
        }
    }
    out
}

#[test]
fn every_documented_command_passes_fanin_check() {
    let commands = documented_commands();
    assert!(commands.len() >= 40, "found only {}", commands.len());
    let mut failures = Vec::new();
    for (place, args) in &commands {
        let out = Command::new(env!("CARGO_BIN_EXE_fanin"))
            .current_dir(root())
            .arg("--check")
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.starts_with("ok: ") {
            let err = String::from_utf8_lossy(&out.stderr);
            failures.push(format!("{place}: fanin {}: {err}{stdout}", args.join(" ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The names `fanin [SUB] --help` lists under "Commands:".
fn subcommands(parent: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_fanin"))
        .args(parent)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let list = help.split("Commands:").nth(1).expect("a command list");
    list.lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn the_docs_list_every_subcommand_policy_experiment_and_fault() {
    let readme = read("README.md");
    let architecture = read("docs/architecture.md");
    let experiments = read("experiments/README.md");
    let mut missing = Vec::new();
    let mut need = |doc: &str, text: &str, what: String| {
        if !text.contains(&what) {
            missing.push(format!("{doc} does not mention {what}"));
        }
    };
    for sub in subcommands(&[]) {
        need("README.md", &readme, format!("fanin {sub}"));
        need(
            "docs/architecture.md",
            &architecture,
            format!("fanin {sub}"),
        );
    }
    for parent in ["bench", "testbed"] {
        for sub in subcommands(&[parent]) {
            need("README.md", &readme, format!("fanin {parent} {sub}"));
        }
    }
    for p in fanin_sched::PolicyKind::ALL {
        for (doc, text) in [
            ("README.md", &readme),
            ("docs/architecture.md", &architecture),
            ("experiments/README.md", &experiments),
        ] {
            need(doc, text, p.name().to_string());
        }
    }
    let mut files: Vec<String> = std::fs::read_dir(root().join("experiments"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for f in files {
        need("experiments/README.md", &experiments, format!("`{f}`"));
    }
    for a in fanin_lab::faults::Action::ALL {
        need(
            "experiments/README.md",
            &experiments,
            format!("{} (", a.name()),
        );
        need("README.md", &readme, format!("`{}`", a.name()));
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_file_format_shown_in_experiments_readme_is_a_valid_experiment() {
    let (_, _, lines) = blocks(&read("experiments/README.md"))
        .into_iter()
        .find(|(lang, _, l)| lang == "toml" && l.iter().any(|l| l.starts_with("[run]")))
        .expect("the file format block");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("format.toml");
    std::fs::write(&file, lines.join("\n")).unwrap();
    run_ok(fanin().args(["--check", "run"]).arg(&file));
}

/// Every section of docs/reproduction.md and docs/performance.md that shows measured
/// figures (an output block, a plot or a table of numbers) gives the command (an `sh`
/// block) and a `Measured:` line naming the machine and its load.
#[test]
fn every_measured_figure_names_its_command_and_machine() {
    let mut missing = Vec::new();
    for file in ["docs/reproduction.md", "docs/performance.md"] {
        let text = read(file);
        for section in text.split("\n## ").skip(1) {
            let title = section.lines().next().unwrap_or_default();
            let figures = section.contains("\n```\n")
                || section.contains("![")
                || section
                    .lines()
                    .any(|l| l.starts_with('|') && l.contains(" 0."));
            if !figures {
                continue;
            }
            let command = blocks(section).iter().any(|(lang, _, lines)| {
                lang == "sh"
                    && lines
                        .iter()
                        .any(|l| l.contains("fanin ") || l.contains("cargo run"))
            });
            let measured = section
                .lines()
                .any(|l| l.starts_with("Measured: ") && l.contains("core"));
            if !command || !measured {
                missing.push(format!(
                    "{file} ## {title}: command {command}, Measured: line {measured}"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn scripts_reproduce_checks_every_command_it_would_run() {
    let out = Command::new(root().join("scripts/reproduce"))
        .current_dir(root())
        .arg("--check")
        .env("FANIN", env!("CARGO_BIN_EXE_fanin"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checked = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
    assert!(checked >= 15, "{stdout}");
}
