//! The M2R2 goldens: round trips, self-checks, tampering reported where it happened, refusals.

use super::record::golden_early_exit_options;
use super::*;
use crate::base::model::Model;
use crate::decode::early_exit::{EarlyExitOptions, early_exit_generate};
use crate::decode::speculative::SpeculativeOptions;
use crate::golden::{DEFAULT_ATOL, Golden, TensorCheck, Tolerance};
use crate::io::builtin;
use crate::m2r2::exit_gate::gate_score;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use ndarray::{ArrayView1, Axis};
use safetensors::Dtype;

pub(super) fn setup(name: &str) -> (Model, M2r2Weights) {
    let model = builtin::builtin(name).unwrap();
    let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
    (model, weights)
}

/// A threshold that makes the built-in models exit at some steps and not at others.
fn ee_options(threshold: impl Into<ExitThreshold>) -> EarlyExitOptions {
    EarlyExitOptions {
        max_new_tokens: 0,
        stop_tokens: vec![],
        gate: GateKind::Arla,
        threshold: threshold.into(),
        kv_policy: KvPolicy::Exact,
        sampling: None,
    }
}

pub(super) fn spec_options(draft_length: DraftLength) -> SpeculativeOptions {
    SpeculativeOptions {
        max_new_tokens: 0,
        stop_tokens: vec![],
        draft_length,
        sampling: None,
    }
}

pub(super) fn round_trip(g: &Golden) -> Golden {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    g.write(&path).unwrap();
    let back = Golden::read(&path).unwrap();
    // NaN padding: compare through Debug, where NaN prints as NaN.
    assert_eq!(format!("{back:?}"), format!("{g:?}"));
    back
}

/// A threshold at the median over steps of the best ARLA score (never exiting), so that exits
/// and full runs both occur.
fn mixed_threshold(m2r2: M2r2<'_>, prompt: &[u32]) -> f32 {
    let g = Golden::record_early_exit(m2r2, "x", prompt, 12, &ee_options(2.0)).unwrap();
    let M2r2Record::EarlyExit { gate_scores, .. } = &g.m2r2.unwrap().record else {
        unreachable!()
    };
    let mut best: Vec<f32> = gate_scores
        .rows()
        .into_iter()
        .skip(1)
        .map(|r| r.fold(f32::MIN, |a, &b| a.max(b)))
        .collect();
    best.sort_by(f32::total_cmp);
    best[best.len() / 2]
}

/// `g` checks against the engine that recorded it with no difference at all.
fn assert_checks_exactly(g: &Golden, m2r2: M2r2<'_>) {
    let report = g.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    assert!(report.ok(), "{report:?}");
    assert!(
        report.entries.iter().all(|e| e.max_abs == 0.0),
        "{report:?}"
    );
}

#[test]
fn early_exit_round_trip_and_self_check() {
    for name in builtin::BUILTIN_NAMES {
        let (model, weights) = setup(name);
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [1, 2, 3];
        let tau = mixed_threshold(m2r2, &prompt);
        let g = Golden::record_early_exit(m2r2, name, &prompt, 12, &ee_options(tau)).unwrap();
        assert_eq!(g.format_version(), 3);
        let back = round_trip(&g);
        let M2r2Record::EarlyExit { exit_gate, .. } = &back.m2r2.as_ref().unwrap().record else {
            unreachable!()
        };
        assert!(
            exit_gate[1..].iter().any(|&e| e > 0),
            "{name}: some tokens exit"
        );
        assert!(exit_gate[1..].contains(&0), "{name}: some run all layers");
        assert_checks_exactly(&back, m2r2);
    }
}

/// Per-gate thresholds (gate 1 closed, the others at the mixed threshold): recorded as
/// `threshold` = `A,B,...`, read back, checked with no difference; a count that is not one per
/// gate, or text that is not numbers, is refused naming the metadata.
#[test]
fn early_exit_per_gate_thresholds_round_trip_and_check() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let prompt = [1, 2, 3];
    let tau = mixed_threshold(m2r2, &prompt);
    let j = weights.config.num_gates();
    assert!(j >= 2, "tiny has several gates");
    let mut per_gate = vec![tau; j];
    per_gate[0] = 2.0;
    let threshold = ExitThreshold::PerGate(per_gate);
    let g = Golden::record_early_exit(m2r2, "tiny", &prompt, 12, &ee_options(threshold.clone()))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    g.write(&path).unwrap();
    let back = round_trip(&g);
    let M2r2Record::EarlyExit {
        exit_gate,
        threshold: read,
        ..
    } = &back.m2r2.as_ref().unwrap().record
    else {
        unreachable!()
    };
    assert_eq!(read, &threshold);
    assert!(!exit_gate.contains(&1), "gate 1 is closed: {exit_gate:?}");
    assert!(exit_gate[1..].iter().any(|&e| e > 1), "later gates exit");
    assert_checks_exactly(&back, m2r2);
    for bad in [vec![tau.to_string(); j + 1].join(","), "2.0;0.5".into()] {
        g.write(&path).unwrap();
        rewrite(&path, |(_, meta)| {
            meta.insert("threshold".into(), bad.clone());
        });
        let err = Golden::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("g.safetensors")
                && err.contains(&format!("metadata `threshold` = `{bad}` is not valid")),
            "{err}"
        );
    }
}

