//! `m2r2 moe-sim` end to end: the JSON report's fields, the SVG, the HF Mixtral fixture, and the
//! failure cases.

use super::{fails, ok};
use serde_json::Value;

const TOKENS: &str = "3,1,4,1,5";

fn moe_sim(extra: &[&str]) -> Value {
    let mut args = vec!["moe-sim", "--tokens", TOKENS, "--steps", "12", "--json"];
    args.extend_from_slice(extra);
    ok(&args).json()
}

#[test]
fn moe_sim_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("moe.svg");
    let r = moe_sim(&["--plot", svg.to_str().unwrap(), "--warmup", "2"]);
    assert_eq!(r["model"], "tiny-moe");
    assert_eq!(r["steps"], 12);
    assert_eq!(r["tokens"].as_array().unwrap().len(), 13);
    assert_eq!(r["trace"]["num_experts"], 8);
    assert_eq!(r["trace"]["top_k"], 2);
    assert_eq!(r["trace"]["moe_layers"].as_array().unwrap().len(), 8);
    assert_eq!(r["m2r2"]["gates"], serde_json::json!([2, 4, 6]));
    // Defaults: half of every layer's experts, global, LRU; tiny-moe's expert is 3 * 64 * 96 bf16.
    assert_eq!(r["params"]["capacity"], 32);
    assert_eq!(r["params"]["capacity_scope"], "global");
    assert_eq!(r["params"]["eviction"], "lru");
    assert_eq!(r["deployment"]["expert_bytes"], 36864.0);
    let transfer = r["deployment"]["transfer_us"].as_f64().unwrap();
    assert!((transfer - (10.0 + 36864.0 / 25e9 * 1e6)).abs() < 1e-9);

    let policies = r["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lazy", "next-gate", "m2r2", "oracle"]);
    for p in policies {
        for key in [
            "hit_rate",
            "cache_hit_rate",
            "bytes_moved",
            "wasted_bytes",
            "stall_seconds",
            "stall_per_token_seconds",
            "compute_per_token_seconds",
            "time_per_token_seconds",
            "speedup_over_lazy",
        ] {
            assert!(p[key].as_f64().unwrap() >= 0.0, "{key}: {p}");
        }
        assert_eq!(p["tokens"], 10);
        assert_eq!(p["accesses"], 10 * 8 * 2);
        for key in [
            "prefetches",
            "useful_prefetches",
            "demand_loads",
            "peak_buffered_experts",
        ] {
            assert!(p[key].is_u64(), "{key}");
        }
        assert_eq!(p["layers"].as_array().unwrap().len(), 8);
        let time = p["time_per_token_seconds"].as_f64().unwrap();
        let compute = p["compute_per_token_seconds"].as_f64().unwrap();
        let stall = p["stall_per_token_seconds"].as_f64().unwrap();
        assert!((time - compute - stall).abs() <= 1e-9 * time, "{p}");
    }
    assert_eq!(policies[0]["speedup_over_lazy"], 1.0);
    // lazy predicts nothing: precision is undefined, recall 0 (none of the accesses predicted).
    assert!(policies[0]["precision"].is_null());
    assert_eq!(policies[0]["recall"], 0.0);
    assert_eq!(policies[3]["precision"], 1.0);
    assert_eq!(policies[3]["recall"], 1.0);
    let oracle = policies[3]["time_per_token_seconds"].as_f64().unwrap();
    for p in policies {
        assert!(oracle <= p["time_per_token_seconds"].as_f64().unwrap() * (1.0 + 1e-9));
    }

    let sweep = &r["sweep"];
    let capacities: Vec<u64> = sweep["capacities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(capacities, [2, 8, 16, 24, 32, 40, 48, 56, 64]);
    let points = sweep["points"].as_array().unwrap();
    assert_eq!(points.len(), capacities.len() * 4);
    for key in [
        "capacity",
        "bandwidth_gbps",
        "policy",
        "hit_rate",
        "stall_per_token_seconds",
        "time_per_token_seconds",
        "speedup_over_lazy",
    ] {
        assert!(!points[0][key].is_null(), "{key}");
    }
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.contains("speedup over lazy"));
    assert_eq!(r["plot"], svg.to_str().unwrap());
}

