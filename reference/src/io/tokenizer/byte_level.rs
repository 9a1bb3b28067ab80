//! Byte-level BPE (GPT-2 style) pipelines, and the small built-in tokenizer of the random models.
//!
//! Byte-level BPE works on bytes, each spelled as one printable character (GPT-2's
//! `bytes_to_unicode`: printable Latin-1 bytes as themselves, the others shifted to U+0100..),
//! so any text is covered by the 256 single-byte tokens and round-trips exactly.

use super::{SpecialToken, Tokenizer};
use crate::error::{Error, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// GPT-2's byte -> character table: `table[b]` spells byte `b`.
pub(crate) fn bytes_to_unicode() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut table = ['\0'; 256];
    let mut shifted = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            shifted += 1;
            255 + shifted
        };
        table[b as usize] = char::from_u32(c).expect("U+0000..U+0143 are chars");
    }
    table
}

/// The pieces of a byte-level BPE pipeline; [`ByteLevelBpe::build`] assembles them.
pub(crate) struct ByteLevelBpe {
    pub vocab: Vocab,
    pub merges: Merges,
    /// A regex that splits text before the byte-level step (Llama 3, Qwen2, ... style); `None`
    /// uses GPT-2's split, built into `ByteLevel`.
    pub split: Option<&'static str>,
    /// Added as special tokens: matched whole in text, dropped by `skip_special_tokens`.
    pub special: Vec<String>,
    /// Added as plain added tokens: matched whole in text, kept when decoding.
    pub user_defined: Vec<String>,
    /// Written before / after each sequence by the post-processor (`add_special_tokens`).
    pub add_bos: Option<SpecialToken>,
    pub add_eos: Option<SpecialToken>,
}

impl ByteLevelBpe {
    /// The pipeline transformers builds for a byte-level BPE: no normalizer; pre-tokenizer
    /// `ByteLevel(add_prefix_space=false, trim_offsets=true, use_regex=true)` (or `Split(regex,
    /// isolated)` then `ByteLevel(use_regex=false)`); BPE without unk, dropout or prefixes;
    /// `TemplateProcessing` with the optional BOS / EOS; `ByteLevel` decoder.
    pub fn build(self, what: &str) -> Result<tokenizers::Tokenizer> {
        super::guard::guarded(what, || self.build_unguarded(what))?
    }

    fn build_unguarded(self, what: &str) -> Result<tokenizers::Tokenizer> {
        let err = |e: String| Error::Tokenizer(format!("{what}: {e}"));
        let bpe = BPE::builder()
            .vocab_and_merges(self.vocab, self.merges)
            .continuing_subword_prefix(String::new())
            .end_of_word_suffix(String::new())
            .build()
            .map_err(|e| err(format!("invalid BPE vocabulary or merges: {e}")))?;
        let mut t = tokenizers::Tokenizer::new(bpe);
        let pre: PreTokenizerWrapper = match self.split {
            None => ByteLevel::new(false, true, true).into(),
            Some(regex) => {
                let split = Split::new(
                    SplitPattern::Regex(regex.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| err(format!("invalid split regex: {e}")))?;
                Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, true, false).into(),
                ])
                .into()
            }
        };
        t.with_pre_tokenizer(Some(pre));
        t.with_decoder(Some(ByteLevelDecoder::new(true, true, true)));
        t.with_post_processor(Some(
            post_processor(self.add_bos.as_ref(), self.add_eos.as_ref()).map_err(err)?,
        ));
        let special: Vec<AddedToken> = self
            .special
            .into_iter()
            .map(|s| AddedToken::from(s, true).normalized(false))
            .collect();
        t.add_special_tokens(special)
            .map_err(|e| err(format!("cannot add special tokens: {e}")))?;
        let user: Vec<AddedToken> = self
            .user_defined
            .into_iter()
            .map(|s| AddedToken::from(s, false).normalized(false))
            .collect();
        t.add_tokens(user)
            .map_err(|e| err(format!("cannot add tokens: {e}")))?;
        Ok(t)
    }
}

