//! A llama-architecture GGUF as a base model: its [`ModelConfig`] from metadata, and its tensors
//! under HF names with HF's layout ([`GgufSource`]).
//!
//! llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the rows of
//! `q_proj` and `k_proj` (weights and biases) so that each head's two rotary halves are interleaved
//! (GPT-J style), which is what llama.cpp's RoPE expects. HF's RoPE rotates halves
//! (`rotate_half`), so [`GgufSource`] undoes the permutation; transformers' GGUF loader does the
//! same (`LlamaTensorProcessor._reverse_permute_weights`).

use super::reader::GgufFile;
use crate::base::config::{Architecture, ModelConfig, RopeScaling, check_float};
use crate::base::weight_names::{AttnProj, WeightId, check_tensor_count};
use crate::base::weights::{RawTensor, TensorSource};
use crate::error::{Error, Result};
use std::collections::HashMap;

/// The base-model config of a GGUF whose `general.architecture` is `llama`.
///
/// Read the way llama.cpp and transformers read it: `llama.block_count`, `context_length`,
/// `embedding_length`, `feed_forward_length`, `attention.head_count`, `attention.head_count_kv`
/// (default: head_count), `rope.freq_base` (default 10000), `attention.layer_norm_rms_epsilon`
/// (both refused where they would make the logits NaN), linear RoPE scaling (`rope_scaling` below);
/// head_dim = `attention.key_length` or embedding_length / head_count, which
/// `rope.dimension_count` must equal (partial rotary is not implemented); vocab size = the
/// length of `tokenizer.ggml.tokens` (else `llama.vocab_size`); embeddings are tied when there is
/// no `output.weight`; biases are present when `blk.0` has them. MoE files (`expert_count` > 0),
/// RoPE scaling other than linear, `rope.scaling.attn_factor` other than 1 and tensors we would
/// not load (`rope_freqs.weight`, ...) are errors. Keys llama.cpp does not read for `llama`
/// (`logit_scale`, `attention.scale`, ...) change nothing and are not looked at.
pub fn config_from_gguf(f: &GgufFile) -> Result<ModelConfig> {
    let file = f.label();
    let arch = f.get_str("general.architecture")?;
    if arch != "llama" {
        return Err(Error::config(
            &file,
            format!("GGUF architecture `{arch}` is not supported (only `llama`)"),
        ));
    }
    let key = |k: &str| format!("llama.{k}");
    let unsupported = |msg: String| Err(Error::config(&file, msg));

    if let Some(experts) = f.optional(&key("expert_count"), GgufFile::get_u64)?
        && experts > 0
    {
        return unsupported(format!(
            "MoE GGUF not supported (`llama.expert_count` = {experts})"
        ));
    }
    let rope_scaling = rope_scaling(f)?;
    // llama.cpp multiplies RoPE's cos and sin by it (so every attention score by its square)
    if let Some(attn_factor) = f.optional(&key("rope.scaling.attn_factor"), GgufFile::get_f64)?
        && attn_factor != 1.0
    {
        return unsupported(format!(
            "`llama.rope.scaling.attn_factor` = {attn_factor} (RoPE scaled by a factor) is not \
             supported"
        ));
    }
    // an epsilon or base that makes every logit NaN, named as the file names it
    let checked = |k: &str, value: f64, zero_ok: bool| -> Result<f64> {
        check_float(&file, &format!("`llama.{k}`"), value, zero_ok).map(|()| value)
    };
    let rms_norm_eps = checked(
        "attention.layer_norm_rms_epsilon",
        f.get_f64(&key("attention.layer_norm_rms_epsilon"))?,
        true,
    )?;
    let rope_theta = match f.optional(&key("rope.freq_base"), GgufFile::get_f64)? {
        Some(base) => checked("rope.freq_base", base, false)?,
        None => 10000.0,
    };

    let hidden_size = f.get_usize(&key("embedding_length"))?;
    let num_attention_heads = f.get_usize(&key("attention.head_count"))?;
    let num_key_value_heads = f
        .optional(&key("attention.head_count_kv"), GgufFile::get_usize)?
        .unwrap_or(num_attention_heads);
    let head_dim = match f.optional(&key("attention.key_length"), GgufFile::get_usize)? {
        Some(d) => d,
        None if num_attention_heads > 0 && hidden_size.is_multiple_of(num_attention_heads) => {
            hidden_size / num_attention_heads
        }
        None => {
            return unsupported(format!(
                "embedding_length ({hidden_size}) is not a multiple of attention.head_count \
                 ({num_attention_heads})"
            ));
        }
    };
    for (k, what) in [
        ("attention.value_length", "value head dim"),
        ("rope.dimension_count", "rotary dim"),
    ] {
        if let Some(d) = f.optional(&key(k), GgufFile::get_usize)?
            && d != head_dim
        {
            return unsupported(format!(
                "`llama.{k}` ({d}) differs from the head dim ({head_dim}): a {what} other than the \
                 head dim is not supported"
            ));
        }
    }

    let vocab_size = match f.optional("tokenizer.ggml.tokens", GgufFile::get_array)? {
        Some(tokens) => tokens.len(),
        None => f.get_usize(&key("vocab_size"))?,
    };
    if let Some(v) = f.optional(&key("vocab_size"), GgufFile::get_usize)?
        && v != vocab_size
    {
        return unsupported(format!(
            "`llama.vocab_size` ({v}) differs from the {vocab_size} tokens of `tokenizer.ggml.tokens`"
        ));
    }

    let has = |name: &str| f.tensor_info(name).is_some();
    let token_id = |k: &str| f.optional(k, GgufFile::get_u32);
    let config = ModelConfig {
        architecture: Architecture::Llama,
        vocab_size,
        hidden_size,
        intermediate_size: f.get_usize(&key("feed_forward_length"))?,
        num_hidden_layers: f.get_usize(&key("block_count"))?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings: f.get_usize(&key("context_length"))?,
        rms_norm_eps,
        rope_theta,
        rope_scaling,
        qkv_bias: has("blk.0.attn_q.bias"),
        o_bias: has("blk.0.attn_output.bias"),
        mlp_bias: has("blk.0.ffn_up.bias"),
        tie_word_embeddings: !has("output.weight"),
        sliding_window: None,
        moe: None,
        bos_token_id: token_id("tokenizer.ggml.bos_token_id")?,
        eos_token_ids: token_id("tokenizer.ggml.eos_token_id")?
            .into_iter()
            .collect(),
    };
    config.validate(&file)?;
    let missing = |id: WeightId| {
        let name = id.gguf_name()?;
        f.tensor_info(&name).is_none().then_some(name)
    };
    check_tensor_count(&config, f.tensor_infos().len(), &file, &missing)?;

    // Every tensor in the file must be one we load: an unknown one (`rope_freqs.weight` of
    // Llama 3.1 scaling, a bias on only some layers, ...) would change the model.
    let expected: std::collections::HashSet<String> = WeightId::all(&config)
        .into_iter()
        .filter_map(WeightId::gguf_name)
        .collect();
    if let Some(extra) = f.tensor_names().into_iter().find(|n| !expected.contains(n)) {
        return unsupported(format!(
            "tensor `{extra}` is not part of a llama model with this config; it is not supported"
        ));
    }
    Ok(config)
}