#[test]
fn moe_sim_options() {
    // Per-layer capacity, two bandwidths, Mixtral-8x7B sizes, zero adapters.
    let r = moe_sim(&[
        "--capacity-per-layer",
        "4",
        "--policy",
        "m2r2,oracle",
        "--sweep-capacities",
        "2,8",
        "--sweep-bandwidths",
        "25,100",
        "--timing",
        "mixtral-8x7b",
        "--m2r2",
        "none",
    ]);
    assert_eq!(r["params"]["capacity_scope"], "per-layer");
    assert_eq!(r["params"]["total_experts"], 8);
    assert_eq!(r["m2r2"]["zero_adapters"], true);
    assert_eq!(r["deployment"]["expert_bytes"], 352_321_536.0);
    assert_eq!(r["policies"].as_array().unwrap().len(), 2);
    assert_eq!(r["sweep"]["points"].as_array().unwrap().len(), 2 * 2 * 2);
    // Times measured from the reference itself: positive, and the same for every policy.
    let m = moe_sim(&["--timing", "measured", "--eviction", "keep-predicted"]);
    assert_eq!(m["deployment"]["timing"], "measured");
    assert_eq!(m["params"]["eviction"], "keep-predicted");
    let pre = m["deployment"]["layer_pre_us"].as_array().unwrap();
    assert!(pre.iter().all(|t| t.as_f64().unwrap() > 0.0), "{pre:?}");
    assert_eq!(
        m["deployment"]["layer_pre_us"],
        m["deployment"]["fast_layer_pre_us"]
    );
    // The text report prints a table per policy.
    let text = ok(&[
        "moe-sim", "--tokens", TOKENS, "--steps", "6", "--warmup", "1",
    ])
    .stdout;
    for needle in [
        "policy",
        "m2r2 per MoE layer",
        "oracle per MoE layer",
        "sweep",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
}

/// The tiny HF Mixtral checkpoint (2 layers, gate after layer 1) traces and simulates.
#[test]
fn moe_sim_on_the_hf_mixtral_fixture() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/mixtral");
    let r = moe_sim(&["--model", dir.to_str().unwrap(), "--warmup", "0"]);
    assert_eq!(r["trace"]["num_layers"], 2);
    assert_eq!(r["m2r2"]["gates"], serde_json::json!([1]));
    assert!(r["policies"][3]["hit_rate"].as_f64().is_some());
}

#[test]
fn moe_sim_refuses_bad_input() {
    fails(
        &["moe-sim", "--model", "tiny", "--tokens", TOKENS],
        &["dense model", "MoE"],
    );
    fails(
        &["moe-sim", "--tokens", TOKENS, "--capacity", "1"],
        &["capacity 1 is below k = 2"],
    );
    fails(
        &[
            "moe-sim", "--tokens", TOKENS, "--steps", "3", "--warmup", "3",
        ],
        &["warm-up"],
    );
    fails(
        &["moe-sim", "--tokens", TOKENS, "--policy", "belady"],
        &["unknown expert predictor `belady`"],
    );
    fails(
        &["moe-sim", "--tokens", TOKENS, "--bandwidth-gbps", "0"],
        &["--bandwidth-gbps must be a finite number > 0"],
    );
    // a negative value reaches the flag's own check (clap alone calls it an unexpected argument)
    fails(
        &["moe-sim", "--tokens", TOKENS, "--latency-us", "-1"],
        &["--latency-us must be a finite number >= 0, got -1"],
    );
    fails(
        &["moe-sim", "--tokens", "999", "--steps", "6"],
        &["token id 999"],
    );
    fails(
        &["moe-sim", "--tokens", TOKENS, "--m2r2", "/nonexistent-m2r2"],
        &["/nonexistent-m2r2"],
    );
}

/// `fails`, and the refusal comes before the model's weights are loaded (nothing was traced).
fn fails_before_loading(args: &[&str], needles: &[&str]) {
    let run = fails(args, needles);
    for late in ["loaded ", "traced "] {
        assert!(
            !run.stderr.contains(late),
            "m2r2 {args:?} should fail before loading:\n{}",
            run.stderr
        );
    }
}

