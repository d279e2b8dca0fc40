//! Tests of `config`.
use super::*;

/// A configuration built in code gets the checks the flags' parsers make, so the run
/// never meets a value it would panic on (a Duration overflow, a modulo by 0, …).
#[test]
fn validate_refuses_what_the_parsers_refuse() {
    let cases: Vec<(&str, StressConfig)> = vec![
        (
            "--duration",
            StressConfig {
                duration_s: 1e300,
                ..Default::default()
            },
        ),
        (
            "--duration",
            StressConfig {
                duration_s: f64::NAN,
                ..Default::default()
            },
        ),
        (
            "--duration",
            StressConfig {
                duration_s: -1.0,
                ..Default::default()
            },
        ),
        (
            "--rate",
            StressConfig {
                rate: Rate::PerSecond(0.0),
                ..Default::default()
            },
        ),
        (
            "--rate",
            StressConfig {
                rate: Rate::PerSecond(f64::INFINITY),
                ..Default::default()
            },
        ),
        (
            "--failure-rate",
            StressConfig {
                failure_rate: -0.1,
                ..Default::default()
            },
        ),
        (
            "--pool-blocks",
            StressConfig {
                pool_blocks: u32::MAX as usize,
                ..Default::default()
            },
        ),
        (
            "--shards",
            StressConfig {
                shards: 65,
                ..Default::default()
            },
        ),
        (
            "--workers",
            StressConfig {
                workers: 257,
                ..Default::default()
            },
        ),
        (
            "--live",
            StressConfig {
                live: 0,
                ..Default::default()
            },
        ),
        (
            "--requests",
            StressConfig {
                requests: 0,
                ..Default::default()
            },
        ),
        (
            "--check-every",
            StressConfig {
                check_every: 0,
                ..Default::default()
            },
        ),
        (
            "--prompt-tokens",
            StressConfig {
                prompt_tokens: 1,
                ..Default::default()
            },
        ),
        (
            "--output-tokens",
            StressConfig {
                output_tokens: 0,
                ..Default::default()
            },
        ),
        (
            "--model-us",
            StressConfig {
                model_us: u64::MAX,
                ..Default::default()
            },
        ),
        (
            "--load-deadline-ms",
            StressConfig {
                load_deadline_ms: Some(0),
                ..Default::default()
            },
        ),
        (
            "--load-deadline-ms",
            StressConfig {
                load_deadline_ms: Some(u64::MAX),
                ..Default::default()
            },
        ),
        (
            "--repeat",
            StressConfig {
                repeat: 0,
                ..Default::default()
            },
        ),
        (
            "--load-latency-us",
            StressConfig {
                load_latency_us: LatencyRange {
                    min_us: 0,
                    max_us: u64::MAX,
                },
                ..Default::default()
            },
        ),
    ];
    for (flag, cfg) in cases {
        match cfg.validate() {
            Err(StressError::Config { flag: f, .. }) => assert_eq!(f, flag),
            other => panic!("{flag}: {other:?}"),
        }
    }
    assert!(StressConfig::default().validate().is_ok());
}
