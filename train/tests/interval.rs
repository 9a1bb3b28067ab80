//! The training forward of an interval equals the reference inference forward, and the whole
//! interval's adapter gradients (through the head and the KL loss) match finite differences.

use ndarray::{Array2, ArrayD, Axis};
use reference::base::weight_names::{AttnProj, Target};
use reference::io::builtin::{builtin, random_model, tiny_config};
use reference::m2r2::accelerator::Lora;
use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
use reference::m2r2::config::M2r2Config;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use reference::{Model, ModelConfig};
use train::adapters::Adapters;
use train::align::{AlignKind, align_loss};
use train::bridge;
use train::fast_stream::{self, Batch, FrozenBase, Row};
use train::grad_check::{compare, numeric_gradient};
use train::head::kl_loss;
use train::slow_stream::SlowSample;

const TOKENS: [u32; 9] = [3, 1, 4, 1, 5, 9, 2, 6, 5];

/// Exit logits of every position and gate from the reference (`run_interval` + head).
fn reference_exit_logits(model: &Model, weights: &M2r2Weights) -> Vec<Array2<f32>> {
    let m2r2 = M2r2::new(model, weights);
    m2r2.all_exit_states(&TOKENS)
        .unwrap()
        .iter()
        .map(|(u, _)| m2r2.exit_logits(u.view()))
        .collect()
}

/// All rows of all samples, out of order, to show rows are independent.
fn rows() -> Vec<Row> {
    let mut rows: Vec<Row> = (0..TOKENS.len())
        .map(|pos| Row { sample: 0, pos })
        .collect();
    rows.reverse();
    rows
}

/// Largest `|a - b| / (1 + |b|)` between the training forward's exit logits (one row per `rows`)
/// and the reference's at the rows' positions.
fn max_relative_diff(logits: &Array2<f32>, want: &Array2<f32>, rows: &[Row]) -> f32 {
    let mut max = 0.0f32;
    for (r, row) in rows.iter().enumerate() {
        for (a, b) in logits.row(r).iter().zip(want.row(row.pos)) {
            max = max.max((a - b).abs() / (1.0 + b.abs()));
        }
    }
    max
}

/// The loss the gradient checks differentiate: exit head, then KL (`tau` 1.5) to the base model's
/// distribution at the rows' positions of sample 0.
struct ExitKl {
    teacher: Array2<f64>,
}

impl ExitKl {
    const TAU: f64 = 1.5;

    fn new(base: &FrozenBase<f64>, sample: &SlowSample<f64>, rows: &[Row]) -> Self {
        let positions: Vec<usize> = rows.iter().map(|r| r.pos).collect();
        let last = sample.last.select(Axis(0), &positions);
        ExitKl {
            teacher: base.head.forward(last.view()).0,
        }
    }

    fn loss(&self, base: &FrozenBase<f64>, u: &Array2<f64>) -> f64 {
        let logits = base.head.forward(u.view()).0;
        kl_loss(logits.view(), self.teacher.view(), Self::TAU, 0.0)
            .0
            .loss
    }

    /// The gradient of [`ExitKl::loss`] with respect to the exit states `u`.
    fn du(&self, base: &FrozenBase<f64>, u: &Array2<f64>) -> Array2<f64> {
        let (logits, head_tape) = base.head.forward(u.view());
        let (_, dlogits) = kl_loss(logits.view(), self.teacher.view(), Self::TAU, 0.0);
        base.head.backward(dlogits.view(), &head_tape)
    }
}

