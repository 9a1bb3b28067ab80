//! `m2r2_export.json`: what `m2r2 export` wrote into a folder, read once at load and checked against
//! the graphs' inputs (contract: docs/ONNX.md).

use crate::ep::EpConfig;
use crate::error::{Error, Result};
use crate::session::OnnxSession;
use reference::ModelConfig;
use reference::io::file_name::sibling;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::config::M2r2Config;
use reference::m2r2::draft_head::DraftHead;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const MANIFEST_FILE: &str = reference::io::folder_kind::EXPORT_MANIFEST_FILE;
/// The manifest format this runner reads.
pub const FORMAT_VERSION: u32 = 1;

/// One of the exported graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKind {
    /// All layers (Optimum / onnxruntime-genai convention).
    Model,
    /// Layers `0..e` with the fast stream at the draft gate.
    Draft,
    /// Layers `e..N` from the draft's slow residual.
    Verifier,
    /// Layers `0..e`, the slow stream only (draft.onnx without fast rows and heads; exports
    /// before it have none).
    Feed,
}

impl GraphKind {
    pub fn name(self) -> &'static str {
        match self {
            GraphKind::Model => "model",
            GraphKind::Draft => "draft",
            GraphKind::Verifier => "verifier",
            GraphKind::Feed => "feed",
        }
    }
}

/// The manifest as written.
#[derive(Clone, Debug, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub exporter_version: String,
    pub model_name: String,
    pub config: ModelConfig,
    /// The M2R2 settings as ONNX Runtime drafts them: [`ExportDir::open`] puts the config's
    /// `onnx_drafting` (ONNX Runtime's own drafting defaults, when it has them) in place of its
    /// top-level drafting fields ([`M2r2Config::for_onnx`]), so every default read here is this
    /// engine's.
    pub m2r2: M2r2Config,
    /// g_d, 1-based: the gate the draft / verifier split was made at.
    pub draft_gate: usize,
    /// e = e_{g_d}: draft.onnx holds layers `0..e`.
    pub draft_layers: usize,
    /// draft.onnx has the `exit_prob` output.
    pub has_arla: bool,
    /// [`reference::golden::weights_hash`] of the exported M2R2 weights (absent in manifests
    /// written before it was added): M2R2 goldens are checked only against the weights they
    /// were recorded with.
    #[serde(default)]
    pub m2r2_hash: Option<String>,
    /// [`reference::golden::weights_hash_without_defaults`] of the same weights (absent in
    /// manifests written before it): with it, goldens written since are checked by the weights
    /// alone, whatever drafting defaults the folder was exported with.
    #[serde(default)]
    pub m2r2_weights_hash: Option<String>,
    /// `K` of the pruned draft head: draft.onnx's `draft_logits` is `[batch, seq, K]`, scores of
    /// the token ids in [`draft_head_file`](Self::draft_head_file). Absent or null: `[batch, seq,
    /// V]`.
    #[serde(default)]
    pub draft_head_tokens: Option<usize>,
    /// The pruned draft head's token ids (`draft_head.json`), beside the graphs.
    #[serde(default)]
    pub draft_head_file: Option<String>,
    /// Tokens that end a generation, as `generate` stops on them (the config's EOS ids and the
    /// tokenizer's end-of-turn tokens): the runner needs no tokenizer to stop. Absent in folders
    /// exported before it was recorded ([`ExportDir::stop_tokens`]).
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    pub opset: i64,
    pub weights_dtype: String,
    /// graph kind name -> file name in the folder
    pub graphs: BTreeMap<String, String>,
    /// `export --static-cache L`: which graphs keep their KV cache in fixed buffers of `l_max`
    /// positions ([`crate::static_kv`]). Absent: every graph has the dynamic interface.
    #[serde(default)]
    pub static_cache: Option<StaticCache>,
}

/// The `static_cache` entry of a static export's manifest.
#[derive(Clone, Debug, Deserialize)]
pub struct StaticCache {
    /// `L`: positions each layer's key / value buffer holds.
    pub l_max: usize,
    /// The opset of those graphs (24).
    pub opset: i64,
    /// Graph kind names with fixed buffers: every graph of the folder (folders written before
    /// the speculative graphs had static forms: `model` alone).
    pub graphs: Vec<String>,
    /// `export --merge-adapters`: draft.onnx has the adapters merged into the fast stream's
    /// weights and both streams stacked (same interface; absent in older folders: false).
    #[serde(default)]
    pub merged_adapters: bool,
}

