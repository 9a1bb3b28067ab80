//! `m2r2 info`'s M2R2 section: the gates and their intervals, each gate's adapter ranks, alphas
//! and scales (PEFT `rank_pattern` / `alpha_pattern` give a pair its own), the drafting policy,
//! ARLA, the pruned draft head and the bridge of the M2R2 weights a decoding command would use.

use crate::cli::common;
use reference::m2r2::accelerator::Lora;
use reference::m2r2::config::EngineDrafting;
use reference::m2r2::weights::M2r2Weights;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The `m2r2` object of `info --json`: `weights` came from `source` (`M2r2Args::source`).
pub fn describe(weights: &M2r2Weights, source: &str) -> Value {
    let config = &weights.config;
    let acc = &weights.accelerator;
    let gates: Vec<Value> = (1..=config.num_gates())
        .map(|g| {
            let layers = config.interval_layers(g - 1);
            let loras: Vec<&Lora> = layers
                .clone()
                .filter_map(|l| acc.layers.get(l).and_then(Option::as_ref))
                .flat_map(|la| la.loras.values())
                .collect();
            let ranks: BTreeSet<usize> = loras.iter().map(|l| l.rank()).collect();
            let reals = |f: &dyn Fn(&Lora) -> f32| distinct(loras.iter().map(|l| f(l)));
            json!({
                "gate": g,
                "after_layer": config.gate_layer(g),
                "layers": [layers.start, layers.end],
                "adapted_maps": loras.len(),
                "ranks": ranks,
                "alphas": reals(&|l| l.alpha()),
                "scales": reals(&|l| acc.scale(l)),
                "adapter_parameters": loras.iter().map(|l| l.parameter_count()).sum::<usize>(),
            })
        })
        .collect();
    let head_tokens = weights.draft_head.as_ref().map(|h| h.len());
    let parameters = acc.parameter_count();
    json!({
        "source": source,
        "gates": gates,
        "rank": acc.rank,
        "alpha": real(acc.alpha),
        "use_rslora": acc.use_rslora,
        "targets": acc.targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "adapter_parameters": parameters,
        "adapter_bytes_f16": 2 * parameters,
        "draft": drafting(&config.drafting(), head_tokens),
        // ONNX Runtime's own defaults (`onnx_drafting`); null: it drafts `draft`
        "onnx_draft": config.onnx_drafting.as_ref().map(|d| drafting(d, head_tokens)),
        "arla": {
            "present": weights.arla.is_some(),
            "latent": config.arla.latent,
            "threshold": real(config.arla.threshold),
        },
        "early_exit": config.early_exit.as_ref().map(|e| json!({
            "gate": e.gate.name(),
            "thresholds": e.thresholds.iter().map(|&x| real(x)).collect::<Vec<_>>(),
        })),
        "bridge": weights.bridge.as_ref().map(|b| json!({
            "gate": config.bridge.as_ref().map(|c| c.gate),
            "rank": b.rank(),
            "sites": b.maps.keys().map(|s| s.name()).collect::<Vec<_>>(),
            "scales": b.maps.keys().map(|&s| real(b.scale(s).unwrap_or(1.0))).collect::<Vec<_>>(),
            "parameters": b.parameter_count(),
        })),
    })
}

/// One engine's drafting defaults: `draft` and `onnx_draft` of `info --json` (and `drafting` of
/// `info --onnx --json`).
pub(super) fn drafting(d: &EngineDrafting, head_tokens: Option<usize>) -> Value {
    let dynamic = d.dynamic_draft.as_ref().map(|x| {
        json!({"gate": x.gate.to_string(), "threshold": real(x.threshold), "at_most": d.draft_len})
    });
    // written field by field: serde_json widens an f32 to f64 digits (0.30000001192092896)
    let tree = d.draft_tree.as_ref().map(|t| {
        let mut tree = json!({"draft_gate": t.draft_gate, "widths": t.widths});
        if let Some(x) = &t.dynamic {
            tree["dynamic"] = json!({"gate": x.gate.to_string(), "threshold": real(x.threshold)});
        }
        tree
    });
    json!({
        "gate": d.draft_gate,
        "draft_len": d.draft_len,
        "dynamic_draft": dynamic,
        "draft_head_tokens": head_tokens,
        "draft_tree": tree,
        "prompt_lookup": d.prompt_lookup,
    })
}

/// An `f32` as the JSON number of its shortest decimal form (0.98, not 0.9800000190734863).
fn real(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .map_or(Value::Null, Value::from)
}

/// The distinct values, ascending, as [`real`]s.
fn distinct(values: impl Iterator<Item = f32>) -> Value {
    let mut v: Vec<f32> = values.collect();
    v.sort_by(f32::total_cmp);
    v.dedup();
    Value::Array(v.into_iter().map(real).collect())
}

