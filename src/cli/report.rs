//! How a decode is reported, the same for `generate` (the reference) and `run` (ONNX Runtime): the
//! `--json` object (settings, mode-specific statistics), the summary line on stderr and the
//! `--trace` lines.

use reference::decode::early_exit::KvPolicy;
use reference::decode::mode::{DecodeRequest, M2r2Settings, ModeDetails, ModeRun};
use reference::decode::speculative::DraftLength;
use reference::decode::tree_speculation::TreeRound;
use serde_json::{Value, json};

/// A mean over `n` things, or null when there were none (`n` is 0).
fn mean_over(mean: f64, n: usize) -> Value {
    if n == 0 { Value::Null } else { json!(mean) }
}

/// The settings as a JSON object (the `m2r2` part of reports).
pub fn settings_json(settings: &M2r2Settings) -> Value {
    let (draft_len, dynamic) = match &settings.draft_length {
        DraftLength::Fixed(n) => (*n, false),
        DraftLength::Dynamic { max, .. } => (*max, true),
    };
    json!({
        "source": settings.source,
        "gates": settings.gates,
        "gate": settings.gate.name(),
        // one threshold per gate (early exit) replaces the one
        "threshold": settings.gate_thresholds.is_none().then(|| decimal(settings.threshold)),
        "gate_thresholds": settings.gate_thresholds.as_ref().map(|t| t.iter().map(|&x| decimal(x)).collect::<Vec<_>>()),
        "kv_policy": settings.kv_policy.to_string(),
        "draft_gate": settings.draft_gate,
        "draft_len": draft_len,
        "dynamic_draft": dynamic,
        "draft_head_tokens": settings.draft_head_tokens,
    })
}