/// RoPE scaling as llama.cpp reads it: `llama.rope.scaling.type` (default `linear`) with
/// `llama.rope.scaling.factor` (else the older `llama.rope.scale_linear`), where a factor that is
/// absent, 0 or 1 means none and type `none` ignores the factor. Linear scaling divides the
/// frequencies by the factor (llama.cpp's `rope_freq_scale = 1 / factor`), which is HF's `linear`
/// rope type; other types (`yarn`, ...) are refused.
fn rope_scaling(f: &GgufFile) -> Result<RopeScaling> {
    let file = f.label();
    let kind = f.optional("llama.rope.scaling.type", GgufFile::get_str)?;
    // (key, factor)
    let factor = ["llama.rope.scaling.factor", "llama.rope.scale_linear"]
        .into_iter()
        .find(|k| f.metadata.contains_key(*k))
        .map(|k| f.get_f64(k).map(|v| (k, v)))
        .transpose()?;
    match (kind.unwrap_or("linear"), factor) {
        ("none", _) | ("linear", None) => Ok(RopeScaling::Default),
        ("linear", Some((_, factor))) if factor == 0.0 || factor == 1.0 => Ok(RopeScaling::Default),
        ("linear", Some((key, factor))) => {
            check_float(&file, &format!("`{key}`"), factor, false)?;
            Ok(RopeScaling::Linear { factor })
        }
        (other, _) => Err(Error::config(
            &file,
            format!("GGUF RoPE scaling `{other}` (`llama.rope.scaling.type`) is not supported"),
        )),
    }
}

