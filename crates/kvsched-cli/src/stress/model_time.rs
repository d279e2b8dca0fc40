//! The simulated model's time per step.

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