/// The section as text under the model's tables.
pub fn print_text(m: &Value) {
    println!();
    println!("M2R2 weights  {}", m["source"].as_str().unwrap_or(""));
    let n = |v: &Value| v.as_u64().unwrap_or(0) as f64;
    println!(
        "adapters      {} parameters ({} as f16), default rank {}, alpha {}{}, on {}",
        common::count(n(&m["adapter_parameters"])),
        common::bytes(n(&m["adapter_bytes_f16"])),
        m["rank"],
        m["alpha"],
        if m["use_rslora"].as_bool() == Some(true) {
            " (rsLoRA)"
        } else {
            ""
        },
        list(&m["targets"])
    );
    print_drafting("drafting     ", "default tree ", &m["draft"]);
    if m["onnx_draft"].is_object() {
        println!("ONNX Runtime  its own drafting defaults (`onnx_drafting`):");
        print_drafting("  drafting   ", "  tree       ", &m["onnx_draft"]);
    }
    let arla = &m["arla"];
    println!(
        "ARLA          {}, latent {}, threshold {}",
        if arla["present"].as_bool() == Some(true) {
            "weights present"
        } else {
            "no weights"
        },
        arla["latent"],
        arla["threshold"]
    );
    match m["early_exit"].as_object() {
        Some(e) => println!(
            "early exit    gate {}, thresholds {} (one per gate)",
            e["gate"].as_str().unwrap_or("?"),
            list(&e["thresholds"])
        ),
        None => println!("early exit    gate arla (else confidence) at arla.threshold"),
    }
    let bridge = &m["bridge"];
    match bridge.as_object() {
        Some(b) => println!(
            "bridge        gate {}, rank {} at {} (scales {}), {} parameters: drafts read the last \
             verified final state",
            b["gate"],
            b["rank"],
            list(&b["sites"]),
            list(&b["scales"]),
            common::count(n(&b["parameters"]))
        ),
        None => println!("bridge        none: drafts read only their own token"),
    }
    println!();
    println!(
        "{:<5} {:<11} {:<9} {:<6} {:<10} {:<10} {:<12} {:>12}",
        "gate", "after layer", "layers", "maps", "ranks", "alphas", "scales", "parameters"
    );
    for g in m["gates"].as_array().into_iter().flatten() {
        let layers = &g["layers"];
        println!(
            "{:<5} {:<11} {:<9} {:<6} {:<10} {:<10} {:<12} {:>12}",
            g["gate"].to_string(),
            g["after_layer"].to_string(),
            format!("{}..{}", layers[0], layers[1]),
            g["adapted_maps"].to_string(),
            list(&g["ranks"]),
            list(&g["alphas"]),
            list(&g["scales"]),
            g["adapter_parameters"].to_string()
        );
    }
}

/// `[a, b]` as `a, b`.
fn list(v: &Value) -> String {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One engine's drafting defaults as text, each line under its label.
pub(super) fn print_drafting(label: &str, tree_label: &str, draft: &Value) {
    let policy = match draft["dynamic_draft"].as_object() {
        Some(d) => format!(
            "dynamic: while {} >= {}, at most {}",
            d["gate"].as_str().unwrap_or(""),
            d["threshold"],
            d["at_most"]
        ),
        None => format!("fixed: {} per verification", draft["draft_len"]),
    };
    let head = match draft["draft_head_tokens"].as_u64() {
        Some(k) => format!("pruned draft head of {k} tokens"),
        None => "full draft head".into(),
    };
    let lookup = match draft["prompt_lookup"].as_u64() {
        Some(n) => format!(", a prompt-lookup branch of up to {n} tokens (greedy)"),
        None => String::new(),
    };
    println!("{label} gate {}, {policy}, {head}{lookup}", draft["gate"]);
    if let Some(tree) = draft["draft_tree"].as_object() {
        let widths: Vec<String> = tree["widths"]
            .as_array()
            .map(|w| w.iter().map(|w| w.to_string()).collect())
            .unwrap_or_default();
        let grown = match tree.get("dynamic").and_then(|d| d.as_object()) {
            Some(d) => format!(
                ", grown per branch while {} >= {}",
                d["gate"].as_str().unwrap_or(""),
                d["threshold"]
            ),
            None => String::new(),
        };
        println!(
            "{tree_label} gate {}, widths {}{grown} (greedy speculative decoding)",
            tree["draft_gate"],
            widths.join(",")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reference::m2r2::config::{DraftTreeConfig, DynamicDraftConfig};
    use reference::m2r2::exit_gate::GateKind;

    #[test]
    fn drafting_thresholds_keep_their_shortest_decimal_form() {
        let grown = DynamicDraftConfig {
            gate: GateKind::Confidence,
            threshold: 0.3,
        };
        let d = EngineDrafting {
            draft_gate: 1,
            draft_len: 1,
            dynamic_draft: Some(grown.clone()),
            draft_tree: Some(DraftTreeConfig {
                draft_gate: 1,
                widths: vec![3],
                dynamic: Some(grown),
            }),
            prompt_lookup: Some(4),
        };
        let v = drafting(&d, None);
        assert_eq!(v["dynamic_draft"]["threshold"], json!(0.3));
        assert_eq!(v["draft_tree"]["dynamic"]["threshold"], json!(0.3));
        assert_eq!(v["draft_tree"]["dynamic"]["gate"], "confidence");
        assert_eq!(v["draft_tree"]["widths"], json!([3]));
        // a whole-shape tree has no `dynamic`, as in the config file
        let whole = EngineDrafting {
            draft_tree: Some(DraftTreeConfig {
                draft_gate: 1,
                widths: vec![2, 1],
                dynamic: None,
            }),
            ..d
        };
        assert!(
            drafting(&whole, None)["draft_tree"]
                .get("dynamic")
                .is_none()
        );
    }
}
