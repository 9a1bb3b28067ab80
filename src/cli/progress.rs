//! Progress bars on stderr (indicatif), drawn only when stderr is a terminal: piped or captured
//! output never gets escape codes or carriage returns.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// Whether progress bars may be drawn.
pub fn enabled() -> bool {
    std::io::stderr().is_terminal()
}

fn bar(len: Option<u64>, template: &str) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(len) => ProgressBar::new(len),
        None => ProgressBar::new_spinner(),
    };
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// A spinner with a message, ticking on its own (model load).
pub fn spinner(message: impl Into<String>) -> ProgressBar {
    let bar = bar(None, "{spinner} {msg} {elapsed}");
    bar.set_message(message.into());
    if enabled() {
        bar.enable_steady_tick(Duration::from_millis(100));
    }
    bar
}

/// A bar over `total` bytes (extraction, hashing).
pub fn bytes(total: u64, message: impl Into<String>) -> ProgressBar {
    let bar = bar(
        Some(total),
        "{msg} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    );
    bar.set_message(message.into());
    bar
}

/// A bar over `total` generated tokens.
pub fn tokens(total: u64, message: impl Into<String>) -> ProgressBar {
    let bar = bar(
        Some(total),
        "{msg} [{bar:32}] {pos}/{len} tokens {per_sec} eta {eta}",
    );
    bar.set_message(message.into());
    bar
}

/// A bar over `total` steps (graphs exported, ...).
pub fn steps(total: u64, message: impl Into<String>) -> ProgressBar {
    let bar = bar(
        Some(total),
        "{prefix} [{bar:32}] {pos}/{len} {msg} {elapsed}",
    );
    bar.set_prefix(message.into());
    bar
}

/// Progress over the items of a long phase (samples, prompts) with the tokens/s processed: a bar
/// when stderr is a terminal, otherwise a plain line at most every 30 s (and one at the end), so
/// that a run of an hour under `nohup` still says in its log how far it is and how fast it goes.
pub struct Counter {
    bar: ProgressBar,
    label: String,
    total: usize,
    every: Duration,
    start: std::time::Instant,
    last: std::time::Instant,
}

impl Counter {
    /// `total` items; `done` of them finished before this run started (a `--resume`).
    pub fn new(label: impl Into<String>, total: usize, done: usize) -> Self {
        let label = label.into();
        let bar = bar(
            Some(total as u64),
            "{prefix} [{bar:32}] {pos}/{len} {msg} eta {eta}",
        );
        bar.set_prefix(label.clone());
        bar.set_position(done as u64);
        let now = std::time::Instant::now();
        Counter {
            bar,
            label,
            total,
            every: Duration::from_secs(30),
            start: now,
            last: now,
        }
    }

    /// `done` of the total items finished, `tokens` processed by this run so far.
    pub fn update(&mut self, done: usize, tokens: usize) {
        let seconds = self.start.elapsed().as_secs_f64();
        let rate = tokens as f64 / seconds.max(1e-9);
        if enabled() {
            self.bar.set_position(done as u64);
            self.bar.set_message(format!("{rate:.1} tokens/s"));
        } else if self.last.elapsed() >= self.every || done >= self.total {
            self.last = std::time::Instant::now();
            eprintln!(
                "{}: {done}/{} after {seconds:.0} s ({rate:.1} tokens/s)",
                self.label, self.total
            );
        }
    }

    /// Removes the bar (the caller prints its own summary).
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
