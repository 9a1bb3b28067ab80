//! Decoding over model.onnx (all layers), one token per run after the prompt's prefill: the
//! reference's [`reference::base::generate::generate`] with ONNX Runtime doing the forward passes.

use crate::ep::EpConfig;
use crate::error::{Error, Result, into_reference};
use crate::kv::Kv;
use crate::kv_store::KvStore;
use crate::manifest::{ExportDir, GraphKind};
use crate::session::OnnxSession;
use crate::static_kv::StaticKv;
use crate::step::{StepInputs, check_tokens};
use ndarray::{Array2, Axis, Ix3};
use reference::ModelConfig;
use reference::base::generate::{GenerateOptions, Generation, GreedyBackend, generate_with};
use reference::base::work::Work;

/// model.onnx with its KV cache.
pub struct OnnxModel {
    session: OnnxSession,
    config: ModelConfig,
    cache: Cache,
    /// Rows per run at most (TensorRT's profile); longer prompts are fed in chunks.
    max_rows: Option<usize>,
}

impl OnnxModel {
    /// Load model.onnx of an export on `ep`.
    pub fn load(export: &ExportDir, ep: &EpConfig) -> Result<OnnxModel> {
        let path = export.graph(GraphKind::Model)?;
        let l_max = export.static_l_max(GraphKind::Model);
        let cuda_graph = ep.resolve_cuda_graph(&path.display().to_string(), l_max.is_some())?;
        let session = export.load_graph(GraphKind::Model, ep, cuda_graph)?;
        let config = export.manifest.config.clone();
        crate::kv::check_layers(&session, &(0..config.num_hidden_layers))?;
        crate::kv::check_width(&session, "logits", config.vocab_size, "vocab_size")?;
        let cache = match l_max {
            Some(l_max) => {
                let mut kv = StaticKv::new(&session, &config, l_max)?;
                // --ep-fallback onto the CPU: the session was built without graphs
                if cuda_graph && session.ep_used() == crate::ep::Ep::Cuda {
                    kv.enable_cuda_graph(&session, config.vocab_size)?;
                }
                Cache::Static(kv)
            }
            None => Cache::Dynamic(Kv::new(
                0..config.num_hidden_layers,
                config.num_key_value_heads,
                config.head_dim,
                ep.binds_kv(session.ep_used()),
            )?),
        };
        Ok(OnnxModel {
            session,
            config,
            cache,
            max_rows: ep.trt_max_rows(),
        })
    }

    pub fn session(&self) -> &OnnxSession {
        &self.session
    }

    /// The session, e.g. to end its profile.
    pub fn session_mut(&mut self) -> &mut OnnxSession {
        &mut self.session
    }

    /// The KV cache of every layer, on the host (a copy when it lives on the device; the filled
    /// positions of a static export's buffers).
    pub fn kv(&mut self) -> Result<KvStore> {
        match &mut self.cache {
            Cache::Dynamic(kv) => kv.to_host(),
            Cache::Static(kv) => kv.to_host(),
        }
    }

    /// `L` of a static export's buffers; `None` for a dynamic export.
    pub fn static_l_max(&self) -> Option<usize> {
        match &self.cache {
            Cache::Dynamic(_) => None,
            Cache::Static(kv) => Some(kv.l_max()),
        }
    }

    /// Runs of the decode step as a CUDA graph and of the uncaptured prefills, when the decode
    /// step is a CUDA graph (`--cuda-graph`); `None` otherwise.
    pub fn cuda_graph_runs(&self) -> Option<crate::static_kv::GraphRuns> {
        match &self.cache {
            Cache::Dynamic(_) => None,
            Cache::Static(kv) => kv.graph_runs(),
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        match &self.cache {
            Cache::Dynamic(kv) => kv.len(),
            Cache::Static(kv) => kv.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget the cache.
    pub fn reset(&mut self) {
        match &mut self.cache {
            Cache::Dynamic(kv) => kv.truncate(0),
            Cache::Static(kv) => kv.truncate(0),
        }
    }

    /// Feed `tokens` after the cached positions; logits of every row.
    ///
    /// # Shapes
    /// - returns `[T, V]`
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Array2<f32>> {
        check_tokens(&self.config, tokens, self.len())?;
        if let Cache::Static(kv) = &self.cache {
            // all or nothing: a prompt fed in chunks (TensorRT) must fit before the first one
            kv.check_room(self.session.file(), tokens.len())?;
        }
        let chunk = self.max_rows.unwrap_or(tokens.len()).max(1);
        let mut rows = Vec::new();
        for part in tokens.chunks(chunk) {
            rows.push(self.forward_chunk(part)?);
        }
        let views: Vec<_> = rows.iter().map(|r| r.view()).collect();
        Ok(ndarray::concatenate(Axis(0), &views).expect("same vocab in every chunk"))
    }

    fn forward_chunk(&mut self, tokens: &[u32]) -> Result<Array2<f32>> {
        let mut out = match &mut self.cache {
            Cache::Dynamic(kv) => {
                let step = StepInputs::new(tokens, kv.len());
                kv.run(&mut self.session, &step.with_ids(), tokens.len())?
            }
            Cache::Static(kv) => kv.run(&mut self.session, tokens)?,
        };
        let file = self.session.file().to_string();
        let logits = logits_rows(
            out.take("logits")?,
            tokens.len(),
            self.config.vocab_size,
            &file,
            "logits",
        )?;
        Ok(logits)
    }

    /// Decode after `prompt` with the reference's loop ([`generate_with`]: same sampler, stop
    /// rules and streaming); the cache starts empty. `work` is not counted (zero).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(u32, &[f32]),
    ) -> Result<Generation> {
        Ok(generate_with(self, prompt, options, on_token)?)
    }
}

/// Where model.onnx's cache lives between runs.
enum Cache {
    /// `past_key_values` in, `present` out, growing by the step's rows.
    Dynamic(Kv),
    /// A static export's fixed buffers, written in place.
    Static(StaticKv),
}

impl GreedyBackend for OnnxModel {
    fn start(&mut self, capacity: usize) -> reference::Result<()> {
        check_tokens(&self.config, &[], capacity).map_err(into_reference)?;
        self.reset();
        Ok(())
    }

    fn feed(&mut self, tokens: &[u32]) -> reference::Result<(Vec<f32>, Work)> {
        let logits = self.forward(tokens).map_err(into_reference)?;
        Ok((logits.row(logits.nrows() - 1).to_vec(), Work::default()))
    }
}

/// `[1, T, W]` -> `[T, W]`, checked.
pub(crate) fn logits_rows(
    t: ndarray::ArrayD<f32>,
    rows: usize,
    width: usize,
    file: &str,
    name: &str,
) -> Result<Array2<f32>> {
    if t.shape() != [1, rows, width] {
        return Err(Error::WrongShape {
            file: file.into(),
            tensor: name.into(),
            expected: format!("[1, {rows}, {width}]"),
            actual: t.shape().to_vec(),
        });
    }
    let t = t.into_dimensionality::<Ix3>().expect("rank checked");
    Ok(t.index_axis_move(Axis(0), 0))
}
