//! Valid inputs of every target, made from the project's own fixtures and built-in models: the
//! folders the folder targets mutate one file of, and the fuzzers' seed corpora.

use super::Target;
use crate::fixture_dir;
use reference::Model;
use reference::decode::prompt_lookup::LookupConfig;
use reference::decode::speculative::{DraftLength, SpeculativeOptions};
use reference::golden::{Golden, TreeRecipe};
use reference::io::builtin::{self, BUILTIN_VOCAB};
use reference::io::gguf::builder::Builder;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::draft_head::DraftHead;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use safetensors::SafeTensors;
use std::path::Path;
use std::sync::OnceLock;

pub(super) const GOLDEN_FILE: &str = "g.golden.safetensors";

/// SmolLM2-135M-Instruct's chat template (a default system message, ChatML turns).
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and \
messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named \
SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + \
'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ \
'<|im_start|>assistant\n' }}{% endif %}";

/// A template using what chat templates use: macros, namespaces, filters, string methods, loops.
const FEATURE_TEMPLATE: &str = "{%- macro turn(m) -%}<|im_start|>{{ m.role }}\n{{ \
m.content | trim }}<|im_end|>\n{%- endmacro -%}{%- set ns = namespace(sys=false) -%}{%- for m in \
messages -%}{%- if m.role == 'system' %}{% set ns.sys = true %}{% endif -%}{{ turn(m) }}{%- if \
m.content.startswith('Why') %}{{ m.content.upper() | length }}{% endif -%}{%- endfor -%}{%- if not \
ns.sys %}{{ raise_exception('no system message') }}{% endif -%}{%- if add_generation_prompt \
%}<|im_start|>assistant\n{% endif %}";

/// A valid folder: the files an input may replace, and files kept as they are.
pub(crate) struct Base {
    pub(crate) files: Vec<(String, Vec<u8>)>,
    pub(crate) fixed: Vec<(String, Vec<u8>)>,
}

/// The built-in tiny model.
pub(crate) fn tiny() -> &'static Model {
    static TINY: OnceLock<Model> = OnceLock::new();
    TINY.get_or_init(|| builtin::builtin("tiny").expect("the built-in model"))
}

/// `target`'s valid folder, made once per process.
pub(crate) fn base(target: Target) -> &'static Base {
    static BASES: [OnceLock<Base>; Target::ALL.len()] = [const { OnceLock::new() }; 11];
    let i = Target::ALL
        .iter()
        .position(|&t| t == target)
        .expect("listed");
    BASES[i].get_or_init(|| make_base(target))
}

/// The seed corpus of `target`, `(name, bytes)`: valid inputs as [`super::run`] takes them (for
/// a folder target, each file of the valid folder behind its index byte).
pub fn seeds(target: Target) -> Vec<(String, Vec<u8>)> {
    match target {
        Target::Gguf => vec![(
            "quant_types.gguf".into(),
            read(&fixture_dir().join("gguf/quant_types.gguf")),
        )],
        Target::HfConfig => [
            "llama_gqa_tied",
            "llama_untied_bias",
            "mistral_window",
            "mixtral",
            "qwen2_bias",
        ]
        .iter()
        .flat_map(|m| {
            ["config.json", "config_v4.json"]
                .map(|f| (format!("{m}_{f}"), fixture_dir().join("hf").join(m).join(f)))
        })
        .filter(|(_, p)| p.is_file())
        .map(|(n, p)| (n, read(&p)))
        .collect(),
        Target::ChatTemplate => [
            ("chatml.jinja", reference::io::tokenizer::CHATML_TEMPLATE),
            ("smollm2.jinja", SMOLLM2_TEMPLATE),
            ("features.jinja", FEATURE_TEMPLATE),
        ]
        .map(|(n, t)| (n.to_string(), t.as_bytes().to_vec()))
        .to_vec(),
        Target::Golden => golden_files(),
        _ => base(target)
            .files
            .iter()
            .enumerate()
            .map(|(i, (name, bytes))| {
                let mut input = vec![i as u8];
                input.extend_from_slice(bytes);
                (name.clone(), input)
            })
            .collect(),
    }
}

fn read(path: &Path) -> Vec<u8> {
    crate::read_fixture(path)
}

fn make_base(target: Target) -> Base {
    let files = match target {
        Target::Gguf | Target::HfConfig => vec![],
        Target::GgufModel => vec![("model.gguf".into(), tiny_llama_gguf())],
        Target::HfCheckpoint => {
            let dir = fixture_dir().join("hf/llama_gqa_tied");
            ["config.json", "model.safetensors"]
                .map(|f| (f.to_string(), read(&dir.join(f))))
                .to_vec()
        }
        Target::HfSharded => sharded_checkpoint(),
        Target::Tokenizer | Target::ChatTemplate => tokenizer_files(),
        Target::Peft => {
            let mut files = m2r2_files(false);
            files.retain(|(name, _)| name.starts_with("adapter_"));
            files
        }
        Target::M2r2Folder => m2r2_files(true),
        Target::Golden => vec![(GOLDEN_FILE.into(), golden_files().remove(0).1)],
        Target::ExportFolder => return export_folder(),
    };
    Base {
        files,
        fixed: vec![],
    }
}

