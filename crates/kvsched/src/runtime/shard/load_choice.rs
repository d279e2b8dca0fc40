//! How much of a lookup hit an admitted request loads: all of it under the `always` load
//! policy, none under `never`; under `cost`, what `runtime::policy::load_cost` decides from
//! the tier's measured estimate (`runtime::load_estimate`) and the requests waiting behind
//! this one, a probe granted now and then — at least one resume unit, so a tier written off
//! is measured again. With a Mamba `align` group a hit is loaded whole or not at all: the
//! tier holds that group's state only where the offer ends. What a decision leaves to recompute is counted
//! (`Metrics::cost_declined_*`, `cost_partial_requests`; `cost_probes` counts probes that
//! loaded more than the decision would have).

use std::time::Instant;

use crate::rules::geometry::{GroupKind, MambaMode};
use crate::runtime::policy::admission::external_end;
use crate::runtime::policy::load_cost::{load_tokens, Engine, LoadPolicy, TierHit};

use super::strategy::Strategy;
use super::{Env, Metrics, Req, Shard, StepSettings};

impl<S: Strategy> Shard<S> {
    /// Where the computed prefix of `r` ends once admitted with a local prefix of `local`
    /// tokens and `offered` tokens offered past it: the offer's end (`external_end`) under
    /// `always`, or no further than the load policy `cost` says is worth loading while
    /// `waiting_behind` requests wait for admission behind it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn loaded_end(
        env: &Env<'_, S>,
        settings: &StepSettings,
        now: Instant,
        r: &Req,
        local: u64,
        offered: u64,
        waiting_behind: u64,
        counters: &mut Metrics,
    ) -> u64 {
        let prompt_len = r.prompt.len() as u64;
        let full = external_end(env.geo, prompt_len, local, offered);
        if settings.load_policy == LoadPolicy::Always || full <= local {
            return full;
        }
        let hit = [TierHit {
            tokens: full - local,
            estimate: env.estimate.snapshot(settings.workers),
        }];
        let engine = Engine {
            compute_rate: settings.compute_rate,
            waiting_behind,
        };
        let decision = load_tokens(settings.load_policy, &hit, engine, false);
        let mut end = external_end(env.geo, prompt_len, local, decision.load);
        // A Mamba `align` group resumes only where a step ended, and a tier holds its state
        // there alone: the lookup vouches for the offer's end, not for any point before it,
        // so a hit is loaded whole or not at all (a head would end where no state is stored,
        // and fail). (Planted bug `align-head-load`, scripts/plants.sh: heads and probes of
        // one resume unit are loaded, and every one of them fails.)
        let whole_only = env.geo.groups().iter().any(|g| {
            matches!(
                g.kind,
                GroupKind::Mamba {
                    mode: MambaMode::Align
                }
            )
        }) && !planted!("align-head-load");
        if whole_only && end < full {
            end = local;
        }
        let probe = settings.load_policy == LoadPolicy::Cost
            && end < full
            && env.estimate.try_probe(now, settings.load_probe_interval);
        if probe {
            let probed = load_tokens(settings.load_policy, &hit, engine, true);
            // At least one resume unit (`S` tokens) past the local prefix: a probe shorter
            // than that (a tier measured failing every load asks for one token) would round
            // down to nothing and measure nothing, and the tier would never be loaded again.
            // (Planted bug `probe-rounds-to-nothing`, scripts/plants.sh.) Under a Mamba
            // `align` group, the whole hit.
            let unit = if planted!("probe-rounds-to-nothing") {
                0
            } else {
                env.geo.scheduler_block_size()
            };
            let probe_end = if whole_only {
                full
            } else {
                external_end(env.geo, prompt_len, local, probed.load.max(unit))
            };
            if probe_end > end {
                end = probe_end.min(full);
                counters.cost_probes += 1;
            }
        }
        if end < full {
            counters.cost_declined_requests += 1;
            counters.cost_declined_tokens += full - end;
            if end > local {
                counters.cost_partial_requests += 1;
            }
        }
        end
    }
}
