//! Result directories: every run, sweep and simulation writes under
//! `<results>/<UTC timestamp>-<kind>-<name>/<label>/`, with names always sanitised.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The directory of one experiment's results under `results`: `<timestamp>-<name>` for
/// runtime experiments (`kind` empty), `<timestamp>-<kind>-<name>` otherwise. The name
/// is sanitised, so `name = "../x"` stays inside `results`. Created here.
pub fn experiment_root(results: &Path, kind: &str, name: &str) -> anyhow::Result<PathBuf> {
    let stem = match kind {
        "" => format!("{}-{}", timestamp(), sanitize(name)),
        k => format!("{}-{}-{}", timestamp(), sanitize(k), sanitize(name)),
    };
    let root = results.join(stem);
    std::fs::create_dir_all(&root)
        .with_context(|| format!("creating results directory {}", root.display()))?;
    Ok(root)
}

/// The directory of one row (run, scenario, policy) under an experiment's root.
pub fn row_dir(root: &Path, label: &str) -> PathBuf {
    root.join(sanitize(label))
}

/// A name safe as a directory name: letters, digits, `-` and `_`; anything else `_`.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// UTC `YYYYMMDD-HHMMSS-mmm` (civil-from-days, Howard Hinnant's algorithm).
pub fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}-{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_leave_the_results_directory() {
        let tmp = std::env::temp_dir().join(format!("fanin-report-{}", std::process::id()));
        let root = experiment_root(&tmp, "sim", "../../x").unwrap();
        assert!(root.starts_with(&tmp), "{}", root.display());
        assert!(!root.to_string_lossy().contains(".."));
        assert!(row_dir(&root, "../y").starts_with(&root));
        assert_eq!(sanitize("a/b c.d"), "a_b_c_d");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn timestamps_sort_as_time() {
        let t = timestamp();
        assert_eq!(t.len(), "20261123-061346-123".len(), "{t}");
        assert!(t.starts_with("20"));
    }
}
