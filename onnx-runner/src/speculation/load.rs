//! Loading a speculative export: draft.onnx, verifier.onnx and feed.onnx on one execution
//! provider, checked against each other and the manifest (layers, widths, ARLA, bridge tensors),
//! with the KV cache they share, growing or static.

use super::tree::TreeState;
use super::{BRIDGE_STATES, EXIT_PROB, EXIT_STATES, FINAL_STATES, OnnxSpeculation};
use crate::ep::{Ep, EpConfig};
use crate::error::{Error, Result};
use crate::kv::Kv;
use crate::manifest::{ExportDir, GraphKind};
use crate::session::OnnxSession;
use crate::spec_cache::{BoundSteps, SpecCache};
use crate::static_kv::StaticKv;
use reference::decode::bridge_state::BridgeMemory;
use reference::m2r2::exit_gate::GateKind;

impl OnnxSpeculation {
    /// Load draft.onnx and verifier.onnx of an export on `ep`. `gate` as in
    /// [`ReferenceSpeculation::new`](reference::decode::draft_verify::ReferenceSpeculation::new); the draft
    /// gate is the one the export was split at.
    pub fn load(export: &ExportDir, ep: &EpConfig, gate: Option<GateKind>) -> Result<Self> {
        let m = &export.manifest;
        if gate == Some(GateKind::Arla) && !m.has_arla {
            return Err(reference::Error::Invalid(
                "the ARLA gate needs ARLA weights, and this export has none (draft.onnx has no \
                 exit_prob output): use --gate confidence or --gate entropy"
                    .into(),
            )
            .into());
        }
        // CUDA graphs: on by default for a static export on CUDA, refused by name where they
        // cannot apply (`EpConfig::resolve_cuda_graph`)
        let static_l = export.static_l_max(GraphKind::Draft);
        let draft_path = export.graph(GraphKind::Draft)?;
        let cuda_graph =
            ep.resolve_cuda_graph(&draft_path.display().to_string(), static_l.is_some())?;
        let load = |kind| export.load_graph(kind, ep, cuda_graph);
        let draft = load(GraphKind::Draft)?;
        let verifier = load(GraphKind::Verifier)?;
        let c = &m.config;
        let e = m.draft_layers;
        let (hkv, dh) = (c.num_key_value_heads, c.head_dim);
        // draft.onnx and feed.onnx both hold layers `0..e` and hand `s_e` to the verifier.
        let check_lower = |session: &OnnxSession| {
            crate::kv::check_layers(session, &(0..e))?;
            crate::kv::check_width(session, "hidden_states", c.hidden_size, "hidden_size")
        };
        check_lower(&draft)?;
        crate::kv::check_layers(&verifier, &(e..c.num_hidden_layers))?;
        crate::kv::check_width(&verifier, "logits", c.vocab_size, "vocab_size")?;
        // the bridge is read when the export's draft gate is the one it was trained at
        let bridge = m
            .m2r2
            .bridge
            .as_ref()
            .is_some_and(|b| b.gate == m.draft_gate);
        if bridge {
            // the manifest's M2R2 settings name a bridge: its tensors must be in the graphs
            for (session, tensor, names) in [
                (&draft, BRIDGE_STATES, draft.inputs()),
                (&draft, EXIT_STATES, draft.outputs()),
                (&verifier, FINAL_STATES, verifier.outputs()),
            ] {
                if !names.iter().any(|t| t.name == tensor) {
                    return Err(Error::Export {
                        file: session.file().to_string(),
                        msg: format!(
                            "m2r2_export.json's M2R2 settings name a bridge, but the graph has \
                             no `{tensor}` (export the folder again)"
                        ),
                    });
                }
            }
            crate::kv::check_width(&draft, EXIT_STATES, c.hidden_size, "hidden_size")?;
            crate::kv::check_width(&verifier, FINAL_STATES, c.hidden_size, "hidden_size")?;
        }
        // the manifest's `has_arla` says draft.onnx scores with ARLA
        if m.has_arla && !draft.outputs().iter().any(|t| t.name == EXIT_PROB) {
            return Err(Error::Export {
                file: draft.file().to_string(),
                msg: format!(
                    "m2r2_export.json says the weights have ARLA (`has_arla`), but the graph has \
                     no `{EXIT_PROB}` output (export the folder again)"
                ),
            });
        }
        let feed = if export.has(GraphKind::Feed) {
            let feed = load(GraphKind::Feed)?;
            check_lower(&feed)?;
            if ep.binds_kv(feed.ep_used()) != ep.binds_kv(draft.ep_used()) {
                return Err(Error::Export {
                    file: feed.file().to_string(),
                    msg: format!(
                        "runs on {} and draft.onnx on {}: the two share one KV cache and must \
                         run on one provider",
                        feed.ep_used(),
                        draft.ep_used()
                    ),
                });
            }
            Some(feed)
        } else {
            None
        };
        let n = c.num_hidden_layers;
        let cache = match static_l {
            // the manifest names draft, verifier and feed static together (ExportDir::open)
            Some(l_max) => {
                if verifier.ep_used() != draft.ep_used() {
                    return Err(Error::Export {
                        file: verifier.file().to_string(),
                        msg: format!(
                            "runs on {} and draft.onnx on {}: the two share one set of static \
                             KV buffers and must run on one provider",
                            verifier.ep_used(),
                            draft.ep_used()
                        ),
                    });
                }
                let kv = StaticKv::new(&draft, c, l_max)?;
                StaticKv::check_graph(&verifier, l_max)?;
                if let Some(feed) = &feed {
                    StaticKv::check_graph(feed, l_max)?;
                }
                SpecCache::Static {
                    kv,
                    split: (0..e, e..n),
                    lower: 0,
                    upper: 0,
                    // --ep-fallback onto the CPU: the sessions were built without graphs
                    bound: BoundSteps::new(cuda_graph && draft.ep_used() == Ep::Cuda)?,
                }
            }
            None => SpecCache::Dynamic {
                lower: Kv::new(0..e, hkv, dh, ep.binds_kv(draft.ep_used()))?,
                upper: Kv::new(e..n, hkv, dh, ep.binds_kv(verifier.ep_used()))?,
                sliding_window: c.sliding_window,
            },
        };
        Ok(OnnxSpeculation {
            cache,
            draft,
            verifier,
            feed,
            config: c.clone(),
            draft_layers: e,
            has_arla: m.has_arla,
            draft_head: export.draft_head.clone(),
            gate,
            kept: Vec::new(),
            bridge,
            bridge_memory: BridgeMemory::default(),
            verified: 0,
            len: 0,
            max_rows: ep.trt_max_rows(),
            tree: TreeState::default(),
        })
    }
}