/// Under `exact`, teacher-forced exit states give back the decoder's gate scores bit for bit:
/// the recomputation of `early_exit_logits` sees what the decoder saw.
#[test]
fn exact_policy_teacher_forcing_reproduces_the_decoder() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let prompt = [4, 5, 6];
    let tau = mixed_threshold(m2r2, &prompt);
    let mut options = golden_early_exit_options(&ee_options(tau), 12).unwrap();
    options.max_new_tokens = 12;
    let out = early_exit_generate(m2r2, &prompt, &options).unwrap();
    let seq: Vec<u32> = prompt.iter().chain(&out.tokens[..11]).copied().collect();
    let states = m2r2.all_exit_states(&seq).unwrap();
    let eps = model.config.rms_norm_eps as f32;
    for (i, t) in out.trace.iter().enumerate().skip(1) {
        let pos = prompt.len() - 1 + i;
        let us: Vec<ArrayView1<f32>> = states.iter().map(|(u, _)| u.row(pos)).collect();
        for (g, &score) in t.scores.iter().enumerate() {
            let logits = m2r2.exit_logits(us[g].insert_axis(Axis(0)));
            let again = gate_score(
                GateKind::Arla,
                weights.arla.as_ref(),
                &us[..=g],
                logits.row(0).as_slice().unwrap(),
                eps,
            )
            .unwrap();
            assert_eq!(again.to_bits(), score.to_bits(), "step {i} gate {}", g + 1);
        }
    }
}

#[test]
fn tampered_exit_gate_is_reported_at_its_step() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let prompt = [1, 2, 3];
    let tau = mixed_threshold(m2r2, &prompt);
    let mut g = Golden::record_early_exit(m2r2, "tiny", &prompt, 12, &ee_options(tau)).unwrap();
    let Some(M2r2Golden {
        record: M2r2Record::EarlyExit { exit_gate, .. },
        ..
    }) = &mut g.m2r2
    else {
        unreachable!()
    };
    let step = exit_gate.iter().rposition(|&e| e == 0).unwrap();
    exit_gate[step] = 1;
    let report = g.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    let entry = report
        .entries
        .iter()
        .find(|e| e.name == "exit_gate")
        .unwrap();
    assert!(!entry.ok && entry.at == vec![step], "{entry:?}");
    assert!(!report.ok());
}

#[test]
fn fast_kv_and_sampling_are_refused() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let mut options = ee_options(0.5);
    options.kv_policy = KvPolicy::FastKv;
    let err = Golden::record_early_exit(m2r2, "tiny", &[1], 4, &options).unwrap_err();
    assert!(err.to_string().contains("exact"), "{err}");
    let mut options = spec_options(DraftLength::Fixed(4));
    options.sampling = Some(crate::base::sampling::SamplingParams {
        temperature: 1.0,
        top_k: None,
        top_p: None,
        seed: 0,
    });
    let err = Golden::record_speculative(m2r2, "tiny", &[1], 4, 1, None, &options).unwrap_err();
    assert!(err.to_string().contains("greedy"), "{err}");
}

