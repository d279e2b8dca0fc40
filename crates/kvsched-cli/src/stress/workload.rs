//! The seeded workload: prompts (partly from one of `--prefixes` shared base prefixes),
//! lengths to generate, client cancels, `cancel` faults and open-loop Poisson arrival times.

use std::time::Duration;

use super::config::StressConfig;
use super::trace::{arrival, prompt_tokens, TraceRequest};
use super::values::{saturating_secs, Rate};
use kvsched::runtime::SubmitRequest;
use kvsched_testkit::SplitMix64;

/// The seeded workload: request `i` and its arrival time depend on the seed and `i` only, so
/// kvsched and the baseline see the same requests.
pub(super) struct Workload {
    seed: u64,
    /// Request ids start with it (`e{i}-` for engine `i` of `--engines`).
    id_prefix: String,
    /// `--prefixes`: base `b`'s tokens are drawn from the seed and `b` alone, as needed.
    bases: u64,
    min_prompt: u64,
    max_prompt: u64,
    share: f64,
    /// `--prefix-burst`.
    burst: u64,
    output_mean: f64,
    output_cap: u64,
    cancel_ratio: f64,
    fault_cancel: f64,
    arrivals: SplitMix64,
    rate: Option<f64>,
    next_arrival_s: f64,
    /// `--trace`: the requests replayed, and the arrivals handed out so far.
    trace: Option<(std::sync::Arc<Vec<TraceRequest>>, f64)>,
    arrivals_out: usize,
}

/// One generated request.
pub(super) struct Generated {
    pub(super) req: SubmitRequest,
    /// Steps after submission at which the client cancels it.
    pub(super) cancel_after: Option<u64>,
    /// Steps after submission at which a `cancel` fault cancels it.
    pub(super) fault_cancel_after: Option<u64>,
}

impl Workload {
    pub(super) fn new(cfg: &StressConfig) -> Self {
        let max_prompt = u64::from(cfg.prompt_tokens);
        Workload {
            seed: cfg.seed,
            id_prefix: cfg.engines.id_prefix(),
            bases: cfg.prefix.prefixes.max(1),
            min_prompt: (max_prompt / 4).max(2),
            max_prompt,
            share: cfg.prefix_share,
            burst: u64::from(cfg.prefix_burst.max(1)),
            output_mean: f64::from(cfg.output_tokens),
            output_cap: cfg.max_output_tokens(),
            cancel_ratio: cfg.cancel_ratio,
            fault_cancel: cfg.fault_rates().cancel,
            arrivals: SplitMix64::new(cfg.seed ^ 0xA221_7A15),
            rate: match cfg.rate {
                Rate::PerSecond(r) => Some(r),
                Rate::Max => None,
            },
            next_arrival_s: 0.0,
            trace: cfg.trace.loaded.clone().map(|t| (t, cfg.trace.trace_speed)),
            arrivals_out: 0,
        }
    }

