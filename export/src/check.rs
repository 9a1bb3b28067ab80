//! The oracle check of an export folder: run its graphs with ONNX Runtime (CPU) on a probe sequence
//! and compare every output with the reference (`m2r2 export --check` and the tests).
//!
//! The probe is fed in two chunks, so the second chunk reads the first one's cache through
//! `past_key_values` (empty past, then a non-empty past):
//!
//! | graph           | compared with the reference                                          |
//! |-----------------|----------------------------------------------------------------------|
//! | `model.onnx`    | `logits` of each chunk (`Model::forward`), final `present.*` (`KvCache`) |
//! | `draft.onnx`    | `draft_logits` (a pruned draft head: its `[T, K]` `subset_logits`), `exit_prob`, `hidden_states` of each chunk (`M2r2::run_interval` with a fast row per position, `Arla::exit_prob`), final `present.*`; with a bridge, fed the reference's final residual of each row's previous position as `bridge_states`, also `exit_states` |
//! | `verifier.onnx` | `logits` of each chunk from the reference `hidden_states`, final `present.*`; with a bridge, `final_states` |
//! | draft -> verifier | `logits` of `verifier.onnx` fed with `draft.onnx`'s `hidden_states` vs `model.onnx`'s |
//!
//! A static `model.onnx` (`--static-cache`) is run by the runner's own loop
//! ([`onnx_runner::greedy::OnnxModel`], buffers bound in place): the first chunk as a prefill, then
//! the second one token per step, each step's `logits` against the reference's step, then the
//! filled positions of every layer's buffers against the reference's cache.
//!
//! Tolerance ([`TOLERANCE`]): f32 on the CPU, the same operations in a different summation order
//! (ORT's blocked GEMMs and vectorised exp / sigmoid against the reference's sequential sums), so
//! differences are rounding: about 1e-6 relative per operation, accumulated over the layers. A
//! tensor passes when `max |onnx - ref| <= TOLERANCE * max(1, max |ref|)`: 1e-4 absolute for
//! values of order one (KV, hidden states, probabilities), scaled for logits of order ten.
//!
//! One exception ([`MERGED_F16_TOLERANCE`]): a static `--merge-adapters` draft in f16 stores the
//! fast stream's merged weight `W' = W + c B A` rounded once to f16, which the reference's
//! separately rounded `W`, `A` and `B` ([`rounded_to_f16`]) cannot reproduce: each weight differs
//! by up to half an f16 unit in the last place (2^-11, about 4.9e-4, relative), and the fast
//! outputs follow it: up to 5.0e-4 of their largest value on SmolLM2's probe, 2.6e-4 on tiny's.
//! The draft's fast-stream outputs (`draft_logits`, `exit_prob`, `exit_states`) are checked at
//! 2e-3 there, four such rounding steps: still far below what a wrong weight or wiring gives
//! (order one). They only choose what to draft; the slow rows, the verifier and the model keep
//! 1e-4.

use crate::error::{Error, Result};
use crate::graphs::{
    self, ATTENTION_MASK, BRIDGE_STATES, DRAFT_LOGITS, EXIT_PROB, EXIT_STATES, FINAL_STATES,
    GraphKind, HIDDEN_STATES, INPUT_IDS, LOGITS, POSITION_IDS,
};
use half::f16;
use ndarray::{Array, Dimension};
use ndarray::{Array2, Array4, ArrayD, ArrayView2, Axis};
use onnx_runner::ep::EpConfig;
use onnx_runner::session::{Input, OnnxSession, Outputs};
use reference::KvCache;
use reference::base::model::Model;
use reference::base::weights::FeedForward;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// Relative tolerance, see the module docs.
pub const TOLERANCE: f32 = 1e-4;
/// Relative tolerance of a merged f16 draft's fast-stream outputs, see the module docs.
pub const MERGED_F16_TOLERANCE: f32 = 2e-3;

