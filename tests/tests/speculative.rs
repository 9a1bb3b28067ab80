//! Self-speculative decoding is lossless (docs/m2r2/speculative.md):
//! - greedy speculative output equals plain greedy decoding token for token, for every draft gate,
//!   fixed and dynamic draft lengths, random adapters and ARLA, dense and MoE (proptest);
//! - afterwards the KV cache equals the one plain decoding builds for the same tokens, bit for bit;
//! - speculative sampling preserves the base model's distribution (chi-square test);
//! - all of it also with a pruned draft head (`reference::m2r2::draft_head`): drafts come from its
//!   subset only, the output is unchanged, and the counted draft work shrinks by `V - K` head rows
//!   per proposal;
//! - and with a bridge from the verified slow state into the draft (entry, gate or both).

use m2r2_tests::{DecodeProblem, DraftSettings, small_config};
use proptest::prelude::*;
use reference::ModelConfig;
use reference::base::generate::greedy;
use reference::base::sampling::{SamplingParams, sampling_distribution};
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use reference::io::builtin::random_model;
use reference::m2r2::config::M2r2Config;
use reference::m2r2::cost::CostModel;
use reference::m2r2::draft_head::DraftHead;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;

/// A decoding problem, how it drafts, and an optional stop token.
#[derive(Debug, Clone)]
struct Problem {
    base: DecodeProblem,
    drafting: DraftSettings,
    stop: Option<u32>,
}

fn problem_strategy() -> impl Strategy<Value = Problem> {
    (
        DecodeProblem::strategy(2..6, 40, 1..6, 1..20),
        DraftSettings::strategy(6, 40),
        prop::option::weighted(0.3, 0u32..40),
    )
        .prop_map(|(base, drafting, stop)| Problem {
            base,
            drafting,
            stop,
        })
}

