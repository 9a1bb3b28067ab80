//! Timing the steps of any speculative backend (the reference's or ONNX Runtime's) from outside:
//! decode speed excludes the prompt's prefill, and `m2r2 bench` reports milliseconds per draft and
//! per verify step.

use crate::decode::speculative::{Draft, SpeculativeBackend};
use crate::error::Result;
use ndarray::Array2;
use std::time::Instant;

/// Time spent in each kind of step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimes {
    pub prefill_seconds: f64,
    pub draft_steps: usize,
    pub draft_seconds: f64,
    pub verify_steps: usize,
    pub verify_seconds: f64,
}

impl StepTimes {
    pub fn ms_per_draft(&self) -> f64 {
        1e3 * self.draft_seconds / self.draft_steps.max(1) as f64
    }

    pub fn ms_per_verify(&self) -> f64 {
        1e3 * self.verify_seconds / self.verify_steps.max(1) as f64
    }
}

/// A backend whose prefill, draft and verify steps are timed; it decodes exactly as `inner`.
pub struct Timed<B> {
    pub inner: B,
    pub times: StepTimes,
}

impl<B: SpeculativeBackend> Timed<B> {
    pub fn new(inner: B) -> Self {
        Timed {
            inner,
            times: StepTimes::default(),
        }
    }
}

impl<B: SpeculativeBackend> SpeculativeBackend for Timed<B> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let start = Instant::now();
        let out = self.inner.prefill(tokens);
        self.times.prefill_seconds += start.elapsed().as_secs_f64();
        out
    }

    fn draft(&mut self, token: u32, propose: bool) -> Result<Option<Draft>> {
        let start = Instant::now();
        let out = self.inner.draft(token, propose);
        self.times.draft_seconds += start.elapsed().as_secs_f64();
        self.times.draft_steps += 1;
        out
    }

    fn verify(&mut self) -> Result<Array2<f32>> {
        let start = Instant::now();
        let out = self.inner.verify();
        self.times.verify_seconds += start.elapsed().as_secs_f64();
        self.times.verify_steps += 1;
        out
    }

    fn rollback(&mut self, len: usize) {
        self.inner.rollback(len)
    }
}

/// A borrowed backend is a backend (so `Timed` wraps `&mut dyn SpeculativeBackend` too).
impl<B: SpeculativeBackend + ?Sized> SpeculativeBackend for &mut B {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn len(&self) -> usize {
        (**self).len()
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        (**self).prefill(tokens)
    }

    fn draft(&mut self, token: u32, propose: bool) -> Result<Option<Draft>> {
        (**self).draft(token, propose)
    }

    fn verify(&mut self) -> Result<Array2<f32>> {
        (**self).verify()
    }

    fn rollback(&mut self, len: usize) {
        (**self).rollback(len)
    }
}