/// One compared tensor.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    pub graph: String,
    pub tensor: String,
    pub max_abs_diff: f32,
    pub max_abs_ref: f32,
    /// It passes when `max_abs_diff <= tolerance * max(1, max_abs_ref)`.
    pub tolerance: f32,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        self.max_abs_diff <= self.tolerance * self.max_abs_ref.max(1.0)
    }
}

fn compare(graph: &str, tensor: &str, onnx: &ArrayD<f32>, reference: &ArrayD<f32>) -> Comparison {
    let max_abs_diff = if onnx.shape() == reference.shape() {
        onnx.iter()
            .zip(reference.iter())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) })
    } else {
        f32::INFINITY
    };
    Comparison {
        graph: graph.into(),
        tensor: format!("{tensor} {:?}", reference.shape()),
        max_abs_diff,
        max_abs_ref: reference.iter().fold(0.0f32, |m, v| m.max(v.abs())),
        tolerance: TOLERANCE,
    }
}

/// `[T, X]` reference rows as a batch of one: `[1, T, X]`.
fn batch1(x: ArrayView2<f32>) -> ArrayD<f32> {
    x.to_owned().insert_axis(Axis(0)).into_dyn()
}

/// Cache rows `[S, Hkv*Dh]` as the graphs' `[1, Hkv, S, Dh]`.
fn kv_layout(x: ArrayView2<f32>, heads: usize, dh: usize) -> ArrayD<f32> {
    let s = x.nrows();
    let x = x
        .to_owned()
        .into_shape_with_order((s, heads, dh))
        .expect("kv_dim = Hkv*Dh");
    let x: Array4<f32> = x
        .permuted_axes([1, 0, 2])
        .insert_axis(Axis(0))
        .as_standard_layout()
        .to_owned();
    x.into_dyn()
}

/// What the reference computes for the probe, chunk by chunk.
struct ReferenceRun {
    /// per chunk `[T_c, V]`
    logits: Vec<Array2<f32>>,
    /// per chunk `[T_c, V]`, or `[T_c, K]` with a pruned draft head
    draft_logits: Vec<Array2<f32>>,
    /// per chunk `[T_c]` (when ARLA weights exist)
    exit_prob: Vec<Option<Vec<f32>>>,
    /// per chunk `[T_c, D]` slow residual at `e`
    hidden: Vec<Array2<f32>>,
    /// per chunk `[T_c, D]` the final slow residual `s_N`
    finals: Vec<Array2<f32>>,
    /// per chunk `[T_c, D]` what the bridge reads: `s_N` of each row's previous position (zeros
    /// at position 0)
    bridge_states: Vec<Array2<f32>>,
    /// per chunk `[T_c, D]` the draft gate's exit state `u_{g_d}` (with the bridge's terms)
    exit_states: Vec<Array2<f32>>,
    /// the base model's cache after the probe (all layers)
    cache: KvCache,
    /// the cache written by the draft's slow rows (layers `0..e`)
    draft_cache: KvCache,
}

