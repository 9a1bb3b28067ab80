//! The flags of commands that run an export folder on ONNX Runtime (`run`, `bench --onnx`): the
//! execution provider, and `--draft-head` checked against what the export holds.

use super::m2r2::OnOff;
use super::refuse_unread_flags;
use anyhow::{Result, bail};
use onnx_runner::ep::{DimRanges, Ep, EpConfig, GraphOptimization, TensorRtOptions};
use onnx_runner::manifest::ExportDir;
use reference::io::load::LoadedModel;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;
use std::path::PathBuf;

/// The execution provider flags, shared by `run` and `bench --onnx`.
#[derive(clap::Args, Clone, Debug)]
pub struct EpArgs {
    /// Execution provider: cpu | cuda | tensorrt (a GPU provider needs ORT_DYLIB_PATH pointing at
    /// an onnxruntime-gpu build)
    #[arg(long, value_name = "EP", default_value = "cpu")]
    pub ep: Ep,
    /// CUDA / TensorRT device
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device_id: i32,
    /// Run on the CPU when the provider cannot be registered (the report says which ran)
    #[arg(long)]
    pub ep_fallback: bool,
    /// TensorRT: build fp16 engines
    #[arg(long)]
    pub trt_fp16: bool,
    /// TensorRT: engine and timing cache folder (default: DIR/trt_cache)
    #[arg(long, value_name = "DIR")]
    pub trt_cache: Option<PathBuf>,
    /// ONNX Runtime: a pool of N intra-op threads for each session (default: one pool with a
    /// thread per core, shared by all sessions, spinning)
    #[arg(long, value_name = "N", value_parser = parse_thread_count)]
    pub ort_threads: Option<usize>,
    /// ONNX Runtime: whether idle intra-op threads spin, in a pool for each session (default: the
    /// shared pool, spinning; `off` where other work needs the cores)
    #[arg(long, value_enum, value_name = "ON|OFF")]
    pub ort_spinning: Option<OnOff>,
    /// ONNX Runtime graph optimisation level: disable | basic | extended | all (default: all)
    #[arg(long, value_name = "LEVEL")]
    pub ort_opt: Option<GraphOptimization>,
    /// ONNX Runtime on the CPU: keep the KV cache in host arrays copied after every run (the path
    /// before IoBinding, for comparisons)
    #[arg(long)]
    pub ort_host_kv: bool,
    /// ONNX Runtime: write each session's per-node profile (JSON) to `PREFIX_<time>.json`, one
    /// file per session, in an existing folder
    #[arg(long, value_name = "PREFIX")]
    pub ort_profile: Option<PathBuf>,
    /// bench --cost-shape --onnx only: also measure ONNX Runtime with these session options, one
    /// row each in the same run: `NAME:key=value,...;NAME:...` (keys threads, spinning, opt,
    /// own-pool, host-kv, cuda-graph; see docs/ONNX.md)
    #[arg(long, value_name = "VARIANTS")]
    pub ort_compare: Option<String>,
    /// Static exports on CUDA: run each decode-time step (greedy's one row; speculative draft row,
    /// fed row, each verify length) as a captured CUDA graph: on | off | both (bench only: each
    /// static export twice, without and with) (default: on for a static export on --ep cuda, off
    /// otherwise; `on` elsewhere is an error; docs/STATIC.md)
    #[arg(long, value_enum, value_name = "ON|OFF|BOTH")]
    pub cuda_graph: Option<CudaGraph>,
}

/// `--cuda-graph`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaGraph {
    On,
    Off,
    /// `bench --onnx` only: each static export measured without and with.
    Both,
}

impl EpArgs {
    /// `--ort-compare` as (name, config) pairs on top of `base`.
    pub fn compare(&self, base: &EpConfig) -> Result<Vec<(String, EpConfig)>> {
        let Some(list) = &self.ort_compare else {
            return Ok(Vec::new());
        };
        list.split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|variant| {
                let (name, spec) = variant.split_once(':').unwrap_or((variant, ""));
                Ok((name.to_string(), apply_session_options(base, spec)?))
            })
            .collect()
    }
}

