//! The human report's last section: per scheduler, whether its accounts reconciled and
//! whether its invariants held, over every run, with every violation.

use std::fmt::Write as _;

use crate::stress::report::StressReport;

/// The invariants section: per scheduler, whether its accounts reconciled and its verdict
/// (over every run), with every violation.
pub(super) fn invariants(report: &StressReport, o: &mut String) {
    let _ = writeln!(o, "invariants");
    let n = report.runs.len();
    let of = if n > 1 {
        format!(" ({n} runs)")
    } else {
        String::new()
    };
    for runs in [&report.runs, &report.baseline_runs] {
        let Some(name) = runs.first().map(|r| r.scheduler) else {
            continue;
        };
        let reconciled = runs.iter().all(|r| r.invariants.reconciled);
        let ok = runs.iter().all(|r| r.invariants.ok);
        let _ = writeln!(
            o,
            "  {:<24}{}{of}",
            format!("{name} reconciled"),
            if reconciled { "yes" } else { "NO" }
        );
        let _ = writeln!(o, "  {name:<24}{}{of}", if ok { "ok" } else { "VIOLATED" });
        for (i, r) in runs.iter().enumerate() {
            for v in &r.invariants.violations {
                if n > 1 {
                    let _ = writeln!(o, "    - run {}: {v}", i + 1);
                } else {
                    let _ = writeln!(o, "    - {v}");
                }
            }
        }
    }
}
