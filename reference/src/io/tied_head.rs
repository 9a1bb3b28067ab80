//! An `lm_head.weight` saved beside tied embeddings. With `tie_word_embeddings` true the output
//! head is the embedding matrix: transformers ties `lm_head.weight` to `model.embed_tokens.weight`
//! after loading, so a head in the file is not what runs, and neither is it here. Such a head is
//! usually a redundant copy (some fine-tuning tools save both); one of another shape was saved for
//! another model and is refused, and one with other values is reported, because the file then
//! holds a head that is not the one that runs.

use crate::base::config::ModelConfig;
use crate::base::weight_names::WeightId;
use crate::base::weights::TensorSource;
use crate::error::{Error, Result};

/// Check the file's `lm_head.weight`, if any, when `config` ties the head to the embedding.
/// `Ok(Some(warning))` when it has the embedding's shape but other values: the loader prints the
/// warning and runs the embedding, as transformers does.
///
/// # Errors
/// [`Error::Config`] naming the tensor's file and both shapes when the shapes differ.
pub fn check_tied_head(
    config: &ModelConfig,
    source: &dyn TensorSource,
    config_file: &str,
) -> Result<Option<String>> {
    let head_name = WeightId::LmHead.hf_name();
    if !config.tie_word_embeddings {
        return Ok(None);
    }
    let Some(head) = source.read(&head_name)? else {
        return Ok(None);
    };
    let embed_name = WeightId::Embed.hf_name();
    let expected = WeightId::Embed.shape(config);
    if head.shape != expected {
        return Err(Error::config(
            source.file_of(&head_name),
            format!(
                "tensor `{head_name}` has shape {:?}, but tie_word_embeddings is true in \
                 {config_file}, so the head is the embedding `{embed_name}` of shape {expected:?} \
                 ([vocab_size, hidden_size]): a head of another shape was saved for another model",
                head.shape
            ),
        ));
    }
    // the embedding's own shape is checked when the weights load
    let Some(embed) = source.read(&embed_name)? else {
        return Ok(None);
    };
    let same = embed.shape == head.shape
        && embed
            .data
            .iter()
            .zip(&head.data)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    Ok((!same).then(|| {
        format!(
            "warning: {}: tensor `{head_name}` differs from `{embed_name}`, and tie_word_embeddings \
             is true in {config_file}: the head is the embedding (transformers ties them the same \
             way) and the file's `{head_name}` is not used",
            source.file_of(&head_name)
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::weights::{MemorySource, RawTensor};
    use crate::io::builtin;

    fn source(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> MemorySource {
        MemorySource {
            label: "model.safetensors".into(),
            tensors: tensors
                .iter()
                .map(|(n, shape, data)| {
                    let t = RawTensor {
                        shape: shape.clone(),
                        data: data.clone(),
                    };
                    (n.to_string(), t)
                })
                .collect(),
        }
    }

    /// A tied config (vocab 2, hidden 3): no head, or a head equal to the embedding bit for bit,
    /// loads silently; a head of another shape is an error naming it and both shapes; a head of
    /// the same shape with another value is a warning saying the embedding runs. Untied configs
    /// are not looked at (the head is a weight there, checked when the weights load).
    #[test]
    fn a_head_beside_tied_embeddings_is_checked() {
        let mut config = builtin::builtin("tiny").unwrap().config;
        config.vocab_size = 2;
        config.hidden_size = 3;
        config.tie_word_embeddings = true;
        let embed = ("model.embed_tokens.weight", vec![2, 3], vec![0.5; 6]);
        let check = |head: Option<(Vec<usize>, Vec<f32>)>, config: &ModelConfig| {
            let mut tensors = vec![embed.clone()];
            tensors.extend(head.map(|(shape, data)| ("lm_head.weight", shape, data)));
            check_tied_head(config, &source(&tensors), "config.json")
        };
        assert_eq!(check(None, &config).unwrap(), None);
        assert_eq!(
            check(Some((vec![2, 3], vec![0.5; 6])), &config).unwrap(),
            None
        );

        let err = check(Some((vec![3, 3], vec![0.0; 9])), &config)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("model.safetensors: tensor `lm_head.weight` has shape [3, 3]")
                && err.contains("tie_word_embeddings is true in config.json")
                && err.contains("`model.embed_tokens.weight` of shape [2, 3]"),
            "{err}"
        );

        let mut other = vec![0.5; 6];
        other[4] = -0.5;
        let warning = check(Some((vec![2, 3], other.clone())), &config)
            .unwrap()
            .unwrap();
        assert!(
            warning.contains("`lm_head.weight` differs from `model.embed_tokens.weight`")
                && warning.contains("the file's `lm_head.weight` is not used"),
            "{warning}"
        );

        config.tie_word_embeddings = false;
        assert_eq!(check(Some((vec![3, 3], other)), &config).unwrap(), None);
    }
}
