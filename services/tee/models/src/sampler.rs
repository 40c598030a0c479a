//! Token sampling, in the TEE on plaintext logits: greedy, temperature, top-k, top-p and
//! repetition penalty, with a ChaCha20 generator so a fixed seed reproduces a run.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::error::Refusal;

/// How to pick the next token. The default is greedy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0: greedy (argmax).
    pub temperature: f32,
    /// 0: no top-k cut.
    pub top_k: usize,
    /// 1 (or 0): no nucleus cut.
    pub top_p: f32,
    /// 1 (or 0): no penalty; > 1 discourages tokens already in the context.
    pub repetition_penalty: f32,
    /// 0: a random seed from the OS; otherwise the run is reproducible.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Refuses a parameter outside its range (`temperature` 0..=5, `top_p` 0..=1,
    /// `repetition_penalty` 0..=10; NaN and infinities never pass). One of the rules of
    /// [`TextGenerator::admit`](crate::TextGenerator::admit).
    pub fn validate(&self) -> Result<(), Refusal> {
        let checks = [
            ("temperature", self.temperature, 0.0..=5.0, "0..=5"),
            ("top_p", self.top_p, 0.0..=1.0, "0..=1"),
            ("repetition_penalty", self.repetition_penalty, 0.0..=10.0, "0..=10"),
        ];
        for (param, value, allowed, range) in checks {
            if !value.is_finite() || !allowed.contains(&value) {
                return Err(Refusal::Sampling { param, range });
            }
        }
        Ok(())
    }
}

/// Draws tokens for one sequence.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = if params.seed == 0 { protocol::os_seeded_rng() } else { ChaCha20Rng::seed_from_u64(params.seed) };
        Sampler { params, rng }
    }

    /// The next token given `logits` (modified in place) and the tokens so far.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let p = &self.params;
        // 1. Repetition penalty (the CTRL / transformers rule).
        if p.repetition_penalty > 0.0 && p.repetition_penalty != 1.0 {
            let mut seen = history.to_vec();
            seen.sort_unstable();
            seen.dedup();
            for &t in &seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        // 2. Greedy: the first maximal logit.
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        // 3. Candidates by descending logit, cut by top-k.
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = if p.top_k == 0 { idx.len() } else { p.top_k.min(idx.len()) };
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
            idx.truncate(k);
        }
        idx.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        // 4. Softmax at temperature, then the nucleus cut.
        let max = logits[idx[0] as usize];
        let mut probs: Vec<f64> =
            idx.iter().map(|&i| (((logits[i as usize] - max) / p.temperature) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
        if p.top_p > 0.0 && p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
        }
        // 5. Draw.
        let total: f64 = probs.iter().sum();
        let mut u = self.rng.random::<f64>() * total;
        for (i, q) in probs.iter().enumerate() {
            if u < *q {
                return idx[i];
            }
            u -= q;
        }
        idx[probs.len() - 1]
    }
}

/// Index of the first maximal value.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_first_maximum_and_penalty_applies() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], &[]), 1);
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() });
        // 3.0 for token 1 halves to 1.5, below token 2's 2.0.
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[1]), 2);
    }

    #[test]
    fn fixed_seed_reproduces_and_cuts_hold() {
        let params = SamplingParams { temperature: 1.0, top_k: 3, top_p: 0.9, seed: 7, ..Default::default() };
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let draw = |params: &SamplingParams| {
            let mut s = Sampler::new(params.clone());
            (0..200).map(|_| s.sample(&mut logits.clone(), &[])).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        let mut top3: Vec<u32> = (0..50).collect();
        top3.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        top3.truncate(3);
        assert!(a.iter().all(|t| top3.contains(t)), "top-k violated");
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 1, "temperature 1 should vary");
        let other = SamplingParams { seed: 8, ..params };
        assert_ne!(a, draw(&other));
    }

    #[test]
    fn invalid_parameters_are_refused() {
        for p in [
            SamplingParams { temperature: -1.0, ..Default::default() },
            SamplingParams { temperature: f32::NAN, ..Default::default() },
            SamplingParams { top_p: 1.5, ..Default::default() },
            SamplingParams { repetition_penalty: -2.0, ..Default::default() },
        ] {
            assert!(p.validate().is_err(), "{p:?}");
        }
        assert_eq!(
            SamplingParams { top_p: f32::INFINITY, ..Default::default() }.validate(),
            Err(Refusal::Sampling { param: "top_p", range: "0..=1" })
        );
        assert_eq!(SamplingParams { temperature: 5.0, top_p: 0.0, ..Default::default() }.validate(), Ok(()));
    }
}