/// A count of intra-op threads, 1 or more: ONNX Runtime reads 0 as its default, which is not the
/// pool of N threads asked for.
fn parse_thread_count(value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err(
            "0 threads: give 1 or more (without it, one pool of a thread per core is \
                      shared by all sessions)"
                .into(),
        ),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{value}` is not a count of threads")),
    }
}

/// Session options as `bench --cost-shape --ort-compare` spells them: `key=value,...` with keys
/// `threads` (N), `spinning` (on|off), `opt` (disable|basic|extended|all), `own-pool` (on|off: a
/// pool for each session) and `host-kv` (on|off), applied on top of `base`.
pub fn apply_session_options(base: &EpConfig, spec: &str) -> Result<EpConfig> {
    let mut ep = base.clone();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            bail!("session option `{item}` is not key=value (in `{spec}`)");
        };
        let on_off = |v: &str| match v {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => bail!("session option `{key}` takes on or off, not `{v}`"),
        };
        match key {
            "threads" => {
                ep.intra_threads =
                    Some(parse_thread_count(value).map_err(|e| {
                        anyhow::anyhow!("session option `threads` takes a count: {e}")
                    })?)
            }
            "spinning" => ep.intra_spinning = Some(on_off(value)?),
            "opt" => ep.optimization = Some(value.parse().map_err(|e: String| anyhow::anyhow!(e))?),
            "own-pool" => ep.own_thread_pool = on_off(value)?,
            "host-kv" => ep.host_kv = on_off(value)?,
            "cuda-graph" => ep.cuda_graph = Some(on_off(value)?),
            _ => bail!(
                "unknown session option `{key}` (in `{spec}`): use threads, spinning, opt, own-pool, \
                 host-kv or cuda-graph"
            ),
        }
    }
    Ok(ep)
}

impl EpArgs {
    /// Refuse ONNX Runtime's flags in a command that runs no session without `--onnx` (`bench`,
    /// `tune-drafting`, `golden check`): they would be ignored, and the figures or the verdict
    /// taken for the provider's.
    pub fn refuse_without_onnx(&self, has_onnx: bool, command: &str) -> Result<()> {
        match self.first_given().filter(|_| !has_onnx) {
            Some(flag) => bail!(
                "{flag} sets up ONNX Runtime, which runs only with --onnx DIR: without it {command} \
                 runs the reference on the CPU"
            ),
            None => Ok(()),
        }
    }

    /// The first flag given that only an ONNX Runtime session reads: `--ep` other than `cpu`,
    /// `--cuda-graph`, `--ort-*`, ...
    fn first_given(&self) -> Option<&'static str> {
        [
            ("--ep", self.ep != Ep::Cpu),
            ("--device-id", self.device_id != 0),
            ("--ep-fallback", self.ep_fallback),
            ("--trt-fp16", self.trt_fp16),
            ("--trt-cache", self.trt_cache.is_some()),
            ("--ort-threads", self.ort_threads.is_some()),
            ("--ort-spinning", self.ort_spinning.is_some()),
            ("--ort-opt", self.ort_opt.is_some()),
            ("--ort-host-kv", self.ort_host_kv),
            ("--ort-profile", self.ort_profile.is_some()),
            ("--ort-compare", self.ort_compare.is_some()),
            ("--cuda-graph", self.cuda_graph.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }

    /// The options of a command that runs one set of sessions (`run`, `golden check --onnx`):
    /// `--ort-compare` and `--cuda-graph both`, which ask for several, are `bench`'s
    /// (`command` names the command).
    pub fn check_one_config(&self, command: &str) -> Result<()> {
        if self.ort_compare.is_some() {
            bail!(
                "--ort-compare is for `m2r2 bench --cost-shape --onnx DIR`; `{command}` takes one \
                 set of options"
            );
        }
        if self.cuda_graph == Some(CudaGraph::Both) {
            bail!(
                "--cuda-graph both is for `bench --onnx` (it measures each static export without \
                 and with CUDA graphs); `{command}` takes on or off"
            );
        }
        Ok(())
    }

    /// The provider config for an export; TensorRT profiles cover `1..=draft_len + 1` rows.
    /// `--cuda-graph both` leaves the choice to the default (`bench` sets it per engine).
    ///
    /// # Errors
    /// A flag of another provider (`--trt-*` without `--ep tensorrt`, `--device-id` on the CPU):
    /// the provider that runs would not read it.
    pub fn config(&self, export: &ExportDir, draft_len: usize) -> Result<EpConfig> {
        const GPU: &[&str] = &["cuda", "tensorrt"];
        refuse_unread_flags(
            "--ep",
            self.ep.name(),
            &[
                ("--device-id", self.device_id != 0, GPU),
                ("--ep-fallback", self.ep_fallback, GPU),
                ("--trt-fp16", self.trt_fp16, &["tensorrt"]),
                ("--trt-cache", self.trt_cache.is_some(), &["tensorrt"]),
            ],
        )?;
        if let Some(prefix) = &self.ort_profile {
            // ONNX Runtime writes PREFIX_<time>.json when a session ends, silently dropping it
            // when the folder is missing
            let folder = prefix.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(folder) = folder.filter(|f| !f.is_dir()) {
                bail!(
                    "--ort-profile {}: `{}` is not a folder (ONNX Runtime writes the profiles \
                     beside the prefix, as PREFIX_<time>.json): create it first",
                    prefix.display(),
                    folder.display()
                );
            }
        }
        let config = &export.manifest.config;
        Ok(EpConfig {
            device_id: self.device_id,
            fallback: self.ep_fallback,
            tensorrt: TensorRtOptions {
                fp16: self.trt_fp16,
                cache_dir: Some(
                    self.trt_cache
                        .clone()
                        .unwrap_or_else(|| export.dir.join("trt_cache")),
                ),
                ranges: Some({
                    let ranges = DimRanges::from_model(draft_len, config.max_position_embeddings);
                    match &export.manifest.static_cache {
                        Some(fixed) => ranges.with_buffer(fixed.l_max),
                        None => ranges,
                    }
                }),
            },
            intra_threads: self.ort_threads,
            intra_spinning: self.ort_spinning.map(|s| s == OnOff::On),
            optimization: self.ort_opt,
            host_kv: self.ort_host_kv,
            profile: self.ort_profile.clone(),
            cuda_graph: match self.cuda_graph {
                Some(CudaGraph::On) => Some(true),
                Some(CudaGraph::Off) => Some(false),
                Some(CudaGraph::Both) | None => None,
            },
            ..EpConfig::new(self.ep)
        })
    }
}

/// `--draft-head` against an export: draft.onnx has the head it was exported with, so `on` needs
/// a pruned one and `off` a full one.
pub fn check_draft_head(export: &ExportDir, choice: Option<OnOff>) -> Result<()> {
    let dir = export.dir.display();
    match (choice, &export.draft_head) {
        (Some(OnOff::On), None) => bail!(
            "--draft-head on: the export {dir} has no pruned draft head (its draft.onnx scores the \
             whole vocabulary); export again from an M2R2 folder with a draft_head.json"
        ),
        (Some(OnOff::Off), Some(head)) => bail!(
            "--draft-head off: the export {dir} was made with a pruned draft head of {} tokens \
             (its draft.onnx scores only those); export again with `m2r2 export --draft-head off` \
             for the full head",
            head.len()
        ),
        _ => Ok(()),
    }
}

/// The export in `dir`, refused when it was made from another model than `loaded`.
pub fn open_export(loaded: &LoadedModel, dir: &Path) -> Result<ExportDir> {
    let export = ExportDir::open(dir)?;
    if export.manifest.config != loaded.model.config {
        bail!(
            "the export in {} was made from a different model than `{}` (their configs differ); \
             pass the model it was exported from with --model",
            dir.display(),
            loaded.name
        );
    }
    Ok(export)
}

/// The export in `dir`, refused when it was made from another model than `loaded` or drafts
/// otherwise than `weights` (another draft gate or draft head).
pub fn open_matching_export(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    dir: &Path,
) -> Result<ExportDir> {
    let export = open_export(loaded, dir)?;
    let manifest = &export.manifest;
    if manifest.draft_gate != weights.config.draft_gate || export.draft_head != weights.draft_head {
        bail!(
            "the export {} drafts at gate {} with {}, the reference's M2R2 weights at gate {} with \
             {}; pass the --m2r2 folder (and --draft-head) the export was made with",
            dir.display(),
            manifest.draft_gate,
            head_words(manifest.draft_head_tokens),
            weights.config.draft_gate,
            head_words(weights.draft_head.as_ref().map(|h| h.len()))
        );
    }
    Ok(export)
}

/// The draft head in words.
pub fn head_words(tokens: Option<usize>) -> String {
    match tokens {
        Some(k) => format!("pruned draft head of {k} tokens"),
        None => "full draft head".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_options_parse_and_name_what_is_wrong() {
        let ep =
            apply_session_options(&EpConfig::cpu(), "threads=1, spinning=off,opt=basic").unwrap();
        assert_eq!(ep.intra_threads, Some(1));
        assert_eq!(ep.intra_spinning, Some(false));
        assert_eq!(ep.optimization, Some(GraphOptimization::Basic));
        let ep = apply_session_options(&EpConfig::cpu(), "own-pool=on,host-kv=on").unwrap();
        assert!(ep.own_thread_pool && ep.host_kv);
        let ep = apply_session_options(&EpConfig::cpu(), "cuda-graph=off").unwrap();
        assert_eq!(ep.cuda_graph, Some(false));
        for (bad, says) in [
            ("threads", "not key=value"),
            ("threads=two", "takes a count"),
            ("threads=0", "0 threads: give 1 or more"),
            ("spinning=yes", "takes on or off"),
            ("opt=max", "unknown graph optimisation level `max`"),
            ("colour=red", "unknown session option `colour`"),
        ] {
            let err = apply_session_options(&EpConfig::cpu(), bad).unwrap_err();
            assert!(err.to_string().contains(says), "{bad}: {err}");
        }
    }
}
