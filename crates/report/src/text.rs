//! Text tables: one writer for every table fanin prints (runs, simulations, benches):
//! the first column left-aligned, the others right-aligned, a rule under the header.

use std::fmt::Write as _;

/// A CSV field in quotes, a quote inside it doubled (RFC 4180).
pub fn csv_quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The fields of one CSV line: commas inside quotes belong to the field, and a doubled
/// quote inside quotes is one quote (what `csv_quoted` writes).
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let (mut cur, mut quoted) = (String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_field_reads_back_as_written_quotes_and_commas_too() {
        for label in ["plain", "k=8, ECMP", "the \"fast\" one", "\"", ""] {
            let line = format!("{},12,{}", csv_quoted(label), csv_quoted("1MiB"));
            assert_eq!(csv_fields(&line), [label, "12", "1MiB"], "{line}");
        }
        assert_eq!(csv_fields("a,,b"), ["a", "", "b"]);
    }
}
