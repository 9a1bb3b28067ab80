//! Tests of the accelerator adapters (`m2r2/accelerator.rs`): the LoRA term by hand, widening,
//! per-interval ranks, batch invariance and the random adapters' layout and size.

use super::*;
use crate::base::weight_names::{AttnProj, MlpProj, WeightId};
use crate::io::builtin::{BUILTIN_SEED, random_source, tiny_config, tiny_moe_config};
use ndarray::{array, s};

#[test]
fn delta_hand_computed() {
    // A = [[1, 0], [0, 2]] (r = 2, in = 2), B = [[1, 1]] (out = 1), alpha 1: scale = 0.5.
    // x = [3, 4]: A x = [3, 8], B (A x) = 11, scaled: 5.5.
    let lora = Lora::new(array![[1.0, 0.0], [0.0, 2.0]], array![[1.0, 1.0]], 1.0);
    assert_eq!(
        lora.delta(array![[3.0f32, 4.0]].view(), 0.5),
        array![[5.5f32]]
    );
    let acc = Accelerator {
        rank: 2,
        alpha: 1.0,
        use_rslora: false,
        targets: vec![Target::Attn(AttnProj::Q)],
        layers: vec![Some(LayerAdapter {
            loras: BTreeMap::from([(Target::Attn(AttnProj::Q), lora.clone())]),
        })],
    };
    assert_eq!(acc.scale(&lora), 0.5);
    let x = array![[3.0f32, 4.0], [1.0, 1.0]];
    assert_eq!(
        acc.delta(0, Target::Attn(AttnProj::Q), x.view()).unwrap(),
        array![[5.5f32], [1.5]]
    );
    assert!(acc.delta(0, Target::Attn(AttnProj::K), x.view()).is_none());
    assert!(acc.delta(1, Target::Attn(AttnProj::Q), x.view()).is_none());
    // rsLoRA: alpha / sqrt(r); r = 4, alpha = 4: 2.
    let lora4 = Lora::new(Array2::zeros((4, 2)), Array2::zeros((1, 4)), 4.0);
    assert_eq!(lora4.scale(true), 2.0);
    assert_eq!(lora4.scale(false), 1.0);
}

/// Widening appends rows to A and zero columns to B and keeps the scale (alpha 1 at r = 2 is
/// alpha 2 at r = 4), so the hand-computed delta above is unchanged; rsLoRA grows alpha by
/// sqrt(2).
#[test]
fn widening_keeps_the_term() {
    let lora = Lora::new(array![[1.0, 0.0], [0.0, 2.0]], array![[1.0, 1.0]], 1.0);
    let wide = lora.widened(array![[5.0, -1.0], [0.5, 3.0]], false);
    assert_eq!(wide.rank(), 4);
    assert_eq!(wide.alpha(), 2.0);
    assert_eq!(wide.b(), &array![[1.0f32, 1.0, 0.0, 0.0]]);
    assert_eq!(wide.a().row(2), array![5.0f32, -1.0]);
    let x = array![[3.0f32, 4.0]];
    assert_eq!(wide.delta(x.view(), wide.scale(false)), array![[5.5f32]]);
    let rs = lora.widened(array![[5.0, -1.0], [0.5, 3.0]], true);
    assert_eq!(rs.scale(true), lora.scale(true));
}

