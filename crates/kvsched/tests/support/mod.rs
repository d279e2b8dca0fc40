//! What the runtime's tests share: a hang guard and a request. Each test file uses its part.
#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

use kvsched::SubmitRequest;

/// Runs `f` on its own thread; fails the test if it does not return within two minutes. A
/// guard against hanging, never a timing assertion: each scenario takes well under a second.
pub fn guarded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: the scenario panicked"),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung (no result after 120 s)"),
    }
}

/// A request of `prompt` that generates `max_new_tokens` (0: no limit), priority 0, the
/// runtime's load deadline.
pub fn req(id: &str, prompt: Vec<u32>, max_new_tokens: u32) -> SubmitRequest {
    SubmitRequest {
        id: id.into(),
        prompt,
        max_new_tokens,
        priority: 0,
        load_deadline: None,
    }
}
