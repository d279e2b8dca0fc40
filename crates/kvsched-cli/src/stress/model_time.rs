//! The simulated model's fixed cost per step (`--model-us`): a wait the engine thread makes
//! between the plan and its answer, outside step overhead.

use std::time::{Duration, Instant};

/// Waits `d` (the simulated model): sleeps most of it, spins the rest for precision.
pub(super) fn simulate_model(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = Instant::now() + d;
    let slack = Duration::from_micros(80);
    if d > slack {
        std::thread::sleep(d - slack);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}
