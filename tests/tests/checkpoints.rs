//! HF checkpoint layouts: a model split into shards with `model.safetensors.index.json` loads to the
//! same weights as the single-file checkpoint; a broken index is a clear error.

use m2r2_tests::{NamedTensors, checkpoint_tensors, fixture_dir};
use reference::io::checkpoint::{load_hf_dir, write_f32_safetensors};
use std::path::Path;

fn shard(src_dir: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(src_dir.join("config.json"), out.join("config.json")).unwrap();
    let mut tensors = checkpoint_tensors(src_dir);
    let second = tensors.split_off(tensors.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", tensors),
        ("model-00002-of-00002.safetensors", second),
    ] {
        for (name, _, _) in &part {
            weight_map.insert(name.clone(), file.into());
        }
        write_f32_safetensors(&out.join(file), &part, None).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let src_dir = fixture_dir().join("hf").join("mixtral");
    let tmp = tempfile::tempdir().unwrap();
    shard(&src_dir, tmp.path());
    let single = load_hf_dir(&src_dir).unwrap();
    let sharded = load_hf_dir(tmp.path()).unwrap();
    let tokens = [1u32, 5, 9, 17, 33];
    let (a, b) = (
        single.teacher_forced_logits(&tokens).unwrap(),
        sharded.teacher_forced_logits(&tokens).unwrap(),
    );
    assert!(
        a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits())
    );
}

#[test]
fn broken_index_is_a_clear_error() {
    let src_dir = fixture_dir().join("hf").join("llama_gqa_tied");
    let tmp = tempfile::tempdir().unwrap();
    shard(&src_dir, tmp.path());
    std::fs::remove_file(tmp.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = load_hf_dir(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");

    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        "{\"weight_map\": 3}",
    )
    .unwrap();
    let err = load_hf_dir(tmp.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors.index.json") && err.contains("weight_map"),
        "{err}"
    );
}

/// `model.safetensors` beside an index (what `save_pretrained` leaves when it saves one file over
/// an earlier sharded save): the single file is the checkpoint, as in transformers, even when the
/// index's shards are gone or hold other weights.
#[test]
fn a_single_file_wins_over_a_stale_index() {
    let src_dir = fixture_dir().join("hf").join("llama_gqa_tied");
    let tmp = tempfile::tempdir().unwrap();
    shard(&fixture_dir().join("hf").join("mixtral"), tmp.path());
    // the folder: llama's config and single file, mixtral's shards and index beside them
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(src_dir.join(file), tmp.path().join(file)).unwrap();
    }
    let tokens = [1u32, 5, 9, 17, 33];
    let want = load_hf_dir(&src_dir)
        .unwrap()
        .teacher_forced_logits(&tokens)
        .unwrap();
    let got = load_hf_dir(tmp.path())
        .unwrap()
        .teacher_forced_logits(&tokens)
        .unwrap();
    assert!(
        want.iter()
            .zip(got.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits())
    );
    std::fs::remove_file(tmp.path().join("model-00001-of-00002.safetensors")).unwrap();
    assert!(load_hf_dir(tmp.path()).is_ok());
}

/// A copy of fixture `name` whose tensors `edit` changes.
fn edited(name: &str, out: &Path, edit: impl Fn(&mut NamedTensors)) {
    let src_dir = fixture_dir().join("hf").join(name);
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(src_dir.join("config.json"), out.join("config.json")).unwrap();
    let mut tensors = checkpoint_tensors(&src_dir);
    edit(&mut tensors);
    write_f32_safetensors(&out.join("model.safetensors"), &tensors, None).unwrap();
}

/// Tensors the config does not call for (a layer more, a bias it turns off) are refused, as the
/// saved model is not the one the config runs; a rotary `inv_freq` buffer is not a weight. A
/// weight that is not finite is refused naming it.
#[test]
fn unused_and_non_finite_tensors_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight";
    let refused = |dir: &str, edit: &dyn Fn(&mut NamedTensors)| {
        let out = tmp.path().join(dir);
        edited("llama_gqa_tied", &out, edit);
        load_hf_dir(&out).err().map(|e| e.to_string())
    };
    let extra_layer = refused("layer", &|t| {
        let (_, shape, data) = t.iter().find(|t| t.0 == q).unwrap().clone();
        t.push(("model.layers.9.self_attn.q_proj.weight".into(), shape, data));
    })
    .unwrap();
    assert!(
        extra_layer.contains("1 tensor(s) this config does not use")
            && extra_layer.contains("model.layers.9.self_attn.q_proj.weight"),
        "{extra_layer}"
    );
    let bias = refused("bias", &|t| {
        let rows = t.iter().find(|t| t.0 == q).unwrap().1[0];
        t.push((
            "model.layers.0.self_attn.q_proj.bias".into(),
            vec![rows],
            vec![0.5; rows],
        ));
    })
    .unwrap();
    assert!(
        bias.contains("`model.layers.0.self_attn.q_proj.bias`"),
        "{bias}"
    );
    let buffer = refused("inv_freq", &|t| {
        t.push((
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            vec![4],
            vec![1.0; 4],
        ));
    });
    assert_eq!(buffer, None);
    let nan = refused("nan", &|t| {
        t.iter_mut().find(|t| t.0 == q).unwrap().2[3] = f32::NAN;
    })
    .unwrap();
    assert!(
        nan.contains(&format!("tensor `{q}` holds a non-finite value (NaN)")),
        "{nan}"
    );
}

