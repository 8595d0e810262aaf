//! Text tables: one writer for every table fanin prints (runs, simulations, benches):
//! the first column left-aligned, the others right-aligned, a rule under the header.

use std::fmt::Write as _;

/// Aligns rows of cells: the first column left, the others right, a rule under the
/// header row.
pub fn align(cells: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..cells[0].len())
        .map(|i| cells.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (k, row) in cells.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if k == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            let _ = writeln!(out, "{}", "-".repeat(total));
        }
    }
    out
}
