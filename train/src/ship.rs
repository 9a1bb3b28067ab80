//! Shipping trained weights (docs/TRAINING.md): the safetensors files of an M2R2 weights folder
//! rewritten in f16, which the reference loads unchanged (it reads f32, f16 and bf16) at half the
//! size.

use crate::error::{Error, Result};
use reference::io::peft::ADAPTER_WEIGHTS_FILE;
use reference::m2r2::arla::ARLA_FILE;
use reference::m2r2::bridge::BRIDGE_FILE;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Rewrite every f32 tensor of `adapter_model.safetensors`, `arla.safetensors` and
/// `bridge.safetensors` (when present) in `dir` as f16 (round to nearest), keeping names, shapes
/// and metadata.
pub fn to_f16_in_place(dir: &Path) -> Result<()> {
    for name in [ADAPTER_WEIGHTS_FILE, ARLA_FILE, BRIDGE_FILE] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let label = path.display().to_string();
        let bad = |msg: String| Error::Data {
            file: label.clone(),
            msg,
        };
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
        let file = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
        let mut converted: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
        for (tensor, view) in file.tensors() {
            let data = match view.dtype() {
                Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .flat_map(|b| {
                        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        half::f16::from_f32(v).to_le_bytes()
                    })
                    .collect(),
                _ => view.data().to_vec(),
            };
            let dtype = if view.dtype() == Dtype::F32 {
                Dtype::F16
            } else {
                view.dtype()
            };
            converted.push((tensor, view.shape().to_vec(), dtype, data));
        }
        let views = converted
            .iter()
            .map(|(n, shape, dtype, data)| {
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| bad(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        reference::io::checkpoint::write_safetensors(views, meta.metadata().clone(), &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reference::io::builtin::tiny_config;
    use reference::m2r2::config::M2r2Config;
    use reference::m2r2::weights::M2r2Weights;

    /// The f16 folder loads, is smaller, and holds the f32 weights rounded to f16.
    #[test]
    fn f16_folder_loads_and_rounds() {
        let model = tiny_config();
        let bridge = reference::m2r2::bridge::BridgeConfig::new(
            1,
            4,
            vec![reference::m2r2::bridge::BridgeSite::Gate],
        );
        let weights = M2r2Weights::random(&model, M2r2Config::default_for(&model), 3)
            .unwrap()
            .with_bridge(&model, bridge, 4, 0.5)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        weights.save_dir(dir.path()).unwrap();
        let size = |d: &Path| {
            std::fs::metadata(d.join(ADAPTER_WEIGHTS_FILE))
                .unwrap()
                .len()
        };
        let before = size(dir.path());
        to_f16_in_place(dir.path()).unwrap();
        assert!(size(dir.path()) < before * 6 / 10);
        let back = M2r2Weights::load_dir(dir.path(), &model).unwrap();
        let round = |x: f32| half::f16::from_f32(x).to_f32();
        let (a_layers, b_layers) = (&weights.accelerator.layers, &back.accelerator.layers);
        for (a, b) in a_layers.iter().flatten().zip(b_layers.iter().flatten()) {
            for (t, lora) in &a.loras {
                assert_eq!(lora.a().mapv(round), *b.loras[t].a(), "{t}");
                assert_eq!(lora.b().mapv(round), *b.loras[t].b(), "{t}");
            }
        }
        assert_eq!(
            a_layers.iter().flatten().count(),
            b_layers.iter().flatten().count()
        );
        let (a, b) = (weights.bridge.unwrap(), back.bridge.unwrap());
        for (site, lora) in &a.maps {
            assert_eq!(lora.b().mapv(round), *b.maps[site].b(), "bridge {site:?}");
        }
        let (a, b) = (weights.arla.unwrap(), back.arla.unwrap());
        assert_eq!(a.proj.mapv(round), b.proj);
        assert_eq!(round(a.bo), b.bo);
    }
}
