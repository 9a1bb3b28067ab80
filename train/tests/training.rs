//! Real training runs on the built-in `tiny` model, seconds long, fixed seeds: the loss falls and the
//! draft gate's agreement with the base model rises on held-out samples; resuming from a checkpoint
//! continues exactly as an uninterrupted run; checkpoints load through `M2r2Weights::load_dir`.

use reference::Model;
use reference::io::builtin::builtin;
use reference::m2r2::config::M2r2Config;
use reference::m2r2::weights::M2r2Weights;
use train::checkpoint;
use train::data::DistillSample;
use train::distill::{DistillOptions, generate_samples};
use train::slow_cache::{CacheUse, SlowPass};
use train::trainer::{TrainOptions, Trainer, initial_weights};

/// Self-distillation data of `tiny`: sampled continuations of seeded random prompts.
fn data(model: &Model, prompts: usize, seed: u64) -> Vec<DistillSample> {
    let prompts: Vec<(String, Vec<u32>)> = (0..prompts)
        .map(|i| {
            let tokens = (0..6)
                .map(|k| ((seed as usize * 31 + i * 17 + k * 7) % 250) as u32 + 1)
                .collect();
            (format!("p{i}"), tokens)
        })
        .collect();
    let options = DistillOptions {
        samples_per_prompt: 1,
        max_new_tokens: 24,
        temperature: Some(0.7),
        seed,
        stop_tokens: vec![],
    };
    generate_samples(model, &prompts, &options, &mut |_| {}).unwrap()
}

/// A trainer that computes its slow stream (no cache folder, no progress).
fn new_trainer(
    model: &Model,
    weights: M2r2Weights,
    data: &[DistillSample],
    options: TrainOptions,
) -> train::error::Result<Trainer> {
    Trainer::new(model, weights, data, options, &mut SlowPass::default())
}

fn options(steps: usize) -> TrainOptions {
    TrainOptions {
        train_gates: vec![1],
        steps,
        batch_rows: 32,
        lr: 3e-3,
        lr_min: 3e-4,
        warmup: 10,
        weight_decay: 0.0,
        clip: 1.0,
        temperature: 1.0,
        hard_label_weight: 0.0,
        align: None,
        align_weight: 0.0,
        align_intermediate: false,
        seed: 1,
        bridge_only: false,
    }
}

fn config(model: &Model) -> M2r2Config {
    let mut c = M2r2Config::default_for(&model.config);
    c.rank = 8;
    c.alpha = 16.0;
    c
}

/// Thresholds (measured: train KL 1.39 -> 0.16, agreement 0.956 -> 0.977; held-out KL 1.49 ->
/// 1.22, agreement 0.955 -> 0.955): see the assertions.
#[test]
fn training_tiny_lowers_loss_and_raises_agreement() {
    let model = builtin("tiny").unwrap();
    let train_data = data(&model, 96, 1);
    let dev_data = data(&model, 8, 2);
    let weights = initial_weights(&model, config(&model), 3).unwrap();
    let mut trainer = new_trainer(&model, weights, &train_data, options(300)).unwrap();
    let before = trainer.evaluate(&model, &dev_data).unwrap()[0];
    let before_train = trainer.evaluate_training_rows()[0];
    for _ in 0..300 {
        trainer.train_step();
    }
    let after = trainer.evaluate(&model, &dev_data).unwrap()[0];
    let after_train = trainer.evaluate_training_rows()[0];
    for (name, b, a) in [
        ("held-out", before, after),
        ("train", before_train, after_train),
    ] {
        println!(
            "gate 1 {name}: KL {:.4} -> {:.4}, agreement {:.3} -> {:.3} ({} rows)",
            b.kl,
            a.kl,
            b.agreement(),
            a.agreement(),
            a.rows
        );
    }
    // On the rows it trains on, the random base model's function is learnt: KL falls by more than
    // half and the agreement rises (it starts high: tiny's tied embedding dominates its logits).
    assert!(
        after_train.kl < 0.5 * before_train.kl,
        "train KL {} -> {}",
        before_train.kl,
        after_train.kl
    );
    assert!(
        after_train.agreement() >= before_train.agreement() + 0.015,
        "train agreement {} -> {}",
        before_train.agreement(),
        after_train.agreement()
    );
    // On held-out samples it generalises a little (a random model is a random function).
    assert!(
        after.kl < 0.9 * before.kl,
        "held-out KL {} -> {}",
        before.kl,
        after.kl
    );
    assert!(after.agreement() >= before.agreement() - 0.01);
}