/// `random_ranked` puts each interval's rank on its layers with alpha growing with the rank
/// (one scale); `widen` raises one interval to a higher rank with the same terms, and refuses
/// to lower one.
#[test]
fn per_interval_ranks() {
    let model = tiny_config();
    let config = M2r2Config::default_for(&model);
    assert_eq!(config.gates, vec![2, 4, 6]);
    let acc = Accelerator::random_ranked(&model, &config, &[32, 16, 8], 4);
    let scale = config.alpha / config.rank as f32;
    for (l, want) in [(0, 32), (1, 32), (2, 16), (3, 16), (4, 8), (5, 8)] {
        assert_eq!(
            acc.layer_ranks(l),
            vec![want; config.targets.len()],
            "layer {l}"
        );
        for lora in acc.layers[l].as_ref().unwrap().loras.values() {
            assert_eq!(acc.scale(lora), scale);
        }
    }
    assert!(acc.layer_ranks(6).is_empty());
    assert_eq!(
        Accelerator::random_ranked(&model, &config, &[16; 3], 4),
        Accelerator::random(&model, &config, 4)
    );

    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let x = Array2::from_shape_simple_fn((3, 64), || standard_normal(&mut rng));
    let q = Target::Attn(AttnProj::Q);
    let before = acc.delta(2, q, x.view()).unwrap();
    let mut wide = acc.clone();
    wide.widen(2..4, 24, 9).unwrap();
    assert_eq!(wide.layer_ranks(2), vec![24; config.targets.len()]);
    assert_eq!(wide.layer_ranks(0), acc.layer_ranks(0));
    let after = wide.delta(2, q, x.view()).unwrap();
    approx::assert_abs_diff_eq!(before, after, epsilon = 1e-6);
    let e = wide.widen(0..2, 16, 9).unwrap_err().to_string();
    assert!(e.contains("cannot lower the rank of layer 0"), "{e}");
}

#[test]
fn delta_is_batch_invariant() {
    let model = tiny_config();
    let config = M2r2Config::default_for(&model);
    let acc = Accelerator::random(&model, &config, 3);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let x = Array2::from_shape_simple_fn((5, 64), || standard_normal(&mut rng));
    for t in Target::ALL.into_iter().filter(|t| !t.is_mlp()) {
        let all = acc.delta(1, t, x.view()).unwrap();
        for row in 0..5 {
            let one = acc.delta(1, t, x.slice(s![row..row + 1, ..])).unwrap();
            assert_eq!(one.row(0), all.row(row), "{t} row {row}");
        }
    }
}

#[test]
fn zeros_and_random_layout() {
    for model in [tiny_config(), tiny_moe_config()] {
        let config = M2r2Config::default_for(&model);
        let z = Accelerator::zeros(&model, &config);
        assert!(z.is_zero());
        let r = Accelerator::random(&model, &config, 5);
        assert!(!r.is_zero());
        assert_eq!(r, Accelerator::random(&model, &config, 5));
        assert_ne!(r, Accelerator::random(&model, &config, 6));
        // Layers 0..e_J = 0..6 carry adapters; the last interval (6..8) none.
        for (l, la) in r.layers.iter().enumerate() {
            assert_eq!(la.is_some(), l < 6, "layer {l}");
        }
        let la = r.layers[0].as_ref().unwrap();
        assert_eq!(la.loras.len(), config.targets.len());
        for (&t, lora) in &la.loras {
            let (out, inp) = t.shape(&model);
            assert_eq!(lora.a.dim(), (16, inp));
            assert_eq!(lora.alpha(), config.alpha);
            assert_eq!(lora.b.dim(), (out, 16));
        }
    }
}

/// The documented sigma: on the built-in `tiny` weights and unit-RMS inputs, the adapter term
/// is about a quarter of the base projection (RMS over rows), for every target.
#[test]
fn random_delta_is_a_quarter_of_the_base_projection() {
    let model = tiny_config();
    let config = M2r2Config::default_for(&model);
    let acc = Accelerator::random(&model, &config, 11);
    let base = random_source(&model, BUILTIN_SEED);
    let rms = |m: &Array2<f32>| (m.iter().map(|v| v * v).sum::<f32>() / m.len() as f32).sqrt();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for t in Target::ALL {
        let (_, inp) = t.shape(&model);
        let x = Array2::from_shape_simple_fn((32, inp), || standard_normal(&mut rng));
        let id = match t {
            Target::Attn(p) => WeightId::Attn(2, p),
            Target::Mlp(p) => WeightId::Mlp(2, p),
        };
        let w = &base.tensors[&id.hf_name()];
        let w = Array2::from_shape_vec((w.shape[0], w.shape[1]), w.data.clone()).unwrap();
        let wx = linear(x.view(), w.view(), None);
        let d = acc.delta(2, t, x.view()).unwrap();
        let ratio = rms(&d) / rms(&wx);
        assert!((0.15..0.4).contains(&ratio), "{t}: ratio {ratio}");
    }
    let _ = MlpProj::Gate;
}