#[test]
fn speculative_round_trip_and_self_check() {
    for name in builtin::BUILTIN_NAMES {
        let (model, weights) = setup(name);
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [7, 8, 9];
        let lengths = [
            DraftLength::Fixed(4),
            DraftLength::Dynamic {
                max: 4,
                gate: GateKind::Arla,
                threshold: 0.5,
            },
        ];
        for draft_length in lengths {
            let gate =
                matches!(draft_length, DraftLength::Dynamic { .. }).then_some(GateKind::Arla);
            let options = spec_options(draft_length);
            let g = Golden::record_speculative(m2r2, name, &prompt, 13, 1, gate, &options).unwrap();
            let back = round_trip(&g);
            // Lossless: the verify logits are the base model's greedy ones, bit for bit.
            let greedy = Golden::record_greedy(&model, name, &prompt, 13).unwrap();
            assert_eq!(back.tokens, greedy.tokens);
            assert!(
                back.logits
                    .iter()
                    .zip(&greedy.logits)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            assert_checks_exactly(&back, m2r2);
        }
    }
}

#[test]
fn tampered_accepted_count_is_reported_at_its_round() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(4));
    let mut g = Golden::record_speculative(m2r2, "tiny", &[1, 2], 12, 1, None, &options).unwrap();
    let Some(M2r2Golden {
        record: M2r2Record::Speculative { rounds, .. },
        ..
    }) = &mut g.m2r2
    else {
        unreachable!()
    };
    assert!(rounds.accepted.len() >= 3);
    rounds.accepted[2] += 1;
    let report = g.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    let entry = |name: &str| report.entries.iter().find(|e| e.name == name).unwrap();
    // one line: the first divergence, at round 2, what differs and both values
    let rounds = entry("rounds");
    let d = rounds.divergence.as_ref().unwrap();
    assert!(
        !rounds.ok && d.row == 2 && d.what == "accepted",
        "{rounds:?}"
    );
    assert_eq!(d.golden, vec![d.recomputed[0] + 1]);
    assert_eq!(rounds.first_round, Some(2));
    // the decode's tokens and the base model's logits are untouched
    assert!(entry("tokens").ok && entry("logits").ok, "{report:?}");
}

/// A golden whose file is older than a tensor reports that tensor as skipped, saying why, and
/// checks the rest: a speculative golden of format version 2 has no verifier or draft logits.
#[test]
fn version_2_speculative_files_check_what_they_have() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(2));
    let mut g = Golden::record_speculative(m2r2, "tiny", &[1, 2], 10, 1, None, &options).unwrap();
    g.version = 2;
    g.stop_tokens = None;
    g.max_steps = None;
    if let Some(M2r2Golden {
        record: M2r2Record::Speculative { graphs, .. },
        ..
    }) = &mut g.m2r2
    {
        *graphs = None;
    }
    let back = round_trip(&g);
    assert_eq!((back.version, back.stop_tokens.clone()), (2, None));
    let report = back.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    assert!(report.ok(), "{report:?}");
    let skipped: Vec<&str> = report
        .entries
        .iter()
        .filter(|e| e.skipped.is_some())
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(skipped, ["verify_logits", "draft_logits", "round_scores"]);
    let why = report
        .entries
        .iter()
        .find(|e| e.name == "verify_logits")
        .unwrap();
    assert!(why.note.contains("format version 2"), "{why:?}");
}

/// Every graph's own output is checked: logits of a verified row or a proposal that were never
/// emitted (a rejected draft) are compared too, and reported at their row and round.
#[test]
fn every_verified_row_and_proposal_is_checked() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(3));
    let g = Golden::record_speculative(m2r2, "tiny", &[1, 2], 12, 1, None, &options).unwrap();
    let Some(M2r2Record::Speculative { rounds, graphs, .. }) = g.m2r2.as_ref().map(|m| &m.record)
    else {
        unreachable!()
    };
    let graphs = graphs.as_ref().unwrap();
    // one row per fed token, the prompt's first; one per proposal
    let fed: usize = (0..rounds.len())
        .map(|r| rounds.drafted_in(r).len() + 1)
        .sum();
    assert_eq!(graphs.verify_logits.nrows(), 1 + fed);
    assert_eq!(graphs.draft_logits.nrows(), rounds.proposal_rounds().len());
    // the prompt's row and each emitted row are the logits the tokens came from
    assert_eq!(graphs.verify_logits.row(0), g.logits.row(0));
    for (name, row) in [("verify_logits", 1 + fed - 1), ("draft_logits", 1)] {
        let mut tampered = g.clone();
        let Some(M2r2Golden {
            record: M2r2Record::Speculative { graphs, .. },
            ..
        }) = &mut tampered.m2r2
        else {
            unreachable!()
        };
        let graphs = graphs.as_mut().unwrap();
        let target = match name {
            "verify_logits" => &mut graphs.verify_logits,
            _ => &mut graphs.draft_logits,
        };
        target[[row, 5]] += 0.5;
        let report = tampered.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
        let bad: Vec<&TensorCheck> = report.entries.iter().filter(|e| !e.ok).collect();
        assert_eq!(bad.len(), 1, "{report:?}");
        let e = bad[0];
        assert_eq!(
            (e.name.as_str(), e.first_row, e.rows_over),
            (name, Some(row), 1)
        );
        assert_eq!(e.graph, "reference");
        let round_of = match name {
            "verify_logits" => rounds.verify_rounds()[row],
            _ => rounds.proposal_rounds()[row],
        };
        assert_eq!(e.first_round, round_of);
        assert!((e.row_max_abs[row] - 0.5).abs() < 1e-4, "{e:?}");
    }
}

