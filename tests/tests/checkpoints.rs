//! HF checkpoint layouts: a model split into shards with `model.safetensors.index.json` loads to the
//! same weights as the single-file checkpoint; a broken index is a clear error.

use m2r2_tests::fixture_dir;
use reference::base::weights::TensorSource;
use reference::io::checkpoint::{load_hf_dir, write_f32_safetensors};
use std::path::Path;

fn shard(src_dir: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(src_dir.join("config.json"), out.join("config.json")).unwrap();
    let src = reference::io::checkpoint::SafetensorsSource::open_dir(src_dir).unwrap();
    let names = src.names();
    let (first, second) = names.split_at(names.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        let tensors: Vec<_> = part
            .iter()
            .map(|n| {
                let t = src.read(n).unwrap().unwrap();
                weight_map.insert(n.clone(), file.into());
                (n.clone(), t.shape, t.data)
            })
            .collect();
        write_f32_safetensors(&out.join(file), &tensors, None).unwrap();
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
