//! `golden check --onnx DIR`: replay goldens on an export through ONNX Runtime, every graph
//! checked on its own. Greedy goldens by teacher forcing `model.onnx`; speculative goldens by the
//! runner's speculative loop (tokens and rounds), the recorded rounds replayed on `draft.onnx` /
//! `verifier.onnx` (their logits and gate scores row by row) and `model.onnx` teacher-forced
//! (logits); token-tree goldens the same way through the reference's tree loop on the runner's
//! tree backend (`tree_speculate` over `OnnxSpeculation`). Early-exit goldens are refused: the
//! runner has no early-exit decoding.

use super::{CheckArgs, ChosenTolerance};
use crate::cli::args::onnx::EpArgs;
use anyhow::{Context, Result, bail};
use onnx_runner::greedy::OnnxModel;
use onnx_runner::manifest::{ExportDir, GraphKind};
use onnx_runner::speculation::OnnxSpeculation;
use reference::golden::{
    CheckReport, EngineGraphs, Golden, M2r2Golden, M2r2Record, SpeculativeEngine, TreeEngine,
};
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::exit_gate::GateKind;
use std::path::Path;

/// Default `--atol` of a check on an f16 export: f16 weights move SmolLM2's logits by up to 2.6e-2
/// and tiny's by 1.4e-2 against the f32 reference (docs/GOLDEN.md); twice the larger.
const F16_EXPORT_ATOL: f32 = 5e-2;
/// Default `--atol` of a check on an f32 export: ONNX Runtime's other summation order moved
/// SmolLM2's logits by up to 7.7e-5 (docs/GOLDEN.md); 2.6 times that.
const F32_EXPORT_ATOL: f32 = 2e-4;

/// What the report calls the export's graphs.
const GRAPHS: EngineGraphs<'static> = EngineGraphs {
    greedy: "model.onnx",
    draft: "draft.onnx",
    verify: "verifier.onnx",
    decode: "feed+draft+verifier.onnx",
};

/// [`GRAPHS`] of an export without feed.onnx (draft.onnx feeds the positions it does not propose
/// from).
const GRAPHS_WITHOUT_FEED: EngineGraphs<'static> = EngineGraphs {
    decode: "draft+verifier.onnx",
    ..GRAPHS
};

/// When a golden's draft head (read off its draft logits) is not the export's: what differs and
/// how to make them agree. `None` when the heads agree or the golden cannot say.
fn head_difference(recorded: &M2r2Golden, export: &ExportDir) -> Option<String> {
    let golden = recorded.recorded_draft_head()?;
    let exported = export.draft_head.as_ref().map(|h| &h.tokens);
    if golden.as_ref() == exported {
        return None;
    }
    let golden_head = match &golden {
        Some(ids) => format!("a pruned draft head of {} tokens", ids.len()),
        None => "the full draft head".into(),
    };
    let (export_head, fix) = match (&golden, exported) {
        (Some(_), None) => (
            "none (its draft.onnx scores the whole vocabulary)".to_string(),
            "export with --draft-head on from the --m2r2 folder the golden was recorded with, or \
             record the golden with --draft-head off",
        ),
        (None, Some(ids)) => (
            format!("a pruned draft head of {} tokens", ids.len()),
            "export with --draft-head off, or record the golden with the export's draft head \
             (--draft-head on)",
        ),
        (_, ids) => (
            format!(
                "another pruned draft head, of {} tokens",
                ids.map_or(0, Vec::len)
            ),
            "export from the --m2r2 folder (and its draft_head.json) the golden was recorded with",
        ),
    };
    Some(format!(
        "the draft head differs: the golden was recorded with {golden_head}, export {} has \
         {export_head}; {fix}",
        export.dir.display()
    ))
}