/// The mode-specific report fields of a run (merged into `generate --json`):
/// - every mode: `mode`, `layers_per_token`, `flops_per_token`, `bytes_per_token` (per decoded
///   token, the first token excluded: it comes from the prompt's prefill), `tokens_per_second`,
///   `timings`;
/// - early-exit: `exit_histogram`, an array of J + 1 counts: tokens that exited at gate 1..=J,
///   then tokens that ran all N layers (the first token, from the prompt, counts there);
///   `layers_at_emit_per_token`: mean slow layers computed before a decoded token was emitted;
/// - speculative: `rounds`, `mean_accepted_tokens` (tokens emitted per verification, the base
///   token included; a last round cut short by the budget or a stop token counts what it
///   emitted), `acceptance_by_position` (accepted / drafted per draft position, every accepted
///   draft counted: the draft's quality), `acceptance_rate` (accepted / drafted);
/// - speculative with `--draft-tree`: `draft_tree` (the widths `[W1, ...]`), `tree_nodes` (the
///   root included), `rounds`, `mean_accepted_tokens` (tokens emitted per verification),
///   `acceptance_by_depth` (per depth d = 1..=D: the fraction of rounds that accepted at least d
///   drafts; with a lookup branch up to the branch's depth); `mean_tree_nodes`: nodes verified per
///   round, the root and any lookup branch included; `prompt_lookup` (the branch's most tokens,
///   0: off), `lookup_rounds` (rounds that verified a branch), `lookup_nodes` (branch nodes
///   verified) and `lookup_accepted` (tokens emitted as accepted branch nodes); `dynamic_tree`:
///   `{"gate", "threshold"}` when the trees grew per branch (`--dynamic-draft`: the shape is the
///   largest tree, a node gets children when its score passes), else null.
///
/// A mean over nothing is null, not 0: the per-token figures when no token was decoded (a budget
/// of one token or none), the per-round ones when no round ran.
pub fn report_fields(run: &ModeRun) -> serde_json::Map<String, Value> {
    let decoded = run.decoded();
    let per_token = |total: f64| mean_over(total / decoded.max(1) as f64, decoded);
    let mut map = serde_json::Map::new();
    map.insert("mode".into(), json!(run.mode.name()));
    map.insert(
        "layers_per_token".into(),
        mean_over(run.layers_per_token, decoded),
    );
    map.insert("flops_per_token".into(), per_token(run.work.flops() as f64));
    map.insert(
        "bytes_per_token".into(),
        per_token(run.work.weight_bytes as f64),
    );
    map.insert(
        "tokens_per_second".into(),
        mean_over(run.tokens_per_second(), decoded),
    );
    map.insert(
        "timings".into(),
        json!({
            "prefill_seconds": run.prefill_seconds,
            "decode_seconds": run.decode_seconds,
        }),
    );
    match &run.details {
        ModeDetails::Greedy => {}
        ModeDetails::EarlyExit {
            histogram,
            layers_at_emit,
        } => {
            map.insert("exit_histogram".into(), json!(histogram));
            map.insert("layers_at_emit_per_token".into(), json!(layers_at_emit));
        }
        ModeDetails::Speculative {
            rounds,
            mean_accepted_tokens,
            acceptance_by_position,
            acceptance_rate,
        } => {
            map.insert("rounds".into(), json!(rounds.len()));
            map.insert(
                "mean_accepted_tokens".into(),
                mean_over(*mean_accepted_tokens, rounds.len()),
            );
            map.insert(
                "acceptance_by_position".into(),
                json!(acceptance_by_position),
            );
            map.insert(
                "acceptance_rate".into(),
                mean_over(*acceptance_rate, rounds.len()),
            );
        }
        ModeDetails::TreeSpeculative {
            widths,
            nodes,
            prompt_lookup,
            dynamic,
            rounds,
            mean_accepted_tokens,
            acceptance_by_depth,
        } => {
            map.insert("draft_tree".into(), json!(widths));
            map.insert(
                "dynamic_tree".into(),
                match dynamic {
                    Some((gate, threshold)) => json!({"gate": gate.name(), "threshold": threshold}),
                    None => Value::Null,
                },
            );
            map.insert("tree_nodes".into(), json!(nodes));
            map.insert("rounds".into(), json!(rounds.len()));
            map.insert(
                "mean_accepted_tokens".into(),
                mean_over(*mean_accepted_tokens, rounds.len()),
            );
            map.insert("acceptance_by_depth".into(), json!(acceptance_by_depth));
            let verified: usize = rounds.iter().map(|r| r.tree.nodes()).sum();
            let n = rounds.len();
            map.insert(
                "mean_tree_nodes".into(),
                mean_over(verified as f64 / n.max(1) as f64, n),
            );
            map.insert(
                "prompt_lookup".into(),
                json!(prompt_lookup.map_or(0, |l| l.max_tokens)),
            );
            let with_branch = rounds.iter().filter(|r| !r.lookup.is_empty()).count();
            map.insert("lookup_rounds".into(), json!(with_branch));
            let branch_nodes: usize = rounds.iter().map(|r| r.lookup.len()).sum();
            map.insert("lookup_nodes".into(), json!(branch_nodes));
            let accepted: usize = rounds.iter().map(TreeRound::lookup_accepted).sum();
            map.insert("lookup_accepted".into(), json!(accepted));
        }
    }
    map
}

