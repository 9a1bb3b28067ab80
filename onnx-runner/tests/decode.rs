//! The library's ONNX decode loop (`onnx_runner::decode`, what `m2r2 run` drives) on tiny exports,
//! dynamic and static: the settings the export's M2R2 settings give, greedy and speculative
//! decoding with the reference's greedy tokens, and early exit refused by name.

use export::folder::{ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use onnx_runner::decode::{decode, settings};
use onnx_runner::ep::EpConfig;
use onnx_runner::manifest::ExportDir;
use reference::base::generate::greedy;
use reference::decode::drafting::DraftingRequest;
use reference::decode::mode::{DecodeRequest, Mode};
use reference::io::builtin;
use reference::m2r2::weights::M2r2Weights;

fn request(speculative: bool) -> DraftingRequest {
    DraftingRequest {
        speculative,
        gate: None,
        threshold: None,
        draft_len: None,
        dynamic_draft: false,
    }
}

#[test]
fn decode_gives_the_reference_tokens_on_dynamic_and_static_exports() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let prompt = [5, 4, 3, 2];
    let want = greedy(&model, &prompt, 12, &[]).unwrap();
    for static_cache in [None, Some(32)] {
        let dir = tempfile::tempdir().unwrap();
        let options = ExportOptions {
            model_name: "tiny".into(),
            opset: 17,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate: weights.config.draft_gate,
            static_cache,
            merge_adapters: false,
        };
        let written = ExportRequest {
            model: &model,
            tokenizer: None,
            m2r2: &weights,
            options,
            graphs: GraphKind::ALL.to_vec(),
            external_data: false,
        };
        export(&written, dir.path(), &mut |_| {}).unwrap();
        let exported = ExportDir::open(dir.path()).unwrap();
        let decode_request = DecodeRequest {
            prompt: &prompt,
            max_new_tokens: 12,
            stop_tokens: vec![],
            sampling: None,
        };
        for speculative in [false, true] {
            let s = settings(&exported, request(speculative)).unwrap();
            assert_eq!(s.draft_gate, exported.manifest.draft_gate);
            let mode = if speculative {
                Mode::Speculative
            } else {
                Mode::Greedy
            };
            assert_eq!(s.mode, mode);
            let run = decode(&exported, &EpConfig::cpu(), &s, &decode_request, true).unwrap();
            assert_eq!(run.run.tokens, want, "{static_cache:?}, {mode:?}");
            assert!(run.cuda_graph.is_none(), "no CUDA graphs on the CPU");
        }
        let mut early = settings(&exported, request(false)).unwrap();
        early.mode = Mode::EarlyExit;
        let err = decode(&exported, &EpConfig::cpu(), &early, &decode_request, false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("early exit is not exported"), "{err}");
    }
}