fn reference_run(
    model: &Model,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    chunks: &[&[u32]],
) -> Result<ReferenceRun> {
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut cache = model.new_cache(total)?;
    let mut draft_cache = model.new_cache(total)?;
    let m = M2r2::new(model, m2r2);
    let eps = model.config.rms_norm_eps as f32;
    let mut run = ReferenceRun {
        logits: vec![],
        draft_logits: vec![],
        exit_prob: vec![],
        hidden: vec![],
        finals: vec![],
        bridge_states: vec![],
        exit_states: vec![],
        cache: model.new_cache(0)?,
        draft_cache: model.new_cache(0)?,
    };
    // s_N of every position, teacher forced: what the bridge reads when all earlier positions are
    // verified
    let finals = m.all_exit_states_and_final(&chunks.concat())?.1;
    let d = model.config.hidden_size;
    for chunk in chunks {
        run.logits.push(model.forward(chunk, &mut cache)?.logits);
        let pos0 = draft_cache.len();
        model.check_input(chunk, pos0, &draft_cache)?;
        let mut s = model.embed(chunk);
        let slots: Vec<usize> = (0..chunk.len()).collect();
        let mut h = Array2::zeros((chunk.len(), d));
        for (t, mut row) in h.rows_mut().into_iter().enumerate() {
            if let Some(prev) = (pos0 + t).checked_sub(1) {
                row.assign(&finals.row(prev));
            }
        }
        let (entry, at_gate) = m.bridge_terms(draft_gate, h.view());
        let mut exits = Vec::new();
        for j in 0..draft_gate {
            let last = j + 1 == draft_gate;
            let from = entry.as_ref().filter(|_| last);
            let mut u = m
                .run_interval_from(j, &mut s, pos0, &mut draft_cache, &slots, from)
                .exit_states;
            if last && let Some(t) = &at_gate {
                u += t;
            }
            exits.push(u);
        }
        draft_cache.set_len(pos0 + chunk.len());
        run.finals.push(
            finals
                .slice(ndarray::s![pos0..pos0 + chunk.len(), ..])
                .to_owned(),
        );
        run.bridge_states.push(h);
        run.exit_states
            .push(exits.last().expect("draft_gate >= 1").clone());
        let u = exits.last().expect("draft_gate >= 1");
        run.draft_logits.push(match &m2r2.draft_head {
            // draft.onnx outputs the subset's K scores only
            Some(head) => head.subset_logits(model, u.view()).logits,
            None => m.exit_logits(u.view()),
        });
        run.exit_prob.push(m2r2.arla.as_ref().map(|arla| {
            (0..chunk.len())
                .map(|t| {
                    let states: Vec<_> = exits.iter().map(|u| u.row(t)).collect();
                    arla.exit_prob(&states, eps)
                })
                .collect()
        }));
        run.hidden.push(s);
    }
    run.cache = cache;
    run.draft_cache = draft_cache;
    Ok(run)
}

/// Feeds one chunk and carries the presents over as the next chunk's past: growing caches for a
/// dynamic graph, or for a static one (`static_l`) fixed buffers of `L` positions fed as plain
/// inputs (not in place: the check reads the graph, the runner's binding is checked by
/// [`check_static_model`] and the runner's tests) with the masks the runner builds.
struct Feeder {
    layers: std::ops::Range<usize>,
    past: Vec<(ArrayD<f32>, ArrayD<f32>)>,
    past_len: usize,
    static_l: Option<usize>,
    sliding_window: Option<usize>,
}

impl Feeder {
    fn new(model: &Model, layers: std::ops::Range<usize>, static_l: Option<usize>) -> Self {
        let c = &model.config;
        let empty = || {
            ArrayD::zeros(vec![
                1,
                c.num_key_value_heads,
                static_l.unwrap_or(0),
                c.head_dim,
            ])
        };
        Feeder {
            past: layers.clone().map(|_| (empty(), empty())).collect(),
            layers,
            past_len: 0,
            static_l,
            sliding_window: c.sliding_window,
        }
    }

