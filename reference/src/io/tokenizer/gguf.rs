//! A tokenizer from GGUF metadata, built the way transformers 5.23 builds it
//! (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`) so that ids are equal.

use super::byte_level::{ByteLevelBpe, bytes_to_unicode};
use super::{SpecialToken, Tokenizer};
use crate::error::{Error, Result};
use crate::io::gguf::GgufFile;
use std::collections::HashSet;
use tokenizers::models::bpe::Vocab;

/// llama.cpp `token_type` values.
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// transformers' `GGUF_PRE_TOKENIZER_SPLITS`: `tokenizer.ggml.pre` -> split regex.
const PRE_TOKENIZER_SPLITS: &[(&str, &str)] = &[
    ("llama3", LLAMA3_SPLIT),
    ("llama-v3", LLAMA3_SPLIT),
    ("llama-bpe", LLAMA3_SPLIT),
    ("falcon3", LLAMA3_SPLIT),
    ("falcon-h1", LLAMA3_SPLIT),
    ("pixtral", LLAMA3_SPLIT),
    ("midm-2.0", LLAMA3_SPLIT),
    ("lfm2", LLAMA3_SPLIT),
    ("jina-v5-nano", LLAMA3_SPLIT),
    ("dbrx", LLAMA3_SPLIT),
    ("smaug-bpe", LLAMA3_SPLIT),
    ("tekken", TEKKEN_SPLIT),
    ("qwen2", QWEN2_SPLIT),
    ("deepseek-r1-qwen", QWEN2_SPLIT),
    ("kormo", QWEN2_SPLIT),
    ("f2llmv2", QWEN2_SPLIT),
    ("megrez", QWEN2_SPLIT),
    ("qwen35", QWEN35_SPLIT),
    ("gpt-4o", GPT4O_SPLIT),
    ("llama4", GPT4O_SPLIT),
    ("kanana2", GPT4O_SPLIT),
    ("talkie", GPT4O_SPLIT),
    ("minimax-m2", GPT4O_SPLIT),
];

