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

/// Advance `bar` by one finished item and show the `tokens` made since `start` per second.
pub fn inc_with_rate(bar: &ProgressBar, tokens: usize, start: std::time::Instant) {
    bar.inc(1);
    bar.set_message(format!(
        "{:.1} tokens/s",
        tokens as f64 / start.elapsed().as_secs_f64().max(1e-9)
    ));
}

/// Progress of a long phase as occasional plain lines on stderr, for when no bar is drawn (stderr
/// is a log file): a run of an hour should still say how far it is and how fast it goes.
pub struct LogLines {
    label: String,
    total: usize,
    every: Duration,
    start: std::time::Instant,
    last: std::time::Instant,
}

impl LogLines {
    /// Lines at most every `every`; none at all when a bar is drawn instead.
    pub fn new(label: impl Into<String>, total: usize, every: Duration) -> Self {
        let now = std::time::Instant::now();
        LogLines {
            label: label.into(),
            total,
            every,
            start: now,
            last: now,
        }
    }

    /// `done` of the total items finished, `tokens` processed so far.
    pub fn update(&mut self, done: usize, tokens: usize) {
        if enabled() || (self.last.elapsed() < self.every && done < self.total) {
            return;
        }
        self.last = std::time::Instant::now();
        let seconds = self.start.elapsed().as_secs_f64();
        eprintln!(
            "{}: {done}/{} after {seconds:.0} s ({:.1} tokens/s)",
            self.label,
            self.total,
            tokens as f64 / seconds.max(1e-9)
        );
    }
}