#[test]
fn forward_equals_reference_run_interval() {
    let model = reference::io::builtin::builtin("tiny").unwrap();
    let weights =
        M2r2Weights::random(&model.config, M2r2Config::default_for(&model.config), 5).unwrap();
    let want = reference_exit_logits(&model, &weights);
    let config = &weights.config;
    let intervals: Vec<usize> = (0..config.num_gates()).collect();
    let sample = SlowSample::<f32>::compute(&model, config, &TOKENS, 0, &intervals).unwrap();
    let samples = [sample];
    let layers = 0..config.gate_layer(config.num_gates());
    let base = FrozenBase::<f32>::new(&model, layers).unwrap();
    let adapters = Adapters::<f32>::from_accelerator(&weights.accelerator, |_| true);
    let rows = rows();
    let batch = Batch {
        samples: &samples,
        rows: &rows,
    };
    for j in intervals {
        let f = fast_stream::start_states(batch, j);
        let (u, _) = fast_stream::forward(&base, &adapters, config.interval_layers(j), batch, f);
        let (logits, _) = base.head.forward(u.view());
        let max = max_relative_diff(&logits, &want[j], &rows);
        println!("gate {}: max relative |logit diff| {max:.2e}", j + 1);
        assert!(max < 1e-5, "gate {}: {max}", j + 1);
    }
}

/// The same check on the real model (SmolLM2-135M: 9 query heads over 3 KV heads, Dh 64, tied
/// head), draft gate only, with seeded random adapters. Needs `m2r2 fetch smollm2` (fails, never
/// skips, without it).
#[test]
fn smollm2_forward_equals_reference_run_interval() {
    let loaded = reference::io::load::load_model("smollm2").unwrap();
    let model = &loaded.model;
    let mut config = M2r2Config::default_for(&model.config);
    config.rank = 4;
    let weights = M2r2Weights::random(&model.config, config, 9).unwrap();
    let want = reference_exit_logits(model, &weights);
    let config = &weights.config;
    let samples = [SlowSample::<f32>::compute(model, config, &TOKENS, 0, &[0]).unwrap()];
    let base = FrozenBase::<f32>::new(model, config.interval_layers(0)).unwrap();
    let adapters = Adapters::<f32>::from_accelerator(&weights.accelerator, |l| l < config.gates[0]);
    let rows = rows();
    let batch = Batch {
        samples: &samples,
        rows: &rows,
    };
    let f = fast_stream::start_states(batch, 0);
    let (u, _) = fast_stream::forward(&base, &adapters, config.interval_layers(0), batch, f);
    let (logits, _) = base.head.forward(u.view());
    let max = max_relative_diff(&logits, &want[0], &rows);
    println!("smollm2 gate 1: max relative |logit diff| {max:.2e}");
    assert!(max < 1e-5, "{max}");
}

/// A tiny dense model (D = 16) so that every adapter coordinate can be probed.
fn micro_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 24,
        hidden_size: 16,
        intermediate_size: 20,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 4,
        max_position_embeddings: 32,
        tie_word_embeddings: false,
        ..tiny_config()
    }
}

#[test]
fn whole_interval_gradients_match_finite_differences() {
    let model = random_model(micro_config(), 11).unwrap();
    // Keep the f32 base weights but run the training code in f64.
    let mut config = M2r2Config::default_for(&model.config);
    config.gates = vec![2, 3];
    config.rank = 2;
    config.alpha = 3.0;
    let mut weights = M2r2Weights::random(&model.config, config, 7).unwrap();
    // Pairs with their own rank and alpha (PEFT's rank / alpha patterns): layer 0 widened to rank
    // 3, layer 1's q_proj with alpha 5 (scale 2.5 where the others have 1.5).
    weights.accelerator.widen(0..1, 3, 1).unwrap();
    let q = Target::Attn(AttnProj::Q);
    let lora = weights.accelerator.layers[1]
        .as_mut()
        .unwrap()
        .loras
        .get_mut(&q)
        .unwrap();
    *lora = Lora::new(lora.a().clone(), lora.b().clone(), 5.0);
    let config = &weights.config;
    let tokens: Vec<u32> = TOKENS.iter().map(|t| t % 24).collect();
    let samples = [SlowSample::<f64>::compute(&model, config, &tokens, 0, &[0]).unwrap()];
    let layers = config.interval_layers(0);
    let base = FrozenBase::<f64>::new(&model, layers.clone()).unwrap();
    let adapters = Adapters::<f64>::from_accelerator(&weights.accelerator, |l| layers.contains(&l));
    let rows: Vec<Row> = [0, 3, 8, 5].map(|pos| Row { sample: 0, pos }).to_vec();
    let batch = Batch {
        samples: &samples,
        rows: &rows,
    };
    let kl = ExitKl::new(&base, &samples[0], &rows);
    let loss = |a: &Adapters<f64>| {
        let f = fast_stream::start_states(batch, 0);
        let (u, _) = fast_stream::forward(&base, a, layers.clone(), batch, f);
        kl.loss(&base, &u)
    };
    // analytic
    let f = fast_stream::start_states(batch, 0);
    let (u, tape) = fast_stream::forward(&base, &adapters, layers.clone(), batch, f);
    let du = kl.du(&base, &u);
    let mut grads = adapters.zeros_like();
    fast_stream::backward(
        &base,
        &adapters,
        layers.clone(),
        batch,
        &tape,
        du,
        &[],
        &mut grads,
    );
    assert_gradients_match(&adapters, &grads, loss);
}

