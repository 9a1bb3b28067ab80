//! Timing each kind of decoding step on any engine (greedy, proposing and feeding draft steps,
//! verify chunks), shared by `bench --cost-shape` and `tune-drafting`.

use crate::cli::decode_speed::median;
use anyhow::Result;
use reference::base::generate::GreedyBackend;
use reference::decode::speculative::SpeculativeBackend;
use reference::io::load::LoadedModel;
use std::time::Instant;

/// The prompt every measurement starts from: fixed pseudo-random ids.
pub fn bench_prompt(loaded: &LoadedModel, len: usize) -> Vec<u32> {
    let vocab = loaded.model.config.vocab_size as u64;
    (0..len as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % vocab) as u32)
        .collect()
}

/// Medians (milliseconds) of each kind of step, from [`time_steps`].
#[derive(Clone, Debug)]
pub struct StepTimes {
    pub greedy: f64,
    /// A draft step that proposes (fast stream and draft head).
    pub propose: f64,
    /// A draft step that only feeds a token to the draft layers' cache.
    pub feed: f64,
    /// `(rows, ms)` per verify chunk size asked for.
    pub verify: Vec<(usize, f64)>,
}

/// Time the kinds of step of one engine: `greedy` decodes, `spec` drafts and verifies, both after
/// `prompt`. The kinds are measured in rounds, one of each kind per round, so that a change in the
/// machine's load during the run (the development machines are shared) moves every kind alike
/// instead of biasing the ratios; each figure is the median of `repeats` rounds after one warm-up
/// round.
pub fn time_steps(
    greedy: &mut dyn GreedyBackend,
    spec: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    repeats: usize,
    verify_rows: &[usize],
) -> Result<StepTimes> {
    let next = prompt[prompt.len() - 1];
    greedy.start(prompt.len() + repeats + 1)?;
    greedy.feed(prompt)?;
    spec.prefill(prompt)?;
    let n = spec.len();
    let (mut greedy_ms, mut propose_ms, mut feed_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut verify_times = vec![Vec::new(); verify_rows.len()];
    for round in 0..=repeats {
        let keep = |times: &mut Vec<f64>, start: Instant| {
            if round > 0 {
                times.push(ms(start));
            }
        };
        // greedy: one more token after the prompt
        let start = Instant::now();
        greedy.feed(&[next])?;
        keep(&mut greedy_ms, start);
        // draft: one proposing draft step, rolled back
        let start = Instant::now();
        spec.draft(next, true)?;
        keep(&mut propose_ms, start);
        spec.verify()?;
        spec.rollback(n);
        // verify chunks: `rows` feeding draft steps (the first one timed), then one verify
        for (rows, times) in verify_rows.iter().zip(&mut verify_times) {
            for i in 0..*rows {
                let start = Instant::now();
                spec.draft(next, false)?;
                if i == 0 && *rows == 1 {
                    keep(&mut feed_ms, start);
                }
            }
            let start = Instant::now();
            spec.verify()?;
            keep(times, start);
            spec.rollback(n);
        }
    }
    Ok(StepTimes {
        greedy: median(&greedy_ms),
        propose: median(&propose_ms),
        feed: if feed_ms.is_empty() {
            f64::NAN
        } else {
            median(&feed_ms)
        },
        verify: verify_rows
            .iter()
            .zip(&verify_times)
            .map(|(&rows, times)| (rows, median(times)))
            .collect(),
    })
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}