/// A 1-layer llama GGUF (D = 4, H = 2, Hkv = 1) with the built-in byte-level vocabulary as a
/// `gpt2` tokenizer and SmolLM2's chat template.
fn tiny_llama_gguf() -> Vec<u8> {
    let tok = Tokenizer::byte_level_builtin(BUILTIN_VOCAB).expect("the built-in tokenizer");
    let tokens: Vec<String> = (0..BUILTIN_VOCAB as u32)
        .map(|id| tok.id_to_token(id).expect("every id has a token"))
        .collect();
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut types = vec![1i32; tokens.len()];
    for t in &mut types[256..259] {
        *t = 3;
    }
    let v = BUILTIN_VOCAB as u64;
    let values =
        |n: usize| -> Vec<f32> { (0..n).map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.5).collect() };
    Builder::default()
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 1)
        .kv_u32("llama.context_length", 64)
        .kv_u32("llama.embedding_length", 4)
        .kv_u32("llama.feed_forward_length", 2)
        .kv_u32("llama.attention.head_count", 2)
        .kv_u32("llama.attention.head_count_kv", 1)
        .kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .kv_u32("llama.rope.dimension_count", 2)
        .kv_f32("llama.rope.freq_base", 10000.0)
        .kv_str("tokenizer.ggml.model", "gpt2")
        .kv_str("tokenizer.ggml.pre", "smollm")
        .kv_str_array("tokenizer.ggml.tokens", &refs)
        .kv_i32_array("tokenizer.ggml.token_type", &types)
        .kv_str_array("tokenizer.ggml.merges", &["Ġ t", "h e"])
        .kv_u32("tokenizer.ggml.eos_token_id", 256)
        .kv_bool("tokenizer.ggml.add_bos_token", false)
        .kv_str("tokenizer.chat_template", SMOLLM2_TEMPLATE)
        .tensor_f32("token_embd.weight", &[4, v], &values(4 * BUILTIN_VOCAB))
        .tensor_f32("blk.0.attn_norm.weight", &[4], &values(4))
        .tensor_f32("blk.0.attn_q.weight", &[4, 4], &values(16))
        .tensor_f32("blk.0.attn_k.weight", &[4, 2], &values(8))
        .tensor_f32("blk.0.attn_v.weight", &[4, 2], &values(8))
        .tensor_f32("blk.0.attn_output.weight", &[4, 4], &values(16))
        .tensor_f32("blk.0.ffn_norm.weight", &[4], &values(4))
        .tensor_f32("blk.0.ffn_gate.weight", &[4, 2], &values(8))
        .tensor_f32("blk.0.ffn_up.weight", &[4, 2], &values(8))
        .tensor_f32("blk.0.ffn_down.weight", &[2, 4], &values(8))
        .tensor_f32("output_norm.weight", &[4], &values(4))
        .build()
}

/// The fixture checkpoint split into two shards with their index.
fn sharded_checkpoint() -> Vec<(String, Vec<u8>)> {
    let dir = fixture_dir().join("hf/llama_gqa_tied");
    let bytes = read(&dir.join("model.safetensors"));
    let st = SafeTensors::deserialize(&bytes).expect("the fixture checkpoint");
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let half = names.len() / 2;
    let mut files = vec![("config.json".to_string(), read(&dir.join("config.json")))];
    let mut weight_map = serde_json::Map::new();
    for (k, part) in [&names[..half], &names[half..]].iter().enumerate() {
        let shard = format!("model-0000{}-of-00002.safetensors", k + 1);
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).expect("listed")))
            .collect();
        for n in part.iter() {
            weight_map.insert(n.clone(), serde_json::Value::String(shard.clone()));
        }
        files.push((
            shard,
            safetensors::serialize(views, None).expect("serialises"),
        ));
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    files.insert(
        1,
        (
            "model.safetensors.index.json".into(),
            index.to_string().into_bytes(),
        ),
    );
    files
}

/// `tokenizer.json` of the built-in tokenizer, a `tokenizer_config.json` naming its special
/// tokens and SmolLM2's template, and a `chat_template.jinja`.
fn tokenizer_files() -> Vec<(String, Vec<u8>)> {
    let tok = Tokenizer::byte_level_builtin(BUILTIN_VOCAB).expect("the built-in tokenizer");
    let json = tok
        .backend()
        .to_string(false)
        .expect("the tokenizer serialises");
    let config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": "<|endoftext|>",
        "pad_token": {"content": "<|im_end|>"},
        "chat_template": SMOLLM2_TEMPLATE,
    });
    vec![
        ("tokenizer.json".into(), json.into_bytes()),
        (
            "tokenizer_config.json".into(),
            config.to_string().into_bytes(),
        ),
        (
            "chat_template.jinja".into(),
            FEATURE_TEMPLATE.as_bytes().to_vec(),
        ),
    ]
}

