//! `m2r2`: the command line of the M2R2 reference. One subcommand per file under `cli/`.
//!
//! Conventions shared by every command: results go to stdout (`--json` prints exactly one JSON
//! object), diagnostics, progress and timings to stderr; any error prints `error: <message with its
//! causes>` and exits 1; usage errors exit 2 (clap's default); `golden check` / `compare` exit 2
//! when a golden could not be checked (docs/GOLDEN.md); a reader that closes stdout early (`| head`)
//! ends the command quietly, as it ends `cat` ([`restore_sigpipe`]).

mod cli;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "m2r2",
    version,
    about = "M2R2 (Mixture of Multi-Rate Residuals): reference implementation on ndarray",
    after_help = "Models: tiny | tiny-moe (built in, random weights) | smollm2 (after `m2r2 fetch smollm2`) \
                  | a Hugging Face checkpoint folder | a .gguf file"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate tokens from a prompt (greedy, or sampled with --temperature).
    Generate(cli::generate::Args),
    /// Teacher-forced logits of every position, written as a safetensors file.
    Logits(cli::logits::Args),
    /// Record a greedy golden file, or check a model against one.
    #[command(subcommand)]
    Golden(cli::golden::Command),
    /// Describe a model: config, parameters, layers, tokenizer.
    Info(cli::info::Args),
    /// Measure prefill and decode speed against the machine's memory bandwidth (threads: all cores,
    /// or RAYON_NUM_THREADS).
    Bench(cli::bench::Args),
    /// Decode with an ONNX export on ONNX Runtime (cpu | cuda | tensorrt), greedy or speculative.
    Run(cli::run::Args),
    /// Download into the cache: the `smollm2` model, or the `onnxruntime` library.
    Fetch(cli::fetch::Args),
    /// A tour of what the reference does, on a built-in model (no files needed).
    Demo(cli::demo::Args),
    /// Write seeded random M2R2 weights (adapters + ARLA) for a model into a folder, for --m2r2 DIR.
    InitM2r2(cli::init_m2r2::Args),
    /// Residual dynamics per layer and gate: direction change, alignment with the final residual,
    /// early-exit agreement (and a PCA view with --features linalg).
    Analyze(cli::analyze::Args),
    /// User prompts sampled from the model itself (Magpie): the chat template up to a user turn,
    /// the model's own message, checked and deduplicated; a prompts file for distill-data.
    DistillPrompts(cli::distill_prompts::Args),
    /// Self-distillation data: the base model's own responses to chat-templated prompts.
    DistillData(cli::distill_data::Args),
    /// Train the accelerator adapters on distillation data (base model frozen).
    Train(cli::train::Args),
    /// Train ARLA on trained adapters and calibrate its threshold on held-out validation data.
    TrainArla(cli::train_arla::Args),
    /// Choose speculative decoding's drafting policy (draft gate, chain or token tree, fixed or
    /// dynamic, prompt-lookup branch) by measurement: traced drafts on greedy data, timed steps,
    /// every policy predicted and ranked.
    TuneDrafting(cli::tune_drafting::Args),
    /// Pruned draft head (FLOPs-aware drafting): the most frequent response tokens, measured.
    DraftHead(cli::draft_head::Args),
    /// Ahead-of-time MoE expert loading: trace the experts of a greedy decode, then simulate a
    /// device cache fed over a host link for each predictor (lazy, next-gate, m2r2, oracle).
    MoeSim(cli::moe_sim::Args),
    /// Write ONNX graphs (model, draft, verifier) with the onnxruntime-genai config and tokenizer
    /// files into a folder; --check compares them with the reference under ONNX Runtime.
    Export(cli::export::Args),
}

/// Every option that takes a value takes a negative number too (`--lr -3`, `--tokens -1`): the
/// option's own check then says what is wrong with it, where clap alone calls `-3` an unexpected
/// argument. (`allow_hyphen_values` would also take the next flag as the value of an option
/// given none.)
fn negative_numbers_as_values(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| {
            if arg.get_action().takes_values() {
                arg.allow_negative_numbers(true)
            } else {
                arg
            }
        })
        .mut_subcommands(negative_numbers_as_values)
}

fn main() -> ExitCode {
    restore_sigpipe();
    let matches = negative_numbers_as_values(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    // A decode step is many short parallel sections (SmolLM2: 7 products a layer, 30 layers).
    // With the main thread outside rayon's pool, each section wakes a worker and then the main
    // thread again; as worker 0 of the pool it runs its share and the joins stay in the pool
    // (greedy and draft steps -12%, docs/PERFORMANCE.md "The main thread in the pool"). The pool
    // still has one thread per core (or `RAYON_NUM_THREADS`), the main thread counted. Nothing has
    // used rayon yet, so this can only fail to spawn threads.
    if let Err(error) = rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global()
    {
        eprintln!("error: cannot start the thread pool: {error}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Generate(args) => cli::generate::run(&args),
        Command::Logits(args) => cli::logits::run(&args),
        Command::Golden(command) => cli::golden::run(&command),
        Command::Info(args) => cli::info::run(&args),
        Command::Bench(args) => cli::bench::run(&args),
        Command::Run(args) => cli::run::run(&args),
        Command::Fetch(args) => cli::fetch::run(&args),
        Command::Demo(args) => cli::demo::run(&args),
        Command::InitM2r2(args) => cli::init_m2r2::run(&args),
        Command::Analyze(args) => cli::analyze::run(&args),
        Command::DistillPrompts(args) => cli::distill_prompts::run(&args),
        Command::DistillData(args) => cli::distill_data::run(&args),
        Command::Train(args) => cli::train::run(&args),
        Command::TrainArla(args) => cli::train_arla::run(&args),
        Command::TuneDrafting(args) => cli::tune_drafting::run(&args),
        Command::DraftHead(args) => cli::draft_head::run(&args),
        Command::MoeSim(args) => cli::moe_sim::run(&args),
        Command::Export(args) => cli::export::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", cli::common::error_chain(&error));
            match error.downcast_ref::<cli::common::Exit>() {
                Some(exit) => ExitCode::from(exit.code),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// Rust ignores SIGPIPE, so a write to a closed pipe (`m2r2 info --json | head -1`) is an error,
/// and `println!` turns it into a panic with a backtrace. The default disposition ends the process
/// on that write with no message, as `cat` and `grep` do (exit status 141 in a shell); the
/// command's output was not wanted past that point. m2r2 opens no sockets, where the default
/// would hide a failure.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first in main, before any thread is started; `signal` with `SIG_DFL` only
    // sets this process's disposition of one signal.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