/// With stop tokens, a golden stops after the first one, as a deployment does, records which,
/// and checks along what it recorded.
#[test]
fn goldens_stop_at_end_of_turn() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let free = Golden::record_greedy(&model, "tiny", &[1, 2], 12).unwrap();
    // stop at the fifth token the model emits
    let stop = free.tokens[4];
    let first = free.tokens.iter().position(|&t| t == stop).unwrap();
    let g = Golden::record_greedy_until(&model, "tiny", &[1, 2], 12, &[stop]).unwrap();
    assert_eq!(g.tokens, free.tokens[..=first]);
    assert_eq!(
        (g.stop_tokens.clone(), g.max_steps),
        (Some(vec![stop]), Some(12))
    );
    let back = round_trip(&g);
    assert_eq!(back, g);
    assert!(back.check(&model, DEFAULT_ATOL).unwrap().ok());
    let mut options = spec_options(DraftLength::Fixed(2));
    options.stop_tokens = vec![stop];
    let s = Golden::record_speculative(m2r2, "tiny", &[1, 2], 12, 1, None, &options).unwrap();
    assert_eq!(
        s.tokens, g.tokens,
        "speculation is lossless, stops included"
    );
    let report = round_trip(&s).check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    assert!(report.ok(), "{report:?}");
    // the golden that ran on, compared with the one that stopped: the common tokens, and a stop
    // line that is OK (the longer one was recorded without stopping)
    let report = free
        .compare_to(&g, Tolerance::absolute(0.0), &|_| None)
        .unwrap();
    let stop_line = report.entries.iter().find(|e| e.name == "stop").unwrap();
    assert!(report.ok() && stop_line.ok, "{report:?}");
}

/// A version-1 greedy file (as older m2r2 wrote it) still reads and checks.
#[test]
fn version_1_greedy_files_still_read_and_check() {
    let (model, weights) = setup("tiny");
    let mut g = Golden::record_greedy(&model, "tiny", &[3, 1, 4], 5).unwrap();
    // as older m2r2 wrote it: no stop tokens, budget or pins
    (g.version, g.stop_tokens, g.max_steps) = (1, None, None);
    assert_eq!(g.format_version(), 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.safetensors");
    g.write(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["format_version"], "1");
    let back = Golden::read(&path).unwrap();
    assert_eq!(back, g);
    assert!(back.check(&model, DEFAULT_ATOL).unwrap().ok());
    let report = back
        .check_m2r2(M2r2::new(&model, &weights), DEFAULT_ATOL)
        .unwrap();
    assert!(report.ok());
}

/// `check_speculative_on` checks what the engine was built from before running it: the draft
/// gate, the M2R2 weights (an engine that cannot name them is refused), the mode.
#[test]
fn speculative_engine_refusals() {
    use crate::base::generate::ReferenceGreedy;
    use crate::decode::draft_verify::ReferenceSpeculation;
    use crate::golden::Tolerance;
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(2));
    let g = Golden::record_speculative(m2r2, "tiny", &[1, 2], 6, 1, None, &options).unwrap();
    let hash = WeightsId::of(&weights);
    let check = |draft_gate: usize, hash: Option<&WeightsId>| {
        let mut speculation = ReferenceSpeculation::new(m2r2, draft_gate, None, 32).unwrap();
        let engine = SpeculativeEngine {
            speculation: &mut speculation,
            greedy: &mut ReferenceGreedy::new(&model),
            config: &model.config,
            weights: hash,
            draft_gate,
            graphs: EngineGraphs::REFERENCE,
        };
        g.check_speculative_on(engine, Tolerance::absolute(DEFAULT_ATOL))
    };
    assert!(check(1, Some(&hash)).unwrap().ok());
    let err = check(2, Some(&hash)).unwrap_err().to_string();
    assert!(
        err.contains("drafts at gate 1, the engine at gate 2"),
        "{err}"
    );
    let err = check(1, None).unwrap_err().to_string();
    assert!(err.contains("does not say which M2R2 weights"), "{err}");
    let other = WeightsId {
        hash: "0123456789abcdef".into(),
        without_defaults: Some("0123456789abcdef".into()),
    };
    let err = check(1, Some(&other)).unwrap_err().to_string();
    assert!(err.contains("not the ones this golden"), "{err}");
    let greedy = Golden::record_greedy(&model, "tiny", &[1, 2], 3).unwrap();
    let mut speculation = ReferenceSpeculation::new(m2r2, 1, None, 32).unwrap();
    let engine = SpeculativeEngine {
        speculation: &mut speculation,
        greedy: &mut ReferenceGreedy::new(&model),
        config: &model.config,
        weights: Some(&hash),
        draft_gate: 1,
        graphs: EngineGraphs::REFERENCE,
    };
    let err = greedy
        .check_speculative_on(engine, Tolerance::absolute(DEFAULT_ATOL))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not `speculative`"), "{err}");
}

