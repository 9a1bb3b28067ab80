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

/// Medians (milliseconds) of each kind of step, from [`time_beside_greedy`].
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
/// `prompt` ([`time_beside_greedy`] with one backend).
pub fn time_steps(
    greedy: &mut dyn GreedyBackend,
    spec: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    repeats: usize,
    verify_rows: &[usize],
) -> Result<StepTimes> {
    let mut timed = [Timed { spec, verify_rows }];
    let mut times = time_beside_greedy(greedy, &mut timed, prompt, repeats)?;
    Ok(times.remove(0))
}

/// One speculation backend timed beside greedy decoding by [`time_beside_greedy`], and the verify
/// chunk sizes timed on it (none: its proposing step alone).
pub struct Timed<'a> {
    pub spec: &'a mut dyn SpeculativeBackend,
    pub verify_rows: &'a [usize],
}

/// Time the kinds of step of several speculation backends (one per draft gate and gate kind)
/// beside one greedy engine, all after `prompt`: per round one greedy step, then each backend's
/// proposing draft step and its verify chunks. The kinds are measured in rounds so that a change
/// in the machine's load during the run (the development machines are shared) moves every kind
/// alike instead of biasing the ratios. Greedy decoding is the baseline every
/// speed-up divides by and does not depend on the draft gate, so it is timed once, in the same
/// rounds as every backend's steps: a change in the machine's load moves it with all of them, and
/// every gate is priced against the same figure. Each figure is the median of `repeats` rounds
/// after one warm-up round; every returned [`StepTimes`] holds that one greedy median.
pub fn time_beside_greedy(
    greedy: &mut dyn GreedyBackend,
    timed: &mut [Timed<'_>],
    prompt: &[u32],
    repeats: usize,
) -> Result<Vec<StepTimes>> {
    let next = prompt[prompt.len() - 1];
    greedy.start(prompt.len() + repeats + 1)?;
    greedy.feed(prompt)?;
    // per backend: its length after the prompt, and the times of its proposing steps, feeding
    // steps and each verify chunk size
    let mut starts = Vec::with_capacity(timed.len());
    for t in timed.iter_mut() {
        t.spec.prefill(prompt)?;
        starts.push(t.spec.len());
    }
    let mut greedy_ms = Vec::with_capacity(repeats);
    let mut propose_ms = vec![Vec::with_capacity(repeats); timed.len()];
    let mut feed_ms = vec![Vec::with_capacity(repeats); timed.len()];
    let mut verify_ms: Vec<Vec<Vec<f64>>> = timed
        .iter()
        .map(|t| vec![Vec::with_capacity(repeats); t.verify_rows.len()])
        .collect();
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
        for (b, t) in timed.iter_mut().enumerate() {
            let n = starts[b];
            // draft: one proposing draft step, rolled back
            let start = Instant::now();
            t.spec.draft(next, true)?;
            keep(&mut propose_ms[b], start);
            t.spec.verify()?;
            t.spec.rollback(n);
            // verify chunks: `rows` feeding draft steps (the first one timed), then one verify
            for (&rows, times) in t.verify_rows.iter().zip(&mut verify_ms[b]) {
                for i in 0..rows {
                    let start = Instant::now();
                    t.spec.draft(next, false)?;
                    if i == 0 && rows == 1 {
                        keep(&mut feed_ms[b], start);
                    }
                }
                let start = Instant::now();
                t.spec.verify()?;
                keep(times, start);
                t.spec.rollback(n);
            }
        }
    }
    let greedy = median(&greedy_ms);
    Ok(timed
        .iter()
        .enumerate()
        .map(|(b, t)| StepTimes {
            greedy,
            propose: median(&propose_ms[b]),
            feed: if feed_ms[b].is_empty() {
                f64::NAN
            } else {
                median(&feed_ms[b])
            },
            verify: t
                .verify_rows
                .iter()
                .zip(&verify_ms[b])
                .map(|(&rows, times)| (rows, median(times)))
                .collect(),
        })
        .collect())
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use reference::base::work::Work;
    use reference::decode::speculative::Draft;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Every step taken, in order: `("greedy", 0)` or (the step, the backend).
    type Log = Rc<RefCell<Vec<(&'static str, usize)>>>;

    /// A greedy engine whose steps take `ms` each.
    struct Greedy {
        log: Log,
        ms: u64,
    }

    impl GreedyBackend for Greedy {
        fn start(&mut self, _capacity: usize) -> reference::Result<()> {
            Ok(())
        }

        fn feed(&mut self, tokens: &[u32]) -> reference::Result<(Vec<f32>, Work)> {
            if tokens.len() == 1 {
                self.log.borrow_mut().push(("greedy", 0));
                std::thread::sleep(std::time::Duration::from_millis(self.ms));
            }
            Ok((vec![0.0; 4], Work::default()))
        }
    }

    /// Backend `id`, whose proposing steps take `ms` each (its other steps nothing).
    struct Spec {
        log: Log,
        id: usize,
        ms: u64,
        len: usize,
        drafted: usize,
    }

    impl SpeculativeBackend for Spec {
        fn vocab_size(&self) -> usize {
            4
        }

        fn len(&self) -> usize {
            self.len
        }

        fn prefill(&mut self, tokens: &[u32]) -> reference::Result<Vec<f32>> {
            self.len += tokens.len();
            Ok(vec![0.0; 4])
        }

        fn draft(&mut self, _token: u32, propose: bool) -> reference::Result<Option<Draft>> {
            self.len += 1;
            self.drafted += 1;
            let step = if propose { "propose" } else { "feed" };
            self.log.borrow_mut().push((step, self.id));
            if propose {
                std::thread::sleep(std::time::Duration::from_millis(self.ms));
            }
            Ok(propose.then(|| Draft {
                logits: vec![0.0; 4],
                score: None,
            }))
        }

        fn verify(&mut self) -> reference::Result<Array2<f32>> {
            self.log.borrow_mut().push(("verify", self.id));
            let rows = std::mem::take(&mut self.drafted);
            Ok(Array2::zeros((rows, 4)))
        }

        fn rollback(&mut self, len: usize) {
            self.len = len;
        }
    }

    /// Greedy is timed once per round, before every backend's steps of that round, and every
    /// backend's times carry that one greedy figure; each backend's own steps are its own.
    #[test]
    fn greedy_is_timed_once_beside_every_backend() {
        let log: Log = Rc::default();
        let mut greedy = Greedy {
            log: log.clone(),
            ms: 4,
        };
        let spec = |id, ms| Spec {
            log: log.clone(),
            id,
            ms,
            len: 0,
            drafted: 0,
        };
        let (mut first, mut second) = (spec(1, 1), spec(2, 8));
        let rows = [1, 2];
        let mut timed = [
            Timed {
                spec: &mut first,
                verify_rows: &rows,
            },
            Timed {
                spec: &mut second,
                verify_rows: &[],
            },
        ];
        let times = time_beside_greedy(&mut greedy, &mut timed, &[3, 4, 5], 3).unwrap();
        assert_eq!(times.len(), 2);
        assert_eq!(times[0].greedy, times[1].greedy);
        assert!(times[0].greedy >= 4.0, "{times:?}");
        assert!(times[0].propose < times[1].propose, "{times:?}");
        assert_eq!(
            times[0].verify.iter().map(|&(n, _)| n).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(times[0].feed.is_finite() && times[1].feed.is_nan());
        assert!(times[1].verify.is_empty());
        // per round (a warm-up and 3 timed): greedy, then backend 1's steps, then backend 2's
        let round = [
            ("greedy", 0),
            ("propose", 1),
            ("verify", 1),
            ("feed", 1),
            ("verify", 1),
            ("feed", 1),
            ("feed", 1),
            ("verify", 1),
            ("propose", 2),
            ("verify", 2),
        ];
        assert_eq!(*log.borrow(), round.repeat(4));
    }
}
