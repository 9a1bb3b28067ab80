//! Per-module graphs against the reference on random inputs: the MLP, the MoE block (slow rows and
//! fast rows on the slow rows' experts), an adapter term, ARLA, and one decoder layer with a KV
//! cache (slow rows, and fast rows reading the slow cache). Tolerance: 1e-5 absolute on inputs of
//! order one (one module: a few f32 roundings in a different summation order), 1e-4 for the layer.

mod common;

use common::{builder, max_diff, output, random, rows_dims, run_graph};
use export::builder::{Dim, Elem};
use export::emit;
use export::emit::attention::visibility;
use export::emit::layer::{LayerContext, LayerInput, decoder_layer, project};
use ndarray::{Array2, ArrayD, Axis, Ix2, s};
use onnx_runner::session::Input;
use reference::base::layer::FastRows;
use reference::base::matmul::linear;
use reference::base::model::Model;
use reference::base::moe::{mix_experts, route, top_k_of};
use reference::base::ops::softmax_inplace;
use reference::base::weight_names::Target;
use reference::base::weights::FeedForward;
use reference::m2r2::config::M2r2Config;
use reference::m2r2::weights::M2r2Weights;

fn small_model(moe: bool) -> Model {
    reference::io::builtin::random_model(m2r2_tests::small_config(4, moe, 50), 7).unwrap()
}

fn rows(x: &ArrayD<f32>) -> Array2<f32> {
    x.index_axis(Axis(0), 0)
        .to_owned()
        .into_dimensionality::<Ix2>()
        .unwrap()
}

#[test]
fn mlp_matches_reference() {
    let model = small_model(false);
    let d = model.config.hidden_size;
    let FeedForward::Dense(m) = &model.weights.layers[1].ffn else {
        unreachable!("dense config")
    };
    let mut b = builder("mlp");
    b.input("h", Elem::F32, &rows_dims(d));
    let y = emit::mlp::mlp(&mut b, "h", &mut |b, p, x| {
        let lin = match p {
            reference::base::weight_names::MlpProj::Gate => &m.gate,
            reference::base::weight_names::MlpProj::Up => &m.up,
            reference::base::weight_names::MlpProj::Down => &m.down,
        };
        project(b, 1, Target::Mlp(p), lin, x, None)
    });
    output(&mut b, "y", &y, &rows_dims(d));
    let h = random(&[1, 5, d], 1.0, 1);
    let dir = tempfile::tempdir().unwrap();
    let out = run_graph(dir.path(), b.finish(&[]), &[("h", Input::F32(h.view()))]);
    let want = reference::base::mlp::mlp(m, rows(&h).view());
    let got = rows(out.get("y").unwrap());
    assert!(max_diff("mlp", &got.into_dyn(), &want.into_dyn()) < 1e-5);
}

#[test]
fn moe_block_matches_reference_for_slow_and_fast_rows() {
    let model = small_model(true);
    let d = model.config.hidden_size;
    let FeedForward::Moe(moe) = &model.weights.layers[2].ffn else {
        unreachable!("MoE config")
    };
    let mut b = builder("moe");
    b.input("h", Elem::F32, &rows_dims(d));
    b.input("h_fast", Elem::F32, &rows_dims(d));
    let (y, y_fast) = emit::moe::moe_block(&mut b, moe, 2, d, "h", Some("h_fast"));
    output(&mut b, "y", &y, &rows_dims(d));
    output(&mut b, "y_fast", &y_fast.unwrap(), &rows_dims(d));
    let (h, hf) = (random(&[1, 6, d], 1.0, 2), random(&[1, 6, d], 1.0, 3));
    let dir = tempfile::tempdir().unwrap();
    let out = run_graph(
        dir.path(),
        b.finish(&[]),
        &[
            ("h", Input::F32(h.view())),
            ("h_fast", Input::F32(hf.view())),
        ],
    );
    // reference: slow routing; fast rows on the slow experts with their own renormalised probs
    let (h, hf) = (rows(&h), rows(&hf));
    let routing = route(moe, h.view());
    let want = mix_experts(moe, h.view(), &routing);
    let mut probs = linear(hf.view(), moe.router.view(), None);
    let fast_routing: Vec<_> = probs
        .rows_mut()
        .into_iter()
        .zip(&routing)
        .map(|(mut p, r)| {
            softmax_inplace(p.view_mut());
            top_k_of(p.as_slice().unwrap(), &r.experts)
        })
        .collect();
    let want_fast = mix_experts(moe, hf.view(), &fast_routing);
    let got = rows(out.get("y").unwrap());
    let got_fast = rows(out.get("y_fast").unwrap());
    assert!(max_diff("moe slow", &got.into_dyn(), &want.into_dyn()) < 1e-5);
    assert!(max_diff("moe fast", &got_fast.into_dyn(), &want_fast.into_dyn()) < 1e-5);
}