/// The ONNX Runtime side of `check --onnx`: the export and its sessions, opened once for every
/// file of a suite (the draft and verifier graphs when the first speculative golden needs them).
pub(super) struct OnnxEngine {
    export: ExportDir,
    ep_args: EpArgs,
    model: OnnxModel,
    /// The speculative graphs, loaded for the gate they score (ARLA, confidence, entropy or none)
    /// and the rows one verification runs (a chain's drafts, a tree's drafted nodes: TensorRT's
    /// profiles depend on it).
    speculation: Option<(Option<GateKind>, usize, OnnxSpeculation)>,
    /// `export DIR (f32 weights) on ONNX Runtime 1.31.1, cpu execution provider` (with `, static
    /// KV cache of L positions` after the weights for a static export)
    pub(super) name: String,
    pub(super) tokenizer: Option<Tokenizer>,
    /// The export's weights precision (`f32`, `f16`).
    pub(super) dtype: String,
    pub(super) ort_version: String,
    pub(super) ep_name: String,
}

impl OnnxEngine {
    pub(super) fn open(args: &CheckArgs, dir: &Path) -> Result<Self> {
        let export = ExportDir::open(dir)?;
        let runtime = onnx_runner::runtime::init()?;
        let ep = args.ep.config(&export, export.manifest.m2r2.draft_len)?;
        let model = OnnxModel::load(&export, &ep)?;
        let ep_name = model.session().ep_used().name().to_string();
        let dtype = export.manifest.weights_dtype.clone();
        let cache = match &export.manifest.static_cache {
            Some(sc) => format!(", static KV cache of {} positions", sc.l_max),
            None => String::new(),
        };
        let name = format!(
            "export {} ({dtype} weights{cache}) on ONNX Runtime {}, {ep_name} execution provider",
            dir.display(),
            runtime.version,
        );
        let tokenizer = export.tokenizer()?;
        Ok(OnnxEngine {
            export,
            ep_args: args.ep.clone(),
            model,
            speculation: None,
            name,
            tokenizer,
            dtype,
            ort_version: runtime.version.clone(),
            ep_name,
        })
    }

    /// The tolerance this export gets when neither the command line nor the golden pins one.
    pub(super) fn default_atol(&self) -> (f32, &'static str) {
        match self.dtype.as_str() {
            "f16" => (F16_EXPORT_ATOL, "f16 export default"),
            _ => (F32_EXPORT_ATOL, "f32 export default"),
        }
    }

    /// Refuse, before any run, a golden longer than a static export's buffers: every token but
    /// the last is fed, and a chain golden's rounds draft up to its longest draft past them
    /// ([`Golden::positions`], the count of `run` and of the reference's check). Token-tree
    /// goldens are left to the tree loop, which counts their scratch slots too before its first
    /// run.
    fn check_room(&self, golden: &Golden) -> Result<()> {
        if golden.tree_recipe().is_some() {
            return Ok(());
        }
        let (prompt, steps) = (golden.prompt_tokens.len(), golden.tokens.len());
        let mut why = format!("a golden of {prompt} prompt tokens and {steps} steps");
        let kind = match golden.speculative_gates() {
            Some(_) => {
                why += &format!(
                    " (its rounds draft up to {} positions past its last token)",
                    golden.draft_max()
                );
                GraphKind::Verifier
            }
            None => GraphKind::Model,
        };
        let needed = golden.positions()?;
        let fix = "check a golden of fewer steps";
        Ok(self.export.check_room(kind, needed, &why, fix)?)
    }

