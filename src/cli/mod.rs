//! The command line: one file (or folder) per subcommand, and the modules they share. A command
//! imports only the shared modules, never another command (`layering` test below).

// Shared by the commands.
pub mod args;
pub mod common;
pub mod decode_speed;
pub mod moe_report;
pub mod progress;
pub mod report;

// The subcommands, as `m2r2 --help` lists them.
pub mod analyze;
pub mod bench;
pub mod demo;
pub mod distill_data;
pub mod draft_head;
pub mod export;
pub mod fetch;
pub mod generate;
pub mod golden;
pub mod info;
pub mod init_m2r2;
pub mod logits;
pub mod moe_sim;
pub mod run;
pub mod train;
pub mod train_arla;

/// The command line's layering: commands import shared modules, never each other.
#[cfg(test)]
mod layering {
    use std::path::{Path, PathBuf};

    /// The modules commands may import (everything else in `src/cli` is a command).
    const SHARED: [&str; 6] = [
        "args",
        "common",
        "decode_speed",
        "moe_report",
        "progress",
        "report",
    ];

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The top-level module of `src/cli` a file belongs to: `bench/onnx.rs` -> `bench`.
    fn module_of(rel: &Path) -> String {
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    }

    /// Every `cli::NAME` and `super::NAME` a file's code (comments left out) names.
    fn cli_imports(text: &str) -> Vec<String> {
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut out = Vec::new();
        for prefix in ["crate::cli::", "super::"] {
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
        out
    }

    #[test]
    fn no_command_imports_another() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli");
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let mut broken = Vec::new();
        for path in &files {
            let rel = path.strip_prefix(&root).unwrap();
            let own = module_of(rel);
            if own == "mod" {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            // `super::` inside a folder names the folder itself; only `crate::cli::` and the
            // top-level files' `super::` reach other modules of the command line.
            let nested = rel.components().count() > 1;
            if nested && text.contains("super::super") {
                broken.push(format!(
                    "{} reaches out of its folder with `super::super`: name the module as \
                     `crate::cli::...`",
                    rel.display()
                ));
            }
            for name in cli_imports(&text) {
                let via_super_in_folder = nested && !text.contains(&format!("crate::cli::{name}"));
                if name == own || via_super_in_folder || SHARED.contains(&name.as_str()) {
                    continue;
                }
                broken.push(format!("{} imports the command `{name}`", rel.display()));
            }
        }
        assert!(
            files.len() > 20,
            "read only {} files under {}",
            files.len(),
            root.display()
        );
        assert!(broken.is_empty(), "{}", broken.join("\n"));
    }

    /// The check catches what it is for.
    #[test]
    fn the_check_sees_imports() {
        let text = "use crate::cli::run::EpArgs; // crate::cli::demo\nuse super::common;";
        assert_eq!(cli_imports(text), ["run", "common"]);
    }
}