/// transformers' `update_post_processor`: `[bos:0] $A:0 [eos:0]` (and the pair form).
fn post_processor(
    bos: Option<&SpecialToken>,
    eos: Option<&SpecialToken>,
) -> Result<TemplateProcessing, String> {
    let b = |t: Option<&SpecialToken>, type_id: u32| t.map(|t| format!("{}:{type_id}", t.content));
    let join =
        |parts: Vec<Option<String>>| parts.into_iter().flatten().collect::<Vec<_>>().join(" ");
    let single = join(vec![b(bos, 0), Some("$A:0".into()), b(eos, 0)]);
    let pair = join(vec![
        Some(single.clone()),
        b(bos, 1),
        Some("$B:1".into()),
        b(eos, 1),
    ]);
    let specials: Vec<(String, u32)> = [bos, eos]
        .into_iter()
        .flatten()
        .map(|t| (t.content.clone(), t.id))
        .collect();
    TemplateProcessing::builder()
        .try_single(single)?
        .try_pair(pair)?
        .special_tokens(specials)
        .build()
        .map_err(|e| format!("invalid post-processor: {e}"))
}

/// Special tokens of the built-in tokenizer, right after the 256 byte tokens.
pub const BUILTIN_SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The built-in tokenizer's merges (GPT-2's first ones), used as far as the vocabulary has room.
const BUILTIN_MERGES: &[(&str, &str)] = &[
    ("Ġ", "t"),
    ("Ġ", "a"),
    ("h", "e"),
    ("i", "n"),
    ("r", "e"),
    ("o", "n"),
    ("Ġt", "he"),
    ("e", "r"),
    ("Ġ", "s"),
    ("a", "t"),
    ("Ġ", "w"),
    ("Ġ", "o"),
    ("e", "n"),
    ("Ġ", "c"),
    ("i", "t"),
    ("i", "s"),
    ("a", "n"),
    ("o", "r"),
    ("e", "s"),
    ("Ġ", "b"),
    ("e", "d"),
    ("Ġ", "f"),
    ("in", "g"),
    ("Ġ", "p"),
    ("o", "u"),
    ("Ġa", "n"),
    ("a", "l"),
    ("a", "r"),
    ("Ġt", "o"),
    ("Ġ", "m"),
    ("Ġo", "f"),
    ("Ġ", "in"),
];

impl Tokenizer {
    /// A byte-level BPE for the built-in random models, with exactly `vocab_size` ids:
    ///
    /// - ids 0..256: the 256 bytes (id = byte value), so any text round-trips;
    /// - ids 256..259: `<|endoftext|>` (EOS), `<|im_start|>`, `<|im_end|>` (special);
    /// - then up to 32 fixed merges (`Ġt`, `he`, ...), as many as fit;
    /// - then `<|reserved_N|>` special tokens up to `vocab_size`.
    ///
    /// No BOS; EOS ids `<|endoftext|>` and `<|im_end|>`; the ChatML template. Errors when
    /// `vocab_size < 259`.
    pub fn byte_level_builtin(vocab_size: usize) -> Result<Tokenizer> {
        let first_free = 256 + BUILTIN_SPECIAL.len();
        if vocab_size < first_free || vocab_size > u32::MAX as usize {
            return Err(Error::Invalid(format!(
                "the built-in tokenizer needs a vocabulary of at least {first_free} tokens \
                 (256 bytes and {}), got {vocab_size}",
                BUILTIN_SPECIAL.join(", ")
            )));
        }
        let bytes = bytes_to_unicode();
        let mut tokens: Vec<String> = bytes.iter().map(char::to_string).collect();
        tokens.extend(BUILTIN_SPECIAL.iter().map(|s| s.to_string()));
        let mut merges = vec![];
        for &(a, b) in BUILTIN_MERGES.iter().take(vocab_size - first_free) {
            merges.push((a.to_string(), b.to_string()));
            tokens.push(format!("{a}{b}"));
        }
        let mut special: Vec<String> = BUILTIN_SPECIAL.iter().map(|s| s.to_string()).collect();
        for n in 0..vocab_size - tokens.len() {
            let reserved = format!("<|reserved_{n}|>");
            tokens.push(reserved.clone());
            special.push(reserved);
        }
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let special_token = |content: &str| {
            Some(SpecialToken {
                content: content.to_string(),
                id: vocab[content],
            })
        };
        let inner = ByteLevelBpe {
            vocab: vocab.clone(),
            merges,
            split: None,
            special,
            user_defined: vec![],
            add_bos: None,
            add_eos: None,
        }
        .build("built-in tokenizer")?;
        Ok(Tokenizer::assemble(
            inner,
            [
                None,
                special_token("<|endoftext|>"),
                special_token("<|endoftext|>"),
                None,
            ],
            &[],
            None,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xad], 'Ń');
        let mut sorted = t.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
    }

