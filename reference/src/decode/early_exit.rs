//! Dynamic compute: early exit (docs/m2r2/early_exit.md). Its equations for one token are
//! `decode/early_exit_naive.rs` (tested equal).
//!
//! Per token, run interval by interval. At gate `g` the fast exit state `u_g` gives exit logits
//! `LMHead(FinalNorm(u_g))` and a gate score (ARLA, confidence or entropy); when the score reaches the
//! gate's threshold (shared by every gate, or one per gate: `m2r2/exit_threshold.rs`) the token is
//! emitted from the exit logits and its remaining layers are skipped.
//!
//! The skipped layers' K/V are needed by later tokens. Two policies:
//! - `exact` (default): the skipped slow layers of exited tokens are computed later, batched with the
//!   next token's rows when it reaches the layer where they stopped. Pending rows form groups of
//!   consecutive positions, each stopped at one frontier layer; older groups have strictly higher
//!   frontiers (a token that passes a group's frontier takes the group along). The KV cache then
//!   equals the base model's, bit for bit (docs/m2r2/shared_kv.md); only when layers run moves.
//! - `fast-kv`: fill the skipped layers' K/V from the exit state `u_g` (each layer's `attn_norm`, k and
//!   v projections, RoPE). Cheaper, approximate: later tokens see different keys above the exit.

use crate::base::generate::decode_positions;
use crate::base::kv_cache::KvCache;
use crate::base::matmul::linear;
use crate::base::model::Output;
use crate::base::ops::rms_norm;
use crate::base::sampling::{Sampler, SamplingParams};
use crate::base::work::Work;
use crate::error::{Error, Result};
use crate::m2r2::cost::CostModel;
use crate::m2r2::exit_gate::{GateKind, gate_score, should_exit};
use crate::m2r2::exit_threshold::ExitThreshold;
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, concatenate, s};

/// What happens to the K/V of the layers an exited token skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPolicy {
    Exact,
    FastKv,
}

impl std::str::FromStr for KvPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "exact" => Ok(KvPolicy::Exact),
            "fast-kv" => Ok(KvPolicy::FastKv),
            other => Err(Error::Invalid(format!(
                "unknown KV policy `{other}` (exact, fast-kv)"
            ))),
        }
    }
}

impl std::fmt::Display for KvPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvPolicy::Exact => "exact",
            KvPolicy::FastKv => "fast-kv",
        })
    }
}

#[derive(Clone, Debug)]
pub struct EarlyExitOptions {
    pub max_new_tokens: usize,
    pub stop_tokens: Vec<u32>,
    pub gate: GateKind,
    /// Exit at gate `g` when its score is at least `threshold.at(g)`.
    pub threshold: ExitThreshold,
    pub kv_policy: KvPolicy,
    /// `None`: greedy.
    pub sampling: Option<SamplingParams>,
}

/// One emitted token, for reports and `--trace`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExitTrace {
    pub token: u32,
    /// The gate it exited at (1-based), or `None` when it ran all N layers (or came from the prompt's
    /// last position).
    pub exit_gate: Option<usize>,
    /// Gate scores, one per gate evaluated.
    pub scores: Vec<f32>,
    /// Slow-stream layers this token had computed when it was emitted.
    pub layers_at_emit: usize,
}

#[derive(Clone, Debug)]
pub struct EarlyExitOutput {
    pub tokens: Vec<u32>,
    pub trace: Vec<ExitTrace>,
    /// Slow layer-rows computed after the prompt (deferred `exact` layers included), and fast ones.
    pub slow_layer_rows: usize,
    pub fast_layer_rows: usize,
    /// Work after the prompt (deferred `exact` layers and `fast-kv` fills included), counted from the
    /// shapes multiplied.
    pub work: Work,
    /// The KV cache left behind (complete: pending `exact` layers are flushed at the end).
    pub cache: KvCache,
}

impl EarlyExitOutput {
    /// Mean slow layers computed per generated token (the first token comes from the prompt's
    /// full forward and is not counted).
    pub fn layers_per_token(&self) -> f64 {
        let decoded = self.tokens.len().saturating_sub(1).max(1);
        self.slow_layer_rows as f64 / decoded as f64
    }

    /// How many tokens exited at each gate (index g-1), plus the last entry for "no exit".
    pub fn exit_histogram(&self, num_gates: usize) -> Vec<usize> {
        let mut hist = vec![0; num_gates + 1];
        for t in &self.trace {
            hist[t.exit_gate.map_or(num_gates, |g| g - 1)] += 1;
        }
        hist
    }
}