/// An export folder: its manifest and where it lies.
#[derive(Clone, Debug)]
pub struct ExportDir {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// The pruned draft head draft.onnx was exported with (its `draft_logits` columns).
    pub draft_head: Option<DraftHead>,
}

impl ExportDir {
    /// Read and check `dir/m2r2_export.json`.
    pub fn open(dir: &Path) -> Result<ExportDir> {
        if dir.is_file() {
            let folder = dir.parent().filter(|p| !p.as_os_str().is_empty());
            return Err(Error::Export {
                file: dir.display().to_string(),
                msg: format!(
                    "a file, where an export folder (the one holding {MANIFEST_FILE}) is \
                     expected{}",
                    folder.map_or(String::new(), |f| format!(
                        ": did you mean {}?",
                        f.display()
                    ))
                ),
            });
        }
        let path = dir.join(MANIFEST_FILE);
        let file = path.display().to_string();
        let bad = |msg: String| Error::Export {
            file: file.clone(),
            msg,
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let what = match reference::io::folder_kind::describe(dir) {
                    Some(kind) => format!("missing: {kind}"),
                    None if !dir.exists() => format!(
                        "missing: the folder {} does not exist (write one with `m2r2 export \
                         --out {}`)",
                        dir.display(),
                        dir.display()
                    ),
                    None => format!(
                        "missing: {} is not a finished export (run `m2r2 export --out {}`)",
                        dir.display(),
                        dir.display()
                    ),
                };
                return Err(bad(what));
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        let mut manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a valid manifest: {e}")))?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(bad(format!(
                "format_version {} is not the {FORMAT_VERSION} this runner reads",
                manifest.format_version
            )));
        }
        manifest.config.validate(&file)?;
        manifest.m2r2.validate(&manifest.config, &file)?;
        manifest.m2r2 = manifest.m2r2.for_onnx().into_owned();
        let expected = manifest
            .m2r2
            .gates
            .get(manifest.draft_gate.wrapping_sub(1))
            .copied();
        if expected != Some(manifest.draft_layers) {
            return Err(bad(format!(
                "draft_layers {} is not the layer of draft gate {} (gates {:?})",
                manifest.draft_layers, manifest.draft_gate, manifest.m2r2.gates
            )));
        }
        let draft_head = match (&manifest.draft_head_file, manifest.draft_head_tokens) {
            (None, None) => None,
            (Some(name), Some(k)) => {
                let path = sibling(dir, name).map_err(|e| bad(format!("draft_head_file: {e}")))?;
                let head = DraftHead::load(&path, manifest.config.vocab_size)?;
                if head.len() != k {
                    return Err(bad(format!(
                        "draft_head_tokens is {k}, but {name} lists {} token ids",
                        head.len()
                    )));
                }
                Some(head)
            }
            _ => {
                return Err(bad(
                    "draft_head_tokens and draft_head_file must be given together".into(),
                ));
            }
        };
        if let Some(sc) = &manifest.static_cache {
            if sc.l_max == 0 {
                return Err(bad("static_cache.l_max is 0".into()));
            }
            let kinds = [
                GraphKind::Model,
                GraphKind::Draft,
                GraphKind::Verifier,
                GraphKind::Feed,
            ];
            if let Some(g) = sc
                .graphs
                .iter()
                .find(|g| kinds.iter().all(|k| k.name() != *g))
            {
                return Err(bad(format!(
                    "static_cache.graphs names `{g}`: expected model, draft, verifier or feed"
                )));
            }
            // draft, verifier and feed share one cache: all of them static, or none
            let speculative = [GraphKind::Draft, GraphKind::Verifier, GraphKind::Feed]
                .into_iter()
                .filter(|k| manifest.graphs.contains_key(k.name()));
            let (fixed, grown): (Vec<_>, Vec<_>) =
                speculative.partition(|k| sc.graphs.iter().any(|g| g == k.name()));
            if let (Some(f), Some(g)) = (fixed.first(), grown.first()) {
                return Err(bad(format!(
                    "static_cache.graphs names `{}` but not `{}`: the draft, verifier and feed \
                     graphs share one KV cache, so they are all static or all dynamic",
                    f.name(),
                    g.name()
                )));
            }
        }
        for (kind, name) in &manifest.graphs {
            sibling(dir, name).map_err(|e| bad(format!("graphs.{kind}: {e}")))?;
        }
        Ok(ExportDir {
            dir: dir.to_path_buf(),
            manifest,
            draft_head,
        })
    }

    /// `L` when graph `kind` keeps its cache in fixed buffers (`export --static-cache`).
    pub fn static_l_max(&self, kind: GraphKind) -> Option<usize> {
        self.manifest
            .static_cache
            .as_ref()
            .filter(|sc| sc.graphs.iter().any(|g| g == kind.name()))
            .map(|sc| sc.l_max)
    }

    /// Refuse, before anything runs, a decode that needs `needed` positions in graph `kind`'s
    /// static buffers when they hold fewer (a graph whose cache grows always has room). The error
    /// names the graph, `L`, `needed` and `why` (what needs them), then says how to fit: `fix`.
    pub fn check_room(&self, kind: GraphKind, needed: usize, why: &str, fix: &str) -> Result<()> {
        match self.static_l_max(kind) {
            Some(l_max) if needed > l_max => Err(Error::Export {
                file: self.graph(kind)?.display().to_string(),
                msg: format!(
                    "the static cache holds {l_max} position{}, and {why} needs {needed}; export \
                     with a larger --static-cache, or {fix}",
                    if l_max == 1 { "" } else { "s" }
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Load graph `kind` on `ep` (with CUDA graphs when `cuda_graph`), checked to be the graph this
    /// manifest describes ([`check_identity`](Self::check_identity)).
    pub fn load_graph(
        &self,
        kind: GraphKind,
        ep: &EpConfig,
        cuda_graph: bool,
    ) -> Result<OnnxSession> {
        let session = OnnxSession::load_with_cuda_graph(&self.graph(kind)?, ep, cuda_graph)?;
        self.check_identity(kind, &session)?;
        Ok(session)
    }

    /// Refuse a loaded graph whose `metadata_props` (written by `m2r2 export`) say it belongs to
    /// another export ([`check_metadata`](Self::check_metadata)).
    pub fn check_identity(&self, kind: GraphKind, session: &OnnxSession) -> Result<()> {
        self.check_metadata(kind, session.file(), |key| session.metadata(key))
    }

    /// Refuse graph file `file`, listed as graph `kind`, whose `metadata_props` (`metadata`: the
    /// value of a key, `None` where the graph has none) say it belongs to another export: another
    /// graph kind, model config, weights dtype, static cache, or (draft, verifier and feed) draft
    /// gate or M2R2 weights. Shapes alone cannot tell a draft.onnx copied from another export of
    /// equal shapes, and it decodes wrong tokens. A key a graph lacks (older exports) is not
    /// compared. The properties come from a loaded session (`check_identity`) or from the parsed
    /// file (`m2r2 info --onnx`, which loads no session). The first of
    /// [`metadata_contradictions`](Self::metadata_contradictions).
    pub fn check_metadata(
        &self,
        kind: GraphKind,
        file: &str,
        metadata: impl Fn(&str) -> Result<Option<String>>,
    ) -> Result<()> {
        match self
            .metadata_contradictions(kind, file, metadata)?
            .into_iter()
            .next()
        {
            Some((_, contradiction)) => Err(contradiction),
            None => Ok(()),
        }
    }

    /// Every `m2r2.*` key of graph file `file` (listed as graph `kind`) whose value contradicts
    /// the manifest, in the order [`check_metadata`](Self::check_metadata) compares them, with
    /// the error that names it (`m2r2 info --onnx` lists them all); a key that cannot be read is
    /// the error.
    pub fn metadata_contradictions(
        &self,
        kind: GraphKind,
        file: &str,
        metadata: impl Fn(&str) -> Result<Option<String>>,
    ) -> Result<Vec<(&'static str, Error)>> {
        let m = &self.manifest;
        let speculative = kind != GraphKind::Model;
        let static_cache = self
            .static_l_max(kind)
            .map_or("none".into(), |l| l.to_string());
        let expected: [(&str, Option<String>, &str); 6] = [
            ("m2r2.graph", Some(kind.name().into()), "graph kind"),
            ("m2r2.config", Some(m.config.hash()), "model config (hash)"),
            (
                "m2r2.weights_dtype",
                Some(m.weights_dtype.clone()),
                "weights dtype",
            ),
            (
                "m2r2.static_cache",
                Some(static_cache),
                "static cache length",
            ),
            (
                "m2r2.draft_gate",
                speculative.then(|| m.draft_gate.to_string()),
                "draft gate",
            ),
            (
                "m2r2.m2r2_hash",
                m.m2r2_hash.clone().filter(|_| speculative),
                "M2R2 weights (hash)",
            ),
        ];
        let mut contradictions = Vec::new();
        for (key, want, what) in expected {
            let Some(want) = want else { continue };
            let found = match (key, metadata(key)?) {
                // the config is recorded whole: compared by its hash
                ("m2r2.config", Some(json)) => match serde_json::from_str::<ModelConfig>(&json) {
                    Ok(config) => Some(config.hash()),
                    Err(_) => Some(format!("unreadable ({json:.40})")),
                },
                // exports before the static graphs record no `m2r2.static_cache` when dynamic
                ("m2r2.static_cache", None) if metadata("m2r2.graph")?.is_some() => {
                    Some("none".into())
                }
                (_, found) => found,
            };
            if let Some(found) = found
                && found != want
            {
                let contradiction = Error::Export {
                    file: file.to_string(),
                    msg: format!(
                        "this graph is not the one {MANIFEST_FILE} describes: its {what} is \
                         {found}, the manifest's is {want} (`{key}`; was it copied from another \
                         export? export the folder again)"
                    ),
                };
                contradictions.push((key, contradiction));
            }
        }
        Ok(contradictions)
    }

    /// Which M2R2 weights the export holds, as goldens identify them (`m2r2_hash`, and
    /// `m2r2_weights_hash` without the decoding defaults, compared by
    /// [`WeightsId::matches`](reference::golden::WeightsId::matches)); `None` for a manifest
    /// written before `m2r2_hash`.
    pub fn weights_id(&self) -> Option<reference::golden::WeightsId> {
        Some(reference::golden::WeightsId {
            hash: self.manifest.m2r2_hash.clone()?,
            without_defaults: self.manifest.m2r2_weights_hash.clone(),
        })
    }

    /// Whether the export has graph `kind`.
    pub fn has(&self, kind: GraphKind) -> bool {
        self.manifest.graphs.contains_key(kind.name())
    }

    /// The file of a graph, or an error saying it was not exported.
    pub fn graph(&self, kind: GraphKind) -> Result<PathBuf> {
        let kind = kind.name();
        let name = self.manifest.graphs.get(kind).ok_or_else(|| {
            let has: Vec<&str> = self.manifest.graphs.keys().map(String::as_str).collect();
            Error::Export {
                file: self.dir.join(MANIFEST_FILE).display().to_string(),
                msg: format!(
                    "this export has no {kind} graph (it has: {}); export the folder again \
                     with `{kind}` in `--graphs` (the default writes all four)",
                    has.join(", ")
                ),
            }
        })?;
        // Checked to be a plain file name by `open`.
        Ok(self.dir.join(name))
    }

    /// The tokenizer written beside the graphs, when there is one (refused when it has more
    /// tokens than the model: another model's).
    pub fn tokenizer(&self) -> Result<Option<Tokenizer>> {
        let path = self.dir.join("tokenizer.json");
        if !path.is_file() {
            return Ok(None);
        }
        let vocab_size = self.manifest.config.vocab_size;
        Ok(Some(Tokenizer::from_file_for(&path, vocab_size)?))
    }

    /// Tokens that end a generation: the manifest's `stop_token_ids`; for folders exported before
    /// it was recorded, the config's EOS ids and `tokenizer`'s end-of-turn tokens
    /// ([`reference::io::load::stop_tokens`]).
    pub fn stop_tokens(&self, tokenizer: Option<&Tokenizer>) -> Vec<u32> {
        match &self.manifest.stop_token_ids {
            Some(ids) => ids.clone(),
            None => reference::io::load::stop_tokens(&self.manifest.config, tokenizer),
        }
    }
}
