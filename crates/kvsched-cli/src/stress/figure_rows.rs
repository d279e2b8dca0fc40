//! What the figure table's rows are built from: a count as a figure's value, and the rows of
//! the scheduler's own cost — the engine thread's CPU in `schedule()` + `update()` per step,
//! and where the run's CPU went ([`StepCost`](super::step_cost::StepCost)).

use super::figures::{row, Better, Format, Row, Section};
use super::report::RunReport;

/// A count as a figure's value.
pub(super) fn c(n: u64) -> Option<f64> {
    Some(n as f64)
}

/// A count that may be absent (`--verify off`) as a figure's value.
pub(super) fn oc(n: Option<u64>) -> Option<f64> {
    n.map(|n| n as f64)
}

/// The sections of the scheduler's own cost, shown after step overhead.
pub(super) fn cost_sections() -> Vec<Section> {
    use Better::Lower;
    use Format::Fixed;
    vec![
        Section {
            title: "step CPU, engine thread (µs): the scheduler's own work — lower is better",
            rows: vec![
                row!("step_cpu_us.p50", "p50", Fixed(1), Some(Lower), |r| {
                    Some(r.step_cpu_us.p50)
                }),
                row!("step_cpu_us.p90", "p90", Fixed(1), Some(Lower), |r| r
                    .step_cpu_us
                    .p90),
                row!("step_cpu_us.p99", "p99", Fixed(1), Some(Lower), |r| {
                    Some(r.step_cpu_us.p99)
                }),
                row!("step_cpu_us.max", "max", Fixed(1), Some(Lower), |r| {
                    Some(r.step_cpu_us.max)
                }),
            ],
        },
        Section {
            title: "where the time went (s) — ranked rows: lower is better",
            rows: vec![
                row!(
                    "cost.step_wall_s",
                    "in schedule() + update(), wall",
                    Fixed(2),
                    Some(Lower),
                    |r| Some(r.cost.step_wall_s)
                ),
                row!(
                    "cost.step_cpu_s",
                    "in schedule() + update(), engine thread CPU",
                    Fixed(2),
                    Some(Lower),
                    |r| r.cost.step_cpu_s
                ),
                row!(
                    "cost.step_cpu_us_per_finished",
                    "  per finished request (µs)",
                    Fixed(1),
                    Some(Lower),
                    |r| r.cost.step_cpu_us_per_finished
                ),
                row!(
                    "cost.engine_cpu_s",
                    "simulated engine, engine thread CPU",
                    Fixed(2),
                    None,
                    |r| r.cost.engine_cpu_s
                ),
                row!(
                    "cost.other_threads_cpu_s",
                    "other threads CPU (shards, workers, store)",
                    Fixed(2),
                    None,
                    |r| r.cost.other_threads_cpu_s
                ),
            ],
        },
    ]
}
