//! Tests of the M2R2 weights (`m2r2/weights.rs`).

use super::*;
use crate::base::weight_names::Target;
use crate::base::weight_names::{AttnProj, MlpProj};
use crate::base::weights::TensorSource;
use crate::io::builtin::{tiny_config, tiny_moe_config};
use crate::io::checkpoint::{SafetensorsSource, write_f32_safetensors};
use crate::io::peft::{ADAPTER_WEIGHTS_FILE, LoraPart, peft_tensor_name};
use serde_json::Value;

type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

fn saved(model: &ModelConfig) -> (tempfile::TempDir, M2r2Weights) {
    let dir = tempfile::tempdir().unwrap();
    let w = M2r2Weights::random(model, M2r2Config::default_for(model), 42).unwrap();
    w.save_dir(dir.path()).unwrap();
    (dir, w)
}

fn edit_adapter_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(v.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
}

fn edit_tensors(dir: &Path, edit: impl FnOnce(&mut Tensors)) {
    let path = dir.join(ADAPTER_WEIGHTS_FILE);
    let src = SafetensorsSource::open_files(std::slice::from_ref(&path)).unwrap();
    let mut tensors: Tensors = src
        .names()
        .into_iter()
        .map(|n| {
            let t = src.read(&n).unwrap().unwrap();
            (n, t.shape, t.data)
        })
        .collect();
    edit(&mut tensors);
    write_f32_safetensors(&path, &tensors, None).unwrap();
}

fn load_err(dir: &Path, model: &ModelConfig) -> String {
    M2r2Weights::load_dir(dir, model).unwrap_err().to_string()
}

#[test]
fn round_trip_is_bitwise() {
    for model in [tiny_config(), tiny_moe_config()] {
        let (dir, w) = saved(&model);
        let back = M2r2Weights::load_dir(dir.path(), &model).unwrap();
        assert_eq!(back, w);
        assert!(back.arla.is_some());
        // Saving again writes the same bytes.
        let dir2 = tempfile::tempdir().unwrap();
        back.save_dir(dir2.path()).unwrap();
        for f in [
            ADAPTER_WEIGHTS_FILE,
            ADAPTER_CONFIG_FILE,
            M2R2_CONFIG_FILE,
            ARLA_FILE,
        ] {
            let a = std::fs::read(dir.path().join(f)).unwrap();
            let b = std::fs::read(dir2.path().join(f)).unwrap();
            assert_eq!(a, b, "{f}");
        }
    }
}

#[test]
fn peft_config_has_the_common_keys() {
    let model = tiny_config();
    let (dir, _) = saved(&model);
    let text = std::fs::read_to_string(dir.path().join(ADAPTER_CONFIG_FILE)).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["peft_type"], "LORA");
    assert_eq!(v["task_type"], "CAUSAL_LM");
    assert_eq!(v["r"], 16);
    assert_eq!(v["lora_alpha"], 32);
    assert_eq!(v["bias"], "none");
    assert_eq!(v["use_dora"], false);
    assert_eq!(
        v["layers_to_transform"],
        serde_json::json!([0, 1, 2, 3, 4, 5])
    );
    let modules: Vec<&str> = v["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(
        modules,
        [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj"
        ]
    );
    let src = SafetensorsSource::open_files(&[dir.path().join(ADAPTER_WEIGHTS_FILE)]).unwrap();
    assert!(
        src.names()
            .contains(&"base_model.model.model.layers.5.mlp.gate_proj.lora_B.weight".to_string())
    );
    assert_eq!(src.names().len(), 6 * 7 * 2);
}