/// The `--trace` lines of a run, for stderr. `text(token)` renders a token (its text, or nothing
/// without a tokenizer).
pub fn trace_lines(
    run: &ModeRun,
    settings: &M2r2Settings,
    text: &dyn Fn(u32) -> String,
) -> Vec<String> {
    let n = run.num_layers;
    let show = |t: u32| {
        let s = text(t);
        if s.is_empty() {
            format!("{t}")
        } else {
            format!("{t} {s:?}")
        }
    };
    let mut lines = Vec::new();
    match &run.details {
        ModeDetails::Greedy => {
            lines.push(format!("trace: greedy, all {n} layers per token"));
            for (i, step) in run.steps.iter().enumerate() {
                lines.push(format!(
                    "  token {i:>3}: {:<20} logit {:>8.3}  p {:.4}",
                    show(step.token),
                    step.logit.unwrap_or(f32::NAN),
                    step.probability.unwrap_or(f32::NAN),
                ));
            }
        }
        ModeDetails::EarlyExit {
            histogram,
            layers_at_emit,
        } => {
            lines.push(format!(
                "trace: early exit, gate {} >= {} at gates after layers {:?} (of {n}), kv {}",
                settings.gate,
                settings.exit_threshold(),
                settings.gates,
                settings.kv_policy
            ));
            for (i, step) in run.steps.iter().enumerate() {
                let scores: Vec<String> = step
                    .scores
                    .iter()
                    .enumerate()
                    .map(|(g, s)| format!("g{}(L{})={s:.3}", g + 1, settings.gates[g]))
                    .collect();
                let outcome = match step.exit_gate {
                    Some(g) => format!("exit at gate {g} after {} layers", settings.gates[g - 1]),
                    None if i == 0 => format!("from the prompt (all {n} layers)"),
                    None => format!("ran all {n} layers"),
                };
                lines.push(format!(
                    "  token {i:>3}: {:<20} {outcome:<28} scores [{}]",
                    show(step.token),
                    scores.join(" ")
                ));
            }
            lines.push(format!(
                "  exits per gate 1..={} then none: {histogram:?}; per decoded token {layers_at_emit:.2} \
                 layers before emitting, {:.2} layers in all ({})",
                histogram.len() - 1,
                run.layers_per_token,
                match settings.kv_policy {
                    KvPolicy::Exact => "exact: skipped layers run later for the KV cache",
                    KvPolicy::FastKv => "fast-kv: skipped layers' K/V filled from the exit state",
                }
            ));
        }
        ModeDetails::Speculative {
            rounds,
            mean_accepted_tokens,
            acceptance_rate,
            ..
        } => {
            let how = match &settings.draft_length {
                DraftLength::Fixed(k) => format!("{k} drafts per round"),
                DraftLength::Dynamic {
                    max,
                    gate,
                    threshold,
                } => {
                    format!("up to {max} drafts while {gate} >= {threshold}")
                }
            };
            lines.push(format!(
                "trace: speculative, draft at gate {} (after layer {} of {n}), {how}",
                settings.draft_gate,
                settings.gates[settings.draft_gate - 1]
            ));
            if let Some(first) = run.tokens.first() {
                lines.push(format!("  prompt -> {}", show(*first)));
            }
            for (r, round) in rounds.iter().enumerate() {
                let drafted: Vec<String> = round.drafted.iter().map(|&t| show(t)).collect();
                let rejected = match round.drafted.get(round.accepted) {
                    Some(&t) => format!(
                        "rejected {}; correction {}",
                        show(t),
                        show(round.base_token)
                    ),
                    None => format!("all accepted; bonus {}", show(round.base_token)),
                };
                let scores = if round.scores.is_empty() {
                    String::new()
                } else {
                    let s: Vec<String> = round.scores.iter().map(|s| format!("{s:.3}")).collect();
                    format!(" scores [{}]", s.join(" "))
                };
                lines.push(format!(
                    "  round {r:>3}: drafted [{}]{scores} accepted {}/{}; {rejected}",
                    drafted.join(", "),
                    round.accepted,
                    round.drafted.len()
                ));
            }
            lines.push(format!(
                "  {} rounds, {mean_accepted_tokens:.2} tokens per verification, acceptance {:.1}%",
                rounds.len(),
                acceptance_rate * 100.0
            ));
        }
        ModeDetails::TreeSpeculative {
            widths,
            nodes,
            prompt_lookup,
            dynamic,
            rounds,
            mean_accepted_tokens,
            acceptance_by_depth,
        } => {
            let shape: Vec<String> = widths.iter().map(usize::to_string).collect();
            let branch = prompt_lookup
                .map(|l| format!(", a lookup branch of up to {} tokens", l.max_tokens))
                .unwrap_or_default();
            let branch = match dynamic {
                Some((gate, threshold)) => format!(
                    "{branch}; a node gets children while its {} score >= {threshold}",
                    gate.name()
                ),
                None => branch,
            };
            lines.push(format!(
                "trace: speculative, draft tree {} ({nodes} nodes{branch}) at gate {} (after \
                 layer {} of {n})",
                shape.join(","),
                settings.draft_gate,
                settings.gates[settings.draft_gate - 1]
            ));
            if let Some(first) = run.tokens.first() {
                lines.push(format!("  prompt -> {}", show(*first)));
            }
            for (r, round) in rounds.iter().enumerate() {
                let tree = &round.tree;
                // the drafts of each depth of the run's tree, then the round's lookup branch
                let depths: Vec<String> = (1..=widths.len())
                    .map(|d| {
                        let level: Vec<String> = tree
                            .level(d)
                            .filter(|i| !round.lookup.contains(i))
                            .map(|i| show(round.tokens[i]))
                            .collect();
                        format!("d{d} [{}]", level.join(", "))
                    })
                    .collect();
                let lookup = if round.lookup.is_empty() {
                    String::new()
                } else {
                    let guess: Vec<String> = round
                        .lookup
                        .iter()
                        .map(|&i| show(round.tokens[i]))
                        .collect();
                    format!(" lookup [{}]", guess.join(", "))
                };
                let path: Vec<String> = tree.path(round.node)[1..]
                    .iter()
                    .map(|&i| show(round.tokens[i]))
                    .collect();
                let from = if round.lookup_accepted() > 0 {
                    " (lookup)"
                } else {
                    ""
                };
                lines.push(format!(
                    "  round {r:>3}: drafted {}{lookup} accepted node {}{from} depth {} [{}]; \
                     base {}",
                    depths.join(" "),
                    round.node,
                    round.accepted,
                    path.join(", "),
                    show(round.base_token)
                ));
            }
            let by_depth: Vec<String> = acceptance_by_depth
                .iter()
                .map(|a| format!("{a:.2}"))
                .collect();
            lines.push(format!(
                "  {} rounds, {mean_accepted_tokens:.2} tokens per verification, rounds accepting \
                 at least d drafts per depth [{}]",
                rounds.len(),
                by_depth.join(" ")
            ));
        }
    }
    lines
}