    #[test]
    fn builtin_round_trips_unicode() {
        let t = Tokenizer::byte_level_builtin(320).unwrap();
        assert_eq!(t.vocab_size(), 320);
        for text in [
            "",
            "Hello, the world!",
            "  tabs\tand\nnewlines\r\n",
            "café 日本語 😀👨‍👩‍👧 Привет مرحبا",
            "\0\u{1}\u{7f} control",
            "<|im_start|>user\nhi<|im_end|>\n",
        ] {
            let ids = t.encode(text, true).unwrap();
            assert!(ids.iter().all(|&id| (id as usize) < 320), "{text:?}");
            assert_eq!(t.decode(&ids, false).unwrap(), text);
        }
        // Bytes are their own ids; merges shorten common text; specials are whole.
        assert_eq!(t.encode("A", true).unwrap(), vec![65]);
        assert_eq!(
            t.encode(" the", true).unwrap(),
            vec![t.token_to_id("Ġthe").unwrap()]
        );
        assert_eq!(t.encode("<|im_end|>", false).unwrap(), vec![258]);
        assert_eq!(t.decode(&[104, 258, 105], true).unwrap(), "hi");
        assert_eq!(t.id_to_token(319).as_deref(), Some("<|reserved_28|>"));
        assert_eq!(t.eos_token_ids(), vec![256, 258]);
        assert_eq!(t.bos_token_id(), None);
        assert!(t.chat_template_is_fallback());
    }

    #[test]
    fn builtin_sizes() {
        let small = Tokenizer::byte_level_builtin(259).unwrap();
        assert_eq!(small.vocab_size(), 259);
        assert_eq!(
            small
                .decode(&small.encode("the end", false).unwrap(), false)
                .unwrap(),
            "the end"
        );
        assert_eq!(
            Tokenizer::byte_level_builtin(512).unwrap().vocab_size(),
            512
        );
        let err = Tokenizer::byte_level_builtin(256).unwrap_err().to_string();
        assert!(err.contains("at least 259 tokens"), "{err}");
    }

    #[test]
    fn post_processor_adds_bos_and_eos() {
        let bytes = bytes_to_unicode();
        let mut vocab: Vocab = bytes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), i as u32))
            .collect();
        vocab.insert("<s>".into(), 256);
        vocab.insert("</s>".into(), 257);
        let tok = |content: &str, id| {
            Some(SpecialToken {
                content: content.into(),
                id,
            })
        };
        let t = ByteLevelBpe {
            vocab,
            merges: vec![],
            split: None,
            special: vec!["<s>".into(), "</s>".into()],
            user_defined: vec![],
            add_bos: tok("<s>", 256),
            add_eos: tok("</s>", 257),
        }
        .build("test")
        .unwrap();
        assert_eq!(
            t.encode("hi", true).unwrap().get_ids(),
            &[256, 104, 105, 257]
        );
        assert_eq!(t.encode("hi", false).unwrap().get_ids(), &[104, 105]);
    }
}