/// A golden's tensors `(name, dtype, shape, bytes)` and metadata, as written.
pub(super) type RawGolden = (
    Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    std::collections::HashMap<String, String>,
);

/// An edit of a golden file setting element `index` of the I64 tensor `name` to `value`.
pub(super) fn set_i64(name: &'static str, index: usize, value: i64) -> impl Fn(&mut RawGolden) {
    move |(tensors, _): &mut RawGolden| {
        let t = tensors.iter_mut().find(|t| t.0 == name).unwrap();
        t.3[8 * index..8 * index + 8].copy_from_slice(&value.to_le_bytes());
    }
}

/// An edit of a golden file setting metadata `key` to `value`.
pub(super) fn set_meta(key: &'static str, value: &'static str) -> impl Fn(&mut RawGolden) {
    move |(_, meta): &mut RawGolden| {
        meta.insert(key.into(), value.into());
    }
}

/// Write `g` to `path`, edit it, and check that reading it fails naming the file and `needle`.
pub(super) fn refused_after(
    g: &Golden,
    path: &std::path::Path,
    edit: &dyn Fn(&mut RawGolden),
    needle: &str,
) {
    g.write(path).unwrap();
    rewrite(path, edit);
    let err = Golden::read(path).unwrap_err().to_string();
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(
        err.contains(name) && err.contains(needle),
        "{needle}: {err}"
    );
}

/// Rewrite the golden at `path` through `edit` of its raw tensors and metadata.
pub(super) fn rewrite(path: &std::path::Path, edit: impl FnOnce(&mut RawGolden)) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    let mut raw = (tensors, meta.metadata().clone().unwrap());
    edit(&mut raw);
    let (tensors, metadata) = raw;
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            let view = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
            (n.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, Some(metadata), path).unwrap();
}

/// A speculative golden's `draft_max` sizes the padded round tensors `[R, M]` and `[R, M + 1]`
/// (and those a check recomputes). With no rounds the file's bytes do not bound it: refused past
/// isize::MAX, and a golden of more than one token must have rounds.
#[test]
fn draft_max_not_bounded_by_the_rounds_is_refused() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(2));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let no_rounds = |max: usize| {
        move |(tensors, meta): &mut RawGolden| {
            meta.insert("draft_max".into(), max.to_string());
            for (name, _, shape, data) in tensors.iter_mut() {
                *shape = match name.as_str() {
                    "round_accepted" | "round_base_token" => vec![0],
                    "round_drafted" => vec![0, max],
                    "round_scores" => vec![0, max.wrapping_add(1)],
                    _ => continue,
                };
                data.clear();
            }
        }
    };
    // One token: no rounds, as recorded; any draft_max whose padded tensors can exist reads.
    let one = Golden::record_speculative(m2r2, "tiny", &[1], 1, 1, None, &options).unwrap();
    one.write(&path).unwrap();
    rewrite(&path, no_rounds(1 << 40));
    let back = Golden::read(&path).unwrap();
    // (a check refuses it: the cache it needs exceeds the context)
    assert!(back.check_m2r2(m2r2, DEFAULT_ATOL).is_err());
    for max in [isize::MAX as usize, usize::MAX] {
        one.write(&path).unwrap();
        rewrite(&path, no_rounds(max));
        let err = Golden::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("g.safetensors")
                && err.contains(&format!("metadata `draft_max` = `{max}` is not valid")),
            "{err}"
        );
    }
    // Four tokens with their rounds removed.
    let four = Golden::record_speculative(m2r2, "tiny", &[1], 4, 1, None, &options).unwrap();
    four.write(&path).unwrap();
    rewrite(&path, no_rounds(1 << 40));
    let err = Golden::read(&path).unwrap_err().to_string();
    assert!(
        err.contains("g.safetensors")
            && err.contains("`round_accepted` has no rounds for 4 tokens"),
        "{err}"
    );
}

