//! The scheduling choice of a step: running requests, in canonical order, get the tokens they
//! have left within the step's budget; a request without a token limit that the pool could
//! never hold one more token of is finished; a request that finds no blocks preempts the
//! latest running request.

use crate::rules::geometry::CacheGroup;

use super::growth::outgrows_pool;

/// What is left of a step's budget: tokens and sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBudget {
    tokens: u64,
    seqs: usize,
}

impl StepBudget {
    /// A step's whole budget: `tokens` tokens over at most `seqs` requests.
    pub fn new(tokens: u64, seqs: usize) -> Self {
        StepBudget { tokens, seqs }
    }

    /// Whether nothing more can be scheduled in the step.
    pub fn exhausted(&self) -> bool {
        self.tokens == 0 || self.seqs == 0
    }

    /// The tokens a running request with `computed` of its `seq_len` tokens computed gets:
    /// all it has left, within the tokens left. 0: it has nothing to schedule.
    pub fn grant(&self, computed: u64, seq_len: u64) -> u64 {
        seq_len.saturating_sub(computed).min(self.tokens)
    }

    /// Charges a request scheduled for `n` tokens (at most what [`StepBudget::grant`] gave).
    pub fn charge(&mut self, n: u64) {
        self.tokens = self.tokens.saturating_sub(n);
        self.seqs = self.seqs.saturating_sub(1);
    }
}

/// Whether a request is finished instead of scheduled because it has generated all it ever
/// can: it has no token limit (`max_new_tokens` 0) and `upto` computed tokens would need more
/// blocks than a pool of `pool_blocks` slots holds.
pub fn length_capped(
    groups: &[CacheGroup],
    max_new_tokens: u32,
    upto: u64,
    pool_blocks: usize,
) -> bool {
    max_new_tokens == 0 && outgrows_pool(groups, upto, pool_blocks)
}

/// The request to preempt when the request `key` finds no blocks to grow into: the latest
/// running request by canonical key (`latest`), unless that is `key` itself.
pub fn preemption_victim<K: PartialEq>(latest: Option<K>, key: K) -> Option<K> {
    latest.filter(|v| *v != key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_grants_what_is_left_within_it() {
        let mut b = StepBudget::new(100, 2);
        assert_eq!(b.grant(10, 50), 40);
        b.charge(40);
        assert_eq!(b.grant(0, 500), 60);
        assert_eq!(b.grant(50, 50), 0);
        b.charge(60);
        assert!(b.exhausted());
        let mut seqs = StepBudget::new(100, 1);
        seqs.charge(1);
        assert!(seqs.exhausted());
    }

    #[test]
    fn the_victim_is_the_latest_unless_it_is_the_request_itself() {
        assert_eq!(preemption_victim(Some(7), 3), Some(7));
        assert_eq!(preemption_victim(Some(3), 3), None);
        assert_eq!(preemption_victim(None, 3), None);
        let g = [CacheGroup::full_attention(16)];
        assert!(length_capped(&g, 0, 17, 2));
        assert!(!length_capped(&g, 1, 17, 2));
        assert!(!length_capped(&g, 0, 16, 2));
    }
}