#[test]
fn zeros_builtin_and_random() {
    let model = tiny_config();
    let z = M2r2Weights::zeros(&model);
    assert!(z.accelerator.is_zero() && z.arla.is_none());
    let dir = tempfile::tempdir().unwrap();
    z.save_dir(dir.path()).unwrap();
    assert_eq!(M2r2Weights::load_dir(dir.path(), &model).unwrap(), z);

    let a = M2r2Weights::builtin_for("tiny", &model).unwrap();
    assert_eq!(a, M2r2Weights::builtin_for("tiny", &model).unwrap());
    assert_eq!(a.config.seed, Some(BUILTIN_M2R2_SEED));
    assert!(!a.accelerator.is_zero() && a.arla.is_some());
    let moe = M2r2Weights::builtin_for("tiny-moe", &tiny_moe_config()).unwrap();
    assert_eq!(moe.accelerator.targets.len(), 4);
    assert_eq!(M2r2Weights::builtin_for("smollm2-135m", &model).unwrap(), z);

    let r = M2r2Weights::random(&model, M2r2Config::default_for(&model), 1).unwrap();
    assert_eq!(
        r,
        M2r2Weights::random(&model, M2r2Config::default_for(&model), 1).unwrap()
    );
    assert_ne!(
        r,
        M2r2Weights::random(&model, M2r2Config::default_for(&model), 2).unwrap()
    );
    let mut bad = M2r2Config::default_for(&model);
    bad.gates = vec![9];
    let err = M2r2Weights::random(&model, bad, 1).unwrap_err().to_string();
    assert!(err.contains("gate after layer 9 is out of range"), "{err}");
}

#[test]
fn stale_arla_is_removed() {
    let model = tiny_config();
    let (dir, w) = saved(&model);
    let without = M2r2Weights { arla: None, ..w };
    without.save_dir(dir.path()).unwrap();
    assert!(!dir.path().join(ARLA_FILE).exists());
    assert_eq!(M2r2Weights::load_dir(dir.path(), &model).unwrap(), without);
}

#[test]
fn draft_head_round_trip_stale_removal_and_errors() {
    let model = tiny_config();
    let (dir, w) = saved(&model);
    assert_eq!(w.draft_head, None);
    let head = DraftHead::new(vec![0, 5, 17], model.vocab_size, "t").unwrap();
    let with = M2r2Weights {
        draft_head: Some(head),
        ..w.clone()
    };
    with.save_dir(dir.path()).unwrap();
    assert_eq!(M2r2Weights::load_dir(dir.path(), &model).unwrap(), with);
    // Saving without a head removes the stale file.
    w.save_dir(dir.path()).unwrap();
    assert!(!dir.path().join(DRAFT_HEAD_FILE).exists());
    assert_eq!(M2r2Weights::load_dir(dir.path(), &model).unwrap(), w);
    // A corrupt file is an error naming it.
    std::fs::write(dir.path().join(DRAFT_HEAD_FILE), "{\"tokens\": [9, 2]}").unwrap();
    let err = load_err(dir.path(), &model);
    assert!(
        err.contains(DRAFT_HEAD_FILE) && err.contains("not sorted"),
        "{err}"
    );
}

#[test]
fn half_precision_and_bare_names_and_rslora_load() {
    let model = tiny_config();
    let (dir, w) = saved(&model);
    // Rewrite every tensor as bf16 under transformers' bare `model.layers.` prefix.
    let path = dir.path().join(ADAPTER_WEIGHTS_FILE);
    let src = SafetensorsSource::open_files(std::slice::from_ref(&path)).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in src.names() {
        let t = src.read(&name).unwrap().unwrap();
        let bytes = t
            .data
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        owned.push((name.replace("base_model.model.", ""), t.shape, bytes));
    }
    let views: Vec<_> = owned
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b);
            (n.clone(), v.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    edit_adapter_config(dir.path(), |m| {
        m.insert("use_rslora".into(), Value::Bool(true));
    });
    let back = M2r2Weights::load_dir(dir.path(), &model).unwrap();
    assert!(back.accelerator.use_rslora);
    assert_eq!(
        back.accelerator
            .scale(back.accelerator.lora(0, Target::Attn(AttnProj::Q)).unwrap()),
        32.0 / 4.0
    );
    let q = Target::Attn(AttnProj::Q);
    let (a0, a1) = (
        w.accelerator.lora(0, q).unwrap(),
        back.accelerator.lora(0, q).unwrap(),
    );
    for (x, y) in a0.a().iter().zip(a1.a()) {
        assert_eq!(half::bf16::from_f32(*x).to_f32(), *y);
    }
}