/// Goldens that draft at another gate, or exit by another rule, are not compared: their rounds
/// and scores would differ for that reason alone, and a NOT OK would hide it.
#[test]
fn compare_refuses_other_draft_gates_and_exit_rules() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let tol = Tolerance::absolute(DEFAULT_ATOL);
    let options = spec_options(DraftLength::Fixed(2));
    let at = |draft_gate| {
        Golden::record_speculative(m2r2, "tiny", &[1, 2, 3], 8, draft_gate, None, &options).unwrap()
    };
    assert!(at(1).compare_to(&at(1), tol, &|_| None).unwrap().ok());
    let err = at(1).compare_to(&at(2), tol, &|_| None).unwrap_err();
    assert!(
        err.to_string()
            .contains("draft at different gates (1 vs 2)"),
        "{err}"
    );
    // (recorded goldens exit with the exact KV policy only)
    let exit = |threshold: f32, gate| {
        let options = EarlyExitOptions {
            gate,
            ..ee_options(threshold)
        };
        Golden::record_early_exit(m2r2, "tiny", &[1, 2, 3], 8, &options).unwrap()
    };
    let arla = exit(0.5, GateKind::Arla);
    assert!(arla.compare_to(&arla, tol, &|_| None).unwrap().ok());
    for (other, said) in [
        (exit(0.6, GateKind::Arla), "gate arla at 0.6, exact KV"),
        (
            exit(0.5, GateKind::Confidence),
            "gate confidence at 0.5, exact KV",
        ),
    ] {
        let err = arla.compare_to(&other, tol, &|_| None).unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("exit by different rules (gate arla at 0.5, exact KV vs ")
                && err.contains(said),
            "{err}"
        );
    }
}

/// A version-3 speculative golden whose `format_version` is edited down to 2 still holds the
/// graphs' logits: refused, since a check would skip them as "not recorded".
#[test]
fn a_version_edited_down_over_recorded_logits_is_refused() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(2));
    let g = Golden::record_speculative(m2r2, "tiny", &[1, 2], 6, 1, None, &options).unwrap();
    let dir = tempfile::tempdir().unwrap();
    refused_after(
        &g,
        &dir.path().join("g.safetensors"),
        &set_meta("format_version", "2"),
        "holds `verify_logits`, which format version 2 does not record",
    );
}

/// Speculative goldens of one prompt that differ only in their budget, or in stopping at end of
/// turn where the other ran on, compare OK (chain, dynamic chain, token tree): the rounds both
/// have are compared, the shorter decode's last round whole, and where they stopped is the `stop`
/// line's verdict. A round that differs there is still found, named against `actual`.
#[test]
fn goldens_of_other_budgets_and_stops_compare_over_their_common_rounds() {
    let (model, weights) = setup("tiny-moe");
    let m2r2 = M2r2::new(&model, &weights);
    let prompt = [5, 6, 7];
    let record = |how: usize, steps: usize, stops: &[u32]| -> Golden {
        let (length, gate) = match how {
            0 => (DraftLength::Fixed(2), None),
            1 => {
                let dynamic = DraftLength::Dynamic {
                    max: 4,
                    gate: GateKind::Arla,
                    threshold: 0.5,
                };
                (dynamic, Some(GateKind::Arla))
            }
            _ => {
                let recipe = TreeRecipe::fixed(1, &[2, 1, 1]);
                let g =
                    Golden::record_tree_drafting(m2r2, "tiny-moe", &prompt, steps, &recipe, stops);
                return g.unwrap();
            }
        };
        let options = SpeculativeOptions {
            stop_tokens: stops.to_vec(),
            ..spec_options(length)
        };
        Golden::record_speculative(m2r2, "tiny-moe", &prompt, steps, 1, gate, &options).unwrap()
    };
    let tol = Tolerance::absolute(DEFAULT_ATOL);
    fn base_token(g: &mut Golden) -> &mut Vec<i64> {
        match &mut g.m2r2.as_mut().unwrap().record {
            M2r2Record::Speculative { rounds, .. } => &mut rounds.base_token,
            M2r2Record::SpeculativeTree { rounds, .. } => &mut rounds.base_token,
            M2r2Record::EarlyExit { .. } => unreachable!(),
        }
    }
    for how in 0..3 {
        let long = record(how, 12, &[]);
        let short = record(how, 7, &[]);
        // stopped at a token the long decode first emits at step k
        let k = (2..12)
            .find(|&k| !long.tokens[..k].contains(&long.tokens[k]))
            .unwrap();
        let stopped = record(how, 12, &[long.tokens[k]]);
        assert_eq!(stopped.tokens.len(), k + 1);
        for other in [&short, &stopped] {
            for (a, b) in [(&long, other), (other, &long)] {
                let report = a.compare_to(b, tol, &|_| None).unwrap();
                assert!(report.ok(), "{how}: {report:?}");
                let rounds = report.entries.iter().find(|e| e.name == "rounds").unwrap();
                assert!(rounds.note.contains("rounds compared, equal"), "{rounds:?}");
            }
        }
        // the shorter decode's last round is compared
        let mut edited = short.clone();
        let last = base_token(&mut edited).len() - 1;
        base_token(&mut edited)[last] += 1;
        let report = long.compare_to(&edited, tol, &|_| None).unwrap();
        let rounds = report.entries.iter().find(|e| e.name == "rounds").unwrap();
        assert_eq!(rounds.first_round, Some(last), "{how}: {rounds:?}");
        assert!(
            rounds.note.contains(", actual ") && !rounds.note.contains("recomputed"),
            "{rounds:?}"
        );
    }
}

