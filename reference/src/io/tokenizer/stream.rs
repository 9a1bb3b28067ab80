//! Decoding generated ids one at a time, for printing text as it is generated.
//!
//! A byte-level token can end in the middle of a UTF-8 character (an emoji is often 2-4 tokens),
//! and decoding a token alone can differ from decoding it in context. The decoder keeps a short
//! window of ids, decodes the window, and hands out only the new text once it no longer ends in an
//! incomplete character (`tokenizers`' `DecodeStream` algorithm). The concatenated pieces, plus
//! [`StreamDecoder::finish`], equal `decode(all ids)`.

use super::Tokenizer;
use crate::error::{Error, Result};

/// Turns ids into text incrementally; see the module docs.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    /// The window of ids still needed to decode the next piece.
    ids: Vec<u32>,
    /// The text of `ids[..prefix_index]`, already handed out.
    prefix: String,
    prefix_index: usize,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        StreamDecoder {
            tokenizer,
            skip_special_tokens,
            ids: vec![],
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// Add one id; returns the new text, or `None` while it would end inside a UTF-8 character
    /// (or when the id adds no text, e.g. a skipped special token).
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        let what = format!("streaming decode at token {id}");
        // Runs the file-made decoder, like `decode`: guarded (see `guard`).
        super::guard::guarded(&what, || {
            tokenizers::step_decode_stream(
                &self.tokenizer.inner,
                vec![id],
                self.skip_special_tokens,
                &mut self.ids,
                &mut self.prefix,
                &mut self.prefix_index,
            )
        })?
        .map_err(|e| Error::Tokenizer(format!("{what}: {e}")))
    }

    /// The text still held back (an incomplete character at the end decodes to U+FFFD), so that
    /// all pieces together equal `decode(all ids)`.
    pub fn finish(self) -> Result<String> {
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        Ok(text
            .strip_prefix(self.prefix.as_str())
            .unwrap_or(&text)
            .to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(t: &Tokenizer, ids: &[u32], skip: bool) -> (Vec<Option<String>>, String) {
        let mut d = t.stream_decoder(skip);
        let pieces: Vec<Option<String>> = ids.iter().map(|&id| d.step(id).unwrap()).collect();
        (pieces, d.finish().unwrap())
    }

    #[test]
    fn multi_byte_characters_wait_for_their_last_byte() {
        let t = Tokenizer::byte_level_builtin(300).unwrap();
        // "é" is bytes c3 a9; "😀" is f0 9f 98 80.
        let ids = t.encode("aé😀", false).unwrap();
        assert_eq!(ids, vec![97, 0xc3, 0xa9, 0xf0, 0x9f, 0x98, 0x80]);
        let (pieces, rest) = stream(&t, &ids, false);
        let want = [Some("a"), None, Some("é"), None, None, None, Some("😀")];
        assert_eq!(pieces, want.map(|p| p.map(String::from)));
        assert_eq!(rest, "");
    }

    #[test]
    fn pieces_concatenate_to_decode() {
        let t = Tokenizer::byte_level_builtin(320).unwrap();
        let text = "<|im_start|>user\nthe café 日本 👨‍👩‍👧<|im_end|> end";
        let ids = t.encode(text, false).unwrap();
        for skip in [false, true] {
            let (pieces, rest) = stream(&t, &ids, skip);
            let joined: String = pieces.into_iter().flatten().collect::<String>() + &rest;
            assert_eq!(
                joined,
                t.decode(&ids, skip).unwrap(),
                "skip_special_tokens = {skip}"
            );
        }
    }

    #[test]
    fn an_unfinished_character_is_flushed_by_finish() {
        let t = Tokenizer::byte_level_builtin(300).unwrap();
        let (pieces, rest) = stream(&t, &[104, 0xf0, 0x9f], false);
        assert_eq!(pieces, vec![Some("h".to_string()), None, None]);
        assert_eq!(rest, "\u{fffd}");
    }

    /// A `Strip` decoder asked to strip more characters than a token has makes tokenizers 0.23
    /// panic (`chars.len() - i - 1` underflows; upstream huggingface/tokenizers#2151): streaming
    /// runs the file's decoder like `decode`, so the panic is an error there too.
    #[test]
    fn a_panicking_decoder_is_an_error_when_streaming() {
        let builtin = Tokenizer::byte_level_builtin(300).unwrap();
        let mut json: serde_json::Value =
            serde_json::from_str(&builtin.backend().to_string(false).unwrap()).unwrap();
        json["decoder"] =
            serde_json::json!({"type": "Strip", "content": "a", "start": 0, "stop": 2});
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        let t = Tokenizer::from_file(&path).unwrap();
        // "a" is token 97: one character, all of it `content`
        let err = t.decode(&[97], false).unwrap_err().to_string();
        assert!(err.contains("a panic inside it"), "{err}");
        let err = t.stream_decoder(false).step(97).unwrap_err().to_string();
        assert!(
            err.contains("streaming decode at token 97") && err.contains("a panic inside it"),
            "{err}"
        );
    }
}
