//! Our tokenizer for the SmolLM2 GGUF against transformers 5.23.0's (tokenizers 0.23.3) for the
//! same file: the pipeline, ids, decoded text and chat templates must be equal, case by case.
//! Fixture and generator: tests/fixtures/smollm2/tokenizer_cases.json,
//! scripts/fixtures/make_tokenizer_fixture.py.
//!
//! Needs the GGUF in the m2r2 cache (`m2r2 fetch smollm2`); without it the tests fail with the
//! message of [`reference::io::hub::require_smollm2`].

use reference::io::gguf::GgufFile;
use reference::io::tokenizer::{ChatMessage, Tokenizer};
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = reference::io::hub::require_smollm2().unwrap_or_else(|e| panic!("{e}"));
        Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
    })
}

fn fixture() -> &'static Value {
    static FIXTURE: OnceLock<Value> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/smollm2/tokenizer_cases.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap()
}

/// Collects mismatches so one run shows all of them.
#[derive(Default)]
struct Report(Vec<String>);

impl Report {
    fn check<T: PartialEq + std::fmt::Debug>(&mut self, what: String, ours: T, theirs: T) {
        if ours != theirs {
            self.0.push(format!(
                "NOT OK {what}\n  ours:   {ours:?}\n  theirs: {theirs:?}"
            ));
        }
    }

    fn assert_ok(self, total: usize) {
        assert!(
            self.0.is_empty(),
            "{} of {total} checks differ:\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// SHA-256 (hex) of the lines joined by `\n`, as the fixture script computes it.
fn sha256_lines(lines: impl Iterator<Item = String>) -> String {
    use sha2::{Digest, Sha256};
    let text = lines.collect::<Vec<_>>().join("\n");
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn pipeline_equals_transformers() {
    let t = tokenizer();
    let want = &fixture()["tokenizer"];
    let ours: Value = serde_json::from_str(&t.backend().to_string(false).unwrap()).unwrap();
    let mut r = Report::default();
    for key in [
        "normalizer",
        "pre_tokenizer",
        "post_processor",
        "decoder",
        "added_tokens",
    ] {
        r.check(key.to_string(), &ours[key], &want[key]);
    }
    let mut model = ours["model"].clone();
    let vocab = model["vocab"].as_object().unwrap();
    let mut by_id: Vec<(u64, &str)> = vocab
        .iter()
        .map(|(t, id)| (id.as_u64().unwrap(), t.as_str()))
        .collect();
    by_id.sort();
    model["vocab_sha256"] = sha256_lines(by_id.iter().map(|(_, t)| t.to_string())).into();
    let merges = model["merges"].as_array().unwrap();
    let merges = merges
        .iter()
        .map(|pair| format!("{} {}", str_of(&pair[0]), str_of(&pair[1])));
    model["merges_sha256"] = sha256_lines(merges).into();
    for (key, value) in want["model"].as_object().unwrap() {
        r.check(format!("model.{key}"), &model[key], value);
    }
    r.check(
        "vocab_size".into(),
        t.vocab_size() as u64,
        want["vocab_size"].as_u64().unwrap(),
    );
    r.check(
        "bos".into(),
        t.bos_token_id().map(u64::from),
        want["bos_token_id"].as_u64(),
    );
    r.check(
        "eos".into(),
        t.eos_token_id().map(u64::from),
        want["eos_token_id"].as_u64(),
    );
    // SmolLM2's EOS is <|im_end|> itself, so there is no separate end-of-turn token.
    r.check("eos_token_ids".into(), t.eos_token_ids(), vec![2]);
    r.check("has template".into(), t.chat_template_is_fallback(), false);
    r.assert_ok(10);
}

#[test]
fn encode_and_decode_equal_transformers() {
    let t = tokenizer();
    let cases = fixture()["encode"].as_array().unwrap();
    let mut r = Report::default();
    for case in cases {
        let text = str_of(&case["text"]);
        let with = ids(&case["ids"]);
        r.check(
            format!("encode {text:?}"),
            t.encode(text, true).unwrap(),
            with.clone(),
        );
        r.check(
            format!("encode {text:?} without special tokens"),
            t.encode(text, false).unwrap(),
            ids(&case["ids_no_special"]),
        );
        r.check(
            format!("decode {with:?}"),
            t.decode(&with, false).unwrap(),
            str_of(&case["decoded"]).to_string(),
        );
        r.check(
            format!("decode {with:?} skipping special tokens"),
            t.decode(&with, true).unwrap(),
            str_of(&case["decoded_skip_special"]).to_string(),
        );
    }
    let decodes = fixture()["decode"].as_array().unwrap();
    for case in decodes {
        let list = ids(&case["ids"]);
        r.check(
            format!("decode {list:?}"),
            t.decode(&list, false).unwrap(),
            str_of(&case["decoded"]).to_string(),
        );
        r.check(
            format!("decode {list:?} skipping special tokens"),
            t.decode(&list, true).unwrap(),
            str_of(&case["decoded_skip_special"]).to_string(),
        );
    }
    for case in fixture()["tokens"].as_array().unwrap() {
        let (token, id) = (str_of(&case["token"]), case["id"].as_u64().unwrap() as u32);
        r.check(
            format!("token_to_id {token:?}"),
            t.token_to_id(token),
            Some(id),
        );
        r.check(
            format!("id_to_token {id}"),
            t.id_to_token(id),
            Some(token.to_string()),
        );
    }
    r.assert_ok(4 * cases.len() + 2 * decodes.len());
}

#[test]
fn streaming_equals_decode() {
    let t = tokenizer();
    for case in fixture()["encode"].as_array().unwrap() {
        let list = ids(&case["ids"]);
        for skip in [false, true] {
            let mut stream = t.stream_decoder(skip);
            let mut text: String = list
                .iter()
                .filter_map(|&id| stream.step(id).unwrap())
                .collect();
            text += &stream.finish().unwrap();
            assert_eq!(
                text,
                t.decode(&list, skip).unwrap(),
                "{list:?}, skip_special_tokens = {skip}"
            );
        }
    }
}

#[test]
fn chat_template_equals_transformers() {
    let t = tokenizer();
    let cases = fixture()["chat"].as_array().unwrap();
    let mut r = Report::default();
    for case in cases {
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(str_of(&m["role"]), str_of(&m["content"])))
            .collect();
        let generation_prompt = case["add_generation_prompt"].as_bool().unwrap();
        let rendered = t.apply_chat_template(&messages, generation_prompt).unwrap();
        r.check(
            format!("render {messages:?}"),
            rendered.as_str(),
            str_of(&case["rendered"]),
        );
        r.check(
            format!("ids of {messages:?}"),
            t.encode(&rendered, false).unwrap(),
            ids(&case["ids"]),
        );
    }
    r.assert_ok(2 * cases.len());
}