/// A chain golden's accepted counts must be counts of its drafts and emit its tokens: otherwise a
/// check would replay rounds past the cache it sizes from the tokens (once `sequence needs 17
/// positions but the context holds 16`, for an edit of `round_accepted`).
#[test]
fn accepted_counts_that_do_not_emit_the_tokens_are_refused() {
    let (model, weights) = setup("tiny-moe");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(2));
    let g =
        Golden::record_speculative(m2r2, "tiny-moe", &[5, 6, 7], 10, 1, None, &options).unwrap();
    let Some(M2r2Record::Speculative { rounds, .. }) = g.m2r2.as_ref().map(|m| &m.record) else {
        unreachable!()
    };
    // every draft refused: 9 rounds after the prompt's token, one token each
    assert_eq!(rounds.accepted, vec![0; 9]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    refused_after(
        &g,
        &path,
        &set_i64("round_accepted", 2, 1),
        "tensor `round_accepted` does not agree with `tokens`: the prompt's token and 9 rounds \
         of accepted drafts and a base token each make 10 tokens before the last round and 11 \
         with it, but `tokens` holds 10",
    );
    refused_after(
        &g,
        &path,
        &set_i64("round_accepted", 2, 3),
        "tensor `round_accepted`: round 2 accepted 3 of its 2 drafts",
    );
    refused_after(
        &g,
        &path,
        &set_i64("round_accepted", 0, -1),
        "tensor `round_accepted`: round 0 accepted -1 of its 2 drafts",
    );
}

/// A chain's drafted token that differs where the golden's draft scored both candidates within
/// the tolerance is a near tie (an f16 export may swap them): past the accepted drafts the round
/// is equal, named in the note; among them, or farther apart, the round diverges, a tie said so.
#[test]
fn near_ties_of_a_chain_draft_are_told_from_faults() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let options = spec_options(DraftLength::Fixed(3));
    // a prompt whose rounds accept all of their drafts and none (tiny repeats tokens)
    let g = Golden::record_speculative(m2r2, "tiny", &[7, 8, 9], 14, 1, None, &options).unwrap();
    let Some(M2r2Record::Speculative { rounds, graphs, .. }) = g.m2r2.as_ref().map(|m| &m.record)
    else {
        unreachable!()
    };
    let graphs = graphs.as_ref().unwrap();
    // draft `j` of round `r` swapped for another token with its logit `gap` below the golden's,
    // the drafts after it drafted from the other token
    let swapped = |r: usize, j: usize, gap: f32| {
        let mut got = rounds.clone();
        let want = rounds.drafted[[r, j]];
        let other = (0..model.config.vocab_size as i64)
            .find(|&t| t != want && !rounds.drafted.row(r).iter().any(|&x| x == t))
            .unwrap();
        got.drafted[[r, j]] = other;
        for k in j + 1..rounds.drafted_in(r).len() {
            got.drafted[[r, k]] = (other + k as i64) % model.config.vocab_size as i64;
        }
        let row = rounds
            .proposal_rounds()
            .iter()
            .position(|&p| p == Some(r))
            .unwrap()
            + j;
        let mut logits = graphs.draft_logits.clone();
        logits[[row, other as usize]] = logits[[row, want as usize]] - gap;
        (got, logits)
    };
    let check = |got: &RoundTensors, logits: &ndarray::Array2<f32>| {
        let ties = DraftTies {
            draft_logits: logits,
            tol: Tolerance::absolute(1e-3),
        };
        compare_rounds("engine", rounds, got, Some(&ties), Against::Recomputed)
    };
    // a round that rejected a draft: its first rejected draft, not emitted
    let r = (0..rounds.len())
        .find(|&r| (rounds.accepted[r] as usize) < rounds.drafted_in(r).len())
        .unwrap();
    let j = rounds.accepted[r] as usize;
    let (got, logits) = swapped(r, j, 5e-4);
    let e = check(&got, &logits);
    assert!(e.ok, "{e:?}");
    assert!(
        e.note
            .contains(&format!("near ties of the draft (candidates whose golden draft logits are within the tolerance swapped, the same tokens emitted): round {r} draft {j} (5.0e-4 apart)")),
        "{}",
        e.note
    );
    // without the golden's logits, or farther apart than 2 x atol: a divergence
    assert!(!compare_rounds("engine", rounds, &got, None, Against::Recomputed).ok);
    let (got, logits) = swapped(r, j, 3e-3);
    let d = check(&got, &logits).divergence.unwrap();
    assert_eq!((d.row, d.what.as_str()), (r, "drafted"));
    // an accepted draft: the round emitted another token, a divergence named as a tie
    let r = (0..rounds.len()).find(|&r| rounds.accepted[r] > 0).unwrap();
    let (got, logits) = swapped(r, 0, 0.0);
    let d = check(&got, &logits).divergence.unwrap();
    assert_eq!(d.row, r);
    assert!(
        d.what
            .contains("draft 0, a near tie of the draft: 0.0e0 apart"),
        "{}",
        d.what
    );
}