/// The tensors of a llama GGUF under their HF names, dequantised to f32, with `q_proj` / `k_proj`
/// rows back in HF's rotate-half order.
pub struct GgufSource<'a> {
    file: &'a GgufFile,
    config: ModelConfig,
    /// HF name -> (tensor, GGUF name)
    names: HashMap<String, (WeightId, String)>,
}

impl<'a> GgufSource<'a> {
    /// A source over `file` for the model `config` describes (from [`config_from_gguf`]).
    pub fn new(file: &'a GgufFile, config: &ModelConfig) -> Self {
        let names = WeightId::all(config)
            .into_iter()
            .filter_map(|id| Some((id.hf_name(), (id, id.gguf_name()?))))
            .collect();
        GgufSource {
            file,
            config: config.clone(),
            names,
        }
    }

    /// Heads to un-permute over: H for q, Hkv for k, `None` for tensors stored as HF has them.
    fn permuted_heads(&self, id: WeightId) -> Option<usize> {
        match id {
            WeightId::Attn(_, AttnProj::Q) | WeightId::AttnBias(_, AttnProj::Q) => {
                Some(self.config.num_attention_heads)
            }
            WeightId::Attn(_, AttnProj::K) | WeightId::AttnBias(_, AttnProj::K) => {
                Some(self.config.num_key_value_heads)
            }
            _ => None,
        }
    }
}

impl TensorSource for GgufSource<'_> {
    fn file_of(&self, _name: &str) -> String {
        self.file.label()
    }

    fn read(&self, name: &str) -> Result<Option<RawTensor>> {
        let Some(&(id, ref gguf_name)) = self.names.get(name) else {
            return Ok(None);
        };
        if self.file.tensor_info(gguf_name).is_none() {
            return Ok(None);
        }
        // Checked here rather than only by the loader, so that errors name the tensor as the
        // file does.
        let mut t = self.file.tensor_f32(gguf_name)?;
        let bad = |msg: String| {
            Err(Error::format(
                self.file.label(),
                format!("tensor `{gguf_name}` ({name}) {msg}"),
            ))
        };
        let expected = id.shape(&self.config);
        // ggml pads every shape with trailing dims of 1 (leading, in PyTorch order), and
        // llama.cpp accepts them written out: a norm of dims [D, 1] is a norm of [D]
        let extra = t.shape.len().saturating_sub(expected.len());
        if t.shape[..extra].iter().all(|&d| d == 1) {
            t.shape.drain(..extra);
        }
        if t.shape != expected {
            return bad(format!("has shape {:?}, expected {expected:?}", t.shape));
        }
        if let Some(v) = t.data.iter().find(|v| !v.is_finite()) {
            return bad(format!("holds a non-finite value ({v})"));
        }
        Ok(Some(match self.permuted_heads(id) {
            Some(heads) => unpermute_rows(&t, heads),
            None => t,
        }))
    }
}