impl Tokenizer {
    /// The tokenizer a GGUF describes, built as transformers 5.23 builds it
    /// (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`) so that ids are equal. Only
    /// byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is supported. The pipeline:
    ///
    /// - model: BPE over `tokenizer.ggml.tokens` (a token using characters outside the byte
    ///   alphabet is respelled byte by byte) and `tokenizer.ggml.merges`; no unk token, no dropout;
    /// - normalizer: none;
    /// - pre-tokenizer: `ByteLevel(add_prefix_space=false, trim_offsets=true, use_regex=true)`
    ///   (GPT-2's split regex); for the `tokenizer.ggml.pre` values transformers knows (`llama-bpe`,
    ///   `qwen2`, `tekken`, `gpt-4o`, ...) `Sequence[Split(regex, isolated),
    ///   ByteLevel(use_regex=false)]`. Any other `pre` value (SmolLM2's `smollm` included) gets
    ///   the GPT-2 split, as in transformers;
    /// - added tokens: `token_type` 3 (control) as special tokens (skipped when they use
    ///   characters outside the byte alphabet: llama.cpp mislabels), 4 (user-defined) as plain
    ///   added tokens; the BOS / EOS / UNK / PAD tokens are special too;
    /// - post-processor: `TemplateProcessing` writing BOS when `tokenizer.ggml.add_bos_token` is
    ///   true and EOS when `tokenizer.ggml.add_eos_token` is true (SmolLM2: neither, so
    ///   `add_special_tokens` adds nothing);
    /// - decoder: `ByteLevel`.
    ///
    /// `tokenizer.ggml.add_space_prefix` is ignored, as transformers ignores it for byte-level
    /// BPE. The chat template is `tokenizer.chat_template`, or ChatML when the file has none. EOS
    /// ids: `tokenizer.ggml.eos_token_id`, `tokenizer.ggml.eot_token_id`, and `<|im_end|>` (or
    /// another known end-of-turn token) when the vocabulary has it.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
        let file = f.label();
        let err = |msg: String| Error::Tokenizer(format!("{file}: {msg}"));
        let model = f.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(err(format!(
                "GGUF tokenizer model `{model}` (tokenizer.ggml.model) is not supported; only \
                 byte-level BPE (`gpt2`) is"
            )));
        }
        let tokens = f.get_str_array("tokenizer.ggml.tokens")?;
        let merges = f
            .optional("tokenizer.ggml.merges", GgufFile::get_str_array)?
            .ok_or_else(|| {
                err("byte-level BPE without `tokenizer.ggml.merges` is not supported".into())
            })?;
        let token_types = f.optional("tokenizer.ggml.token_type", GgufFile::get_i64_array)?;
        if let Some(types) = &token_types
            && types.len() != tokens.len()
        {
            return Err(err(format!(
                "`tokenizer.ggml.token_type` has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }

        // Respell tokens that use characters outside the byte alphabet, byte by byte.
        let spelling = bytes_to_unicode();
        let alphabet: HashSet<char> = spelling.iter().copied().collect();
        let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
        let mut vocab = Vocab::default();
        for (id, token) in tokens.iter().enumerate() {
            let spelled = if in_alphabet(token) {
                token.to_string()
            } else {
                token.bytes().map(|b| spelling[b as usize]).collect()
            };
            // A repeated token keeps its last id, as in transformers' dict comprehension.
            vocab.insert(spelled, id as u32);
        }
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| match m.split(' ').collect::<Vec<_>>().as_slice() {
                [a, b] => Ok((a.to_string(), b.to_string())),
                _ => Err(err(format!(
                    "merge {i} {m:?} is not two tokens separated by one space"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;

        let special_token = |key: &str| -> Result<Option<SpecialToken>> {
            let Some(id) = f.optional(key, GgufFile::get_u32)? else {
                return Ok(None);
            };
            let content = tokens.get(id as usize).ok_or_else(|| {
                err(format!(
                    "`{key}` = {id} is beyond the {} tokens",
                    tokens.len()
                ))
            })?;
            Ok(Some(SpecialToken {
                content: content.to_string(),
                id,
            }))
        };
        let bos = special_token("tokenizer.ggml.bos_token_id")?;
        let eos = special_token("tokenizer.ggml.eos_token_id")?;
        let unk = special_token("tokenizer.ggml.unknown_token_id")?;
        let pad = special_token("tokenizer.ggml.padding_token_id")?;
        let eot = special_token("tokenizer.ggml.eot_token_id")?;
        let flag = |key: &str| {
            f.optional(key, GgufFile::get_bool)
                .map(|b| b.unwrap_or(false))
        };
        let add_bos = if flag("tokenizer.ggml.add_bos_token")? {
            bos.clone()
        } else {
            None
        };
        let add_eos = if flag("tokenizer.ggml.add_eos_token")? {
            eos.clone()
        } else {
            None
        };

        let of_type = |wanted: i64| -> Vec<String> {
            let Some(types) = &token_types else {
                return vec![];
            };
            tokens
                .iter()
                .zip(types)
                .filter(|&(_, &ty)| ty == wanted)
                .map(|(t, _)| t.to_string())
                .collect()
        };
        let mut special: Vec<String> = of_type(CONTROL)
            .into_iter()
            .filter(|t| in_alphabet(t))
            .collect();
        for t in [&bos, &eos, &unk, &pad].into_iter().flatten() {
            if !special.contains(&t.content) {
                special.push(t.content.clone());
            }
        }
        let user_defined = of_type(USER_DEFINED)
            .into_iter()
            .filter(|t| vocab.contains_key(t))
            .collect();

        let pre = f.optional("tokenizer.ggml.pre", GgufFile::get_str)?;
        let split = pre.and_then(|pre| {
            PRE_TOKENIZER_SPLITS
                .iter()
                .find(|(name, _)| *name == pre)
                .map(|(_, r)| *r)
        });
        let inner = ByteLevelBpe {
            vocab,
            merges,
            split,
            special,
            user_defined,
            add_bos,
            add_eos,
        }
        .build(&file)?;
        let key = "tokenizer.chat_template";
        let chat_template = f
            .optional(key, GgufFile::get_str)?
            .map(|t| (t.to_string(), format!("GGUF key `{key}` in {file}")));
        let extra_eos: Vec<u32> = eot.iter().map(|t| t.id).collect();
        Ok(Tokenizer::assemble(
            inner,
            [bos, eos, unk, pad],
            &extra_eos,
            chat_template,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::gguf::builder::Builder;

    /// A tiny byte-level GGUF vocabulary: bytes, `Ġt` `Ġth` `Ġthe` (256..259), `<|endoftext|>`
    /// and `<|im_end|>` (control), `<think>` (user-defined).
    fn tiny(pre: &str, merges: &[&str]) -> Builder {
        let bytes = bytes_to_unicode();
        let mut tokens: Vec<String> = bytes.iter().map(char::to_string).collect();
        tokens.extend(
            [
                "Ġt",
                "Ġth",
                "Ġthe",
                "<|endoftext|>",
                "<|im_end|>",
                "<think>",
            ]
            .map(String::from),
        );
        let mut types = vec![1i32; tokens.len()];
        types[259] = 3;
        types[260] = 3;
        types[261] = 4;
        let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        Builder::default()
            .kv_str("tokenizer.ggml.model", "gpt2")
            .kv_str("tokenizer.ggml.pre", pre)
            .kv_str_array("tokenizer.ggml.tokens", &refs)
            .kv_i32_array("tokenizer.ggml.token_type", &types)
            .kv_str_array("tokenizer.ggml.merges", merges)
            .kv_u32("tokenizer.ggml.eos_token_id", 259)
    }

    const MERGES: &[&str] = &["Ġ t", "Ġt h", "Ġth e"];

    #[test]
    fn tiny_gguf_tokenizer() {
        let f = tiny("gpt2", MERGES)
            .kv_bool("tokenizer.ggml.add_bos_token", false)
            .open()
            .unwrap();
        let t = Tokenizer::from_gguf(&f).unwrap();
        assert_eq!(t.vocab_size(), 262);
        assert_eq!(t.encode(" t", true).unwrap(), vec![256]);
        assert_eq!(t.encode(" the", true).unwrap(), vec![258]);
        assert_eq!(t.encode("<|im_end|><think>", true).unwrap(), vec![260, 261]);
        assert_eq!(t.decode(&[260, 261, 256], true).unwrap(), "<think> t");
        assert_eq!(
            t.decode(&[260, 261, 256], false).unwrap(),
            "<|im_end|><think> t"
        );
        assert_eq!(t.eos_token_ids(), vec![259, 260]);
        assert!(t.chat_template_is_fallback());
    }

    #[test]
    fn bos_flag_and_split_regex() {
        let f = tiny("llama-bpe", MERGES)
            .kv_u32("tokenizer.ggml.bos_token_id", 259)
            .kv_bool("tokenizer.ggml.add_bos_token", true)
            .open()
            .unwrap();
        let t = Tokenizer::from_gguf(&f).unwrap();
        // Llama 3's split keeps digits in groups of three: "12345" -> "123", "45".
        let ids = t.encode("12345", true).unwrap();
        assert_eq!(
            ids,
            vec![
                259,
                b'1' as u32,
                b'2' as u32,
                b'3' as u32,
                b'4' as u32,
                b'5' as u32
            ]
        );
        assert_eq!(t.bos_token_id(), Some(259));
        let pieces = t.backend().encode("12345 abc", false).unwrap();
        let words: Vec<_> = pieces.get_word_ids().to_vec();
        assert_eq!(
            words,
            vec![
                Some(0),
                Some(0),
                Some(0),
                Some(1),
                Some(1),
                Some(2),
                Some(2),
                Some(2),
                Some(2)
            ]
        );
    }

    /// A template that does not parse loads (text without `--chat` still works) and says where
    /// it came from when checked or applied.
    #[test]
    fn broken_chat_template_names_its_key_and_file() {
        let f = tiny("gpt2", MERGES)
            .kv_str(
                "tokenizer.chat_template",
                "{% for m in messages %}{{ m.content",
            )
            .open()
            .unwrap();
        let t = Tokenizer::from_gguf(&f).unwrap();
        assert!(!t.chat_template_is_fallback());
        let err = t.check_chat_template().unwrap_err().to_string();
        let want = "chat template (GGUF key `tokenizer.chat_template` in test.gguf): syntax error";
        assert!(err.contains(want), "{err}");
        let err = t.apply_chat_template(&[], true).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }

    #[test]
    fn rejections_name_the_problem() {
        let sp = Builder::default()
            .kv_str("tokenizer.ggml.model", "llama")
            .open()
            .unwrap();
        let err = Tokenizer::from_gguf(&sp).unwrap_err().to_string();
        assert!(
            err.contains("GGUF tokenizer model `llama` (tokenizer.ggml.model) is not supported"),
            "{err}"
        );
        let bad_merge = tiny("gpt2", &["Ġ t", "a b c"]).open().unwrap();
        let err = Tokenizer::from_gguf(&bad_merge).unwrap_err().to_string();
        assert!(err.contains("merge 1 \"a b c\" is not two tokens"), "{err}");
        let unknown_merge = tiny("gpt2", &["x yz"]).open().unwrap();
        let err = Tokenizer::from_gguf(&unknown_merge)
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid BPE vocabulary or merges"), "{err}");
        let bad_bos = tiny("gpt2", MERGES)
            .kv_u32("tokenizer.ggml.bos_token_id", 9999)
            .open()
            .unwrap();
        let err = Tokenizer::from_gguf(&bad_bos).unwrap_err().to_string();
        assert!(
            err.contains("`tokenizer.ggml.bos_token_id` = 9999 is beyond the 262 tokens"),
            "{err}"
        );
        let no_model = Builder::default().open().unwrap();
        let err = Tokenizer::from_gguf(&no_model).unwrap_err().to_string();
        assert!(
            err.contains("metadata key `tokenizer.ggml.model` is missing"),
            "{err}"
        );
    }
}
