//! Reading a [`PeftLora`] from PEFT's files, refusing what this crate cannot load (named by file
//! and tensor).

use super::adapter_config::AdapterSettings;
use super::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, LoraPart, PeftLora, PeftPair, parse_tensor_name,
    peft_tensor_name,
};
use crate::base::config::ModelConfig;
use crate::base::weight_names::Target;
use crate::base::weights::TensorSource;
use crate::error::{Error, Result};
use crate::io::checkpoint::SafetensorsSource;
use crate::io::peft_pattern::module_name;
use ndarray::Array2;
use std::collections::BTreeMap;
use std::path::Path;

impl PeftLora {
    /// Read a PEFT LoRA adapter (`adapter_config.json`, `adapter_model.safetensors`) for `model`.
    /// Per-module ranks and alphas (`rank_pattern` / `alpha_pattern`) load (`io::peft_pattern`).
    /// Refused, with the file and key or tensor named: anything but plain LoRA on linear maps
    /// (DoRA, biases, `fan_in_fan_out`, `modules_to_save`, ...), target
    /// modules outside the seven, MLP targets on a MoE model, unknown tensor names, layers `>= N`,
    /// a `lora_A` without its `lora_B` (or the reverse), ranks other than the module's `r` (or its
    /// `rank_pattern` entry), wrong shapes, non-finite values.
    pub fn read(dir: &Path, model: &ModelConfig) -> Result<Self> {
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let settings = AdapterSettings::read(&config_path, model)?;
        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        let label = weights_path.display().to_string();
        let config_label = config_path.display().to_string();
        let src = SafetensorsSource::open_files(std::slice::from_ref(&weights_path))?;

        let mut halves: BTreeMap<(usize, Target), [Option<Array2<f32>>; 2]> = BTreeMap::new();
        for name in src.names() {
            let Some((l, t, part)) = parse_tensor_name(&name) else {
                return Err(Error::format(
                    &label,
                    format!(
                        "unknown tensor `{name}`: expected LoRA tensors named like \
                         `{}` on {}",
                        peft_tensor_name(0, Target::ALL[0], LoraPart::A),
                        Target::all_modules()
                    ),
                ));
            };
            let bad = |msg: String| Err(Error::format(&label, format!("tensor `{name}`: {msg}")));
            if l >= model.num_hidden_layers {
                return bad(format!(
                    "layer {l} does not exist (the model has {} layers, 0..{})",
                    model.num_hidden_layers, model.num_hidden_layers
                ));
            }
            if !settings.targets.contains(&t) {
                return bad(format!(
                    "`{t}` is not in target_modules of {config_label} ({})",
                    settings.module_list()
                ));
            }
            if let Some(allowed) = &settings.layers_to_transform
                && !allowed.contains(&l)
            {
                return bad(format!(
                    "layer {l} is not in layers_to_transform of {config_label} ({allowed:?})"
                ));
            }
            let raw = src.read(&name)?.expect("listed name");
            let (r, r_source) = match settings.rank_pattern.get(&module_name(l, t)) {
                Some(r) => (r, "its rank_pattern entry"),
                None => (settings.rank, "r"),
            };
            let (out, inp) = t.shape(model);
            let expected = match part {
                LoraPart::A => vec![r, inp],
                LoraPart::B => vec![out, r],
            };
            if raw.shape != expected {
                let rank_axis = usize::from(part == LoraPart::B);
                let other_axis = 1 - rank_axis;
                if raw.shape.len() == 2 && raw.shape[other_axis] == expected[other_axis] {
                    return Err(Error::config(
                        &label,
                        format!(
                            "tensor `{name}` has rank {} (shape {:?}) but {config_label} says \
                             {r_source} = {r} (expected shape {expected:?})",
                            raw.shape[rank_axis], raw.shape
                        ),
                    ));
                }
                return Err(Error::ShapeMismatch {
                    file: label.clone(),
                    tensor: name,
                    expected,
                    actual: raw.shape,
                });
            }
            if let Some(v) = raw.data.iter().find(|v| !v.is_finite()) {
                return bad(format!("holds a non-finite value ({v})"));
            }
            let m = Array2::from_shape_vec((expected[0], expected[1]), raw.data)
                .expect("shape checked");
            let slot = &mut halves.entry((l, t)).or_default()[part as usize];
            if slot.is_some() {
                return bad(format!(
                    "layer {l} {t} {part:?} appears twice (under both name prefixes)"
                ));
            }
            *slot = Some(m);
        }

        let mut pairs = BTreeMap::new();
        for ((l, t), [a, b]) in halves {
            let missing = |part| {
                Err(Error::MissingTensor {
                    file: label.clone(),
                    tensor: peft_tensor_name(l, t, part),
                })
            };
            let alpha = settings
                .alpha_pattern
                .get(&module_name(l, t))
                .unwrap_or(settings.alpha);
            match (a, b) {
                (Some(a), Some(b)) => pairs.insert((l, t), PeftPair { a, b, alpha }),
                (None, _) => return missing(LoraPart::A),
                (_, None) => return missing(LoraPart::B),
            };
        }
        Ok(PeftLora {
            rank: settings.rank,
            alpha: settings.alpha,
            use_rslora: settings.use_rslora,
            targets: settings.targets,
            num_layers: model.num_hidden_layers,
            pairs,
        })
    }
}