/// Undo llama.cpp's q/k permutation on the rows (first axis) of a weight `[H*Dh, D]` or bias
/// `[H*Dh]`.
///
/// llama.cpp wrote `w.reshape(H, 2, Dh/2, D).swapaxes(1, 2).reshape(H*Dh, D)`, i.e. GGUF row
/// `h*Dh + 2j + i` holds HF row `h*Dh + i*Dh/2 + j` (i in 0..2, j in 0..Dh/2). The PyTorch inverse:
/// `w.reshape(H, Dh/2, 2, D).swapaxes(1, 2).reshape(H*Dh, D)`.
///
/// # Shapes
/// - `t`: `[H*Dh, D]` or `[H*Dh]` -> same shape
///
/// # Panics
/// If `t` has more than 2 dims or its rows are not a positive multiple of `2 * heads`
/// ([`GgufSource`] checks the shape against the config first).
pub fn unpermute_rows(t: &RawTensor, heads: usize) -> RawTensor {
    let rows = t.shape.first().copied().unwrap_or(0);
    assert!(
        heads > 0 && rows > 0 && rows.is_multiple_of(2 * heads) && t.shape.len() <= 2,
        "unpermute_rows: shape {:?} does not split into {heads} heads of even size",
        t.shape
    );
    let cols = t.shape.get(1).copied().unwrap_or(1);
    let (head_dim, half) = (rows / heads, rows / heads / 2);
    let mut out = vec![0f32; t.data.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..half {
                let hf_row = h * head_dim + i * half + j;
                let gguf_row = h * head_dim + 2 * j + i;
                out[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&t.data[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    RawTensor {
        shape: t.shape.clone(),
        data: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::gguf::builder::Builder;

    #[test]
    fn unpermute_by_hand() {
        // One head, Dh = 4, D = 1: HF rows [a0, a1, b0, b1] (halves a, b) were written interleaved
        // as [a0, b0, a1, b1].
        let t = RawTensor {
            shape: vec![4, 1],
            data: vec![10.0, 20.0, 11.0, 21.0],
        };
        assert_eq!(unpermute_rows(&t, 1).data, vec![10.0, 11.0, 20.0, 21.0]);

        // Two heads, Dh = 4, D = 2: rows are permuted within each head, columns move together.
        // Within each head the GGUF rows are HF rows 0, 2, 1, 3.
        let mut data = vec![];
        for h in 0..2 {
            for hf_row in [0, 2, 1, 3].map(|r| h * 4 + r) {
                data.extend([hf_row as f32, 100.0 + hf_row as f32]);
            }
        }
        let t = RawTensor {
            shape: vec![8, 2],
            data,
        };
        let want: Vec<f32> = (0..8).flat_map(|r| [r as f32, 100.0 + r as f32]).collect();
        assert_eq!(unpermute_rows(&t, 2).data, want);

        // A bias permutes like a one-column weight.
        let b = RawTensor {
            shape: vec![4],
            data: vec![0.0, 2.0, 1.0, 3.0],
        };
        assert_eq!(unpermute_rows(&b, 1).data, vec![0.0, 1.0, 2.0, 3.0]);
    }

    /// `permute` as llama.cpp writes it, to check the round trip.
    fn permute(t: &RawTensor, heads: usize) -> RawTensor {
        let (rows, cols) = (t.shape[0], t.shape.get(1).copied().unwrap_or(1));
        let (dh, half) = (rows / heads, rows / heads / 2);
        let mut out = vec![0f32; t.data.len()];
        for h in 0..heads {
            for j in 0..half {
                for i in 0..2 {
                    let src = h * dh + i * half + j;
                    let dst = h * dh + 2 * j + i;
                    out[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&t.data[src * cols..(src + 1) * cols]);
                }
            }
        }
        RawTensor {
            shape: t.shape.clone(),
            data: out,
        }
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let t = RawTensor {
            shape: vec![12, 3],
            data: (0..36).map(|v| v as f32).collect(),
        };
        for heads in [1, 2, 3, 6] {
            assert_eq!(
                unpermute_rows(&permute(&t, heads), heads),
                t,
                "{heads} heads"
            );
        }
    }

    /// A 1-layer llama GGUF: D = 4, H = 2, Hkv = 1, Dh = 2, I = 2, V = 3, tied embeddings.
    fn tiny() -> Builder {
        tiny_with(1e-5, "", &[], &[])
    }

    /// [`tiny`] with RMSNorm epsilon `eps`, and the tensor `name` written with GGUF dims `dims`
    /// and values `values`.
    fn tiny_with(eps: f32, name: &str, dims: &[u64], values: &[f32]) -> Builder {
        let mut b = Builder::default()
            .kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 1)
            .kv_u32("llama.context_length", 16)
            .kv_u32("llama.embedding_length", 4)
            .kv_u32("llama.feed_forward_length", 2)
            .kv_u32("llama.attention.head_count", 2)
            .kv_u32("llama.attention.head_count_kv", 1)
            .kv_f32("llama.attention.layer_norm_rms_epsilon", eps)
            .kv_u32("llama.rope.dimension_count", 2)
            .kv_str_array("tokenizer.ggml.tokens", &["a", "b", "c"])
            .kv_u32("tokenizer.ggml.bos_token_id", 1)
            .kv_u32("tokenizer.ggml.eos_token_id", 2);
        let tensors: [(&str, &[u64], f32); 11] = [
            ("token_embd.weight", &[4, 3], 0.0),
            ("blk.0.attn_norm.weight", &[4], 0.0),
            ("blk.0.attn_q.weight", &[4, 4], 0.0),
            ("blk.0.attn_k.weight", &[4, 2], 100.0),
            ("blk.0.attn_v.weight", &[4, 2], 0.0),
            ("blk.0.attn_output.weight", &[4, 4], 0.0),
            ("blk.0.ffn_norm.weight", &[4], 0.0),
            ("blk.0.ffn_gate.weight", &[4, 2], 0.0),
            ("blk.0.ffn_up.weight", &[4, 2], 0.0),
            ("blk.0.ffn_down.weight", &[2, 4], 0.0),
            ("output_norm.weight", &[4], 0.0),
        ];
        for (n, d, base) in tensors {
            b = if n == name {
                b.tensor_f32(n, dims, values)
            } else {
                let count = d.iter().product::<u64>() as usize;
                b.tensor_f32(
                    n,
                    d,
                    &(0..count).map(|i| base + i as f32).collect::<Vec<_>>(),
                )
            };
        }
        b
    }

    #[test]
    fn config_and_source_of_a_tiny_llama() {
        let f = tiny().open().unwrap();
        let c = config_from_gguf(&f).unwrap();
        assert_eq!(
            (
                c.vocab_size,
                c.hidden_size,
                c.intermediate_size,
                c.num_hidden_layers
            ),
            (3, 4, 2, 1)
        );
        assert_eq!(
            (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
            (2, 1, 2)
        );
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.rms_norm_eps, f64::from(1e-5f32));
        assert!(c.tie_word_embeddings && !c.qkv_bias && !c.o_bias && !c.mlp_bias);
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.clone()),
            (Some(1), vec![2])
        );

        let src = GgufSource::new(&f, &c);
        assert_eq!(src.file_of("x"), "test.gguf");
        assert!(src.read("lm_head.weight").unwrap().is_none());
        assert!(src.read("no.such.tensor").unwrap().is_none());
        // k: [Hkv*Dh = 2, D = 4]; with Dh = 2 each head's rows (x, y) are already in order.
        let k = src
            .read("model.layers.0.self_attn.k_proj.weight")
            .unwrap()
            .unwrap();
        assert_eq!(k.shape, vec![2, 4]);
        assert_eq!(k.data, (0..8).map(|i| 100.0 + i as f32).collect::<Vec<_>>());
        let embed = src.read("model.embed_tokens.weight").unwrap().unwrap();
        assert_eq!(embed.shape, vec![3, 4]);
        let w = crate::base::weights::Weights::load(&c, &src).unwrap();
        assert_eq!(w.layers.len(), 1);
    }

    /// llama.cpp's linear RoPE scaling (`rope_freq_scale = 1 / factor`) is HF's `linear` rope
    /// type: the tiny GGUF with a factor reads as the same config as its `config.json` would.
    #[test]
    fn linear_rope_scaling_reads_as_hf_linear() {
        let hf = |rope: &str| {
            let text = format!(
                r#"{{"model_type": "llama", "vocab_size": 3, "hidden_size": 4,
                "intermediate_size": 2, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 16, "rms_norm_eps": {},
                "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2 {rope}}}"#,
                f64::from(1e-5f32)
            );
            ModelConfig::from_hf_json(&text, "config.json").unwrap()
        };
        let gguf = |b: Builder| config_from_gguf(&b.open().unwrap()).unwrap();
        assert_eq!(gguf(tiny()), hf(""));
        let linear = hf(r#", "rope_scaling": {"rope_type": "linear", "factor": 4.0}"#);
        let (kind, factor) = ("llama.rope.scaling.type", "llama.rope.scaling.factor");
        // without a type, llama.cpp applies the factor as linear; the older key too
        for b in [
            tiny().kv_f32(factor, 4.0),
            tiny().kv_str(kind, "linear").kv_f32(factor, 4.0),
            tiny().kv_f32("llama.rope.scale_linear", 4.0),
        ] {
            assert_eq!(gguf(b), linear);
        }
        // type `none` ignores the factor; a factor of 0 or 1 is no scaling
        for b in [
            tiny().kv_str(kind, "none").kv_f32(factor, 4.0),
            tiny().kv_f32(factor, 1.0),
            tiny().kv_str(kind, "linear").kv_f32(factor, 0.0),
        ] {
            assert_eq!(gguf(b).rope_scaling, RopeScaling::Default);
        }
    }

    /// Tensor errors name the tensor as the file does and as HF does; ggml's trailing dims of 1
    /// are accepted.
    #[test]
    fn tensor_errors_name_both_names() {
        let load = |b: Builder| -> Result<()> {
            let f = b.open().unwrap();
            let c = config_from_gguf(&f).unwrap();
            crate::base::weights::Weights::load(&c, &GgufSource::new(&f, &c)).map(|_| ())
        };
        let err = |name: &str, dims: &[u64], values: &[f32]| {
            let e = load(tiny_with(1e-5, name, dims, values))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("test.gguf: "), "{e}");
            e
        };
        // k (un-permuted) and v: [Hkv*Dh = 2, D = 4], written transposed
        for (gguf, hf) in [("attn_k", "k_proj"), ("attn_v", "v_proj")] {
            let e = err(&format!("blk.0.{gguf}.weight"), &[2, 4], &[0.0; 8]);
            let want = format!(
                "tensor `blk.0.{gguf}.weight` (model.layers.0.self_attn.{hf}.weight) has shape \
                 [4, 2], expected [2, 4]"
            );
            assert!(e.contains(&want), "{e}");
        }
        let mut nan = [0.0; 8];
        nan[3] = f32::NAN;
        let e = err("blk.0.attn_v.weight", &[4, 2], &nan);
        let want = "tensor `blk.0.attn_v.weight` (model.layers.0.self_attn.v_proj.weight) holds \
                    a non-finite value (NaN)";
        assert!(e.contains(want), "{e}");
        for dims in [&[4, 1][..], &[4, 1, 1]] {
            load(tiny_with(1e-5, "output_norm.weight", dims, &[1.0; 4])).unwrap();
        }
        let e = err("output_norm.weight", &[1, 4], &[1.0; 4]);
        assert!(e.contains("has shape [4, 1], expected [4]"), "{e}");
    }

    #[test]
    fn config_rejections_name_the_problem() {
        let cases = [
            (
                tiny().kv_str("general.architecture", "qwen2"),
                "metadata key `general.architecture` appears twice",
            ),
            (
                tiny().kv_u32("llama.expert_count", 8),
                "MoE GGUF not supported",
            ),
            (
                tiny().kv_str("llama.rope.scaling.type", "yarn"),
                "GGUF RoPE scaling `yarn`",
            ),
            (
                tiny().kv_f32("llama.rope.scaling.factor", -2.0),
                "`llama.rope.scaling.factor` is -2: it must be a finite number more than 0",
            ),
            (
                tiny().kv_f32("llama.rope.scaling.attn_factor", 2.0),
                "`llama.rope.scaling.attn_factor` = 2",
            ),
            (
                tiny().kv_u32("llama.vocab_size", 5),
                "`llama.vocab_size` (5) differs from the 3 tokens",
            ),
            (
                tiny().kv_u32("llama.attention.key_length", 4),
                "`llama.rope.dimension_count` (2) differs",
            ),
            (
                tiny().tensor_f32("rope_freqs.weight", &[1], &[1.0]),
                "tensor `rope_freqs.weight` is not part",
            ),
        ];
        // an epsilon or a RoPE base that would make every logit NaN
        let eps = "llama.attention.layer_norm_rms_epsilon";
        let base = "llama.rope.freq_base";
        let numbers = [
            (eps, -1e-5, "0 or more"),
            (eps, f32::NAN, "0 or more"),
            (eps, f32::INFINITY, "0 or more"),
            (base, 0.0, "more than 0"),
            (base, -10000.0, "more than 0"),
            (base, f32::NAN, "more than 0"),
            (base, f32::INFINITY, "more than 0"),
        ]
        .map(|(key, v, want)| {
            let b = match key {
                "llama.rope.freq_base" => tiny().kv_f32(key, v),
                _ => tiny_with(v, "", &[], &[]),
            };
            let v = f64::from(v);
            (
                b,
                format!("`{key}` is {v}: it must be a finite number {want}"),
            )
        });
        for (b, want) in cases
            .into_iter()
            .map(|(b, w)| (b, w.to_string()))
            .chain(numbers)
        {
            let err = b
                .open()
                .and_then(|f| config_from_gguf(&f))
                .unwrap_err()
                .to_string();
            assert!(err.contains(&want), "{err:?} should contain {want:?}");
            assert!(err.starts_with("test.gguf"), "{err}");
        }
        let qwen = Builder::default()
            .kv_str("general.architecture", "qwen2")
            .open()
            .unwrap();
        let err = config_from_gguf(&qwen).unwrap_err();
        assert!(matches!(err, Error::Config { .. }));
        assert!(
            err.to_string()
                .contains("GGUF architecture `qwen2` is not supported"),
            "{err}"
        );
        let scaled_none = tiny()
            .kv_str("llama.rope.scaling.type", "none")
            .open()
            .unwrap();
        assert!(config_from_gguf(&scaled_none).is_ok());
    }
}
