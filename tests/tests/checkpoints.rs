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
