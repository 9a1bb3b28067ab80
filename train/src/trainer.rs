//! The training loop of the accelerator adapters (docs/TRAINING.md): per trained gate, a batch of
//! fast rows drawn from the data, the interval forward, KL to the base model's final distribution
//! (plus the optional alignment term), the hand-written backward into that interval's adapters
//! only, global norm clipping, AdamW with warm-up and cosine schedule.
//!
//! Deterministic for a seed: the rows of step `s`, gate `g` come from ChaCha8 stream
//! `s * 256 + g` of the seed (so a resumed run draws what an uninterrupted run draws), every row is
//! computed independently and in a fixed order, and the sub-batches processed in parallel are summed
//! in a fixed order.

mod init;
mod options;
mod stats;

pub use init::{initial_weights, initial_weights_ranked};
pub use options::TrainOptions;
pub use stats::{GateStats, StepLog, mean_kl};

use crate::adamw::{AdamW, AdamWConfig, clip_grad_norm};
use crate::adapters::Adapters;
use crate::align::align_loss;
use crate::bridge;
use crate::data::DistillSample;
use crate::error::{Error, Result};
use crate::fast_stream::{self, Batch, FrozenBase, Row};
use crate::head::kl_loss;
use crate::slow_cache::{SlowKey, SlowPass};
use crate::slow_stream::SlowSample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use reference::Model;
use reference::m2r2::weights::M2r2Weights;

/// Rows per sub-batch: the default batch is one sub-batch, whose products with the frozen weights
/// run in parallel over output columns ([`gemm`](crate::gemm)); larger batches and evaluation run
/// several sub-batches side by side.
const ROWS_PER_TASK: usize = 64;

/// Adapters and optimizer state of one trained gate.
#[derive(Clone, Debug)]
pub struct GateState {
    pub gate: usize,
    pub adapters: Adapters<f32>,
    pub opt: AdamW<f32>,
}

/// The whole training state.
pub struct Trainer {
    pub options: TrainOptions,
    /// Settings and the adapters of the untrained gates; trained pairs are written in by `weights()`.
    pub template: M2r2Weights,
    pub gates: Vec<GateState>,
    /// Steps done.
    pub step: usize,
    pub history: Vec<StepLog>,
    /// SHA-256 of the training data's tokens (`checkpoint::data_digest`): a checkpoint resumes
    /// only on the same data.
    pub data_sha256: String,
    base: FrozenBase<f32>,
    samples: Vec<SlowSample<f32>>,
    pool: Vec<Row>,
}

impl Trainer {
    /// Set up training of `weights` on `data`: the frozen slow stream of every sample, computed
    /// once (or read from `slow`'s cache folder).
    pub fn new(
        model: &Model,
        weights: M2r2Weights,
        data: &[DistillSample],
        options: TrainOptions,
        slow: &mut SlowPass,
    ) -> Result<Self> {
        let config = &weights.config;
        options.validate(config)?;
        if options.bridge_only && weights.bridge.is_none() {
            return Err(Error::Invalid(
                "training only the bridge needs one: the weights have no bridge".into(),
            ));
        }
        if options.bridge_only && options.weight_decay != 0.0 {
            return Err(Error::Invalid(
                "training only the bridge keeps the adapters as they are, which weight decay \
                 would shrink: use weight decay 0"
                    .into(),
            ));
        }
        let intervals: Vec<usize> = options.train_gates.iter().map(|g| g - 1).collect();
        let layers: Vec<usize> = intervals
            .iter()
            .flat_map(|&j| config.interval_layers(j))
            .collect();
        let base = FrozenBase::new(model, layers.clone())?;
        // Layers of untrained gates keep their adapters only when they carry something (a run
        // started from trained weights, `--init`); untouched ones (`B = 0`) are the plain early
        // exit and are dropped, so the checkpoint lists only adapted layers.
        let mut weights = weights;
        for (l, layer) in weights.accelerator.layers.iter_mut().enumerate() {
            let untrained = layer.as_ref().is_some_and(|a| {
                a.loras
                    .values()
                    .all(|lora| lora.b().iter().all(|&b| b == 0.0))
            });
            if !layers.contains(&l) && untrained {
                *layer = None;
            }
        }
        let config = &weights.config;
        let keep_aligned = options.align_intermediate;
        let samples = slow.run(&SlowKey {
            model,
            config,
            data,
            intervals: &intervals,
            keep_aligned,
        })?;
        let pool = response_rows(&samples);
        if pool.is_empty() {
            return Err(Error::Invalid(
                "the data has no response rows to train on".into(),
            ));
        }
        let gates = options
            .train_gates
            .iter()
            .map(|&g| {
                let range = config.interval_layers(g - 1);
                let mut adapters =
                    Adapters::from_accelerator(&weights.accelerator, |l| range.contains(&l));
                // the bridge belongs to the draft gate and is trained with its adapters
                if let Some(bridge) = weights.bridge_at(g) {
                    adapters = adapters.with_bridge(bridge);
                }
                let opt = AdamW::new(
                    AdamWConfig {
                        weight_decay: options.weight_decay,
                        ..AdamWConfig::default()
                    },
                    adapters.tensors(),
                );
                GateState {
                    gate: g,
                    adapters,
                    opt,
                }
            })
            .collect();
        Ok(Trainer {
            options,
            template: weights,
            gates,
            step: 0,
            history: Vec::new(),
            data_sha256: crate::checkpoint::data_digest(data),
            base,
            samples,
            pool,
        })
    }

