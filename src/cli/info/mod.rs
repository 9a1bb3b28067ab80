//! `m2r2 info`: what a model is: config, parameter count and size, one row per layer, context,
//! tokenizer, and the M2R2 weights decoding would use with it (`m2r2.rs`); with `--onnx DIR`,
//! what an export folder holds (`export.rs`).

mod export;
mod m2r2;
mod problems;

use crate::cli::args::m2r2::M2r2Args;
use crate::cli::args::model::ModelArgs;
use crate::cli::common;
use crate::cli::decode_speed::DecodeWeights;
use anyhow::Result;
use reference::base::weight_names::WeightId;
use reference::io::load::LoadedModel;
use serde_json::{Value, json};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// M2R2 weights folder to describe, or `none`; default: the model's built-in M2R2 weights
    /// (the shipped trained weights for smollm2), as the decoding commands use them
    #[arg(long = "m2r2", value_name = "DIR|none")]
    pub m2r2: Option<String>,
    /// Describe an export folder written by `m2r2 export` instead: its graphs, their size and
    /// node counts, the draft split, and whether the KV cache is static (`--static-cache`); fails
    /// (after the description) on what the graphs contradict: an empty graph, a graph of another
    /// export (its `m2r2.*` metadata, as `run` checks it), KV buffers of another length than the
    /// manifest's, truncated external data, a manifest without graphs
    #[arg(long, value_name = "DIR", conflicts_with_all = ["m2r2", "model"])]
    pub onnx: Option<std::path::PathBuf>,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if let Some(dir) = &args.onnx {
        let info = export::describe(dir)?;
        match args.json {
            true => common::print_json(&info)?,
            false => export::print_text(&info),
        }
        return export::check_problems(&info);
    }
    let loaded = common::load(&args.model.model)?;
    let mut info = describe(&loaded)?;
    let choice = M2r2Args::weights_only(args.m2r2.clone());
    match choice.weights(&loaded) {
        Ok(weights) => info["m2r2"] = m2r2::describe(&weights, &choice.source(&loaded)),
        // A folder the user named must load; a model the built-in weights do not fit (too
        // shallow for a gate) is still described, with the reason.
        Err(e) if args.m2r2.is_some() => return Err(e),
        Err(e) => {
            info["m2r2"] = Value::Null;
            info["m2r2_unavailable"] = format!("{e:#}").into();
        }
    }
    if args.json {
        common::print_json(&info)?;
    } else {
        print_text(&info);
        match info["m2r2"].is_object() {
            true => m2r2::print_text(&info["m2r2"]),
            false => println!(
                "\nM2R2 weights  none: {}",
                info["m2r2_unavailable"].as_str().unwrap_or("")
            ),
        }
    }
    Ok(())
}

/// The layer a weight belongs to (`None` for embedding, final norm, head).
fn layer_of(id: WeightId) -> Option<usize> {
    match id {
        WeightId::Embed | WeightId::FinalNorm | WeightId::LmHead => None,
        WeightId::AttnNorm(l)
        | WeightId::MlpNorm(l)
        | WeightId::Attn(l, _)
        | WeightId::AttnBias(l, _)
        | WeightId::Mlp(l, _)
        | WeightId::MlpBias(l, _)
        | WeightId::Router(l)
        | WeightId::Expert(l, _, _) => Some(l),
    }
}