#[test]
fn resume_continues_exactly_and_checkpoints_load() {
    let model = builtin("tiny").unwrap();
    let train_data = data(&model, 6, 4);
    let start = || initial_weights(&model, config(&model), 5).unwrap();
    let mut straight = new_trainer(&model, start(), &train_data, options(12)).unwrap();
    for _ in 0..12 {
        straight.train_step();
    }
    let mut first = new_trainer(&model, start(), &train_data, options(12)).unwrap();
    for _ in 0..5 {
        first.train_step();
    }
    let dir = tempfile::tempdir().unwrap();
    checkpoint::save(&first, dir.path()).unwrap();
    // The checkpoint is an ordinary M2R2 weights folder.
    let loaded = M2r2Weights::load_dir(dir.path(), &model.config).unwrap();
    assert_eq!(loaded, first.weights());
    let mut resumed = checkpoint::resume(
        &model,
        dir.path(),
        &train_data,
        None,
        &mut SlowPass::default(),
    )
    .unwrap();
    assert_eq!(resumed.step, 5);
    // data of the same shape with another token is not the same data
    let mut other = train_data.clone();
    let last = other[0].tokens.len() - 1;
    other[0].tokens[last] = (other[0].tokens[last] + 1) % 320;
    let err = checkpoint::resume(&model, dir.path(), &other, None, &mut SlowPass::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("trained on other data (as many samples and rows, other tokens)"),
        "{err}"
    );
    for _ in 5..12 {
        resumed.train_step();
    }
    assert_eq!(resumed.weights(), straight.weights());
    // (losses pass through JSON in the checkpoint: equal to a few ulps)
    assert_eq!(resumed.history.len(), straight.history.len());
    for (a, b) in resumed.history.iter().zip(&straight.history) {
        assert_eq!((a.step, a.gates[0].agree), (b.step, b.gates[0].agree));
        assert!((a.gates[0].kl - b.gates[0].kl).abs() < 1e-12);
    }
    // Training changed the adapters of gate 1; the untrained gates' layers carry none.
    let w = straight.weights();
    let init = start();
    for (l, (a, b)) in w
        .accelerator
        .layers
        .iter()
        .zip(&init.accelerator.layers)
        .enumerate()
    {
        if w.config.interval_layers(0).contains(&l) {
            assert!(a.is_some() && a != b, "layer {l}");
        } else {
            assert!(a.is_none(), "layer {l}");
        }
    }
}

/// Intermediate alignment (the targets `s_{d_j(i)}` of docs/m2r2/streams.md): refused without an
/// alignment kind; with one, every inner state adds a non-negative term to the exit's, so the
/// statistic on the same rows exceeds the exit term alone, the step is deterministic, and training
/// lowers it.
#[test]
fn intermediate_alignment_trains_and_needs_a_kind() {
    let model = builtin("tiny").unwrap();
    let train_data = data(&model, 8, 5);
    let weights = || initial_weights(&model, config(&model), 3).unwrap();
    let with = |intermediate: bool, steps: usize| TrainOptions {
        align: Some(train::align::AlignKind::Cosine),
        align_weight: 0.5,
        align_intermediate: intermediate,
        ..options(steps)
    };
    let refused = TrainOptions {
        align_intermediate: true,
        ..options(1)
    };
    let err = new_trainer(&model, weights(), &train_data, refused)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("--align"), "{err}");

    let exit_only = new_trainer(&model, weights(), &train_data, with(false, 1))
        .unwrap()
        .evaluate_training_rows();
    let mut trainer = new_trainer(&model, weights(), &train_data, with(true, 30)).unwrap();
    let before = trainer.evaluate_training_rows();
    assert_eq!(before[0].kl, exit_only[0].kl, "the KL does not change");
    assert!(
        before[0].align > exit_only[0].align,
        "{} vs {}",
        before[0].align,
        exit_only[0].align
    );
    let first = trainer.train_step();
    let mut again = new_trainer(&model, weights(), &train_data, with(true, 30)).unwrap();
    assert_eq!(again.train_step(), first, "deterministic");
    for _ in 1..30 {
        trainer.train_step();
    }
    let after = trainer.evaluate_training_rows();
    println!("align {} -> {}", before[0].align, after[0].align);
    assert!(after[0].align < before[0].align);
}

/// The hard-label term (cross-entropy on the teacher's argmax): refused when negative; it leaves
/// the reported KL alone (evaluation is the same KL with or without it), changes the update, and
/// the step stays deterministic. Its gradient is checked by finite differences in `head.rs`.
#[test]
fn hard_label_term_changes_the_update_not_the_reported_kl() {
    let model = builtin("tiny").unwrap();
    let train_data = data(&model, 8, 7);
    let weights = || initial_weights(&model, config(&model), 3).unwrap();
    let with = |w: f64| TrainOptions {
        hard_label_weight: w,
        ..options(4)
    };
    let err = new_trainer(&model, weights(), &train_data, with(-1.0))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("--hard-label-weight"), "{err}");
    let mut kl_only = new_trainer(&model, weights(), &train_data, with(0.0)).unwrap();
    let mut hard = new_trainer(&model, weights(), &train_data, with(1.0)).unwrap();
    assert_eq!(
        hard.evaluate_training_rows(),
        kl_only.evaluate_training_rows()
    );
    let first = hard.train_step();
    assert_eq!(first, kl_only.train_step(), "the same KL at the first step");
    assert_ne!(hard.weights(), kl_only.weights(), "a different update");
    let mut again = new_trainer(&model, weights(), &train_data, with(1.0)).unwrap();
    again.train_step();
    assert_eq!(again.weights(), hard.weights(), "deterministic");
}

