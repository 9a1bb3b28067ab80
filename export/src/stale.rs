//! Temporary folders of exports that were stopped before they finished.
//!
//! An export writes into `.<name>.partial-<pid>` beside its target and removes it on any error
//! (see [`crate::folder`]), but a process stopped by Ctrl-C or `kill` runs no clean-up, and a
//! SmolLM2 export leaves hundreds of megabytes behind in a hidden folder. The next export to the
//! same target removes such folders whose process is gone. Whether a process is gone is read from
//! `/proc`; where there is none (not Linux), nothing is removed. A folder whose process id is alive
//! (another export running, or the id reused) is left alone.

use std::path::{Path, PathBuf};

/// The name of `name`'s temporary sibling for process `pid`.
pub fn partial_name(name: &str, pid: u32) -> String {
    format!("{}{pid}", partial_prefix(name))
}

fn partial_prefix(name: &str) -> String {
    format!(".{name}.partial-")
}

/// Remove `parent/.<name>.partial-<pid>` folders whose process has ended; returns those removed.
/// Folders that cannot be removed are left, silently: they do not stop a new export.
pub fn remove_stale(parent: &Path, name: &str) -> Vec<PathBuf> {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let prefix = partial_prefix(name);
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix.as_str()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || pid == std::process::id() || proc.join(pid.to_string()).exists() {
            continue;
        }
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed.sort();
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process id that no process has: above Linux's largest (`pid_max` is at most 2^22).
    const ENDED: u32 = 4_000_000_000;

    #[test]
    fn only_folders_of_ended_processes_of_this_target_go() {
        let dir = tempfile::tempdir().unwrap();
        let make = |n: &str| std::fs::create_dir(dir.path().join(n)).unwrap();
        let stale = partial_name("out", ENDED);
        make(&stale);
        std::fs::write(dir.path().join(&stale).join("model.onnx"), b"x").unwrap();
        let alive = partial_name("out", std::process::id());
        make(&alive);
        let parent_pid = partial_name("out", 1);
        make(&parent_pid);
        let other_target = partial_name("out2", ENDED);
        make(&other_target);
        make(".out.partial-12x");
        std::fs::write(dir.path().join(partial_name("out", ENDED + 1)), b"a file").unwrap();

        let removed = remove_stale(dir.path(), "out");

        if !Path::new("/proc/self").exists() {
            assert!(removed.is_empty());
            return;
        }
        assert_eq!(removed, vec![dir.path().join(&stale)]);
        for kept in [
            &alive,
            &parent_pid,
            &other_target,
            ".out.partial-12x",
            &partial_name("out", ENDED + 1),
        ] {
            assert!(dir.path().join(kept).exists(), "{kept} was removed");
        }
    }
}
