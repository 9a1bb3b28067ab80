//! `m2r2 tune-drafting`'s tables: the traces, the step costs, the policies best first on each
//! engine and by family, the notes and the defaults.

use super::{EngineCosts, Family, PolicyResult, Report, describe_defaults};
use reference::decode::draft_sim::tree::shape_text;

fn speed(s: Option<f64>) -> String {
    s.map_or("-".into(), |s| format!("{s:.2}x"))
}

/// A table of policies with their predictions.
fn print_policies<'a>(policies: impl Iterator<Item = &'a PolicyResult>) {
    println!(
        "| draft gate | drafting | tokens per verification | proposals per round | reference | ONNX Runtime |"
    );
    println!("|---|---|---|---|---|---|");
    for p in policies {
        let onnx = speed(p.speedup_onnx);
        println!(
            "| {} | {} | {:.2} | {:.2} | {} | {} |",
            p.draft_gate,
            p.policy,
            p.tokens_per_round,
            p.proposals_per_round,
            speed(p.speedup_reference),
            onnx
        );
    }
}

/// " (the best N of M; --top)" when a table shows `top` of its `rows`, else nothing.
fn shown(top: usize, rows: usize) -> String {
    match rows > top {
        true => format!(" (the best {top} of {rows}; --top)"),
        false => String::new(),
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |ms| format!("{ms:.1}"))
}

/// The tree step costs: one column per timed size of each kind.
fn print_tree_costs(costs: &[EngineCosts]) {
    let trees: Vec<&EngineCosts> = costs.iter().filter(|c| c.costs.tree.is_some()).collect();
    let Some(first) = trees.first().and_then(|c| c.costs.tree.as_ref()) else {
        return;
    };
    let sizes = |v: &[Option<f64>]| -> Vec<usize> {
        (1..=v.len()).filter(|&n| v[n - 1].is_some()).collect()
    };
    let columns = [
        ("propose", sizes(&first.propose)),
        ("leaves", sizes(&first.leaves)),
        ("verify", sizes(&first.verify)),
    ];
    println!(
        "token tree steps, ms (median): a draft level of n nodes that propose (propose n) or of \
         n leaves (leaves n), a verification of a tree of n nodes (verify n):"
    );
    println!();
    let header: Vec<String> = columns
        .iter()
        .flat_map(|(kind, sizes)| sizes.iter().map(move |n| format!("{kind} {n}")))
        .collect();
    println!("| engine | draft gate | {} |", header.join(" | "));
    println!("|---|---|{}", "---|".repeat(header.len()));
    for c in trees {
        let t = c.costs.tree.as_ref().expect("filtered");
        let cells: Vec<String> = [(&t.propose, &columns[0].1), (&t.leaves, &columns[1].1)]
            .into_iter()
            .chain([(&t.verify, &columns[2].1)])
            .flat_map(|(v, sizes)| sizes.iter().map(|&n| ms(v.get(n - 1).copied().flatten())))
            .collect();
        println!("| {} | {} | {} |", c.engine, c.gate, cells.join(" | "));
    }
    println!();
}

pub(super) fn print(r: &Report, top: usize) {
    println!(
        "{} with M2R2 weights {}: {} samples of {}",
        r.model, r.m2r2, r.samples, r.data
    );
    println!();
    println!("| draft gate | drafts traced | agreement with the next greedy token | seconds |");
    println!("|---|---|---|---|");
    for t in &r.traces {
        println!(
            "| {} | {} | {:.3} | {:.1} |",
            t.gate, t.points, t.agreement, t.seconds
        );
    }
    println!();
    println!(
        "step costs, ms (median; greedy, the baseline of every speed-up, timed once per engine \
         beside every gate's steps):"
    );
    println!();
    let rows = r.costs.first().map_or(0, |c| c.costs.verify.len());
    let header: Vec<String> = (1..=rows).map(|n| format!("verify {n}")).collect();
    println!(
        "| engine | draft gate | greedy | propose | propose (ARLA) | feed | {} |",
        header.join(" | ")
    );
    println!("|---|---|---|---|---|---|{}", "---|".repeat(rows));
    for c in &r.costs {
        let verify: Vec<String> = c.costs.verify.iter().map(|v| format!("{v:.1}")).collect();
        println!(
            "| {} | {} | {:.1} | {:.1} | {} | {:.1} | {} |",
            c.engine,
            c.gate,
            c.costs.greedy,
            c.costs.propose,
            ms(c.propose_arla_ms),
            c.costs.feed,
            verify.join(" | ")
        );
    }
    println!();
    print_tree_costs(&r.costs);
    println!(
        "predicted speed-up over greedy decoding, best first on the reference{}:",
        shown(top, r.policies.len())
    );
    println!();
    print_policies(r.policies.iter().take(top));
    println!();
    if r.best_onnx.is_some() {
        let mut onnx: Vec<&PolicyResult> = r
            .policies
            .iter()
            .filter(|p| p.speedup_onnx.is_some())
            .collect();
        println!(
            "best first on ONNX Runtime (at the export's draft gate){}:",
            shown(top, onnx.len())
        );
        println!();
        let by_onnx = |p: &PolicyResult| p.speedup_onnx.unwrap_or(0.0);
        onnx.sort_by(|a, b| by_onnx(b).total_cmp(&by_onnx(a)));
        print_policies(onnx.into_iter().take(top));
        println!();
    }
    let mut seen: Vec<(usize, String)> = Vec::new();
    let mut family: Vec<&PolicyResult> = r
        .policies
        .iter()
        .filter(|p| {
            let mut kind = match (&p.draft_tree, &p.dynamic_draft) {
                (Some(w), Some(d)) => format!("tree {} dynamic {}", shape_text(w), d.gate),
                (None, Some(d)) => format!("dynamic {}", d.gate),
                (_, None) => p.policy.clone(),
            };
            if let Some(n) = p.prompt_lookup {
                kind += &format!(", lookup {n}");
            }
            let key = (p.draft_gate, kind);
            let new = !seen.contains(&key);
            if new {
                seen.push(key);
            }
            new
        })
        .collect();
    // the policies are best first, so each family's first is its best: keep the best `top`
    println!(
        "by family: each fixed length, the best dynamic policy of each gate kind, and each tree \
         whole and best grown by each gate kind, per draft gate and lookup branch{}:",
        shown(top, family.len())
    );
    println!();
    family.truncate(top);
    let order = |p: &PolicyResult| {
        (
            p.draft_gate,
            p.prompt_lookup,
            p.family == Family::Tree,
            p.dynamic_draft.is_some(),
            p.draft_len,
            p.tree_nodes,
        )
    };
    family.sort_by_key(|p| order(p));
    print_policies(family.into_iter());
    println!();
    for note in &r.notes {
        println!("note: {note}");
    }
    let best = |engine: &str, p: &PolicyResult, s: Option<f64>| {
        println!(
            "best on {engine}: draft gate {}, {} ({})",
            p.draft_gate,
            p.policy,
            speed(s)
        );
    };
    best(
        "the reference",
        &r.best_reference,
        r.best_reference.speedup_reference,
    );
    if let Some(o) = &r.best_onnx {
        best("ONNX Runtime", o, o.speedup_onnx);
    }
    println!(
        "defaults (--write), the reference: {}",
        describe_defaults(&r.defaults)
    );
    if let Some(d) = &r.onnx_defaults {
        println!("defaults (--write), ONNX Runtime: {}", describe_defaults(d));
    }
}