/// The Mixtral fixture's experts per layer.
const MIXTRAL_EXPERTS: usize = 8;

/// Rewrite `layers` of a Mixtral checkpoint's tensors in transformers 5's fused expert layout.
fn fuse(t: &mut NamedTensors, layers: &[usize]) {
    for &l in layers {
        reference::io::fused_experts::fuse_layer(t, l, MIXTRAL_EXPERTS).unwrap();
    }
}

/// A Mixtral folder in transformers 5's fused expert layout (`mlp.gate.weight`,
/// `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) loads to the per-expert tensors of
/// transformers 4's layout, bit for bit, so its logits are those of the fixture (checked against
/// transformers): all layers fused and stored as BF16 like the fixture, or one layer fused and the
/// other per-expert, as F32.
#[test]
fn fused_mixtral_experts_load_as_the_per_expert_layout() {
    use safetensors::tensor::TensorView;
    let src_dir = fixture_dir().join("hf").join("mixtral");
    let tmp = tempfile::tempdir().unwrap();
    let all = tmp.path().join("all_bf16");
    std::fs::create_dir_all(&all).unwrap();
    std::fs::copy(src_dir.join("config.json"), all.join("config.json")).unwrap();
    let mut tensors = checkpoint_tensors(&src_dir);
    fuse(&mut tensors, &[0, 1]);
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, d)| {
            d.iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect()
        })
        .collect();
    let views = tensors.iter().zip(&bytes).map(|((name, shape, _), b)| {
        let view = TensorView::new(safetensors::Dtype::BF16, shape.clone(), b).unwrap();
        (name.clone(), view)
    });
    let file = all.join("model.safetensors");
    reference::io::checkpoint::write_safetensors(views, None, &file).unwrap();
    let one = tmp.path().join("layer_1_f32");
    edited("mixtral", &one, |t| fuse(t, &[1]));

    let want = load_hf_dir(&src_dir).unwrap();
    let tokens = [1u32, 5, 9, 17, 33, 2, 64, 95];
    let want_logits = want.teacher_forced_logits(&tokens).unwrap();
    for dir in [all, one] {
        let got = load_hf_dir(&dir).unwrap();
        for (id, w) in want.weights.named_tensors(&want.config) {
            assert_eq!(got.weights.get(id), Some(w), "{dir:?} {}", id.hf_name());
        }
        let logits = got.teacher_forced_logits(&tokens).unwrap();
        assert!(
            want_logits
                .iter()
                .zip(logits.iter())
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{dir:?}"
        );
    }
}

/// A fused Mixtral layer is checked as a whole: a fused tensor of the wrong shape is refused
/// naming it and both shapes, a missing one naming it, a layer holding both layouts naming a
/// tensor of each, and fused tensors of a layer past `num_hidden_layers` as unused. A NaN in
/// expert 1's up rows is named as its w3, in the fused tensor.
#[test]
fn fused_mixtral_experts_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |dir: &str, edit: &dyn Fn(&mut NamedTensors)| {
        let out = tmp.path().join(dir);
        edited("mixtral", &out, |t| {
            fuse(t, &[0, 1]);
            edit(t);
        });
        load_hf_dir(&out).unwrap_err().to_string()
    };
    let gate_up = "model.layers.0.mlp.experts.gate_up_proj";
    let shape = refused("shape", &|t| {
        t.iter_mut().find(|t| t.0 == gate_up).unwrap().1 = vec![8, 48, 64];
    });
    assert!(
        shape.contains(&format!(
            "tensor `{gate_up}` has shape [8, 48, 64], expected [8, 96, 32]"
        )),
        "{shape}"
    );
    let down = "model.layers.1.mlp.experts.down_proj";
    let missing = refused("missing", &|t| t.retain(|t| t.0 != down));
    assert!(
        missing.contains(&format!("tensor `{down}` is missing")),
        "{missing}"
    );
    let w2 = "model.layers.0.block_sparse_moe.experts.3.w2.weight";
    let both = refused("both", &|t| {
        t.push((w2.into(), vec![32, 48], vec![0.0; 32 * 48]))
    });
    assert!(
        both.contains(&format!(
            "layer 0 has its experts in two layouts, transformers 4's per-expert `{w2}` and \
             transformers 5's fused `model.layers.0.mlp.experts.down_proj`"
        )),
        "{both}"
    );
    let extra = refused("extra_layer", &|t| {
        let layer_1: Vec<_> = t
            .iter()
            .filter(|t| t.0.starts_with("model.layers.1.mlp."))
            .map(|(n, s, d)| (n.replace("layers.1.", "layers.2."), s.clone(), d.clone()))
            .collect();
        t.extend(layer_1);
    });
    assert!(
        extra.contains("3 tensor(s) this config does not use")
            && extra.contains("`model.layers.2.mlp.experts.down_proj`"),
        "{extra}"
    );
    let nan = refused("nan", &|t| {
        // [8, 96, 32]: expert 1, row 48 (the first of its up rows), column 5
        t.iter_mut().find(|t| t.0 == gate_up).unwrap().2[96 * 32 + 48 * 32 + 5] = f32::NAN;
    });
    assert!(
        nan.contains(&format!("model.safetensors (in `{gate_up}`): "))
            && nan.contains(
                "tensor `model.layers.0.block_sparse_moe.experts.1.w3.weight` holds a \
                 non-finite value (NaN)"
            ),
        "{nan}"
    );
}