/// A `--steps` beyond any context is a clear error (no capacity-overflow panic, no wrapped count),
/// and a context too small for the prompt and `--steps` says to lower --steps, not --max-new-tokens.
#[test]
fn moe_sim_refuses_steps_beyond_the_context() {
    for steps in ["18446744073709551615", "18446744073709551613"] {
        fails_before_loading(
            &["moe-sim", "--prompt", "hi", "--steps", steps],
            &[
                &format!("--steps {steps} is more than any model's context"),
                "lower --steps",
            ],
        );
    }
    // tiny-moe's context is 512 positions.
    fails_before_loading(
        &["moe-sim", "--tokens", TOKENS, "--steps", "512"],
        &[
            "--steps 512 does not fit in tiny-moe's context of 512 positions",
            "lower --steps",
        ],
    );
    let run = fails(
        &["moe-sim", "--tokens", "1,2", "--steps", "511"],
        &[
            "the prompt's 2 tokens and --steps 511 need 513 positions but tiny-moe's context holds 512",
            "(shorten the prompt or lower --steps)",
        ],
    );
    assert!(!run.stderr.contains("--max-new-tokens"), "{}", run.stderr);
}

/// The trace needs exactly the prompt and `--steps` positions: a 500-token prompt with --steps 12
/// fits in 512 (as `generate --max-new-tokens 13` does), --steps 13 does not.
#[test]
fn moe_sim_fills_the_context_exactly() {
    let prompt = vec!["7"; 500].join(",");
    ok(&[
        "generate",
        "--model",
        "tiny-moe",
        "--tokens",
        &prompt,
        "--max-new-tokens",
        "13",
    ]);
    let r = ok(&["moe-sim", "--tokens", &prompt, "--steps", "12", "--json"]).json();
    assert_eq!(r["tokens"].as_array().unwrap().len(), 13);
    fails(
        &["moe-sim", "--tokens", &prompt, "--steps", "13"],
        &[
            "the prompt's 500 tokens and --steps 13 need 513 positions",
            "lower --steps",
        ],
    );
}

/// Capacities from k to every expert of their scope; more is refused, naming the flag and the
/// model's count, before the weights are loaded (also for a HF folder: its config.json).
#[test]
fn moe_sim_refuses_capacities_beyond_the_experts() {
    let global = "is more than the 64 experts of tiny-moe (8 MoE layers x 8)";
    for c in ["65", "18446744073709551615"] {
        fails_before_loading(
            &["moe-sim", "--tokens", TOKENS, "--capacity", c],
            &[&format!("--capacity {c} {global}"), "give at most 64"],
        );
    }
    fails_before_loading(
        &["moe-sim", "--tokens", TOKENS, "--capacity-per-layer", "9"],
        &["--capacity-per-layer 9 is more than the 8 experts of one of tiny-moe's MoE layers"],
    );
    fails_before_loading(
        &[
            "moe-sim",
            "--tokens",
            TOKENS,
            "--sweep-capacities",
            "5,1000",
        ],
        &[&format!("--sweep-capacities 1000 {global}")],
    );
    // With --capacity-per-layer the sweep counts per layer too.
    fails_before_loading(
        &[
            "moe-sim",
            "--tokens",
            TOKENS,
            "--capacity-per-layer",
            "4",
            "--sweep-capacities",
            "2,16",
        ],
        &["--sweep-capacities 16 is more than the 8 experts of one of tiny-moe's MoE layers"],
    );
    fails_before_loading(
        &["moe-sim", "--tokens", TOKENS, "--capacity-per-layer", "1"],
        &["--capacity-per-layer 1 is below k = 2"],
    );
    let hf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/mixtral");
    fails_before_loading(
        &[
            "moe-sim",
            "--model",
            hf.to_str().unwrap(),
            "--tokens",
            TOKENS,
            "--capacity",
            "1000",
        ],
        &["--capacity 1000 is more than the", "MoE layers x"],
    );
    // Every expert is the largest capacity accepted.
    let r = moe_sim(&["--capacity", "64", "--sweep-capacities", "2,64"]);
    assert_eq!(r["params"]["capacity"], 64);
}