#[test]
fn adapter_term_matches_reference() {
    let model = small_model(false);
    let c = &model.config;
    let m2r2 = M2r2Weights::random(c, M2r2Config::default_for(c), 11).unwrap();
    let acc = &m2r2.accelerator;
    let target = Target::Attn(reference::base::weight_names::AttnProj::K);
    let (out_dim, in_dim) = target.shape(c);
    let mut b = builder("adapter");
    b.input("x", Elem::F32, &rows_dims(in_dim));
    let y = emit::accelerator::delta(&mut b, acc, 0, target, "x").expect("layer 0 has an adapter");
    output(&mut b, "y", &y, &rows_dims(out_dim));
    let x = random(&[1, 4, in_dim], 1.0, 4);
    let dir = tempfile::tempdir().unwrap();
    let out = run_graph(dir.path(), b.finish(&[]), &[("x", Input::F32(x.view()))]);
    let want = acc.delta(0, target, rows(&x).view()).unwrap();
    let got = rows(out.get("y").unwrap());
    assert!(max_diff("adapter", &got.into_dyn(), &want.into_dyn()) < 1e-5);
}

#[test]
fn arla_matches_reference_at_every_gate() {
    let model = small_model(false);
    let c = &model.config;
    let m2r2 = M2r2Weights::random(c, M2r2Config::default_for(c), 12).unwrap();
    let arla = m2r2.arla.as_ref().unwrap();
    let eps = c.rms_norm_eps as f32;
    let d = c.hidden_size;
    let dir = tempfile::tempdir().unwrap();
    for g in 1..=arla.n_gates() {
        let mut b = builder(&format!("arla{g}"));
        let names: Vec<String> = (1..=g).map(|i| format!("u{i}")).collect();
        for n in &names {
            b.input(n, Elem::F32, &rows_dims(d));
        }
        let p = emit::arla::exit_prob(&mut b, arla, eps, &names);
        output(
            &mut b,
            "p",
            &p,
            &[Dim::Named("batch"), Dim::Named("sequence_length")],
        );
        let states: Vec<ArrayD<f32>> = (0..g)
            .map(|i| random(&[1, 5, d], 2.0, 20 + i as u64))
            .collect();
        let inputs: Vec<(&str, Input<'_>)> = names
            .iter()
            .zip(&states)
            .map(|(n, u)| (n.as_str(), Input::F32(u.view())))
            .collect();
        let out = run_graph(dir.path(), b.finish(&[]), &inputs);
        let want: Vec<f32> = (0..5)
            .map(|t| {
                let rows: Vec<_> = states.iter().map(|u| u.slice(s![0, t, ..])).collect();
                arla.exit_prob(&rows, eps)
            })
            .collect();
        let want = ArrayD::from_shape_vec(vec![1, 5], want).unwrap();
        assert!(max_diff(&format!("arla gate {g}"), out.get("p").unwrap(), &want) < 1e-5);
    }
}

/// One decoder layer reading a cache of `P` positions, with slow and fast rows, against the
/// reference `decoder_layer` (which is attention with cache + FFN + adapters).
fn layer_case(moe: bool, sliding_window: Option<usize>) {
    let mut config = m2r2_tests::small_config(4, moe, 50);
    config.sliding_window = sliding_window;
    config.qkv_bias = !moe;
    let model = reference::io::builtin::random_model(config, 9).unwrap();
    let c = &model.config;
    let m2r2 = M2r2Weights::random(c, M2r2Config::default_for(c), 13).unwrap();
    let (d, hkv, dh) = (c.hidden_size, c.num_key_value_heads, c.head_dim);
    let (p, t, l) = (5usize, 4usize, 1usize);
    let tokens: Vec<u32> = (0..(p + t) as u32).map(|i| (i * 7 + 3) % 50).collect();

    // reference: a cache of P positions through layer l, then the chunk's slow and fast rows
    let mut cache = model.new_cache(p + t).unwrap();
    let mut prefix = model.embed(&tokens[..p]);
    for layer in 0..=l {
        model.layer_forward(layer, &mut prefix, 0, &mut cache);
    }
    cache.set_len(p);
    let s_in = random(&[1, t, d], 1.0, 30);
    let f_in = random(&[1, t, d], 1.0, 31);
    let past_k = export_kv(cache.layer(l, p).0, hkv, dh);
    let past_v = export_kv(cache.layer(l, p).1, hkv, dh);
    let mut s = rows(&s_in);
    let mut f = rows(&f_in);
    let slots: Vec<usize> = (0..t).collect();
    model.layer(l).forward(
        &mut s,
        p,
        &mut cache,
        Some(FastRows {
            f: &mut f,
            slot: &slots,
            adapter: Some(&m2r2.accelerator),
        }),
    );

    // the same layer as a graph
    let mut b = builder("layer");
    b.input("s", Elem::F32, &rows_dims(d));
    b.input("f", Elem::F32, &rows_dims(d));
    let mask = b.input(
        "attention_mask",
        Elem::I64,
        &[Dim::Named("batch"), Dim::Named("total")],
    );
    let pos = b.input(
        "position_ids",
        Elem::I64,
        &[Dim::Named("batch"), Dim::Named("sequence_length")],
    );
    let kv = [
        Dim::Named("batch"),
        Dim::Fixed(hkv),
        Dim::Named("past"),
        Dim::Fixed(dh),
    ];
    b.input("past_key", Elem::F32, &kv);
    b.input("past_value", Elem::F32, &kv);
    let rope = emit::rope::tables(&mut b, c, &pos);
    let vis = visibility(&mut b, c, "s", "past_key", &mask, None, true);
    let cx = LayerContext {
        model: &model,
        rope: &rope,
        visibility: &vis,
    };
    let out = decoder_layer(
        &mut b,
        &cx,
        l,
        LayerInput {
            s: "s",
            fast: Some(("f", &m2r2.accelerator)),
            past_key: "past_key",
            past_value: "past_value",
        },
    );
    output(&mut b, "s_out", &out.s, &rows_dims(d));
    output(&mut b, "f_out", &out.f.unwrap(), &rows_dims(d));
    output(&mut b, "present_key", &out.present_key, &kv);
    output(&mut b, "present_value", &out.present_value, &kv);
    let mask_v = ArrayD::<i64>::ones(vec![1, p + t]);
    let pos_v = ArrayD::from_shape_fn(vec![1, t], |i| (p + i[1]) as i64);
    let dir = tempfile::tempdir().unwrap();
    let got = run_graph(
        dir.path(),
        b.finish(&[]),
        &[
            ("s", Input::F32(s_in.view())),
            ("f", Input::F32(f_in.view())),
            ("attention_mask", Input::I64(mask_v.view())),
            ("position_ids", Input::I64(pos_v.view())),
            ("past_key", Input::F32(past_k.view())),
            ("past_value", Input::F32(past_v.view())),
        ],
    );
    let label = format!("layer (moe {moe}, window {sliding_window:?})");
    let tol = 1e-4;
    assert!(
        max_diff(
            &format!("{label} slow"),
            &rows(got.get("s_out").unwrap()).into_dyn(),
            &s.into_dyn()
        ) < tol
    );
    assert!(
        max_diff(
            &format!("{label} fast"),
            &rows(got.get("f_out").unwrap()).into_dyn(),
            &f.into_dyn()
        ) < tol
    );
    let want_k = export_kv(cache.layer(l, p + t).0, hkv, dh);
    let want_v = export_kv(cache.layer(l, p + t).1, hkv, dh);
    assert!(
        max_diff(
            &format!("{label} present key"),
            got.get("present_key").unwrap(),
            &want_k
        ) < tol
    );
    assert!(
        max_diff(
            &format!("{label} present value"),
            got.get("present_value").unwrap(),
            &want_v
        ) < tol
    );
}

/// `[S, Hkv*Dh]` -> `[1, Hkv, S, Dh]`.
fn export_kv(x: ndarray::ArrayView2<f32>, hkv: usize, dh: usize) -> ArrayD<f32> {
    let s = x.nrows();
    x.to_owned()
        .into_shape_with_order((s, hkv, dh))
        .unwrap()
        .permuted_axes([1, 0, 2])
        .insert_axis(Axis(0))
        .as_standard_layout()
        .to_owned()
        .into_dyn()
}

#[test]
fn dense_layer_with_cache_matches_reference() {
    layer_case(false, None);
}

#[test]
fn moe_layer_with_cache_matches_reference() {
    layer_case(true, None);
}

#[test]
fn sliding_window_layer_with_cache_matches_reference() {
    layer_case(false, Some(3));
}