/// Every coordinate of every adapter and bridge tensor: `grads` against finite differences of
/// `loss` (tensors in `Adapters::tensors` order).
fn assert_gradients_match(
    adapters: &Adapters<f64>,
    grads: &Adapters<f64>,
    loss: impl Fn(&Adapters<f64>) -> f64,
) {
    let pairs = adapters.pairs.keys().map(|(l, t)| format!("layer {l} {t}"));
    let sites = adapters
        .bridge
        .keys()
        .map(|s| format!("bridge {}", s.name()));
    let names: Vec<String> = pairs
        .chain(sites)
        .flat_map(|k| [format!("{k} A"), format!("{k} B")])
        .collect();
    let mut all_ok = true;
    for (i, (tensor, analytic)) in adapters.tensors().zip(grads.tensors()).enumerate() {
        let numeric: ArrayD<f64> = numeric_gradient(tensor.view().into_dyn(), |p| {
            let mut probe = adapters.clone();
            let t = probe.tensors_mut().nth(i).unwrap();
            t.assign(&p.view().into_dimensionality::<ndarray::Ix2>().unwrap());
            loss(&probe)
        });
        let report = compare(
            &names[i],
            analytic.view().into_dyn(),
            numeric.view(),
            1e-8,
            1e-5,
        );
        println!("{report}");
        all_ok &= report.ok;
    }
    assert!(
        all_ok,
        "some adapter gradients differ from finite differences"
    );
}

/// The draft gate's interval with a bridge at both sites (`train::bridge::interval_forward`):
/// every adapter and bridge gradient against finite differences of the KL, in f64. Rows at
/// position 0 (no earlier state: the bridge adds nothing) and later ones.
#[test]
fn bridged_interval_gradients_match_finite_differences() {
    let model = random_model(micro_config(), 13).unwrap();
    let mut config = M2r2Config::default_for(&model.config);
    config.gates = vec![2, 3];
    config.rank = 2;
    config.alpha = 3.0;
    let bridge = BridgeConfig {
        gate: 1,
        rank: 2,
        sites: BridgeSite::ALL.to_vec(),
        scales: [(BridgeSite::Entry, 0.3)].into(),
    };
    let weights = M2r2Weights::random(&model.config, config, 9)
        .unwrap()
        .with_bridge(&model.config, bridge, 4, 0.3)
        .unwrap();
    let config = &weights.config;
    let tokens: Vec<u32> = TOKENS.iter().map(|t| (t * 3) % 24).collect();
    let samples = [SlowSample::<f64>::compute(&model, config, &tokens, 0, &[0]).unwrap()];
    let layers = config.interval_layers(0);
    let base = FrozenBase::<f64>::new(&model, layers.clone()).unwrap();
    let adapters = Adapters::<f64>::from_accelerator(&weights.accelerator, |l| layers.contains(&l))
        .with_bridge(weights.bridge.as_ref().unwrap());
    let rows: Vec<Row> = [0, 3, 8, 5].map(|pos| Row { sample: 0, pos }).to_vec();
    let batch = Batch {
        samples: &samples,
        rows: &rows,
    };
    let kl = ExitKl::new(&base, &samples[0], &rows);
    let loss = |a: &Adapters<f64>| {
        let (u, _) = bridge::interval_forward(&base, a, 0, layers.clone(), batch);
        kl.loss(&base, &u)
    };
    let (u, tape) = bridge::interval_forward(&base, &adapters, 0, layers.clone(), batch);
    let du = kl.du(&base, &u);
    let mut grads = adapters.zeros_like();
    bridge::interval_backward(
        &base,
        &adapters,
        layers.clone(),
        batch,
        &tape,
        du,
        &[],
        &mut grads,
        false,
    );
    assert_eq!(grads.bridge.len(), 2);
    // bridge only, gate site only: the interval's backward is skipped, the gate's map gets the
    // same gradient
    let gate_only = Adapters {
        bridge: adapters
            .bridge
            .iter()
            .filter(|(s, _)| **s == BridgeSite::Gate)
            .map(|(&s, p)| (s, p.clone()))
            .collect(),
        ..adapters.clone()
    };
    let (u, gate_tape) = bridge::interval_forward(&base, &gate_only, 0, layers.clone(), batch);
    let du = kl.du(&base, &u);
    let (mut full, mut only) = (gate_only.zeros_like(), gate_only.zeros_like());
    for (out, skip) in [(&mut full, false), (&mut only, true)] {
        bridge::interval_backward(
            &base,
            &gate_only,
            layers.clone(),
            batch,
            &gate_tape,
            du.clone(),
            &[],
            out,
            skip,
        );
    }
    assert_eq!(only.bridge, full.bridge);
    assert!(only.pairs.values().all(|p| p.a.iter().all(|&v| v == 0.0)));
    assert_gradients_match(&adapters, &grads, loss);
}

