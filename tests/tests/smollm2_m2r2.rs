//! M2R2 on the real model: SmolLM2-135M-Instruct with random seeded adapters and ARLA. Greedy
//! self-speculative decoding must reproduce plain greedy decoding token for token at every draft
//! gate, and exact early exit must leave the base model's KV cache. Fails (never skips) when the GGUF
//! has not been fetched.

use reference::base::generate::greedy;
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::early_exit::{EarlyExitOptions, KvPolicy, early_exit_generate};
use reference::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use reference::m2r2::config::M2r2Config;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;

#[test]
fn smollm2_random_adapters_are_lossless() {
    let loaded = reference::io::load::load_model("smollm2").unwrap_or_else(|e| panic!("{e}"));
    let model = &loaded.model;
    let weights =
        M2r2Weights::random(&model.config, M2r2Config::default_for(&model.config), 7).unwrap();
    let tokenizer = loaded.tokenizer().unwrap();
    let prompt = tokenizer
        .encode("The three most important inventions in history are", false)
        .unwrap();
    let steps = 10;
    let want = greedy(model, &prompt, steps, &[]).unwrap();

    for draft_gate in 1..=weights.config.num_gates() {
        for draft_length in [
            DraftLength::Fixed(3),
            DraftLength::Dynamic {
                max: 3,
                gate: GateKind::Arla,
                threshold: 0.5,
            },
        ] {
            let gate =
                matches!(draft_length, DraftLength::Dynamic { .. }).then_some(GateKind::Arla);
            let mut backend = ReferenceSpeculation::new(
                M2r2::new(model, &weights),
                draft_gate,
                gate,
                prompt.len() + steps + 4,
            )
            .unwrap();
            let options = SpeculativeOptions {
                max_new_tokens: steps,
                stop_tokens: vec![],
                draft_length,
                sampling: None,
            };
            let got = speculative_generate(&mut backend, &prompt, &options).unwrap();
            assert_eq!(got.tokens, want, "draft gate {draft_gate}");
        }
    }

    let options = EarlyExitOptions {
        max_new_tokens: steps,
        stop_tokens: vec![],
        gate: GateKind::Confidence,
        threshold: 0.5.into(),
        kv_policy: KvPolicy::Exact,
        sampling: None,
    };
    let out = early_exit_generate(M2r2::new(model, &weights), &prompt, &options).unwrap();
    let fed: Vec<u32> = prompt
        .iter()
        .chain(&out.tokens[..steps - 1])
        .copied()
        .collect();
    let mut plain = model.new_cache(fed.len()).unwrap();
    model.forward(&fed, &mut plain).unwrap();
    assert!(
        out.cache.prefix_equals(&plain, fed.len()),
        "exact early exit changed the KV cache"
    );
}
