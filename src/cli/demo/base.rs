//! The demo's sections on the base model: its summary, greedy decoding, seeded sampling,
//! teacher-forced logits, the KV cache against a full recompute, and a golden written and checked.

use super::{Demo, NEW_TOKENS, PROMPT, TempDir};
use crate::cli::common;
use anyhow::Result;
use reference::base::generate::{GenerateOptions, generate};
use reference::base::sampling::SamplingParams;
use reference::golden::{DEFAULT_ATOL, Golden};

pub(super) fn model_summary(demo: &mut Demo) -> Result<()> {
    let l = &demo.loaded;
    let c = &l.model.config;
    println!("  {} from {}", l.name, l.source);
    println!(
        "  {:?}, {} parameters ({} as f32), {} layers, D={}, I={}, {} query / {} kv heads of {}, context {}",
        c.architecture,
        common::count(c.parameter_count() as f64),
        common::bytes(4.0 * c.parameter_count() as f64),
        c.num_hidden_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        l.model.context_length()
    );
    match &c.moe {
        None => println!("  feed-forward: dense SwiGLU"),
        Some(m) => println!(
            "  feed-forward: MoE, {} experts, top-{}",
            m.num_local_experts, m.num_experts_per_tok
        ),
    }
    println!("  vocab {}, config hash {}", c.vocab_size, c.hash());
    Ok(())
}

pub(super) fn greedy_generation(demo: &mut Demo) -> Result<()> {
    let g = demo.run(None, NEW_TOKENS)?;
    println!("  prompt {PROMPT:?} -> {:?}", demo.prompt);
    println!("  greedy {:?}", g.tokens);
    println!("  text   {:?}", demo.text(&g.tokens)?);
    println!(
        "  prefill {:.1} ms, decode {:.1} tokens/s",
        1e3 * g.prefill_seconds,
        g.decode_tokens_per_second()
    );
    let again = demo.run(None, NEW_TOKENS)?;
    demo.check("greedy decoding is deterministic", again.tokens == g.tokens);
    demo.greedy = g.tokens;
    Ok(())
}

pub(super) fn seeded_sampling(demo: &mut Demo) -> Result<()> {
    let params = |seed| SamplingParams {
        temperature: 3.0,
        top_k: Some(40),
        top_p: Some(0.95),
        seed,
    };
    let a = demo.run(Some(params(7)), NEW_TOKENS)?;
    let b = demo.run(Some(params(7)), NEW_TOKENS)?;
    let c = demo.run(Some(params(8)), NEW_TOKENS)?;
    println!("  temperature 3.0, top-k 40, top-p 0.95");
    println!("  seed 7 {:?}", a.tokens);
    println!("  seed 8 {:?}", c.tokens);
    println!("  text (seed 7) {:?}", demo.text(&a.tokens)?);
    demo.check("the same seed gives the same tokens", a.tokens == b.tokens);
    println!(
        "  another seed gives {} tokens",
        if c.tokens == a.tokens {
            "the same"
        } else {
            "different"
        }
    );
    Ok(())
}

pub(super) fn teacher_forced_logits(demo: &mut Demo) -> Result<()> {
    let tokens: Vec<u32> = demo.prompt.iter().chain(&demo.greedy).copied().collect();
    let logits = demo.loaded.model.teacher_forced_logits(&tokens)?; // [T, V]
    println!(
        "  {} tokens -> logits {:?} in one chunk",
        tokens.len(),
        logits.shape()
    );
    let last = logits.row(logits.nrows() - 1);
    let mut top: Vec<(usize, f32)> = last.iter().copied().enumerate().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> = top[..5]
        .iter()
        .map(|(id, l)| format!("{id}: {l:.3}"))
        .collect();
    println!("  top 5 at the last position: {}", top.join(", "));
    // Greedy token i was chosen from position P - 1 + i.
    let p = demo.prompt.len();
    let argmax_agrees = demo.greedy.iter().enumerate().all(|(i, &t)| {
        let row = logits.row(p - 1 + i);
        reference::base::ops::argmax(row.as_slice().expect("contiguous")) as u32 == t
    });
    demo.check(
        "every greedy token is the argmax of its teacher-forced row",
        argmax_agrees,
    );
    Ok(())
}

pub(super) fn cache_vs_recompute(demo: &mut Demo) -> Result<()> {
    let model = &demo.loaded.model;
    let options = GenerateOptions {
        max_new_tokens: NEW_TOKENS,
        stop_tokens: vec![],
        sampling: None,
    };
    // Decoding one token at a time from the cache ...
    let mut rows: Vec<Vec<f32>> = vec![];
    let g = generate(model, &demo.prompt, &options, &mut |_, logits| {
        rows.push(logits.to_vec())
    })?;
    // ... against the whole sequence in one chunk from an empty cache.
    let tokens: Vec<u32> = demo.prompt.iter().chain(&g.tokens).copied().collect();
    let full = model.teacher_forced_logits(&tokens[..tokens.len() - 1])?;
    let p = demo.prompt.len();
    let mut max_abs = 0.0f32;
    let mut bitwise = true;
    for (i, row) in rows.iter().enumerate() {
        for (a, b) in row.iter().zip(full.row(p - 1 + i)) {
            bitwise &= a.to_bits() == b.to_bits();
            max_abs = max_abs.max((a - b).abs());
        }
    }
    println!(
        "  {} decoded positions compared, max abs diff {max_abs:e}",
        rows.len()
    );
    demo.check(
        "cached decode logits == full recompute, bit for bit",
        bitwise,
    );

    let mut one_chunk = model.new_cache(tokens.len())?;
    model.forward(&tokens, &mut one_chunk)?;
    let mut step_by_step = model.new_cache(tokens.len())?;
    model.forward(&tokens[..p], &mut step_by_step)?;
    for &t in &tokens[p..] {
        model.forward(&[t], &mut step_by_step)?;
    }
    demo.check(
        "KV cache filled token by token == filled in one chunk, bit for bit",
        one_chunk.prefix_equals(&step_by_step, tokens.len()),
    );
    Ok(())
}

pub(super) fn golden_round_trip(demo: &mut Demo) -> Result<()> {
    let dir = TempDir::new()?;
    let path = dir.0.join("golden.safetensors");
    let model = &demo.loaded.model;
    let golden = Golden::record_greedy(model, &demo.loaded.name, &demo.prompt, 8)?;
    golden.write(&path)?;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "  wrote {} ({}), {} steps",
        path.display(),
        common::bytes(size as f64),
        golden.tokens.len()
    );
    let back = Golden::read(&path)?;
    let report = back.check(model, DEFAULT_ATOL)?;
    for e in &report.entries {
        println!(
            "    {:<7} {:<6} max abs diff {:.3e}  max rel diff {:.3e}  {}",
            e.name,
            if e.ok { "OK" } else { "NOT OK" },
            e.max_abs,
            e.max_rel,
            e.note
        );
    }
    demo.check("golden written, read back and checked", report.ok());
    let mut tampered = back;
    tampered.logits[[3, 5]] += 1e-2;
    let report = tampered.check(model, DEFAULT_ATOL)?;
    let logits = &report.entries[0];
    println!(
        "  one logit moved by 1e-2: logits {} (max abs diff {:.3e} at {:?})",
        if logits.ok { "OK" } else { "NOT OK" },
        logits.max_abs,
        logits.at
    );
    demo.check(
        "a tampered golden is caught",
        !report.ok() && logits.at == vec![3, 5],
    );
    Ok(())
}
