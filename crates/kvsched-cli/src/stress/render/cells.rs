//! Numbers as the human table writes them: thousands separators, counted nouns, and a cell's
//! median with the min–max of the runs.

use crate::stress::figures::{Format, Stats};

/// A number written in `format`, with thousands separators.
pub(super) fn num(x: f64, format: Format) -> String {
    let text = match format {
        Format::Count | Format::Bytes => format!("{:.0}", x.round()),
        Format::Fixed(d) => format!("{x:.d$}"),
    };
    let (sign, digits) = text.strip_prefix('-').map_or(("", &*text), |t| ("-", t));
    let (int, frac) = digits
        .split_once('.')
        .map_or((digits, None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// `n` and the noun for it: `1 sample`, `2 samples`.
pub(super) fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// A count with thousands separators.
pub(super) fn count(n: u64) -> String {
    num(n as f64, Format::Count)
}

/// One cell: the median, and with several runs that differ, `[min–max]`; `unit` after the
/// median. A figure of 1,000 or more is written without decimals, a ratio of 10 or more with
/// one.
pub(super) fn cell(s: &Stats, format: Format, several: bool, unit: &str) -> String {
    if format == Format::Bytes {
        return bytes_cell(s, several);
    }
    let format = match format {
        Format::Fixed(_) if s.median.abs() >= 1000.0 => Format::Fixed(0),
        Format::Fixed(2) if unit == "×" && s.median.abs() >= 10.0 => Format::Fixed(1),
        f => f,
    };
    let median = num(s.median, format);
    if several && num(s.min, format) != num(s.max, format) {
        format!(
            "{median}{unit} [{}–{}]",
            num(s.min, format),
            num(s.max, format)
        )
    } else {
        format!("{median}{unit}")
    }
}

/// A byte cell: the median in the binary unit that suits it, and with several runs that
/// differ, `[min–max]` in the same unit.
fn bytes_cell(s: &Stats, several: bool) -> String {
    let (div, unit) = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]
        .into_iter()
        .find(|&(d, _)| s.median.abs() >= d as f64)
        .map_or((1.0, "B"), |(d, u)| (d as f64, u));
    let f = if unit == "B" {
        Format::Count
    } else {
        Format::Fixed(1)
    };
    let (median, min, max) = (
        num(s.median / div, f),
        num(s.min / div, f),
        num(s.max / div, f),
    );
    if several && min != max {
        format!("{median} {unit} [{min}–{max}]")
    } else {
        format!("{median} {unit}")
    }
}
