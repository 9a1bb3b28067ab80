//! Lossless self-speculative decoding (docs/m2r2/speculative.md), written once against
//! [`SpeculativeBackend`] so the reference and the ONNX runner run the same loop and cannot drift.
//!
//! One round, with `last` the newest emitted token (not yet fed) and `n` positions in the cache:
//! ```text
//! draft:   feed last, d_1, ..., d_m through layers 0..e_gd (0-based, half-open; the slow rows
//!          write the cache, the slow state at e_gd is kept); the fast exit logits at gate g_d
//!          propose d_{i+1}. Stop at the draft length, or (dynamic) when the gate's exit
//!          probability falls below its threshold.
//! verify:  continue the kept slow states of those m+1 positions through layers e_gd..N as ONE
//!          chunk -> base logits y_1..y_{m+1} (layers below e_gd are not recomputed).
//! accept:  greedy: the longest prefix with d_i == argmax(y_i); then the base token at the first
//!          mismatch, or the bonus token argmax(y_{m+1}) when all m are accepted.
//!          sampling: accept d_i with probability min(1, p(d_i)/q(d_i)); on rejection sample from
//!          norm(max(0, p - q)); bonus from p_{m+1}.
//! rollback: keep the n + a + 1 positions whose inputs were right.
//! ```
//! Greedy output equals plain greedy decoding token for token because the base model is batch
//! invariant: the verify chunk's logits are bitwise those of one-at-a-time decoding.

use crate::base::ops::argmax;
use crate::base::sampling::{Sampler, SamplingParams, draw, sampling_distribution};
use crate::base::work::Work;
use crate::decode::tree_sampling::{NodeChoice, verify_node};
use crate::error::{Error, Result};
use crate::m2r2::cost::CostModel;
use crate::m2r2::exit_gate::GateKind;
use ndarray::Array2;

/// What a draft step proposes for the next position.
#[derive(Clone, Debug)]
pub struct Draft {
    /// `[V]` the fast stream's exit logits at the draft gate
    pub logits: Vec<f32>,
    /// The draft gate's score (ARLA `p_exit`, or confidence / entropy), when asked for.
    pub score: Option<f32>,
}

/// The three operations the speculative loop needs from a model runtime.
pub trait SpeculativeBackend {
    fn vocab_size(&self) -> usize;
    /// Positions in the cache (fed tokens, drafted or verified).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Run `tokens` through the whole model, appended to the cache; logits of the last position.
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// Feed `token` at the next position through the draft layers (the slow rows write the cache and
    /// the slow state at the draft gate is kept for [`verify`](Self::verify)). With `propose`, also
    /// run the fast stream and return its proposal for the position after.
    fn draft(&mut self, token: u32, propose: bool) -> Result<Option<Draft>>;
    /// Finish every position drafted since the last verify through the remaining layers, as one
    /// chunk: base logits `[m, V]`, one row per drafted position.
    fn verify(&mut self) -> Result<Array2<f32>>;
    /// Keep the first `len` positions and forget the rest (KV cache and kept states).
    fn rollback(&mut self, len: usize);
}

/// How long each draft is.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftLength {
    /// Always this many proposals per round.
    Fixed(usize),
    /// Up to `max` proposals; stop when the draft gate's score falls below `threshold`.
    Dynamic {
        max: usize,
        gate: GateKind,
        threshold: f32,
    },
}

