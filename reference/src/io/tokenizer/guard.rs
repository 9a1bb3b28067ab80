//! Calls into the `tokenizers` crate with its panics turned into errors. tokenizers 0.23 panics on
//! some malformed `tokenizer.json` files instead of returning an error (found by the `tokenizer`
//! fuzz target: `expect("Helper")` in its decoder deserialiser on a JSON syntax error; upstream
//! huggingface/tokenizers#2151 lists six more, at load and at encode / decode). Until it is fixed
//! there, every call that parses or runs a file-made pipeline goes through [`guarded`].

use crate::error::{Error, Result};
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// Set while a guarded call runs: its panic is reported as an error, not printed.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Run `f`; a panic inside it becomes [`Error::Tokenizer`] with `what` and the panic's message.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(was));
    outcome.map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Error::Tokenizer(format!(
            "{what}: the tokenizers crate failed on it (a panic inside it: {msg})"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_the_next_call_works() {
        let err = guarded("x.json", || -> u32 { panic!("boom") })
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.json") && err.contains("boom"), "{err}");
        assert_eq!(guarded("x.json", || 7).unwrap(), 7);
    }
}