/// The bridged interval in f32 equals the reference's draft: a fast row with the bridge's entry
/// term added to its start and its gate term to its exit state, reading the previous position's
/// final slow residual.
#[test]
fn bridged_forward_equals_reference() {
    let model = builtin("tiny").unwrap();
    let config = BridgeConfig {
        gate: 1,
        rank: 4,
        sites: BridgeSite::ALL.to_vec(),
        scales: [(BridgeSite::Gate, 2.0)].into(),
    };
    let weights = M2r2Weights::builtin_for("tiny", &model.config)
        .unwrap()
        .with_bridge(&model.config, config, 5, 0.5)
        .unwrap();
    let c = &weights.config;
    let samples = [SlowSample::<f32>::compute(&model, c, &TOKENS, 0, &[0]).unwrap()];
    let layers = c.interval_layers(0);
    let base = FrozenBase::<f32>::new(&model, layers.clone()).unwrap();
    let adapters = Adapters::<f32>::from_accelerator(&weights.accelerator, |l| layers.contains(&l))
        .with_bridge(weights.bridge.as_ref().unwrap());
    let rows: Vec<Row> = (1..TOKENS.len())
        .map(|pos| Row { sample: 0, pos })
        .collect();
    let batch = Batch {
        samples: &samples,
        rows: &rows,
    };
    let (u, _) = bridge::interval_forward(&base, &adapters, 0, layers, batch);
    // the reference: teacher-forced finals, then each row's draft with its bridge terms
    let m2r2 = M2r2::new(&model, &weights);
    let (_, finals) = m2r2.all_exit_states_and_final(&TOKENS).unwrap();
    let mut cache = model.new_cache(TOKENS.len()).unwrap();
    let mut s = model.embed(&TOKENS);
    let prev = finals.slice(ndarray::s![..TOKENS.len() - 1, ..]);
    let (entry, gate) = m2r2.bridge_terms(1, prev);
    let mut entry_all = Array2::zeros(s.raw_dim());
    entry_all
        .slice_mut(ndarray::s![1.., ..])
        .assign(entry.as_ref().unwrap());
    let slots: Vec<usize> = (0..TOKENS.len()).collect();
    let out = m2r2.run_interval_from(0, &mut s, 0, &mut cache, &slots, Some(&entry_all));
    let want = &out.exit_states.slice(ndarray::s![1.., ..]) + gate.as_ref().unwrap();
    approx::assert_abs_diff_eq!(u, want, epsilon = 2e-4);
}

