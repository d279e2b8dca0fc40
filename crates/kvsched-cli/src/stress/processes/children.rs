//! The engine processes: spawned to die with the parent, their stdout captured, their
//! progress read from their stderr, stopped on drop; and the SIGINT/SIGTERM flag.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::unix::process::ExitStatusExt;

use kvsched_testkit::process::die_with_parent;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::combine::{EngineOutcome, Exit};
use super::PROGRESS_MARKER;
use kvsched::sync::{thread, Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// The most bytes of a child's stdout kept (its JSON report is a few tens of KiB); the rest
/// is read and dropped, and the report marked cut.
pub const MAX_REPORT_BYTES: usize = 16 << 20;
/// The longest stderr line kept whole; the rest of a longer line is dropped.
const MAX_LINE_BYTES: usize = 64 << 10;
/// The last stderr lines of a child kept for the report.
const TAIL_LINES: usize = 20;

/// The running engines, in order of their index. Dropping it kills and reaps every child
/// still running.
#[derive(Default)]
pub struct Children {
    running: Vec<Running>,
}

struct Running {
    index: u8,
    child: Child,
    status: Option<ExitStatus>,
    overdue: bool,
    /// The child's progress (0 to 1) as `f64` bits, from its stderr.
    progress: Arc<AtomicU64>,
    stdout: Option<thread::JoinHandle<(Vec<u8>, bool)>>,
    stderr: Option<thread::JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl Children {
    /// Spawns `cmd` as engine `index`: stdin empty, stdout and stderr captured, killed
    /// (SIGKILL) when the calling thread ends.
    pub fn spawn(&mut self, index: u8, mut cmd: Command) -> io::Result<()> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn()?;
        let progress = Arc::new(AtomicU64::new(0f64.to_bits()));
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stdout = match child.stdout.take() {
            Some(out) => Some(
                thread::Builder::new()
                    .name(format!("kvsched-e{index}-stdout"))
                    .spawn(move || read_capped(out, MAX_REPORT_BYTES))?,
            ),
            None => None,
        };
        let stderr = match child.stderr.take() {
            Some(err) => {
                let (p, t) = (Arc::clone(&progress), Arc::clone(&tail));
                Some(
                    thread::Builder::new()
                        .name(format!("kvsched-e{index}-stderr"))
                        .spawn(move || read_stderr(err, index, &p, &t))?,
                )
            }
            None => None,
        };
        self.running.push(Running {
            index,
            child,
            status: None,
            overdue: false,
            progress,
            stdout,
            stderr,
            tail,
        });
        Ok(())
    }

    /// Whether every child has exited (reaping those that did).
    pub fn all_ended(&mut self) -> bool {
        let mut all = true;
        for r in &mut self.running {
            if r.status.is_none() {
                match r.child.try_wait() {
                    Ok(Some(s)) => r.status = Some(s),
                    Ok(None) => all = false,
                    // Cannot be waited for (never happens for our own child): treat as gone.
                    Err(_) => r.status = Some(ExitStatus::from_raw(1 << 8)),
                }
            }
        }
        all
    }

    /// The children's mean progress, 0 to 1 (a child that exited counts as done).
    pub fn mean_progress(&self) -> f64 {
        if self.running.is_empty() {
            return 1.0;
        }
        let sum: f64 = self
            .running
            .iter()
            .map(|r| {
                if r.status.is_some() {
                    1.0
                } else {
                    // Relaxed: a progress hint; nothing else is read through it.
                    f64::from_bits(r.progress.load(Ordering::Relaxed))
                }
            })
            .sum();
        sum / self.running.len() as f64
    }

    /// Kills the children still running once `limit` has passed since `started`; each is
    /// reported as overdue.
    pub fn kill_overdue(&mut self, started: Instant, limit: Duration) {
        if started.elapsed() < limit {
            return;
        }
        for r in self.running.iter_mut().filter(|r| r.status.is_none()) {
            r.overdue = true;
            let _ = writeln!(
                io::stderr(),
                "error: engine {} did not end within {limit:?}: killed",
                r.index
            );
            r.kill();
        }
    }

    /// Kills and reaps every child still running.
    pub fn kill_all(&mut self) {
        for r in &mut self.running {
            r.kill();
        }
    }

    /// Waits for every child and returns what each left: exit status, report, stderr tail.
    pub fn finish(mut self) -> Vec<EngineOutcome> {
        let running = std::mem::take(&mut self.running);
        running.into_iter().map(Running::outcome).collect()
    }
}

impl Running {
    fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    fn outcome(mut self) -> EngineOutcome {
        let status = match self.status {
            Some(s) => Some(s),
            None => self.child.wait().ok(),
        };
        let (stdout, cut) = self
            .stdout
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        let stderr_tail = self.tail.lock().drain(..).collect();
        EngineOutcome {
            index: self.index,
            exit: Exit {
                code: status.and_then(|s| s.code()),
                signal: status.and_then(|s| s.signal()),
            },
            stdout,
            stdout_cut: cut,
            stderr_tail,
            overdue: self.overdue,
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Reads `r` to its end, keeping at most `cap` bytes; `true` if some were dropped.
pub fn read_capped(mut r: impl Read, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                cut |= n > room;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    (kept, cut)
}

/// Reads engine `index`'s stderr line by line: progress lines set `progress`; every other
/// line is echoed on our stderr as `e{index}: …` and kept in `tail` (the last few).
fn read_stderr(r: impl Read, index: u8, progress: &AtomicU64, tail: &Mutex<VecDeque<String>>) {
    for_each_line(r, MAX_LINE_BYTES, |line| {
        let line = String::from_utf8_lossy(line);
        if let Some(p) = parse_progress(&line) {
            // Relaxed: a progress hint polled by the parent; nothing is published through it.
            progress.store(p.to_bits(), Ordering::Relaxed);
            return;
        }
        let _ = writeln!(io::stderr(), "e{index}: {line}");
        let mut t = tail.lock();
        if t.len() == TAIL_LINES {
            t.pop_front();
        }
        t.push_back(line.into_owned());
    });
}

/// The share done in a progress line, if it is one.
pub fn parse_progress(line: &str) -> Option<f64> {
    let v: f64 = line.strip_prefix(PROGRESS_MARKER)?.trim().parse().ok()?;
    v.is_finite().then(|| v.clamp(0.0, 1.0))
}

/// Calls `f` with each line of `r` (without its `\n`), each cut at `max` bytes.
pub fn for_each_line(mut r: impl Read, max: usize, mut f: impl FnMut(&[u8])) {
    let mut line = Vec::new();
    let mut long = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                f(&line);
                line.clear();
                long = false;
            } else if line.len() < max {
                line.push(b);
            } else if !long {
                long = true;
            }
        }
    }
    if !line.is_empty() {
        f(&line);
    }
}

/// Set by the SIGINT/SIGTERM handler [`Interrupt`] installs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Relaxed: a flag the parent's loop polls; nothing is published through it. A store to
    // an atomic is async-signal-safe.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM, caught while this value lives (the previous dispositions come back
/// on drop): the parent then stops its children and server itself instead of dying with
/// them still starting.
pub struct Interrupt {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Interrupt {
    /// Installs the handler.
    pub fn install() -> Interrupt {
        // Relaxed: see `on_signal`.
        INTERRUPTED.store(false, Ordering::Relaxed);
        let mut previous = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: `sigaction` is given a zeroed (then filled) struct whose handler is an
            // `extern "C"` function that only stores to an atomic (async-signal-safe), and a
            // valid out-pointer for the old disposition; both live across the call.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &act, &mut old) == 0 {
                    previous.push((sig, old));
                }
            }
        }
        Interrupt { previous }
    }

    /// Whether SIGINT or SIGTERM came since [`install`](Self::install).
    pub fn raised(&self) -> bool {
        // Relaxed: see `on_signal`.
        INTERRUPTED.load(Ordering::Relaxed)
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores a disposition `sigaction` itself returned, from a valid
            // pointer; no out-pointer is written.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_not_grown() {
        let text = b"short\nabcdefghij\n\nlast".to_vec();
        let mut lines = Vec::new();
        for_each_line(&text[..], 4, |l| lines.push(l.to_vec()));
        assert_eq!(
            lines,
            [b"shor".to_vec(), b"abcd".to_vec(), vec![], b"last".to_vec()]
        );
    }

    #[test]
    fn stdout_is_kept_up_to_its_cap() {
        let data = vec![7u8; 20_000];
        assert_eq!(read_capped(&data[..], 100_000), (data.clone(), false));
        let (kept, cut) = read_capped(&data[..], 10_000);
        assert_eq!((kept.len(), cut), (10_000, true));
    }

    #[test]
    fn progress_lines_are_recognised() {
        assert_eq!(parse_progress("kvsched-engine-progress 0.2500"), Some(0.25));
        assert_eq!(parse_progress("kvsched-engine-progress 7"), Some(1.0));
        assert_eq!(parse_progress("kvsched-engine-progress NaN"), None);
        assert_eq!(parse_progress("invariant violated: x"), None);
    }

    /// A child's report, exit code, stderr tail and progress come back through the pipes;
    /// a child that outlives its limit is killed and marked overdue.
    #[test]
    fn children_are_captured_and_stopped() {
        let mut c = Children::default();
        let mut ok = Command::new("sh");
        ok.args([
            "-c",
            "echo 'kvsched-engine-progress 0.5' >&2; echo 'a line' >&2; printf '{\"x\": 1}'; exit 3",
        ]);
        c.spawn(0, ok).unwrap();
        let mut slow = Command::new("sh");
        slow.args([
            "-c",
            "echo 'kvsched-engine-progress 0.5' >&2; exec sleep 600",
        ]);
        c.spawn(1, slow).unwrap();
        let started = Instant::now();
        // Engine 0 ends by itself (progress 1), engine 1 says it is half-way and runs on.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(c.running[0].status.is_some() && c.mean_progress() == 0.75) {
            assert!(Instant::now() < deadline, "no exit or progress line");
            assert!(!c.all_ended(), "engine 1 ended by itself");
            thread::sleep(Duration::from_millis(5));
        }
        c.kill_overdue(started, Duration::ZERO);
        assert!(c.all_ended());
        let out = c.finish();
        assert_eq!(out[0].exit.code, Some(3));
        assert_eq!(out[0].stdout, b"{\"x\": 1}");
        assert_eq!(out[0].stderr_tail, ["a line"]);
        assert!(!out[0].overdue);
        assert_eq!(out[1].exit.signal, Some(libc::SIGKILL));
        assert!(out[1].overdue);
    }

    /// Dropping the set kills what still runs (the test would otherwise wait 600 s for
    /// the pipe's end in `finish`; here nothing waits).
    #[test]
    fn dropping_the_children_kills_them() {
        let mut c = Children::default();
        let mut slow = Command::new("sleep");
        slow.arg("600");
        c.spawn(0, slow).unwrap();
        let pid = c.running[0].child.id();
        drop(c);
        // The process is reaped: its /proc entry is gone.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
