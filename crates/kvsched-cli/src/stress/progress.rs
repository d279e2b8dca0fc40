//! Progress of a run, and the terminal progress bar drawn from it.

use std::time::Duration;

/// Which run of a scheduler this is, of how many (`--repeat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nth {
    /// From 1; 0 for the unmeasured warm-up of a comparison.
    pub run: u32,
    /// Runs of each scheduler in all.
    pub of: u32,
}

/// Progress of a run, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// `kvsched` or `mutex`.
    pub scheduler: &'static str,
    /// Which run of it.
    pub nth: Nth,
    /// Requests to run in all.
    pub total: u64,
    /// Requests ended so far.
    pub ended: u64,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Load completions applied so far.
    pub completions: u64,
}

/// A progress sink drawing an indicatif bar on standard error when it is a terminal, and
/// nothing otherwise.
pub fn terminal_progress() -> impl FnMut(&Progress) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let mut current: Option<((&'static str, Nth), indicatif::ProgressBar)> = None;
    move |p: &Progress| {
        if !tty {
            return;
        }
        let who = (p.scheduler, p.nth);
        if current.as_ref().is_none_or(|(w, _)| *w != who) {
            if let Some((_, bar)) = current.take() {
                bar.finish_and_clear();
            }
            let bar = indicatif::ProgressBar::new(p.total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{prefix:>13} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
            ) {
                bar.set_style(style);
            }
            if p.nth.run == 0 {
                bar.set_prefix(format!("{} warm-up", p.scheduler));
            } else if p.nth.of > 1 {
                bar.set_prefix(format!("{} {}/{}", p.scheduler, p.nth.run, p.nth.of));
            } else {
                bar.set_prefix(p.scheduler);
            }
            current = Some((who, bar));
        }
        if let Some((_, bar)) = &current {
            bar.set_position(p.ended);
            let secs = p.elapsed.as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "{:.0} load completions/s",
                p.completions as f64 / secs
            ));
            if p.ended >= p.total {
                bar.finish_and_clear();
            }
        }
    }
}