impl Problem {
    fn check(&self) -> Result<(), TestCaseError> {
        let (base, mut weights) = self.base.setup(0x55);
        let config = base.config.clone();
        let draft_gate = self.drafting.apply(&base, &mut weights);
        let (prompt, new_tokens, draft) = (
            &self.base.prompt,
            self.base.new_tokens,
            &self.drafting.draft,
        );
        let stop: Vec<u32> = self.stop.into_iter().collect();

        let want = greedy(&base, prompt, new_tokens, &stop).unwrap();

        let gate = match &draft {
            DraftLength::Dynamic { gate, .. } => Some(*gate),
            DraftLength::Fixed(_) => None,
        };
        let capacity = prompt.len() + new_tokens + draft.max() + 1;
        let mut backend =
            ReferenceSpeculation::new(M2r2::new(&base, &weights), draft_gate, gate, capacity)
                .unwrap();
        let options = SpeculativeOptions {
            max_new_tokens: new_tokens,
            stop_tokens: stop,
            draft_length: draft.clone(),
            sampling: None,
        };
        let got = speculative_generate(&mut backend, prompt, &options).unwrap();
        prop_assert_eq!(
            &got.tokens,
            &want,
            "draft gate {} of {:?}",
            draft_gate,
            weights.config.gates
        );

        // The cache holds exactly the base model's entries for prompt + emitted tokens (all but the last).
        let fed: Vec<u32> = prompt
            .iter()
            .chain(&want[..want.len() - 1])
            .copied()
            .collect();
        let mut plain = base.new_cache(capacity).unwrap();
        base.forward(&fed, &mut plain).unwrap();
        prop_assert_eq!(backend.cache().len(), fed.len());
        prop_assert!(
            backend.cache().prefix_equals(&plain, fed.len()),
            "KV cache differs from the base model's"
        );

        // Every round emits its accepted drafts plus one base token.
        let emitted: usize = got.rounds.iter().map(|r| r.accepted + 1).sum();
        prop_assert!(emitted + 1 >= got.tokens.len());
        prop_assert!(
            got.rounds
                .iter()
                .all(|r| r.accepted <= r.drafted.len() && r.drafted.len() <= draft.max())
        );

        // Drafts come from the pruned head's subset, and each proposal counts K head rows, not V:
        // the work of the full-head cost model for these rounds, less (V - K) rows per proposal.
        // (The full-head run's own rounds differ, so the cost model stands in for it.)
        let full_head = M2r2Weights {
            draft_head: None,
            ..weights.clone()
        };
        let full_cost = CostModel::new(&config, Some(&full_head)).speculative(
            &got.rounds,
            draft_gate,
            gate == Some(GateKind::Arla),
        );
        let work = backend.work();
        let saved = match &weights.draft_head {
            Some(head) => {
                prop_assert!(
                    got.rounds
                        .iter()
                        .flat_map(|r| &r.drafted)
                        .all(|d| head.tokens.contains(d))
                );
                let proposals: usize = got.rounds.iter().map(|r| r.proposals).sum();
                let rows =
                    (proposals * (config.vocab_size - head.len()) * config.hidden_size) as u64;
                // MACs, and f32 bytes: each proposal reads its head rows once
                (rows, 4 * rows)
            }
            None => (0, 0),
        };
        prop_assert_eq!(work.weight_macs + saved.0, full_cost.weight_macs);
        if !self.base.moe {
            // MoE bytes depend on which experts a chunk's rows share, which the cost model does
            // not predict from the rounds alone.
            prop_assert_eq!(work.weight_bytes + saved.1, full_cost.weight_bytes);
        }
        prop_assert_eq!(work.attention_macs, full_cost.attention_macs);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn greedy_speculative_equals_greedy(problem in problem_strategy()) {
        problem.check()?;
    }
}

/// Zero adapters: the draft is exactly "exit at the draft gate with the base head", still lossless.
#[test]
fn zero_adapters_are_lossless_too() {
    let tiny = reference::io::builtin::builtin("tiny-moe").unwrap();
    let zeros = M2r2Weights::zeros(&tiny.config);
    let prompt = [10u32, 20, 30, 40];
    let want = greedy(&tiny, &prompt, 24, &[]).unwrap();
    for draft_gate in 1..=zeros.config.num_gates() {
        let mut backend =
            ReferenceSpeculation::new(M2r2::new(&tiny, &zeros), draft_gate, None, 64).unwrap();
        let options = SpeculativeOptions {
            max_new_tokens: 24,
            stop_tokens: vec![],
            draft_length: DraftLength::Fixed(4),
            sampling: None,
        };
        let got = speculative_generate(&mut backend, &prompt, &options).unwrap();
        assert_eq!(got.tokens, want, "draft gate {draft_gate}");
    }
}

/// Speculative sampling draws from the base model's distribution. Vocabulary of 6, temperature 6 (the
/// random model is very peaked; this spreads every cell above 5 expected counts), prompt of one
/// token, 3 new tokens (the 2nd and 3rd come from the first speculative round: accepted drafts,
/// corrections and bonus tokens). Over 4000 seeds, the empirical distributions of token 2 and of
/// token 3 are compared with the exact marginals computed from the base model by enumeration, with
/// a chi-square test at significance 0.001 each (df = 5, critical value 20.515).
///
/// With a pruned draft head of tokens {0, 2, 5} the draft distribution q is 0 on 1, 3 and 4: those
/// are reached only through the residual `norm(max(0, p - q))`, and the output distribution must
/// still be the base model's.
#[test]
fn speculative_sampling_preserves_the_distribution() {
    let vocab = 6;
    let config = small_config(4, false, vocab);
    let full = M2r2Weights::random(&config, M2r2Config::default_for(&config), 12).unwrap();
    let pruned = M2r2Weights {
        draft_head: Some(DraftHead::new(vec![0, 2, 5], vocab, "test").unwrap()),
        ..full.clone()
    };
    sampling_preserves_the_distribution(&config, &full);
    sampling_preserves_the_distribution(&config, &pruned);
}

fn sampling_preserves_the_distribution(config: &ModelConfig, weights: &M2r2Weights) {
    let vocab = config.vocab_size;
    let base = random_model(config.clone(), 11).unwrap();
    let params = |seed| SamplingParams {
        temperature: 6.0,
        top_k: None,
        top_p: None,
        seed,
    };
    let prompt = [3u32];

    // Exact marginals of tokens 2 and 3 by enumerating tokens 1 and 2.
    let dist = |tokens: &[u32]| {
        let logits = base.teacher_forced_logits(tokens).unwrap();
        sampling_distribution(logits.row(tokens.len() - 1).as_slice().unwrap(), &params(0))
    };
    let p1 = dist(&prompt);
    let (mut m2, mut m3) = (vec![0.0f64; vocab], vec![0.0f64; vocab]);
    for t1 in 0..vocab as u32 {
        let p2 = dist(&[3, t1]);
        for t2 in 0..vocab as u32 {
            let joint = p1[t1 as usize] as f64 * p2[t2 as usize] as f64;
            m2[t2 as usize] += joint;
            let p3 = dist(&[3, t1, t2]);
            for t3 in 0..vocab {
                m3[t3] += joint * p3[t3] as f64;
            }
        }
    }

    let samples = 4000;
    let (mut c2, mut c3) = (vec![0usize; vocab], vec![0usize; vocab]);
    let mut rejections = 0;
    for seed in 0..samples {
        let mut backend =
            ReferenceSpeculation::new(M2r2::new(&base, weights), 1, None, 16).unwrap();
        let options = SpeculativeOptions {
            max_new_tokens: 3,
            stop_tokens: vec![],
            draft_length: DraftLength::Fixed(2),
            sampling: Some(params(seed as u64)),
        };
        let out = speculative_generate(&mut backend, &prompt, &options).unwrap();
        if let Some(head) = &weights.draft_head {
            assert!(
                out.rounds
                    .iter()
                    .flat_map(|r| &r.drafted)
                    .all(|d| head.tokens.contains(d))
            );
        }
        c2[out.tokens[1] as usize] += 1;
        c3[out.tokens[2] as usize] += 1;
        rejections += out
            .rounds
            .iter()
            .filter(|r| r.accepted < r.drafted.len())
            .count();
    }
    let chi2 = |counts: &[usize], p: &[f64]| -> f64 {
        counts
            .iter()
            .zip(p)
            .map(|(&c, &p)| {
                let expected = p * samples as f64;
                (c as f64 - expected).powi(2) / expected
            })
            .sum()
    };
    let (x2, x3) = (chi2(&c2, &m2), chi2(&c3, &m3));
    println!("draft head {:?}", weights.draft_head);
    println!("token 2: chi2 {x2:.2} counts {c2:?} expected {m2:?}");
    println!("token 3: chi2 {x3:.2} counts {c3:?} expected {m3:?}");
    assert!(
        rejections > samples / 20,
        "drafts should be rejected sometimes ({rejections}), else the test is weak"
    );
    assert!(
        x2 < 20.515 && x3 < 20.515,
        "chi-square {x2:.2} / {x3:.2} above the 0.001 critical value 20.515"
    );
}

/// A bridge is read only when drafting at the gate it was trained at: at another draft gate the
/// rounds are those of the same weights without it; at its own gate the drafts change.
#[test]
fn a_bridge_is_read_only_at_its_gate() {
    use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
    let model = reference::io::builtin::builtin("tiny").unwrap();
    let plain = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let config = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
    let bridged = plain
        .clone()
        .with_bridge(&model.config, config, 6, 2.0)
        .unwrap();
    let rounds = |weights: &M2r2Weights, gate: usize| {
        let mut backend =
            ReferenceSpeculation::new(M2r2::new(&model, weights), gate, None, 64).unwrap();
        let options = SpeculativeOptions {
            max_new_tokens: 24,
            stop_tokens: vec![],
            draft_length: DraftLength::Fixed(3),
            sampling: None,
        };
        speculative_generate(&mut backend, &[4, 8, 15], &options)
            .unwrap()
            .rounds
    };
    assert_eq!(rounds(&bridged, 2), rounds(&plain, 2));
    assert_ne!(rounds(&bridged, 1), rounds(&plain, 1));
}