/// Spec section 1's intermediate alignment targets: with gates [3] on 4 layers, interval 0 has
/// k = 3 layers and its inner states after layers 1 and 2 estimate the slow residuals at depths
/// d(1) = round(4/3) = 1 and d(2) = round(8/3) = 3. The loss is KL + the exit alignment + one
/// term per inner state; its adapter gradients (through `backward`'s `d_inner`) match finite
/// differences for both kinds.
#[test]
fn intermediate_alignment_gradients_match_finite_differences() {
    let model = random_model(micro_config(), 12).unwrap();
    let mut config = M2r2Config::default_for(&model.config);
    config.gates = vec![3];
    config.rank = 2;
    config.alpha = 3.0;
    let weights = M2r2Weights::random(&model.config, config, 8).unwrap();
    let config = &weights.config;
    assert_eq!(
        (1..3)
            .map(|i| config.aligned_depth(0, i))
            .collect::<Vec<_>>(),
        [1, 3]
    );
    let tokens: Vec<u32> = TOKENS.iter().map(|t| (t * 5) % 24).collect();
    let sample = SlowSample::<f64>::compute_with(&model, config, &tokens, 0, &[0], true).unwrap();
    // the kept targets are the slow residuals after 1 and 3 layers
    let mut cache = model.new_cache(tokens.len()).unwrap();
    let mut s = model.embed(&tokens);
    let mut after = Vec::new();
    for l in 0..4 {
        model.layer_forward(l, &mut s, 0, &mut cache);
        after.push(s.clone());
    }
    let kept = sample.aligned[0].as_ref().expect("kept");
    assert_eq!(kept.len(), 2);
    for (got, want) in kept.iter().zip([&after[0], &after[2]]) {
        let diff = (got - &want.mapv(f64::from))
            .mapv(f64::abs)
            .fold(0.0, |a: f64, &b| a.max(b));
        assert!(diff == 0.0, "{diff}");
    }
    let samples = [sample];
    let layers = config.interval_layers(0);
    let base = FrozenBase::<f64>::new(&model, layers.clone()).unwrap();
    let adapters = Adapters::<f64>::from_accelerator(&weights.accelerator, |l| layers.contains(&l));
    let picked = [1, 4, 8];
    let rows: Vec<Row> = picked.map(|pos| Row { sample: 0, pos }).to_vec();
    let pick = |a: &Array2<f64>| a.select(Axis(0), &picked);
    let last = pick(&samples[0].last);
    let inner: Vec<Array2<f64>> = samples[0].aligned[0]
        .as_ref()
        .expect("kept")
        .iter()
        .map(pick)
        .collect();
    let teacher = base.head.forward(last.view()).0;
    let batch = Batch {
        samples: &samples,
        rows: &rows,
    };
    for kind in [AlignKind::Cosine, AlignKind::Mse] {
        let w = 0.7;
        // loss and, with `grads`, the analytic gradient
        let run = |a: &Adapters<f64>, grads: Option<&mut Adapters<f64>>| {
            let f = fast_stream::start_states(batch, 0);
            let (u, tape) = fast_stream::forward(&base, a, layers.clone(), batch, f);
            let (logits, head_tape) = base.head.forward(u.view());
            let (kl, dlogits) = kl_loss(logits.view(), teacher.view(), 1.0, 0.0);
            let (exit, du_exit) = align_loss(kind, u.view(), last.view(), w);
            let mut total = kl.loss + exit;
            let mut d_inner = Vec::new();
            for (state, target) in tape.inner_states().zip(&inner) {
                let (l, d) = align_loss(kind, state.view(), target.view(), w);
                total += l;
                d_inner.push(d);
            }
            assert_eq!(d_inner.len(), 2);
            if let Some(grads) = grads {
                let du = base.head.backward(dlogits.view(), &head_tape) + du_exit;
                fast_stream::backward(&base, a, layers.clone(), batch, &tape, du, &d_inner, grads);
            }
            total
        };
        let mut grads = adapters.zeros_like();
        run(&adapters, Some(&mut grads));
        println!("{kind:?}");
        assert_gradients_match(&adapters, &grads, |a| run(a, None));
    }
}
