//! `kvsched replay`'s input: a scenario read from a file or standard input, within a size
//! limit, then parsed by the scenario format's crate (`kvsched-replay`, shared with the
//! Python package), whose scenario, parser and renderers this module re-exports.

use std::ffi::OsStr;
use std::io::Read;

#[cfg(test)]
pub use kvsched_replay::parse_scenario;
pub use kvsched_replay::{
    parse_scenario_bytes, render_explain_text, render_outcome, render_outcome_explained, Scenario,
    ScenarioError, MAX_BENCH_RUNS,
};

fn err(field: impl Into<String>, problem: impl Into<String>) -> ScenarioError {
    ScenarioError::new(field, problem)
}

/// The default cap on the input's size: 256 MiB (`--max-input-bytes` raises it).
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 256 << 20;

/// Reads a scenario from the file `file`, or from standard input when `file` is `-`, and
/// parses it. At most `max_bytes` are read: a longer input is an error on `input`, found
/// without reading further (a regular file's size is checked before reading). Read failures
/// (a missing file, a directory) are errors on field `FILE`.
pub fn load_scenario(file: &OsStr, max_bytes: u64) -> Result<Scenario, ScenarioError> {
    let bytes = if file == "-" {
        read_bounded(std::io::stdin().lock(), None, max_bytes)
            .map_err(|e| read_error(e, "standard input".to_owned(), max_bytes))?
    } else {
        let what = format!("{file:?}");
        let opened = std::fs::File::open(file).and_then(|f| {
            let meta = f.metadata()?;
            Ok((f, meta.is_file().then_some(meta.len())))
        });
        let (f, size) = opened.map_err(|e| read_error(ReadFailure::Io(e), what.clone(), 0))?;
        read_bounded(f, size, max_bytes).map_err(|e| read_error(e, what, max_bytes))?
    };
    parse_scenario_bytes(bytes)
}

enum ReadFailure {
    Io(std::io::Error),
    TooLarge,
}

fn read_error(e: ReadFailure, what: String, max_bytes: u64) -> ScenarioError {
    match e {
        ReadFailure::Io(e) => err("FILE", format!("cannot read {what}: {e}")),
        ReadFailure::TooLarge => err(
            "input",
            format!(
                "larger than the input limit of {max_bytes} bytes; raise it with \
                 --max-input-bytes"
            ),
        ),
    }
}

/// Reads all of `r`, but never more than `max_bytes + 1` bytes (one more tells that the input
/// is too long). `size` is the input's size when known (a regular file): a larger one fails
/// at once, any other is read into a buffer of exactly that size. An input of unknown size (a
/// pipe, a device) is read in chunks of 1 MiB and joined at the end, so an input cut off at
/// the limit never holds more than the limit.
fn read_bounded(
    mut r: impl Read,
    size: Option<u64>,
    max_bytes: u64,
) -> Result<Vec<u8>, ReadFailure> {
    const CHUNK: usize = 1 << 20;
    let oom = || ReadFailure::Io(std::io::ErrorKind::OutOfMemory.into());
    let limit = usize::try_from(max_bytes.saturating_add(1)).unwrap_or(usize::MAX);
    if size.is_some_and(|n| n > max_bytes) {
        return Err(ReadFailure::TooLarge);
    }
    // Chunks (one buffer of the known size, or 1 MiB ones), each filled before the next.
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut total = 0usize;
    let mut first = size.map(|n| usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1));
    while total < limit {
        if chunks.last().is_none_or(|c| c.len() == c.capacity()) {
            let cap = first.take().unwrap_or(CHUNK).min(limit - total);
            let mut c = Vec::new();
            c.try_reserve_exact(cap).map_err(|_| oom())?;
            chunks.push(c);
        }
        let Some(c) = chunks.last_mut() else { break };
        let room = c.capacity() - c.len();
        let n = match (&mut r).take(room as u64).read_to_end(c) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadFailure::Io(e)),
        };
        total += n;
        if c.len() < c.capacity() {
            break; // end of input
        }
    }
    if total as u64 > max_bytes {
        return Err(ReadFailure::TooLarge);
    }
    if chunks.len() <= 1 {
        return Ok(chunks.pop().unwrap_or_default());
    }
    let mut all = Vec::new();
    all.try_reserve_exact(total).map_err(|_| oom())?;
    for c in chunks.drain(..) {
        all.extend_from_slice(&c);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_reads() {
        let data = vec![b'x'; 3_000_000];
        let ok = |max| read_bounded(&data[..], None, max).ok().map(|v| v.len());
        assert_eq!(ok(3_000_000), Some(3_000_000));
        assert_eq!(ok(u64::MAX), Some(3_000_000));
        assert_eq!(ok(2_999_999), None);
        assert_eq!(ok(0), None);
        assert!(matches!(
            read_bounded(&data[..], Some(3_000_000), 2_500_000),
            Err(ReadFailure::TooLarge)
        ));
        let v = read_bounded(&data[..], Some(3_000_000), 3_500_000)
            .ok()
            .unwrap();
        assert_eq!(v, data);
        assert!(v.capacity() <= 3_000_001);
        // An endless input stops one byte past the limit.
        assert!(matches!(
            read_bounded(std::io::repeat(0), None, 5 << 20),
            Err(ReadFailure::TooLarge)
        ));
        assert!(read_bounded(&b""[..], None, 10).ok().unwrap().is_empty());
        let exact = vec![b'y'; 2 << 20];
        assert_eq!(
            read_bounded(&exact[..], None, 2 << 20).ok(),
            Some(exact.clone())
        );
    }
}
