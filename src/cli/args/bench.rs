//! The sizes of a bench run (`m2r2 bench`, also used by `info` and `demo` for short measurements).

use serde::Serialize;

/// What one bench runs. Threads: rayon's global pool (all cores, or `RAYON_NUM_THREADS`).
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct Sizes {
    /// Prompt tokens prefilled in one chunk
    #[arg(long, value_name = "P", default_value_t = 64)]
    pub prompt_len: usize,
    /// Tokens decoded one at a time after the prompt (at least 2)
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub decode_tokens: usize,
    /// Timed runs after one warm-up run; the table shows their median
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub repeats: usize,
    /// Buffer streamed by the memory-bandwidth probe, in MiB (much larger than the last-level cache)
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub bandwidth_mib: usize,
}