/// Lists repeat no value: a repeated policy would print duplicate rows.
#[test]
fn moe_sim_refuses_repeated_values() {
    for (flag, list, needle) in [
        ("--policy", "lazy,lazy", "--policy lists lazy twice"),
        ("--policy", "m2r2,oracle,m2r2", "--policy lists m2r2 twice"),
        (
            "--sweep-capacities",
            "8,16,8",
            "--sweep-capacities lists 8 twice",
        ),
        (
            "--sweep-bandwidths",
            "25,25",
            "--sweep-bandwidths lists 25 twice",
        ),
    ] {
        fails_before_loading(&["moe-sim", "--tokens", TOKENS, flag, list], &[needle]);
    }
}

/// Flags that need no model are refused before it is loaded, and nothing is traced first.
#[test]
fn moe_sim_validates_flags_before_loading() {
    for (args, needle) in [
        (
            &["--steps", "4"][..],
            "--warmup 4: the warm-up leaves none of the 4 decoded tokens",
        ),
        (
            &["--warmup", "100"],
            "--warmup 100: the warm-up leaves none of the 32 decoded tokens",
        ),
        (&["--steps", "0"], "--steps must be at least 1"),
        (&["--capacity", "0"], "--capacity must be at least 1"),
        (
            &["--capacity-per-layer", "0"],
            "--capacity-per-layer must be at least 1",
        ),
        (
            &["--sweep-capacities", "0"],
            "--sweep-capacities: every capacity must be at least 1",
        ),
        (
            &["--sweep-bandwidths", "25,-1"],
            "--sweep-bandwidths must be a finite number > 0, got -1",
        ),
        (
            &["--tflops", "inf"],
            "--tflops must be a finite number > 0, got inf",
        ),
        (
            &["--bandwidth-gbps", "1e300"],
            "--bandwidth-gbps 1e300 is out of range",
        ),
        // Per-layer pools would make keep-predicted exactly lru (docs/MOE_AOT.md).
        (
            &["--capacity-per-layer", "4", "--eviction", "keep-predicted"],
            "--eviction keep-predicted needs --capacity, not --capacity-per-layer",
        ),
        // A dense model is refused from its config, before its weights.
        (&["--model", "tiny"], "tiny is a dense model"),
    ] {
        let mut full = vec!["moe-sim", "--tokens", TOKENS];
        full.extend_from_slice(args);
        fails_before_loading(&full, &[needle]);
    }
}

/// --latency-us accepts 0 (a link without a fixed cost) and refuses what is not a finite number
/// `>= 0`, -0 included (the report would print `-0.0`), saying so; byte sizes far below a byte
/// print with a precision, not 40 digits.
#[test]
fn moe_sim_latency_and_byte_sizes() {
    let r = moe_sim(&["--latency-us", "0"]);
    assert_eq!(r["deployment"]["latency_us"], 0.0);
    for bad in ["nan", "-1", "inf", "-0", "-0.0"] {
        fails_before_loading(
            &[
                "moe-sim",
                "--tokens",
                TOKENS,
                &format!("--latency-us={bad}"),
            ],
            &["--latency-us must be a finite number >= 0"],
        );
    }
    let text = ok(&[
        "moe-sim",
        "--tokens",
        TOKENS,
        "--steps",
        "6",
        "--bytes-per-param",
        "1e-30",
    ])
    .stdout;
    assert!(text.contains("expert 1.84e-26 B;"), "{text}");
    assert!(!text.contains("0.0000000000"), "{text}");
}

/// A `--plot` that could not be written is refused before the trace, whose results would be lost
/// at the end: a folder, a path below a file, a name that is not `.svg` (the plot is SVG).
#[test]
fn moe_sim_refuses_an_unwritable_plot_before_tracing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.json");
    std::fs::write(&file, "{}").unwrap();
    let below_file = file.join("x.svg");
    let folder = dir.path().to_str().unwrap();
    let png = dir.path().join("moe.png");
    for (plot, needle) in [
        (folder, "plots are drawn as SVG"),
        (
            below_file.to_str().unwrap(),
            "a.json is a file, not a folder",
        ),
        (png.to_str().unwrap(), "give a file name ending in .svg"),
    ] {
        fails_before_loading(&["moe-sim", "--tokens", TOKENS, "--plot", plot], &[needle]);
    }
    assert!(!png.exists());
}