/// A trainer whose slow stream was read from `--slow-cache` trains the same adapters, bit for bit,
/// as the one that computed (and wrote) it.
#[test]
fn training_from_a_read_slow_cache_is_the_same_training() {
    let model = builtin("tiny").unwrap();
    let train_data = data(&model, 6, 6);
    let dir = tempfile::tempdir().unwrap();
    let mut adapters = Vec::new();
    for read_back in [false, true] {
        let start = initial_weights(&model, config(&model), 3).unwrap();
        let mut pass = SlowPass {
            cache: Some(dir.path()),
            ..SlowPass::default()
        };
        let mut trainer = Trainer::new(&model, start, &train_data, options(6), &mut pass).unwrap();
        match (pass.used.as_slice(), read_back) {
            ([CacheUse::Written(..)], false) | ([CacheUse::Read(_)], true) => {}
            (other, _) => panic!("pass {read_back}: {other:?}"),
        }
        for _ in 0..6 {
            trainer.train_step();
        }
        let bits: Vec<Vec<u32>> = trainer.gates[0]
            .adapters
            .tensors()
            .map(|t| t.iter().map(|v| v.to_bits()).collect())
            .collect();
        adapters.push(bits);
    }
    assert_eq!(adapters[0], adapters[1]);
}

/// A bridge trained jointly with gate 1's adapters lowers the training loss, its checkpoint loads
/// with the bridge and resumes exactly; with `bridge_only` the adapters stay bit for bit as given
/// while the bridge moves; a bridge-only run without a bridge, or with weight decay, is refused.
#[test]
fn bridge_trains_checkpoints_and_freezes_adapters_when_asked() {
    use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
    let model = builtin("tiny").unwrap();
    let train_data = data(&model, 12, 6);
    let bridge = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
    let start = || {
        initial_weights(&model, config(&model), 7)
            .unwrap()
            .with_bridge(&model.config, bridge.clone(), 8, 0.0)
            .unwrap()
    };
    let mut opts = options(16);
    opts.train_gates = vec![1];
    let mut trainer = new_trainer(&model, start(), &train_data, opts.clone()).unwrap();
    let before = trainer.evaluate_training_rows()[0];
    for _ in 0..8 {
        trainer.train_step();
    }
    let dir = tempfile::tempdir().unwrap();
    checkpoint::save(&trainer, dir.path()).unwrap();
    let loaded = M2r2Weights::load_dir(dir.path(), &model.config).unwrap();
    assert_eq!(loaded.config.bridge.as_ref(), Some(&bridge));
    let trained = loaded.bridge.as_ref().unwrap();
    assert!(
        trained.maps.values().all(|l| !l.is_zero()),
        "B moved off zero"
    );
    let mut resumed = checkpoint::resume(
        &model,
        dir.path(),
        &train_data,
        None,
        &mut SlowPass::default(),
    )
    .unwrap();
    for _ in 8..16 {
        trainer.train_step();
        resumed.train_step();
    }
    assert_eq!(
        resumed.weights(),
        trainer.weights(),
        "resume continues exactly"
    );
    let after = trainer.evaluate_training_rows()[0];
    assert!(after.kl < before.kl, "KL {} -> {}", before.kl, after.kl);

    // bridge only: the adapters are those given, bit for bit
    let given = trainer.weights();
    let mut frozen = opts.clone();
    frozen.bridge_only = true;
    let mut only = new_trainer(&model, given.clone(), &train_data, frozen.clone()).unwrap();
    for _ in 0..4 {
        only.train_step();
    }
    let w = only.weights();
    assert_eq!(w.accelerator, given.accelerator);
    assert_ne!(w.bridge, given.bridge);
    let no_bridge = initial_weights(&model, config(&model), 7).unwrap();
    let err = new_trainer(&model, no_bridge, &train_data, frozen.clone())
        .err()
        .unwrap();
    assert!(err.to_string().contains("no bridge"), "{err}");
    frozen.weight_decay = 0.1;
    let err = new_trainer(&model, given, &train_data, frozen)
        .err()
        .unwrap();
    assert!(err.to_string().contains("weight decay"), "{err}");
}