    /// Request `i`'s id, shaped as an OpenAI-compatible server names its requests
    /// (`cmpl-<32 hex digits>-0`, 39 bytes), so routing and id lookups hash what they would in
    /// an engine: 16 digits drawn from the seed and `i`, then `i` itself in hex (unique).
    pub(super) fn id(&self, i: u64) -> String {
        let drawn =
            SplitMix64::new(self.seed ^ 0x1D5 ^ (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .next_u64();
        format!("{}cmpl-{drawn:016x}{i:016x}-0", self.id_prefix)
    }

    pub(super) fn request(&self, i: u64) -> Generated {
        let mut rng = SplitMix64::new(self.seed ^ (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        // A separate stream, so faults do not change the workload.
        let mut frng =
            SplitMix64::new(self.seed ^ 0xFA17_CA2C ^ (i + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let fault_cancel_after = (self.fault_cancel > 0.0 && frng.unit() < self.fault_cancel)
            .then(|| 1 + frng.below(128));
        if let Some(r) = self.trace.as_ref().and_then(|(t, _)| t.get(i as usize)) {
            // A trace's request: its prompt from its block ids, its output length as recorded.
            let cancel_after = (rng.unit() < self.cancel_ratio).then(|| 1 + rng.below(64));
            return Generated {
                req: SubmitRequest {
                    id: self.id(i),
                    prompt: prompt_tokens(r),
                    max_new_tokens: super::trace_fit::max_new_tokens(r),
                    priority: 0,
                    load_deadline: None,
                },
                cancel_after,
                fault_cancel_after,
            };
        }
        let len = self.min_prompt + rng.below(self.max_prompt - self.min_prompt + 1);
        let shared = ((len as f64) * self.share) as usize;
        let base = rng.below(self.bases);
        // A burst's requests share the base its first request picked.
        let base = if self.burst > 1 {
            let first = i - i % self.burst;
            SplitMix64::new(self.seed ^ (first + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .below(self.bases)
        } else {
            base
        };
        let mut prompt = Vec::with_capacity(len as usize);
        // The base's first `shared` tokens: the same stream for every request drawing it.
        let mut brng =
            SplitMix64::new(self.seed ^ 0xBA5E ^ (base + 1).wrapping_mul(0xA076_1D64_78BD_642F));
        prompt.extend((0..shared.min(self.max_prompt as usize)).map(|_| brng.next_u64() as u32));
        while (prompt.len() as u64) < len {
            prompt.push(rng.next_u64() as u32);
        }
        let exp = -(1.0 - rng.unit()).ln();
        let out = 1 + (exp * (self.output_mean - 1.0)) as u64;
        let max_new_tokens = out.min(self.output_cap).max(1) as u32;
        let cancel_after = (rng.unit() < self.cancel_ratio).then(|| 1 + rng.below(64));
        Generated {
            req: SubmitRequest {
                id: self.id(i),
                prompt,
                max_new_tokens,
                priority: 0,
                load_deadline: None,
            },
            cancel_after,
            fault_cancel_after,
        }
    }

    /// The next request's arrival offset from the start (open loop), advancing the process.
    /// Offsets saturate: at a tiny rate the gaps overflow a `Duration` (or `f64`, to
    /// infinity), and such an arrival is simply never reached within `--duration`.
    pub(super) fn next_arrival(&mut self) -> Option<Duration> {
        if let Some((t, speed)) = &self.trace {
            // Past the trace's end: no more arrivals (the run has submitted them all).
            let at = t.get(self.arrivals_out).map(|r| arrival(r, *speed));
            self.arrivals_out += 1;
            return at.or(Some(Duration::MAX));
        }
        let rate = self.rate?;
        let at = self.next_arrival_s;
        self.arrivals_out += 1;
        // A burst arrives at once: the clock moves after its last request, by a gap of the
        // burst's size at the same mean rate.
        if self.arrivals_out as u64 % self.burst == 0 {
            self.next_arrival_s += -(1.0 - self.arrivals.unit()).ln() * self.burst as f64 / rate;
        }
        Some(saturating_secs(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine of `--engines` runs the same prompts under its own ids.
    #[test]
    fn an_engine_index_prefixes_the_ids_and_keeps_the_prompts() {
        let plain = Workload::new(&StressConfig::default());
        let mut cfg = StressConfig::default();
        cfg.engines.engine_index = Some(3);
        let e3 = Workload::new(&cfg);
        for i in [0, 1, 99] {
            let (a, b) = (plain.request(i).req, e3.request(i).req);
            assert_eq!(b.id, format!("e3-{}", a.id));
            assert!(a.id.starts_with("cmpl-") && a.id.ends_with(&format!("{i:016x}-0")));
            assert_eq!(a.id.len(), 39);
            assert_eq!(a.prompt, b.prompt);
        }
    }

    /// Two requests drawing the same base share its start, as far as the shorter one takes;
    /// requests of other bases do not.
    #[test]
    fn requests_of_one_base_share_its_prefix() {
        let cfg = StressConfig {
            prefix_share: 1.0,
            ..StressConfig::default()
        };
        let w = Workload {
            bases: 3,
            ..Workload::new(&cfg)
        };
        let prompts: Vec<Vec<u32>> = (0..60).map(|i| w.request(i).req.prompt).collect();
        let mut starts: Vec<[u32; 8]> = prompts
            .iter()
            .map(|p| std::array::from_fn(|k| p[k]))
            .collect();
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), 3, "60 prompts over 3 bases");
        for a in &prompts {
            for b in &prompts {
                let n = a.len().min(b.len());
                assert!(a[..8] != b[..8] || a[..n] == b[..n]);
            }
        }
    }
}