    /// Run one chunk: `rows` is `input_ids` (ints) or `hidden_states` (floats); `extra`, another
    /// float input (draft.onnx's `bridge_states`).
    fn run(
        &mut self,
        session: &mut OnnxSession,
        rows: Rows<'_>,
        t: usize,
        extra: Option<(&str, &ArrayD<f32>)>,
    ) -> Result<onnx_runner::session::Outputs> {
        use onnx_runner::static_kv::{ATTN_MASK, FAST_ATTN_MASK, WRITE_INDICES};
        let total = self.past_len + t;
        let positions = ArrayD::from_shape_fn(vec![1, t], |i| (self.past_len + i[1]) as i64);
        let names: Vec<(String, String)> = self.layers.clone().map(graphs::past_names).collect();
        let mut inputs: Vec<(&str, Input<'_>)> = vec![(POSITION_IDS, Input::I64(positions.view()))];
        // dynamic: which cache positions are real; static: the masks and where to write
        let (mask, tree_mask, attn_mask, fast_mask, write);
        match self.static_l {
            None => {
                mask = ArrayD::<i64>::ones(vec![1, total]);
                inputs.push((ATTENTION_MASK, Input::I64(mask.view())));
                if session.inputs().iter().any(|i| i.name == graphs::TREE_MASK) {
                    let (p, w) = (self.past_len, self.sliding_window);
                    tree_mask = onnx_runner::tree_mask::causal_visibility(p, t, w).into_dyn();
                    inputs.push((graphs::TREE_MASK, Input::I64(tree_mask.view())));
                }
            }
            Some(l) => {
                let (p, w) = (self.past_len, self.sliding_window);
                attn_mask = onnx_runner::static_kv::attn_mask(p, t, l, w).into_dyn();
                fast_mask = onnx_runner::static_kv::fast_attn_mask(p, t, l, w).into_dyn();
                write = ArrayD::from_elem(vec![1], p as i64);
                inputs.push((ATTN_MASK, Input::F32(attn_mask.view())));
                inputs.push((WRITE_INDICES, Input::I64(write.view())));
                if session.inputs().iter().any(|i| i.name == FAST_ATTN_MASK) {
                    inputs.push((FAST_ATTN_MASK, Input::F32(fast_mask.view())));
                }
            }
        }
        match &rows {
            Rows::Ids(ids) => inputs.push((INPUT_IDS, Input::I64(ids.view()))),
            Rows::Hidden(h) => inputs.push((HIDDEN_STATES, Input::F32(h.view()))),
        }
        if let Some((name, x)) = extra {
            inputs.push((name, Input::F32(x.view())));
        }
        for ((k, v), (pk, pv)) in names.iter().zip(&self.past) {
            inputs.push((k, Input::F32(pk.view())));
            inputs.push((v, Input::F32(pv.view())));
        }
        let mut out = session.run(&inputs).map_err(runner_error)?;
        for (i, l) in self.layers.clone().enumerate() {
            let (k, v) = graphs::present_names(l);
            self.past[i] = (
                out.take(&k).map_err(runner_error)?,
                out.take(&v).map_err(runner_error)?,
            );
        }
        self.past_len = total;
        Ok(out)
    }

    /// Layer `i`'s (index in `layers`) filled positions, `[1, Hkv, past_len, Dh]`.
    fn filled(&self, i: usize) -> (ArrayD<f32>, ArrayD<f32>) {
        let cut = |x: &ArrayD<f32>| x.slice_axis(Axis(2), (0..self.past_len).into()).to_owned();
        (cut(&self.past[i].0), cut(&self.past[i].1))
    }
}

enum Rows<'a> {
    Ids(ArrayD<i64>),
    Hidden(&'a ArrayD<f32>),
}

/// The runner's name for graph `kind`.
fn runner_kind(kind: GraphKind) -> onnx_runner::manifest::GraphKind {
    use onnx_runner::manifest::GraphKind as Runner;
    match kind {
        GraphKind::Model => Runner::Model,
        GraphKind::Draft => Runner::Draft,
        GraphKind::Verifier => Runner::Verifier,
        GraphKind::Feed => Runner::Feed,
    }
}

fn runner_error(e: onnx_runner::Error) -> Error {
    Error::Invalid(format!("ONNX Runtime: {e}"))
}

fn ids(chunk: &[u32]) -> ArrayD<i64> {
    ArrayD::from_shape_vec(
        vec![1, chunk.len()],
        chunk.iter().map(|&t| t as i64).collect(),
    )
    .expect("[1, T]")
}

fn output(out: &Outputs, name: &str) -> Result<ArrayD<f32>> {
    Ok(out.get(name).map_err(runner_error)?.clone())
}

/// Compare the final presents of `layers` with the reference cache.
fn compare_presents(
    graph: &str,
    model: &Model,
    feeder: &Feeder,
    cache: &KvCache,
    rows: &mut Vec<Comparison>,
) {
    let c = &model.config;
    for (i, l) in feeder.layers.clone().enumerate() {
        let (k, v) = cache.layer(l, feeder.past_len);
        let (kn, vn) = graphs::present_names(l);
        let (ok, ov) = &feeder.filled(i);
        rows.push(compare(
            graph,
            &kn,
            ok,
            &kv_layout(k, c.num_key_value_heads, c.head_dim),
        ));
        rows.push(compare(
            graph,
            &vn,
            ov,
            &kv_layout(v, c.num_key_value_heads, c.head_dim),
        ));
    }
}

/// Run the graphs `kinds` of the folder `dir` on `tokens` (split into two chunks at `split`) and
/// compare with the reference. `draft_gate` must be the one the folder was exported with.
pub fn check_folder(
    dir: &Path,
    model: &Model,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    kinds: &[GraphKind],
    tokens: &[u32],
    split: usize,
) -> Result<Vec<Comparison>> {
    if split == 0 || split >= tokens.len() {
        return Err(Error::Invalid(format!(
            "probe of {} tokens cannot be split at {split}",
            tokens.len()
        )));
    }
    onnx_runner::runtime::init().map_err(runner_error)?;
    let chunks = [&tokens[..split], &tokens[split..]];
    let reference = reference_run(model, m2r2, draft_gate, &chunks)?;
    let n = model.config.num_hidden_layers;
    let e = m2r2.config.gate_layer(draft_gate);
    let ep = EpConfig::cpu();
    let load =
        |k: GraphKind| OnnxSession::load(&dir.join(k.file_name()), &ep).map_err(runner_error);
    let mut rows = Vec::new();
    let mut model_logits = Vec::new();
    let mut draft_hidden = Vec::new();
    let mut feed_hidden = Vec::new();
    let export = onnx_runner::manifest::ExportDir::open(dir).map_err(runner_error)?;
    let static_model = export
        .static_l_max(onnx_runner::manifest::GraphKind::Model)
        .is_some()
        && kinds.contains(&GraphKind::Model);
    if static_model {
        model_logits = check_static_model(&export, model, &chunks, &mut rows)?;
    }
    let manifest = &export.manifest;
    let merged = manifest
        .static_cache
        .as_ref()
        .is_some_and(|s| s.merged_adapters);
    let fast_tolerance = match merged && manifest.weights_dtype == "f16" {
        true => MERGED_F16_TOLERANCE,
        false => TOLERANCE,
    };
    let fast_outputs = [DRAFT_LOGITS, EXIT_PROB, EXIT_STATES];
    for &kind in kinds
        .iter()
        .filter(|&&k| !(static_model && k == GraphKind::Model))
    {
        let mut session = load(kind)?;
        let name = kind.file_name();
        let mut feeder = Feeder::new(
            model,
            kind.layers(n, e),
            export.static_l_max(runner_kind(kind)),
        );
        for (c, chunk) in chunks.iter().enumerate() {
            // Output `tensor` of this chunk's run against `want`: the row is kept, the output
            // returned.
            let mut checked = |out: &Outputs, tensor: &str, want: &ArrayD<f32>| {
                let got = output(out, tensor)?;
                let tag = format!("{tensor} (chunk {})", c + 1);
                let mut row = compare(&name, &tag, &got, want);
                if kind == GraphKind::Draft && fast_outputs.contains(&tensor) {
                    row.tolerance = fast_tolerance;
                }
                rows.push(row);
                Ok::<_, Error>(got)
            };
            let hidden = batch1(reference.hidden[c].view());
            let logits = batch1(reference.logits[c].view());
            match kind {
                GraphKind::Model => {
                    let out = feeder.run(&mut session, Rows::Ids(ids(chunk)), chunk.len(), None)?;
                    model_logits.push(checked(&out, LOGITS, &logits)?);
                }
                GraphKind::Draft => {
                    let bridge = batch1(reference.bridge_states[c].view());
                    let bridged = m2r2.bridge_at(draft_gate).is_some();
                    let extra = bridged.then_some((BRIDGE_STATES, &bridge));
                    let out =
                        feeder.run(&mut session, Rows::Ids(ids(chunk)), chunk.len(), extra)?;
                    if bridged {
                        checked(&out, EXIT_STATES, &batch1(reference.exit_states[c].view()))?;
                    }
                    let draft_logits = batch1(reference.draft_logits[c].view());
                    checked(&out, DRAFT_LOGITS, &draft_logits)?;
                    if let Some(p) = &reference.exit_prob[c] {
                        let want =
                            ArrayD::from_shape_vec(vec![1, p.len()], p.clone()).expect("[1, T]");
                        checked(&out, EXIT_PROB, &want)?;
                    }
                    draft_hidden.push(checked(&out, HIDDEN_STATES, &hidden)?);
                }
                GraphKind::Feed => {
                    let out = feeder.run(&mut session, Rows::Ids(ids(chunk)), chunk.len(), None)?;
                    feed_hidden.push(checked(&out, HIDDEN_STATES, &hidden)?);
                }
                GraphKind::Verifier => {
                    let out = feeder.run(&mut session, Rows::Hidden(&hidden), chunk.len(), None)?;
                    checked(&out, LOGITS, &logits)?;
                    if m2r2.bridge_at(draft_gate).is_some() {
                        checked(&out, FINAL_STATES, &batch1(reference.finals[c].view()))?;
                    }
                }
            }
        }
        let cache = match kind {
            GraphKind::Draft | GraphKind::Feed => &reference.draft_cache,
            _ => &reference.cache,
        };
        compare_presents(&name, model, &feeder, cache, &mut rows);
    }
    // draft (or feed) -> verifier on ONNX Runtime alone reproduces model.onnx
    for (chain, hidden) in [
        ("draft.onnx -> verifier.onnx", &draft_hidden),
        ("feed.onnx -> verifier.onnx", &feed_hidden),
    ] {
        if !kinds.contains(&GraphKind::Verifier) || model_logits.is_empty() || hidden.is_empty() {
            continue;
        }
        let mut session = load(GraphKind::Verifier)?;
        let mut feeder = Feeder::new(
            model,
            GraphKind::Verifier.layers(n, e),
            export.static_l_max(runner_kind(GraphKind::Verifier)),
        );
        for (c, chunk) in chunks.iter().enumerate() {
            let out = feeder.run(&mut session, Rows::Hidden(&hidden[c]), chunk.len(), None)?;
            rows.push(compare(
                chain,
                &format!("logits vs model.onnx (chunk {})", c + 1),
                &output(&out, LOGITS)?,
                &model_logits[c],
            ));
        }
    }
    Ok(rows)
}

/// A static model.onnx through the runner: `chunks[0]` as one run, then each token of the later
/// chunks as a run of its own, each against the reference's same step; then the buffers' filled
/// positions against the reference's cache. Returns the logits per chunk (`[1, T_c, V]`).
fn check_static_model(
    export: &onnx_runner::manifest::ExportDir,
    model: &Model,
    chunks: &[&[u32]],
    rows: &mut Vec<Comparison>,
) -> Result<Vec<ArrayD<f32>>> {
    let graph = "model.onnx (static)";
    let mut onnx =
        onnx_runner::greedy::OnnxModel::load(export, &EpConfig::cpu()).map_err(runner_error)?;
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut cache = model.new_cache(total)?;
    let mut per_chunk = Vec::new();
    for (c, chunk) in chunks.iter().enumerate() {
        let steps: Vec<&[u32]> = if c == 0 {
            vec![chunk]
        } else {
            chunk.chunks(1).collect()
        };
        let mut got_rows = Vec::new();
        for step in steps {
            let pos = cache.len();
            let want = model.forward(step, &mut cache)?.logits;
            let got = onnx.forward(step).map_err(runner_error)?;
            let tag = format!("{LOGITS} (positions {pos}..{})", pos + step.len());
            rows.push(compare(
                graph,
                &tag,
                &batch1(got.view()),
                &batch1(want.view()),
            ));
            got_rows.push(got);
        }
        let views: Vec<_> = got_rows.iter().map(|r| r.view()).collect();
        let logits = ndarray::concatenate(Axis(0), &views).expect("same vocab in every step");
        per_chunk.push(batch1(logits.view()));
    }
    let kv = onnx.kv().map_err(runner_error)?;
    let c = &model.config;
    for l in 0..c.num_hidden_layers {
        let (k, v) = cache.layer(l, total);
        let (ok, ov) = kv.layer(l);
        let (kn, vn) = graphs::present_names(l);
        let filled = format!("filled positions 0..{total}");
        rows.push(compare(
            graph,
            &format!("{kn} ({filled})"),
            &ok.clone().into_dyn(),
            &kv_layout(k, c.num_key_value_heads, c.head_dim),
        ));
        rows.push(compare(
            graph,
            &format!("{vn} ({filled})"),
            &ov.clone().into_dyn(),
            &kv_layout(v, c.num_key_value_heads, c.head_dim),
        ));
    }
    Ok(per_chunk)
}

/// The probe `--check` feeds: a short English sentence when the model has a tokenizer, else fixed
/// ids; split in the middle.
pub fn probe_tokens(
    model: &Model,
    tokenizer: Option<&reference::io::tokenizer::Tokenizer>,
) -> Result<Vec<u32>> {
    let tokens = match tokenizer {
        Some(t) => t.encode("The quick brown fox jumps over the lazy dog.", false)?,
        None => vec![3, 1, 4, 1, 5, 9, 2, 6],
    };
    let tokens: Vec<u32> = tokens
        .into_iter()
        .map(|t| t % model.config.vocab_size as u32)
        .collect();
    if tokens.len() < 2 {
        return Err(Error::Invalid(
            "the probe sequence needs at least 2 tokens".into(),
        ));
    }
    Ok(tokens)
}

fn round_f16<D: Dimension>(a: &mut Array<f32, D>) {
    a.mapv_inplace(|v| f16::from_f32(v).to_f32());
}

/// The model and M2R2 weights with every weight rounded to f16 (round to nearest even): what the
/// f16 graphs compute after their casts, so the f16 flavour is checked against this reference.
pub fn rounded_to_f16(model: &Model, m2r2: &M2r2Weights) -> (Model, M2r2Weights) {
    let mut w = model.weights.clone();
    round_f16(&mut w.embed);
    round_f16(&mut w.final_norm);
    if let Some(h) = &mut w.lm_head {
        round_f16(h);
    }
    let lin = |l: &mut reference::base::weights::Linear| {
        round_f16(&mut l.w);
        if let Some(b) = &mut l.b {
            round_f16(b);
        }
    };
    for layer in &mut w.layers {
        round_f16(&mut layer.attn_norm);
        round_f16(&mut layer.mlp_norm);
        let a = &mut layer.attn;
        for l in [&mut a.q, &mut a.k, &mut a.v, &mut a.o] {
            lin(l);
        }
        let mlps = match &mut layer.ffn {
            FeedForward::Dense(m) => vec![m],
            FeedForward::Moe(moe) => {
                round_f16(&mut moe.router);
                moe.experts.iter_mut().collect()
            }
        };
        for m in mlps {
            for l in [&mut m.gate, &mut m.up, &mut m.down] {
                lin(l);
            }
        }
    }
    let mut m = m2r2.clone();
    for la in m.accelerator.layers.iter_mut().flatten() {
        for lora in la.loras.values_mut() {
            let (mut a, mut b) = (lora.a().clone(), lora.b().clone());
            round_f16(&mut a);
            round_f16(&mut b);
            lora.set(a, b);
        }
    }
    if let Some(bridge) = &mut m.bridge {
        for lora in bridge.maps.values_mut() {
            let (mut a, mut b) = (lora.a().clone(), lora.b().clone());
            round_f16(&mut a);
            round_f16(&mut b);
            lora.set(a, b);
        }
    }
    if let Some(arla) = &mut m.arla {
        for x in [
            &mut arla.proj,
            &mut arla.gate_embed,
            &mut arla.wq,
            &mut arla.wk,
            &mut arla.wv,
        ] {
            round_f16(x);
        }
        round_f16(&mut arla.norm);
        round_f16(&mut arla.wo);
        arla.bo = f16::from_f32(arla.bo).to_f32();
    }
    (Model::new(model.config.clone(), w), m)
}