/// An f32 the user gave (a flag, a tolerance) as the f64 with the same shortest decimal text, so
/// that JSON says `0.0001` and not `9.999999747378752e-05`.
pub(crate) fn decimal(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// The `--json` report of one decode (`m2r2 generate`, and `m2r2 run` on ONNX Runtime, which adds
/// its own fields).
pub fn json_report(
    model: &str,
    source: &str,
    request: &DecodeRequest<'_>,
    run: &ModeRun,
    text: Option<String>,
    settings: &M2r2Settings,
) -> serde_json::Value {
    let stopped = run
        .tokens
        .last()
        .is_some_and(|t| request.stop_tokens.contains(t));
    let sampling = request.sampling.as_ref();
    let mut report = json!({
        "model": model,
        "source": source,
        "sampling": if sampling.is_some() { "sample" } else { "greedy" },
        "temperature": sampling.map(|s| decimal(s.temperature)),
        "top_p": sampling.and_then(|s| s.top_p).map(decimal),
        "top_k": sampling.and_then(|s| s.top_k),
        "seed": sampling.map(|s| s.seed),
        "max_new_tokens": request.max_new_tokens,
        "prompt_tokens": request.prompt,
        "tokens": run.tokens,
        "text": text,
        "stop_reason": if stopped { "stop_token" } else { "max_new_tokens" },
        "prefill_tokens_per_second": run.prefill_seconds.map(|s| rate(request.prompt.len(), s)),
        "m2r2": settings_json(settings),
    });
    let object = report.as_object_mut().expect("a JSON object");
    // `mode` names the decoding loop (greedy | early-exit | speculative); `sampling` says whether
    // tokens were sampled.
    object.extend(report_fields(run));
    report
}

/// `n` per `seconds`, 0 when nothing was timed.
fn rate(n: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// The one-line summary on stderr: mode (and sampling), tokens, prefill and decode speed.
pub fn print_summary(run: &ModeRun, request: &DecodeRequest<'_>, stopped: bool) {
    let prompt_tokens = request.prompt.len();
    // the mode names the loop; sampling chooses the tokens within it
    let sampled = match &request.sampling {
        Some(p) => format!(", sampled at temperature {}", p.temperature),
        None => String::new(),
    };
    let prefill = match run.prefill_seconds {
        Some(s) => format!(
            "prefill {s:.3} s = {:.1} tokens/s; ",
            rate(prompt_tokens, s)
        ),
        None => String::new(),
    };
    // the prefill chose the first token: with fewer than two there was no decode step to time
    let decode = if run.decoded() == 0 {
        "no decode step".to_string()
    } else {
        format!(
            "decode {:.3} s = {:.1} tokens/s; {:.2} layers per token",
            run.decode_seconds,
            run.tokens_per_second(),
            run.layers_per_token
        )
    };
    eprintln!(
        "[{} mode{sampled}: {prompt_tokens} prompt tokens, {} generated ({}); {prefill}{decode}]",
        run.mode.name(),
        run.tokens.len(),
        if stopped {
            "stopped at an end token"
        } else {
            "reached --max-new-tokens"
        },
    );
}