#[test]
fn adapter_config_rejections() {
    let model = tiny_config();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "use_dora",
            Value::Bool(true),
            "`use_dora` = true asks for DoRA",
        ),
        ("bias", "all".into(), "bias = \"all\" is not supported"),
        (
            "fan_in_fan_out",
            Value::Bool(true),
            "`fan_in_fan_out` = true",
        ),
        (
            "modules_to_save",
            serde_json::json!(["lm_head"]),
            "`modules_to_save`",
        ),
        (
            "peft_type",
            "IA3".into(),
            "peft_type \"IA3\" is not supported",
        ),
        ("r", 0.into(), "`r` must be a positive integer"),
        (
            "target_modules",
            serde_json::json!(["q_proj", "w1"]),
            "target module \"w1\" is not supported",
        ),
        ("target_modules", ".*proj".into(), "regular expression"),
        (
            "layers_to_transform",
            serde_json::json!([0, 8]),
            "names layer 8",
        ),
        ("layers_pattern", "h".into(), "layers_pattern \"h\""),
        (
            "shiny_new_feature",
            Value::Bool(true),
            "unknown key `shiny_new_feature`",
        ),
    ];
    for (key, value, want) in cases {
        let (dir, _) = saved(&model);
        edit_adapter_config(dir.path(), |m| {
            m.insert(key.into(), value);
        });
        let err = load_err(dir.path(), &model);
        assert!(err.contains(want), "{key}: {err:?} should contain {want:?}");
        assert!(err.contains(ADAPTER_CONFIG_FILE), "{err}");
    }
    // New keys at their "off" value are accepted.
    let (dir, _) = saved(&model);
    edit_adapter_config(dir.path(), |m| {
        m.insert("shiny_new_feature".into(), Value::Null);
        m.insert("peft_version".into(), "0.19.1".into());
    });
    M2r2Weights::load_dir(dir.path(), &model).unwrap();
    // "all-linear" means the seven targets on a dense model.
    edit_adapter_config(dir.path(), |m| {
        m.insert("target_modules".into(), "all-linear".into());
    });
    M2r2Weights::load_dir(dir.path(), &model).unwrap();
}

#[test]
fn mlp_targets_on_moe_are_rejected() {
    let moe = tiny_moe_config();
    let (dir, _) = saved(&moe);
    edit_adapter_config(dir.path(), |m| {
        m.insert(
            "target_modules".into(),
            serde_json::json!(["q_proj", "gate_proj"]),
        );
    });
    let err = load_err(dir.path(), &moe);
    assert!(
        err.contains("`gate_proj` is an MLP projection") && err.contains("MoE"),
        "{err}"
    );
    edit_adapter_config(dir.path(), |m| {
        m.insert("target_modules".into(), "all-linear".into());
    });
    assert!(load_err(dir.path(), &moe).contains("all-linear"));
}