    /// Number of samples in the data.
    pub fn samples_count(&self) -> usize {
        self.samples.len()
    }

    /// Number of trainable rows in the data.
    pub fn rows_available(&self) -> usize {
        self.pool.len()
    }

    /// The current M2R2 weights: the trained adapters written into the template, whose other
    /// layers are as given (no adapter where the plain early exit runs: PEFT's
    /// `layers_to_transform` lists the adapted layers, and the checkpoint stays small).
    pub fn weights(&self) -> M2r2Weights {
        let mut w = self.template.clone();
        for g in &self.gates {
            g.adapters.write_into(&mut w.accelerator);
            if let Some(bridge) = w.bridge.as_mut() {
                g.adapters.write_bridge(bridge);
            }
        }
        w
    }

    /// The rows of step `step` for gate `gate`.
    fn draw_rows(&self, step: usize, gate: usize) -> Vec<Row> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.options.seed);
        rng.set_stream((step as u64) * 256 + gate as u64);
        (0..self.options.batch_rows)
            .map(|_| self.pool[rng.random_range(0..self.pool.len())])
            .collect()
    }

    /// One optimizer step of every trained gate; returns each gate's batch statistics.
    pub fn train_step(&mut self) -> StepLog {
        let lr = self.options.schedule().lr(self.step);
        let mut stats = Vec::new();
        for i in 0..self.gates.len() {
            let gate = self.gates[i].gate;
            let rows = self.draw_rows(self.step, gate);
            let (s, mut grads) = self.gradient(i, &rows);
            if self.options.bridge_only {
                // zero gradients leave AdamW's moments, and so the adapters, at zero change
                grads.pairs.values_mut().for_each(|p| {
                    p.a.fill(0.0);
                    p.b.fill(0.0);
                });
            }
            clip_grad_norm(grads.tensors_mut(), self.options.clip);
            let g = &mut self.gates[i];
            g.opt.step(lr, g.adapters.tensors_mut(), grads.tensors());
            stats.push(s);
        }
        let log = StepLog {
            step: self.step,
            lr,
            gates: stats,
        };
        self.step += 1;
        self.history.push(log.clone());
        log
    }

    /// Loss statistics and mean gradient of gate `i` over `rows`, sub-batches in parallel.
    pub fn gradient(&self, i: usize, rows: &[Row]) -> (GateStats, Adapters<f32>) {
        let parts: Vec<(GateStats, Adapters<f32>)> = rows
            .par_chunks(ROWS_PER_TASK)
            .map(|chunk| self.chunk_gradient(i, &self.samples, chunk, true))
            .collect();
        let mut stats = GateStats {
            gate: self.gates[i].gate,
            ..GateStats::default()
        };
        let mut grads = self.gates[i].adapters.zeros_like();
        for (s, g) in parts {
            let weight = s.rows as f32 / rows.len() as f32;
            for (acc, part) in grads.tensors_mut().zip(g.tensors()) {
                acc.scaled_add(weight, part);
            }
            stats.add(&s);
        }
        (stats, grads)
    }

    /// Statistics of every trained gate on `rows` of the training data, without gradients.
    pub fn evaluate_rows(&self, rows: &[Row]) -> Vec<GateStats> {
        self.evaluate_on(&self.samples, rows)
    }

    /// Statistics of every trained gate on every trainable row of the training data.
    pub fn evaluate_training_rows(&self) -> Vec<GateStats> {
        self.evaluate_rows(&self.pool)
    }

    /// Statistics of every trained gate on all response rows of other samples (held-out data).
    pub fn evaluate(&self, model: &Model, data: &[DistillSample]) -> Result<Vec<GateStats>> {
        let held_out = self.held_out(model, data, &mut SlowPass::default())?;
        Ok(self.evaluate_held_out(&held_out))
    }

    /// The slow stream of held-out `data`, computed once for repeated evaluation (early stopping).
    pub fn held_out(
        &self,
        model: &Model,
        data: &[DistillSample],
        slow: &mut SlowPass,
    ) -> Result<HeldOut> {
        let intervals: Vec<usize> = self.gates.iter().map(|g| g.gate - 1).collect();
        let samples = slow.run(&SlowKey {
            model,
            config: &self.template.config,
            data,
            intervals: &intervals,
            keep_aligned: self.options.align_intermediate,
        })?;
        let rows = response_rows(&samples);
        Ok(HeldOut { samples, rows })
    }

    /// Statistics of every trained gate on every response row of `held_out`.
    pub fn evaluate_held_out(&self, held_out: &HeldOut) -> Vec<GateStats> {
        self.evaluate_on(&held_out.samples, &held_out.rows)
    }

    fn evaluate_on(&self, samples: &[SlowSample<f32>], rows: &[Row]) -> Vec<GateStats> {
        (0..self.gates.len())
            .map(|i| {
                let parts: Vec<GateStats> = rows
                    .par_chunks(ROWS_PER_TASK)
                    .map(|chunk| self.chunk_gradient(i, samples, chunk, false).0)
                    .collect();
                let mut stats = GateStats {
                    gate: self.gates[i].gate,
                    ..GateStats::default()
                };
                parts.iter().for_each(|p| stats.add(p));
                stats
            })
            .collect()
    }

    /// Forward (and, with `grad`, backward) of gate `i` on one sub-batch; loss averaged over it.
    fn chunk_gradient(
        &self,
        i: usize,
        samples: &[SlowSample<f32>],
        rows: &[Row],
        grad: bool,
    ) -> (GateStats, Adapters<f32>) {
        let g = &self.gates[i];
        let j = g.gate - 1;
        let layers = self.template.config.interval_layers(j);
        let batch = Batch { samples, rows };
        let (u, tape) = bridge::interval_forward(&self.base, &g.adapters, j, layers.clone(), batch);
        // teacher: the base model's final distribution, from s_N
        let target = fast_stream::gather(batch, |s| &s.last);
        let (logits, head_tape, teacher) =
            self.base.head.forward_with_teacher(u.view(), target.view());
        let tau = self.options.temperature as f32;
        let hard = self.options.hard_label_weight as f32;
        let (kl, dlogits) = kl_loss(logits.view(), teacher.view(), tau, hard);
        let mut stats = GateStats {
            gate: g.gate,
            kl: kl.kl,
            align: 0.0,
            agree: kl.agree,
            rows: kl.rows,
        };
        let mut grads = g.adapters.zeros_like();
        let mut du_align = None;
        let mut d_inner = Vec::new();
        if let Some(kind) = self.options.align {
            let w = self.options.align_weight as f32;
            let (loss, du) = align_loss(kind, u.view(), target.view(), w);
            stats.align = loss as f64;
            du_align = Some(du);
            if self.options.align_intermediate {
                for (i, state) in tape.interval.inner_states().enumerate() {
                    let target = fast_stream::gather(batch, |s| {
                        &s.aligned[j]
                            .as_ref()
                            .expect("the samples keep the intermediate targets")[i]
                    });
                    let (loss, du) = align_loss(kind, state.view(), target.view(), w);
                    stats.align += loss as f64;
                    d_inner.push(du);
                }
            }
        }
        if grad {
            let mut du = self.base.head.backward(dlogits.view(), &head_tape);
            if let Some(d) = du_align {
                du += &d;
            }
            bridge::interval_backward(
                &self.base,
                &g.adapters,
                layers,
                batch,
                &tape,
                du,
                &d_inner,
                &mut grads,
                self.options.bridge_only,
            );
        }
        (stats, grads)
    }

    /// Rebuild a trainer from its parts (checkpoint resume).
    pub(crate) fn with_state(
        mut self,
        gates: Vec<GateState>,
        step: usize,
        history: Vec<StepLog>,
    ) -> Result<Self> {
        if gates.len() != self.gates.len()
            || gates
                .iter()
                .zip(&self.gates)
                .any(|(a, b)| a.gate != b.gate || a.opt.m.len() != b.opt.m.len())
        {
            return Err(Error::Invalid(
                "the checkpoint's optimizer state does not match its adapters".into(),
            ));
        }
        self.gates = gates;
        self.step = step;
        self.history = history;
        Ok(self)
    }
}

/// Held-out samples with their slow stream computed ([`Trainer::held_out`]).
pub struct HeldOut {
    samples: Vec<SlowSample<f32>>,
    rows: Vec<Row>,
}

/// Every trainable row (response positions) of `samples`.
fn response_rows(samples: &[SlowSample<f32>]) -> Vec<Row> {
    samples
        .iter()
        .enumerate()
        .flat_map(|(i, s)| (s.first_row..s.len()).map(move |pos| Row { sample: i, pos }))
        .collect()
}
