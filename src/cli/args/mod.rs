//! The flags that several commands share, as clap structs, and their parsers. Nothing here runs
//! a command: commands flatten these into their own `Args`, so no command imports another.

pub mod bench;
pub mod m2r2;
pub mod model;
pub mod moe_sim;
pub mod onnx;
pub mod sampling;
pub mod trained;
pub mod tree;

/// Refuse a flag that the run's `option` (`--mode`, `--ep`), set to `value`, makes nobody read: a
/// flag silently ignored reads as if it had taken effect. Each `(flag, given, the values of
/// `option` that read it)`.
///
/// # Errors
/// The first flag given that `value` does not read, with the values to choose instead.
pub fn refuse_unread_flags(
    option: &str,
    value: &str,
    flags: &[(&str, bool, &[&str])],
) -> anyhow::Result<()> {
    for &(flag, given, readers) in flags {
        if given && !readers.contains(&value) {
            let readers: Vec<String> = readers.iter().map(|r| format!("{option} {r}")).collect();
            let readers = readers.join(" or ");
            anyhow::bail!(
                "{flag} is for {readers}, and this run is {option} {value}: add {readers}, or drop \
                 {flag}"
            );
        }
    }
    Ok(())
}
