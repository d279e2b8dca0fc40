//! The human report's table: titled sections of rows and notes, laid out in columns, and the
//! word wrapping of its notes.

use std::fmt::Write as _;

/// A table: titled sections of rows (label, kvsched, baseline, ratio) and notes, with columns
/// as wide as their widest cell.
pub(super) struct Table {
    baseline: Option<&'static str>,
    lines: Vec<Line>,
}

enum Line {
    Title(&'static str),
    Row(&'static str, [Option<String>; 2], String),
    Note(String),
}

impl Table {
    pub(super) fn new(baseline: Option<&'static str>) -> Self {
        Table {
            baseline,
            lines: Vec::new(),
        }
    }
    pub(super) fn title(&mut self, t: &'static str) {
        self.lines.push(Line::Title(t));
    }
    pub(super) fn row(&mut self, label: &'static str, cells: [Option<String>; 2], ratio: String) {
        self.lines.push(Line::Row(label, cells, ratio));
    }
    pub(super) fn note(&mut self, n: String) {
        self.lines.push(Line::Note(n));
    }

    pub(super) fn render(&self) -> String {
        let rows = || {
            self.lines.iter().filter_map(|l| match l {
                Line::Row(label, cells, ratio) => Some((label, cells, ratio)),
                _ => None,
            })
        };
        let label_w = rows().map(|(l, _, _)| l.chars().count()).max().unwrap_or(0) + 4;
        let width = |i: usize, title: &str| {
            rows()
                .filter_map(|(_, c, _)| c[i].as_ref().map(|s| s.chars().count()))
                .chain([title.chars().count()])
                .max()
                .unwrap_or(0)
                + 3
        };
        let kw = width(0, "kvsched");
        let bw = self.baseline.map_or(0, |b| width(1, b));
        let rw = self.baseline.map_or(0, |_| {
            rows()
                .map(|(_, _, r)| r.chars().count())
                .chain([5])
                .max()
                .unwrap_or(0)
                + 3
        });
        let pad =
            |s: &str, w: usize| format!("{}{s}", " ".repeat(w.saturating_sub(s.chars().count())));
        let mut o = String::new();
        let mut header = format!("{}{}", " ".repeat(label_w), pad("kvsched", kw));
        if let Some(b) = self.baseline {
            header.push_str(&pad(b, bw));
            header.push_str(&pad("ratio", rw));
        }
        let _ = writeln!(o, "\n{}", header.trim_end());
        for l in &self.lines {
            match l {
                Line::Title(t) => {
                    let _ = writeln!(o, "{t}");
                }
                Line::Row(label, cells, ratio) => {
                    let mut line = format!("  {label}");
                    line.push_str(&" ".repeat(label_w.saturating_sub(line.chars().count())));
                    line.push_str(&pad(cells[0].as_deref().unwrap_or("n/a"), kw));
                    if self.baseline.is_some() {
                        line.push_str(&pad(cells[1].as_deref().unwrap_or("n/a"), bw));
                        line.push_str(&pad(ratio, rw));
                    }
                    let _ = writeln!(o, "{}", line.trim_end());
                }
                Line::Note(n) => wrap(n, "  · ", "    ", &mut o),
            }
        }
        o
    }
}

/// The width notes are wrapped to.
pub(super) const WRAP: usize = 100;

/// Writes `text` wrapped at [`WRAP`] columns, the first line after `first`, the others after
/// `rest`.
pub(super) fn wrap(text: &str, first: &str, rest: &str, o: &mut String) {
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split(' ') {
        if !empty && line.chars().count() + 1 + word.chars().count() > WRAP {
            let _ = writeln!(o, "{line}");
            line = rest.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    let _ = writeln!(o, "{line}");
}