/// Rows of consecutive positions, as the `exact` policy's pending groups hold them: the slow
/// residuals (`[P, D]`) in the decoder, the positions in [`CostModel::early_exit`].
trait Rows {
    /// These rows after `older` (whose positions come just before them).
    fn after(self, older: Self) -> Self;
}

impl Rows for Array2<f32> {
    fn after(self, older: Self) -> Self {
        concatenate![Axis(0), older, self]
    }
}

impl Rows for Vec<usize> {
    fn after(self, mut older: Self) -> Self {
        older.extend(self);
        older
    }
}

/// The `exact` policy's exited tokens' slow rows waiting for their remaining layers: groups of
/// consecutive positions, each stopped at one frontier layer, oldest first, with frontiers
/// strictly decreasing along the stack (rows that reach a group's frontier take the group along).
/// The decoder and the cost model both keep their groups here, so they group alike.
struct Pending<R> {
    /// (rows, frontier), oldest first
    groups: Vec<(R, usize)>,
}

impl<R: Rows> Pending<R> {
    fn new() -> Self {
        Pending { groups: Vec::new() }
    }

    /// `rows` (the newest positions) reach `layer`: the group stopped there, if any, joins them.
    fn join_at(&mut self, layer: usize, rows: R) -> R {
        match self.groups.pop_if(|g| g.1 == layer) {
            Some((older, _)) => rows.after(older),
            None => rows,
        }
    }

    /// `rows` stop at `frontier` (merging with the group stopped there).
    fn stop(&mut self, rows: R, frontier: usize) {
        let rows = self.join_at(frontier, rows);
        self.groups.push((rows, frontier));
    }

    /// Run every group through its remaining layers up to `n_layers`: the newest group up, taking
    /// older groups along at their frontiers; `layer(l, rows)` runs layer `l` on the rows.
    fn complete(&mut self, n_layers: usize, mut layer: impl FnMut(usize, &mut R)) {
        let Some((mut rows, frontier)) = self.groups.pop() else {
            return;
        };
        for l in frontier..n_layers {
            rows = self.join_at(l, rows);
            layer(l, &mut rows);
        }
    }
}