/// The built-in tiny M2R2 weights as a folder (with a pruned draft head when `draft_head`).
fn m2r2_files(draft_head: bool) -> Vec<(String, Vec<u8>)> {
    let model = tiny();
    let mut weights = M2r2Weights::builtin_for("tiny", &model.config).expect("built-in weights");
    if draft_head {
        weights.draft_head =
            Some(DraftHead::new(vec![1, 2, 3, 5, 8, 13], BUILTIN_VOCAB, "seed").expect("a head"));
        // and a bridge, so bridge.safetensors and the config's "bridge" entry are fuzzed too
        let bridge = reference::m2r2::bridge::BridgeConfig {
            gate: 1,
            rank: 2,
            sites: reference::m2r2::bridge::BridgeSite::ALL.to_vec(),
            scales: [(reference::m2r2::bridge::BridgeSite::Gate, 3.0)].into(),
        };
        weights = weights
            .with_bridge(&model.config, bridge, 5, 0.5)
            .expect("a bridge");
        // and ONNX Runtime's own drafting defaults, so that section is fuzzed too
        weights.config.onnx_drafting = Some(reference::m2r2::config::EngineDrafting {
            draft_gate: 2,
            draft_len: 2,
            dynamic_draft: None,
            draft_tree: None,
            prompt_lookup: Some(3),
        });
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    weights.save_dir(dir.path()).expect("the weights save");
    folder_files(dir.path())
}

/// Every file of `dir`, sorted by name.
fn folder_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("a readable folder")
        .map(|e| {
            let path = e.expect("an entry").path();
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&path).expect("a readable file"))
        })
        .collect();
    files.sort();
    files
}

/// A greedy golden, a speculative one, a token-tree one and one of trees grown per branch beside a
/// prompt-lookup branch (format version 5) of tiny.
fn golden_files() -> Vec<(String, Vec<u8>)> {
    let model = tiny();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).expect("built-in weights");
    let greedy = Golden::record_greedy(model, "tiny", &[1, 2, 3], 4).expect("records");
    let options = SpeculativeOptions {
        max_new_tokens: 0,
        stop_tokens: vec![],
        draft_length: DraftLength::Fixed(2),
        sampling: None,
    };
    let spec = Golden::record_speculative(
        M2r2::new(model, &weights),
        "tiny",
        &[1, 2],
        4,
        1,
        None,
        &options,
    )
    .expect("records");
    let tree = Golden::record_tree_speculative(
        M2r2::new(model, &weights),
        "tiny",
        &[1, 2],
        4,
        1,
        &[2, 1],
        &[],
    )
    .expect("records");
    let recipe = TreeRecipe {
        grown: Some((GateKind::Confidence, 0.5)),
        lookup: Some(LookupConfig::new(2)),
        ..TreeRecipe::fixed(1, &[2, 1])
    };
    let grown = Golden::record_tree_drafting(
        M2r2::new(model, &weights),
        "tiny",
        &[1, 2, 1, 2],
        6,
        &recipe,
        &[],
    )
    .expect("records");
    let dir = tempfile::tempdir().expect("a temporary folder");
    [
        ("greedy.golden.safetensors", greedy),
        ("speculative.golden.safetensors", spec),
        ("tree.golden.safetensors", tree),
        ("grown-tree.golden.safetensors", grown),
    ]
    .into_iter()
    .map(|(name, g)| {
        let path = dir.path().join(name);
        g.write(&path).expect("writes");
        (name.to_string(), std::fs::read(&path).expect("reads"))
    })
    .collect()
}

/// tiny exported (model graph only) with a pruned draft head and its tokenizer: the manifest,
/// `draft_head.json` and the tokenizer files may be replaced, the graph is kept.
fn export_folder() -> Base {
    let model = tiny();
    let mut weights = M2r2Weights::builtin_for("tiny", &model.config).expect("built-in weights");
    weights.draft_head =
        Some(DraftHead::new(vec![1, 2, 3, 5, 8, 13], BUILTIN_VOCAB, "seed").expect("a head"));
    let tok = Tokenizer::byte_level_builtin(BUILTIN_VOCAB).expect("the built-in tokenizer");
    let request = export::folder::ExportRequest {
        model,
        tokenizer: Some(&tok),
        m2r2: &weights,
        options: export::graphs::ExportOptions {
            model_name: "tiny".into(),
            opset: 17,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate: 1,
            static_cache: None,
            merge_adapters: false,
        },
        graphs: vec![export::graphs::GraphKind::Model],
        external_data: false,
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = dir.path().join("export");
    export::folder::export(&request, &out, &mut |_| {}).expect("tiny exports");
    let (files, fixed) = folder_files(&out)
        .into_iter()
        .partition(|(name, _)| !name.ends_with(".onnx") && !name.ends_with(".onnx.data"));
    Base { files, fixed }
}