/// `golden compare` tells near ties by the first file's draft logits, for chains and trees: a
/// deployment's golden that swapped two near-equal candidates of the draft, off what the round
/// emitted, is equal.
#[test]
fn file_compare_tells_near_ties_by_the_first_files_draft() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    // a prompt whose chain rounds reject drafts (tiny repeats tokens)
    let (prompt, vocab) = ([7, 8, 9], model.config.vocab_size as i64);
    let chain = Golden::record_speculative(
        m2r2,
        "tiny",
        &prompt,
        14,
        1,
        None,
        &spec_options(DraftLength::Fixed(3)),
    )
    .unwrap();
    let recipe = TreeRecipe::fixed(1, &[2, 1, 1]);
    let tree = Golden::record_tree_drafting(m2r2, "tiny", &prompt, 14, &recipe, &[]).unwrap();
    for mut golden in [chain, tree] {
        let mut deployed = golden.clone();
        // a drafted token the round did not emit becomes one no draft of the round holds, its
        // logit in the golden's draft row set 5e-4 under the golden token's
        let (row, want, other) = match (
            &mut golden.m2r2.as_mut().unwrap().record,
            &mut deployed.m2r2.as_mut().unwrap().record,
        ) {
            (
                M2r2Record::Speculative { rounds, .. },
                M2r2Record::Speculative { rounds: got, .. },
            ) => {
                let r = (0..rounds.len())
                    .find(|&r| (rounds.accepted[r] as usize) < rounds.drafted_in(r).len())
                    .unwrap();
                let j = rounds.accepted[r] as usize;
                let other = (0..vocab)
                    .find(|&t| !rounds.drafted.row(r).iter().any(|&x| x == t))
                    .unwrap();
                got.drafted[[r, j]] = other;
                let row = rounds.proposal_rounds().iter().position(|&p| p == Some(r));
                (row.unwrap() + j, rounds.drafted[[r, j]], other)
            }
            (
                M2r2Record::SpeculativeTree { rounds, .. },
                M2r2Record::SpeculativeTree { rounds: got, .. },
            ) => {
                // node 2, the root's second candidate, off the accepted path; the nodes below
                // it drafted from the other token
                let tree = &rounds.trees[0];
                let r = (0..rounds.len())
                    .find(|&r| !tree.path(rounds.node[r] as usize).contains(&2))
                    .unwrap();
                let other = (0..vocab)
                    .find(|&t| !rounds.tokens.row(r).iter().any(|&x| x == t))
                    .unwrap();
                got.tokens[[r, 2]] = other;
                for d in (3..tree.nodes()).filter(|&d| tree.path(d).contains(&2)) {
                    got.tokens[[r, d]] = (other + d as i64) % vocab;
                }
                let parent = tree.parent(2).unwrap();
                let row = rounds.draft_rows().iter().position(|&p| p == (r, parent));
                (row.unwrap(), rounds.tokens[[r, 2]], other)
            }
            _ => unreachable!(),
        };
        let tol = Tolerance::absolute(1e-3);
        let unexcused = golden.compare_to(&deployed, tol, &|_| None).unwrap();
        assert!(!unexcused.ok(), "{unexcused:?}");
        let graphs = match &mut golden.m2r2.as_mut().unwrap().record {
            M2r2Record::Speculative { graphs, .. } => graphs.as_mut().unwrap(),
            M2r2Record::SpeculativeTree { graphs, .. } => graphs,
            M2r2Record::EarlyExit { .. } => unreachable!(),
        };
        let logits = &mut graphs.draft_logits;
        logits[[row, other as usize]] = logits[[row, want as usize]] - 5e-4;
        // the deployment's draft logits are the golden's: only the golden's are edited here
        let report = golden.compare_to(&deployed, tol, &|_| None);
        let report = report.unwrap();
        let rounds = report.entries.iter().find(|e| e.name == "rounds").unwrap();
        assert!(rounds.ok, "{rounds:?}");
        assert!(rounds.note.contains("(5.0e-4 apart)"), "{}", rounds.note);
    }
}