    /// Replay `golden` in its recorded mode.
    pub(super) fn check(&mut self, golden: &Golden, tol: &ChosenTolerance) -> Result<CheckReport> {
        self.check_room(golden)?;
        let manifest = &self.export.manifest;
        let dir = self.export.dir.display();
        let Some((draft_gate, gate)) = golden.speculative_gates() else {
            if golden.m2r2.is_some() {
                bail!(
                    "`{}` goldens cannot be checked on ONNX Runtime: the export has no per-gate exit \
                     graphs and the runner no early-exit decoding loop (it runs greedy and \
                     speculative decoding); check this golden with the reference (drop --onnx)",
                    golden.mode
                );
            }
            return Ok(golden.check_on(
                &mut self.model,
                &manifest.config,
                tol.tol,
                GRAPHS.greedy,
            )?);
        };
        let Some(hash) = self.export.weights_id() else {
            bail!(
                "export {dir} does not record which M2R2 weights it holds (its m2r2_export.json \
                 predates `m2r2_hash`): export it again with this m2r2 to check speculative goldens"
            );
        };
        // other weights because of another draft head: said so, with how to make them agree
        if let Some(recorded) = &golden.m2r2
            && !hash.matches(&recorded.weights)
            && let Some(why) = head_difference(recorded, &self.export)
        {
            bail!(
                "{why} (the hashes cover the head, so the export's M2R2 weights ({hash}) are not \
                 the ones this golden was recorded with ({}); whether more than the head differs \
                 shows once the heads agree)",
                recorded.weights
            );
        }
        // the golden's settings are the ones its hashes cover (the export's, when they match;
        // the manifest has no tensors to hash them with)
        if let Some(recorded) = &golden.m2r2
            && hash.matches(&recorded.weights)
        {
            let export = format!("export {dir} (its m2r2_export.json)");
            recorded.check_settings_against(&manifest.m2r2, &export)?;
        }
        if manifest.draft_gate != draft_gate {
            bail!(
                "this golden drafts at gate {draft_gate}, export {dir} at gate {}: export with \
                 `m2r2 export --draft-gate {draft_gate}` to check it",
                manifest.draft_gate
            );
        }
        // the largest tree a round verifies (with its lookup branch)
        let tree = golden
            .tree_recipe()
            .map(reference::golden::TreeRecipe::largest)
            .transpose()?;
        // rows per verification: a tree's drafted nodes, the chain's recorded longest draft
        let rows = match (&tree, golden.m2r2.as_ref().map(|m| &m.record)) {
            (Some(tree), _) => tree.nodes() - 1,
            (None, Some(M2r2Record::Speculative { draft_length, .. })) => draft_length.max(),
            (None, _) => manifest.m2r2.draft_len,
        };
        let speculation = match &mut self.speculation {
            Some((loaded, loaded_rows, speculation)) if *loaded == gate && *loaded_rows == rows => {
                speculation
            }
            slot => {
                *slot = None; // one set of sessions at a time
                let ep = self.ep_args.config(&self.export, rows)?;
                let loaded = OnnxSpeculation::load(&self.export, &ep, gate)
                    .with_context(|| format!("cannot load the speculative graphs of {dir}"))?;
                &mut slot.insert((gate, rows, loaded)).2
            }
        };
        speculation.reset();
        let bridged = speculation.has_bridge();
        let has_feed = self.export.has(GraphKind::Feed);
        let graphs = if has_feed {
            GRAPHS
        } else {
            GRAPHS_WITHOUT_FEED
        };
        let mut report = match &tree {
            Some(_) => {
                let engine = TreeEngine {
                    speculation,
                    greedy: &mut self.model,
                    config: &manifest.config,
                    weights: Some(&hash),
                    draft_gate: manifest.draft_gate,
                    graphs,
                };
                golden.check_tree_on(engine, tol.tol)?
            }
            None => {
                let engine = SpeculativeEngine {
                    speculation,
                    greedy: &mut self.model,
                    config: &manifest.config,
                    weights: Some(&hash),
                    draft_gate: manifest.draft_gate,
                    graphs,
                };
                golden.check_speculative_on(engine, tol.tol)?
            }
        };
        // verifier.onnx starts from the slow states the lower graphs hand it: a fault in their
        // slow stream shows on its line too, so the line says where else to look
        let lower = if has_feed {
            "draft.onnx or feed.onnx"
        } else {
            "draft.onnx"
        };
        for e in report
            .entries
            .iter_mut()
            .filter(|e| e.graph == GRAPHS.verify && e.name == "verify_logits" && !e.ok)
        {
            e.note += &format!(
                "; verifier.onnx starts from the draft layers' slow states (the hidden_states \
                 of {lower}): a fault in those layers shows here too"
            );
        }
        if bridged {
            for e in report
                .entries
                .iter_mut()
                .filter(|e| e.graph == GRAPHS.draft && !e.ok)
            {
                e.note += "; the draft also reads verifier.onnx's final_states (the bridge), \
                           which read draft.onnx's slow states: where verifier.onnx is NOT OK \
                           too, either graph may be at fault";
            }
        }
        Ok(report)
    }
}