/// Decode with early exit: prefill, then one token at a time until a gate fires, then complete the
/// KV cache.
pub fn early_exit_generate(
    m2r2: M2r2<'_>,
    prompt: &[u32],
    options: &EarlyExitOptions,
) -> Result<EarlyExitOutput> {
    if prompt.is_empty() {
        return Err(Error::Invalid(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    if options.gate == GateKind::Arla && m2r2.weights.arla.is_none() {
        return Err(Error::Invalid(
            "the ARLA gate needs ARLA weights (arla.safetensors)".into(),
        ));
    }
    options
        .threshold
        .check(m2r2.weights.config.num_gates(), "the early-exit threshold")?;
    let mut run = EarlyExit::prefill(m2r2, prompt, options)?;
    if options.max_new_tokens > 0 {
        let mut token = run.first_token();
        while run.out.tokens.len() < options.max_new_tokens && !options.stop_tokens.contains(&token)
        {
            token = run.step(token)?;
        }
        run.complete_pending();
    }
    run.out.cache = run.cache;
    Ok(run.out)
}

/// The state of an early-exit decode.
struct EarlyExit<'a> {
    m2r2: M2r2<'a>,
    options: &'a EarlyExitOptions,
    sampler: Sampler,
    cache: KvCache,
    /// The prompt's logits at its last position.
    prompt_last: Vec<f32>,
    /// The exited tokens' slow rows waiting for their skipped layers (`exact`).
    pending: Pending<Array2<f32>>,
    out: EarlyExitOutput,
}

impl<'a> EarlyExit<'a> {
    /// The prompt through the whole model in one chunk.
    fn prefill(m2r2: M2r2<'a>, prompt: &[u32], options: &'a EarlyExitOptions) -> Result<Self> {
        let model = m2r2.model;
        let sampler = Sampler::new(options.sampling.clone())?;
        let mut cache = model.new_cache(decode_positions(prompt.len(), options.max_new_tokens))?;
        let logits = model.forward(prompt, &mut cache)?.logits;
        Ok(EarlyExit {
            m2r2,
            options,
            sampler,
            cache,
            prompt_last: logits.row(prompt.len() - 1).to_vec(),
            pending: Pending::new(),
            out: EarlyExitOutput {
                tokens: Vec::new(),
                trace: Vec::new(),
                slow_layer_rows: 0,
                fast_layer_rows: 0,
                work: Work::default(),
                cache: KvCache::new(&model.config, 0),
            },
        })
    }

    /// The first token, from the prompt's full forward.
    fn first_token(&mut self) -> u32 {
        let token = self.sampler.next(&self.prompt_last);
        self.emit(token, None, vec![]);
        token
    }

    /// Feed `token` and run it interval by interval (taking pending groups along at their
    /// frontiers) until a gate's score reaches the threshold or the last layer; emit the next token.
    fn step(&mut self, token: u32) -> Result<u32> {
        let (m2r2, config) = (self.m2r2, &self.m2r2.weights.config);
        let model = m2r2.model;
        let p = self.cache.len();
        model.check_input(&[token], p, &self.cache)?;
        let mut s = model.embed(&[token]); // [rows, D]; the current token is the last row
        self.out.work += Work::read(model.config.hidden_size);
        let mut exit_states = Vec::new();
        let mut scores = Vec::new();
        for j in 0..=config.num_gates() {
            // A pending group joins when the current token reaches its frontier.
            s = self.pending.join_at(config.boundary(j), s);
            let current = s.nrows() - 1;
            let pos0 = p - current;
            let gated = j < config.num_gates();
            let slots: &[usize] = if gated { &[current] } else { &[] };
            let interval = m2r2.run_interval(j, &mut s, pos0, &mut self.cache, slots);
            self.out.work += interval.work;
            self.out.slow_layer_rows += s.nrows() * config.interval_len(j);
            self.out.fast_layer_rows += slots.len() * config.interval_len(j);
            if !gated {
                let Output { logits, work } = model.head(s.slice(s![current.., ..]));
                self.out.work += work;
                return Ok(self.emit_next(p, logits.row(0).as_slice().expect("row"), None, scores));
            }
            exit_states.push(interval.exit_states.row(0).to_owned());
            let (logits, score) = self.exit_head(&exit_states)?;
            scores.push(score);
            let gate = j + 1;
            if should_exit(score, self.options.threshold.at(gate)) {
                self.skip_layers(s, config.gate_layer(gate), exit_states[j].view(), p);
                return Ok(self.emit_next(p, &logits, Some(gate), scores));
            }
        }
        unreachable!("the last interval always emits")
    }

    /// Exit logits of the newest exit state and the gate's score over all of them.
    fn exit_head(&mut self, exit_states: &[Array1<f32>]) -> Result<(Vec<f32>, f32)> {
        let u = exit_states.last().expect("one exit state per gate reached");
        let Output { logits, work } = self.m2r2.model.head(u.view().insert_axis(Axis(0)));
        self.out.work += work;
        let logits = logits.row(0).to_vec();
        let views: Vec<ArrayView1<f32>> = exit_states.iter().map(|u| u.view()).collect();
        let eps = self.m2r2.model.config.rms_norm_eps as f32;
        let arla = self.m2r2.weights.arla.as_ref();
        let score = gate_score(self.options.gate, arla, &views, &logits, eps)?;
        Ok((logits, score))
    }

    /// The rows `s` stop at `exit_layer`: with `exact` they wait for the next token that reaches it
    /// (merging with an older group stopped there); with `fast-kv` the skipped layers' K/V of
    /// position `p` are filled from the exit state `u` now.
    fn skip_layers(&mut self, s: Array2<f32>, exit_layer: usize, u: ArrayView1<f32>, p: usize) {
        match self.options.kv_policy {
            KvPolicy::Exact => self.pending.stop(s, exit_layer),
            KvPolicy::FastKv => {
                self.out.work +=
                    fill_kv_from_exit_state(self.m2r2, exit_layer, u, p, &mut self.cache);
            }
        }
    }

    /// Choose the token after position `p` from `logits` and record it.
    fn emit_next(
        &mut self,
        p: usize,
        logits: &[f32],
        exit_gate: Option<usize>,
        scores: Vec<f32>,
    ) -> u32 {
        self.cache.set_len(p + 1);
        let token = self.sampler.next(logits);
        self.emit(token, exit_gate, scores);
        token
    }

    fn emit(&mut self, token: u32, exit_gate: Option<usize>, scores: Vec<f32>) {
        let config = &self.m2r2.weights.config;
        let n_layers = self.m2r2.model.config.num_hidden_layers;
        self.out.trace.push(ExitTrace {
            token,
            exit_gate,
            scores,
            layers_at_emit: exit_gate.map_or(n_layers, |g| config.gate_layer(g)),
        });
        self.out.tokens.push(token);
    }

    /// Complete the pending groups so the cache is the base model's: run the newest group up,
    /// taking older groups along at their frontiers.
    fn complete_pending(&mut self) {
        let model = self.m2r2.model;
        // The newest group ends at the cache's last position.
        let end = self.cache.len();
        let (cache, out) = (&mut self.cache, &mut self.out);
        self.pending
            .complete(model.config.num_hidden_layers, |l, states| {
                out.work += model
                    .layer_forward(l, states, end - states.nrows(), cache)
                    .work;
                out.slow_layer_rows += states.nrows();
            });
    }
}

/// `fast-kv`: K/V of layers `from..N` at position `p` computed from the exit state `u` with each
/// layer's own norm and projections (no adapters), written to the cache.
///
/// # Shapes
/// - `u`: `[D]`
fn fill_kv_from_exit_state(
    m2r2: M2r2<'_>,
    from: usize,
    u: ArrayView1<f32>,
    p: usize,
    cache: &mut KvCache,
) -> Work {
    let model = m2r2.model;
    let eps = model.config.rms_norm_eps as f32;
    let u: ArrayView2<f32> = u.insert_axis(Axis(0));
    let mut work = Work::default();
    for l in from..model.config.num_hidden_layers {
        let layer = &model.weights.layers[l];
        let h = rms_norm(u, &layer.attn_norm, eps);
        let mut k = linear(h.view(), layer.attn.k.w.view(), layer.attn.k.b.as_ref()); // [1, Hkv*Dh]
        let v = linear(h.view(), layer.attn.v.w.view(), layer.attn.v.b.as_ref());
        model.rope().apply(k.view_mut(), p, model.config.head_dim);
        cache.write(l, p, k.view(), v.view());
        let (kw, vw) = (&layer.attn.k, &layer.attn.v);
        work += Work::read(model.config.hidden_size)
            + Work::matmul(1, kw.w.nrows(), kw.w.ncols(), kw.b.is_some())
            + Work::matmul(1, vw.w.nrows(), vw.w.ncols(), vw.b.is_some());
    }
    work
}

impl CostModel<'_> {
    /// The work of early-exit decoding after the prompt, from the exit trace alone:
    /// token `i >= 1` of `trace` was produced by feeding the previous token at position
    /// `prompt_len + i - 1`; it ran interval by interval with a fast row, evaluating the exit head at
    /// each gate it reached, until its exit gate (or all layers and the base head). With `exact`, the
    /// rows it skipped wait in groups and run later with the next token that reaches them (and at the
    /// end); with `fast-kv`, the skipped layers' k/v projections run on the exit state at once.
    pub fn early_exit(&self, prompt_len: usize, trace: &[ExitTrace], kv_policy: KvPolicy) -> Work {
        let weights = self.m2r2.expect("early-exit cost needs the M2R2 weights");
        let m2r2 = &weights.config;
        let n_layers = self.model.num_hidden_layers;
        // The pending groups' positions, grouped as the decoder groups its rows.
        let mut pending = Pending::new();
        let mut w = Work::default();
        for (i, t) in trace.iter().enumerate().skip(1) {
            let p = prompt_len + i - 1;
            let mut positions = vec![p];
            w += self.embed(1);
            for j in 0..=m2r2.num_gates() {
                positions = pending.join_at(m2r2.boundary(j), positions);
                let gated = j < m2r2.num_gates();
                let fast: &[usize] = if gated { &[p] } else { &[] };
                for l in m2r2.interval_layers(j) {
                    w += self.layer(l, &positions, fast);
                }
                w += self.head(1);
                if !gated || t.exit_gate != Some(j + 1) {
                    continue;
                }
                let exit_layer = m2r2.gate_layer(j + 1);
                match kv_policy {
                    KvPolicy::Exact => pending.stop(positions, exit_layer),
                    KvPolicy::FastKv => w += self.kv_fill(exit_layer..n_layers),
                }
                break;
            }
        }
        pending.complete(n_layers, |l, positions| w += self.layer(l, positions, &[]));
        w
    }
}