#[test]
fn tensor_rejections() {
    let model = tiny_config();
    let q = Target::Attn(AttnProj::Q);
    let up = Target::Mlp(MlpProj::Up);
    let a0 = peft_tensor_name(0, q, LoraPart::A);
    let b0 = peft_tensor_name(0, q, LoraPart::B);
    type Edit = Box<dyn FnOnce(&mut Tensors)>;
    let a0c = a0.clone();
    let b0c = b0.clone();
    let cases: Vec<(Edit, String)> = vec![
        (
            Box::new(move |t| t.retain(|(n, ..)| *n != b0c)),
            format!("tensor `{b0}` is missing"),
        ),
        (
            Box::new(move |t| {
                t.push((
                    "base_model.model.lm_head.lora_A.weight".into(),
                    vec![1],
                    vec![0.0],
                ))
            }),
            "unknown tensor `base_model.model.lm_head.lora_A.weight`".into(),
        ),
        (
            Box::new(move |t| {
                t.push((
                    peft_tensor_name(8, q, LoraPart::A),
                    vec![16, 64],
                    vec![0.0; 1024],
                ))
            }),
            "layer 8 does not exist".into(),
        ),
        (
            Box::new(move |t| {
                let e = t.iter_mut().find(|(n, ..)| *n == a0c).unwrap();
                *e = (a0c.clone(), vec![8, 64], vec![0.0; 512]);
            }),
            format!("tensor `{a0}` has rank 8 (shape [8, 64]) but"),
        ),
        (
            Box::new(move |t| {
                let name = peft_tensor_name(1, up, LoraPart::B);
                let e = t.iter_mut().find(|(n, ..)| *n == name).unwrap();
                *e = (name, vec![64, 16], vec![0.0; 1024]);
            }),
            "mlp.up_proj.lora_B.weight` has shape [64, 16], expected [128, 16]".into(),
        ),
        (
            Box::new(|t| {
                let (n, shape, data) = t[0].clone();
                t.push((n.replace("base_model.model.", ""), shape, data));
            }),
            "appears twice (under both name prefixes)".into(),
        ),
        (
            Box::new(|t| t[0].2[0] = f32::INFINITY),
            "non-finite value".into(),
        ),
    ];
    for (edit, want) in cases {
        let (dir, _) = saved(&model);
        edit_tensors(dir.path(), edit);
        let err = load_err(dir.path(), &model);
        assert!(err.contains(&want), "{err:?} should contain {want:?}");
        assert!(err.contains(ADAPTER_WEIGHTS_FILE), "{err}");
    }
    // A tensor on a layer outside layers_to_transform, and on a module outside target_modules.
    let (dir, _) = saved(&model);
    edit_tensors(dir.path(), |t| {
        t.push((
            peft_tensor_name(7, q, LoraPart::A),
            vec![16, 64],
            vec![0.0; 1024],
        ));
    });
    assert!(load_err(dir.path(), &model).contains("not in layers_to_transform"));
    let (dir, _) = saved(&model);
    edit_adapter_config(dir.path(), |m| {
        m.insert("target_modules".into(), serde_json::json!(["q_proj"]));
    });
    let err = load_err(dir.path(), &model);
    assert!(
        err.contains("_proj` is not in target_modules") && err.contains("(q_proj)"),
        "{err}"
    );
}

#[test]
fn layers_without_tensors_have_no_adapter() {
    let model = tiny_config();
    let (dir, _) = saved(&model);
    edit_tensors(dir.path(), |t| {
        t.retain(|(n, ..)| n.starts_with("base_model.model.model.layers.0."))
    });
    let acc = Accelerator::load_peft(dir.path(), &model).unwrap();
    assert!(acc.layers[0].is_some());
    assert!(acc.layers[1..].iter().all(Option::is_none));
}

#[test]
fn m2r2_config_must_agree_with_adapter_config() {
    let model = tiny_config();
    for (key, value, want) in [
        ("r", Value::from(8), "`rank` is 16 here but r = 8"),
        (
            "lora_alpha",
            Value::from(16),
            "`alpha` is 32 here but lora_alpha = 16",
        ),
        (
            "target_modules",
            serde_json::json!(["q_proj"]),
            "`targets` is",
        ),
    ] {
        let (dir, _) = saved(&model);
        // Drop the tensors so only the configs disagree.
        edit_tensors(dir.path(), Vec::clear);
        edit_adapter_config(dir.path(), |m| {
            m.insert(key.into(), value);
        });
        let err = load_err(dir.path(), &model);
        assert!(err.contains(want), "{err:?} should contain {want:?}");
        assert!(err.contains(M2R2_CONFIG_FILE), "{err}");
    }
    let (dir, _) = saved(&model);
    std::fs::remove_file(dir.path().join(ADAPTER_CONFIG_FILE)).unwrap();
    assert!(load_err(dir.path(), &model).contains(ADAPTER_CONFIG_FILE));
}