impl DraftLength {
    pub fn max(&self) -> usize {
        match self {
            DraftLength::Fixed(n) => *n,
            DraftLength::Dynamic { max, .. } => *max,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SpeculativeOptions {
    pub max_new_tokens: usize,
    pub stop_tokens: Vec<u32>,
    pub draft_length: DraftLength,
    /// `None`: greedy (lossless token for token); `Some`: speculative sampling (lossless in
    /// distribution), seeded.
    pub sampling: Option<SamplingParams>,
}

/// One verification round, for reports and `--trace`.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// Positions in the cache when the round began: its rows sit at `start..start + drafted + 1`.
    pub start: usize,
    /// Draft steps that ran the fast stream (the drafted ones, plus one whose proposal the dynamic
    /// gate dropped).
    pub proposals: usize,
    pub drafted: Vec<u32>,
    /// How many drafted tokens were accepted.
    pub accepted: usize,
    /// The base model's token after the accepted prefix (correction or bonus).
    pub base_token: u32,
    /// The draft gate's score for each proposal (when the gate was evaluated).
    pub scores: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeOutput {
    pub tokens: Vec<u32>,
    pub rounds: Vec<Round>,
}

impl SpeculativeOutput {
    /// Mean tokens emitted per verification: each round's accepted drafts and base token, as far
    /// as the token budget and the stop tokens let them out (a last round cut short counts the
    /// tokens it emitted, not the drafts it accepted past the end). The first token, chosen by the
    /// prompt's prefill, is no round's.
    pub fn mean_accepted_length(&self) -> f64 {
        if self.rounds.is_empty() {
            return 0.0;
        }
        self.tokens.len().saturating_sub(1) as f64 / self.rounds.len() as f64
    }

    /// For draft position i (0-based): accepted / drafted over all rounds that drafted it.
    pub fn acceptance_by_position(&self) -> Vec<f64> {
        let longest = self
            .rounds
            .iter()
            .map(|r| r.drafted.len())
            .max()
            .unwrap_or(0);
        (0..longest)
            .map(|i| {
                let drafted = self.rounds.iter().filter(|r| r.drafted.len() > i).count();
                let accepted = self.rounds.iter().filter(|r| r.accepted > i).count();
                accepted as f64 / drafted.max(1) as f64
            })
            .collect()
    }

    /// Accepted drafts over drafted tokens.
    pub fn acceptance_rate(&self) -> f64 {
        let drafted: usize = self.rounds.iter().map(|r| r.drafted.len()).sum();
        let accepted: usize = self.rounds.iter().map(|r| r.accepted).sum();
        accepted as f64 / drafted.max(1) as f64
    }
}

/// Decode up to `max_new_tokens` after `prompt` with self-speculation.
pub fn speculative_generate(
    backend: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    options: &SpeculativeOptions,
) -> Result<SpeculativeOutput> {
    if prompt.is_empty() {
        return Err(Error::Invalid(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    if options.draft_length.max() == 0 {
        return Err(Error::Invalid("the draft length must be at least 1".into()));
    }
    let mut chooser = Chooser(Sampler::new(options.sampling.clone())?);

    let prompt_logits = backend.prefill(prompt)?;
    let mut tokens = Vec::new();
    let mut rounds = Vec::new();
    if options.max_new_tokens == 0 {
        return Ok(SpeculativeOutput { tokens, rounds });
    }
    let mut last = chooser.base(&prompt_logits);
    tokens.push(last);
    let max_draft = options.draft_length.max();

    while tokens.len() < options.max_new_tokens && !options.stop_tokens.contains(&last) {
        let n = backend.len();
        // draft: feed `last` and each proposal through the draft layers
        let (mut drafted, mut draft_logits, mut scores) = (Vec::new(), Vec::new(), Vec::new());
        let mut feed = last;
        loop {
            let propose = drafted.len() < max_draft;
            let Some(draft) = backend.draft(feed, propose)? else {
                break;
            };
            if let DraftLength::Dynamic { threshold, .. } = &options.draft_length {
                let score = draft.score.ok_or_else(|| {
                    Error::Invalid("dynamic drafting needs the draft gate's score".into())
                })?;
                scores.push(score);
                if score < *threshold {
                    break;
                }
            }
            feed = chooser.draft(&draft.logits);
            drafted.push(feed);
            draft_logits.push(draft.logits);
        }
        // verify: base logits for each fed position
        let base = backend.verify()?;
        let (accepted, base_token) = chooser.accept(&drafted, &draft_logits, &base);
        rounds.push(Round {
            start: n,
            proposals: drafted.len().max(scores.len()),
            drafted: drafted.clone(),
            accepted,
            base_token,
            scores,
        });

        let mut emitted: Vec<u32> = drafted[..accepted].to_vec();
        emitted.push(base_token);
        // Stop at a stop token or the token budget; the cache keeps the inputs of emitted tokens.
        let room = options.max_new_tokens - tokens.len();
        let end = emitted
            .iter()
            .position(|t| options.stop_tokens.contains(t))
            .map_or(emitted.len(), |i| i + 1)
            .min(room);
        emitted.truncate(end);
        backend.rollback(n + emitted.len());
        last = *emitted.last().expect("at least one token per round");
        tokens.extend(emitted);
    }
    Ok(SpeculativeOutput { tokens, rounds })
}

/// Token choice for the base model and the drafts (the one [`Sampler`]), and the acceptance rule.
struct Chooser(Sampler);

impl Chooser {
    fn base(&mut self, logits: &[f32]) -> u32 {
        self.0.next(logits)
    }

    fn draft(&mut self, logits: &[f32]) -> u32 {
        self.0.next(logits)
    }

    /// How many drafts to accept, and the base model's token after them.
    fn accept(
        &mut self,
        drafted: &[u32],
        draft_logits: &[Vec<f32>],
        base: &Array2<f32>,
    ) -> (usize, u32) {
        let row = |i: usize| base.row(i).to_vec();
        match &mut self.0 {
            Sampler::Greedy => {
                let accepted = drafted
                    .iter()
                    .enumerate()
                    .take_while(|&(i, &d)| argmax(&row(i)) as u32 == d)
                    .count();
                (accepted, argmax(&row(accepted)) as u32)
            }
            Sampler::Sample { params, rng } => {
                for (i, &d) in drafted.iter().enumerate() {
                    let p = sampling_distribution(&row(i), params);
                    let q = sampling_distribution(&draft_logits[i], params);
                    // one candidate: accept with min(1, p/q), else sample norm(max(0, p - q))
                    if let NodeChoice::Sample(token) = verify_node(p, &q, &[d], rng.as_mut()) {
                        return (i, token);
                    }
                }
                let bonus = sampling_distribution(&row(drafted.len()), params);
                (drafted.len(), draw(&bonus, rng.as_mut()) as u32)
            }
        }
    }
}

impl CostModel<'_> {
    /// The draft and verify work of self-speculative rounds: per round, `drafted + 1`
    /// draft steps (the last one proposes only when a dynamic gate dropped its proposal), then one
    /// verify chunk. `all_intervals`: the gate needs every exit state (ARLA), so the fast stream runs
    /// in every interval up to the draft gate; otherwise only in the one ending at it.
    pub fn speculative(&self, rounds: &[Round], draft_gate: usize, all_intervals: bool) -> Work {
        let fast: Vec<usize> = if all_intervals {
            (0..draft_gate).collect()
        } else {
            vec![draft_gate - 1]
        };
        rounds
            .iter()
            .map(|r| {
                let rows = r.drafted.len() + 1;
                let drafts: Work = (0..rows)
                    .map(|i| self.draft_step(r.start + i, draft_gate, &fast, i < r.proposals))
                    .sum();
                let positions: Vec<usize> = (r.start..r.start + rows).collect();
                drafts + self.verify(draft_gate, &positions)
            })
            .sum()
    }
}