/// Everything `info` reports, as JSON (the text output is printed from it too).
pub fn describe(loaded: &LoadedModel) -> Result<Value> {
    let model = &loaded.model;
    let c = &model.config;
    // Parameters per layer, counted from the loaded tensors.
    let mut per_layer = vec![0usize; c.num_hidden_layers];
    let mut outside_layers = 0usize;
    for (id, tensor) in model.weights.named_tensors(c) {
        match layer_of(id) {
            Some(l) => per_layer[l] += tensor.len(),
            None => outside_layers += tensor.len(),
        }
    }
    let (d, q, kv) = (c.hidden_size, c.q_dim(), c.kv_dim());
    let ffn = match &c.moe {
        None => json!({"kind": "dense", "intermediate_size": c.intermediate_size}),
        Some(moe) => json!({
            "kind": "moe",
            "experts": moe.num_local_experts,
            "experts_per_token": moe.num_experts_per_tok,
            "intermediate_size": c.intermediate_size,
        }),
    };
    let layers: Vec<Value> = per_layer
        .iter()
        .enumerate()
        .map(|(l, &parameters)| {
            json!({
                "layer": l,
                "attention": {"q": [q, d], "k": [kv, d], "v": [kv, d], "o": [d, q]},
                "ffn": ffn,
                "parameters": parameters,
            })
        })
        .collect();
    let parameter_count = c.parameter_count();
    let tokenizer = match &loaded.tokenizer {
        None => Value::Null,
        Some(t) => json!({
            "vocab_size": t.vocab_size(),
            "bos_token_id": t.bos_token_id(),
            "bos_token": t.bos_token_id().and_then(|id| t.id_to_token(id)),
            "eos_token_ids": t.eos_token_ids(),
            "eos_tokens": t.eos_token_ids().into_iter().map(|id| t.id_to_token(id)).collect::<Vec<_>>(),
            "chat_template": !t.chat_template_is_fallback(),
            "chat_template_fallback": if t.chat_template_is_fallback() { Some("chatml") } else { None },
            // a template that does not parse fails `--chat` only when used: said here first
            "chat_template_error": t.check_chat_template().err().map(|e| e.to_string()),
        }),
    };
    let decode = DecodeWeights::of(c);
    Ok(json!({
        "model": loaded.name,
        "source": loaded.source,
        "config": serde_json::to_value(c)?,
        "config_hash": c.hash(),
        "parameter_count": parameter_count,
        "bytes_f32": 4 * parameter_count,
        "parameters_outside_layers": outside_layers,
        "weights_read_per_decoded_token": decode.floats(),
        "context_length": model.context_length(),
        "layers": layers,
        "tokenizer": tokenizer,
    }))
}

fn print_text(info: &Value) {
    let n = |v: &Value| v.as_u64().unwrap_or(0) as f64;
    println!("model         {}", info["model"].as_str().unwrap_or(""));
    println!("source        {}", info["source"].as_str().unwrap_or(""));
    println!(
        "parameters    {} ({}), {} as f32",
        common::count(n(&info["parameter_count"])),
        info["parameter_count"],
        common::bytes(n(&info["bytes_f32"]))
    );
    println!(
        "per token     {} weights read per decoded token (see `m2r2 bench`)",
        common::count(n(&info["weights_read_per_decoded_token"]))
    );
    println!("context       {} positions", info["context_length"]);
    println!(
        "config hash   {}",
        info["config_hash"].as_str().unwrap_or("")
    );
    println!("config");
    if let Some(config) = info["config"].as_object() {
        for (key, value) in config {
            println!("  {key:<26} {value}");
        }
    }
    match info["tokenizer"].as_object() {
        None => println!("tokenizer     none (pass --tokens)"),
        Some(t) => println!(
            "tokenizer     vocab {}, bos {}, eos {}, chat template {}",
            t["vocab_size"],
            t["bos_token"],
            t["eos_tokens"],
            match (
                t["chat_template"].as_bool(),
                t["chat_template_error"].as_str()
            ) {
                // "chat template does not parse (GGUF key `...` in FILE): syntax error: ..."
                (_, Some(e)) => match e.strip_prefix("tokenizer: chat template ") {
                    Some(rest) => format!("does not parse {rest}"),
                    None => format!("does not parse: {e}"),
                },
                (Some(true), None) => "yes".into(),
                _ => "no (ChatML stands in)".into(),
            }
        ),
    }
    println!();
    println!(
        "{:<6} {:<12} {:<12} {:<12} {:<12} {:<34} {:>12}",
        "layer", "q", "k", "v", "o", "ffn", "parameters"
    );
    let shape = |v: &Value| format!("{v}").replace(',', ", ");
    for layer in info["layers"].as_array().into_iter().flatten() {
        let a = &layer["attention"];
        let f = &layer["ffn"];
        let ffn = if f["kind"] == "moe" {
            format!(
                "MoE {} experts, top-{}, I={}",
                f["experts"], f["experts_per_token"], f["intermediate_size"]
            )
        } else {
            format!("dense SwiGLU, I={}", f["intermediate_size"])
        };
        println!(
            "{:<6} {:<12} {:<12} {:<12} {:<12} {:<34} {:>12}",
            layer["layer"].to_string(),
            shape(&a["q"]),
            shape(&a["k"]),
            shape(&a["v"]),
            shape(&a["o"]),
            ffn,
            layer["parameters"].to_string()
        );
    }
    println!(
        "{:<93} {:>12}",
        "embedding, final norm, head",
        info["parameters_outside_layers"].to_string()
    );
}
