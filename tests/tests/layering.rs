//! The workspace's layering, as docs/ARCHITECTURE.md draws it. This test reads the sources
//! (comments and `#[cfg(test)]` modules, inline or in files of their own, left out: tests may use
//! anything) and fails naming the file and the import that breaks the rule:
//! - `reference/src`: the folders are layers: a folder imports only from folders before it in
//!   reading order;
//! - `reference/src`, `export/src`, `onnx-runner/src`: no two files import each other, directly or
//!   round a cycle (imports are `crate::`, `super::` and `self::` paths, in `use` or in code);
//! - `src/cli`: a command imports only the shared modules (flags, loading, reports), never another
//!   command.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Reading order. `error` is shared by all; each folder may import from the folders before it.
const LAYERS: [&str; 8] = [
    "error", "base", "io", "m2r2", "decode", "golden", "analyze", "moe_aot",
];

/// Folders of the same rank (none imports another).
fn rank(folder: &str) -> Option<usize> {
    match folder {
        "golden" | "analyze" | "moe_aot" => Some(5),
        _ => LAYERS.iter().position(|&l| l == folder),
    }
}

/// `reference/src`.
fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../reference/src")
}

/// `src/cli`: the command line of the `m2r2` binary.
fn cli_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../src/cli")
}

/// The modules of `src/cli` that commands may import; every other module is a command.
const CLI_SHARED: [&str; 8] = [
    "args",
    "common",
    "decode_speed",
    "moe_checks",
    "moe_report",
    "progress",
    "report",
    "step_times",
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

/// The module path of a source file: `base/model.rs` -> `base::model`, `io/gguf/mod.rs` -> `io::gguf`.
fn module_of(rel: &Path) -> String {
    let text = rel.with_extension("").to_string_lossy().replace('/', "::");
    text.strip_suffix("::mod").unwrap_or(&text).to_string()
}

/// The code of a file without comments, string contents and `#[cfg(test)]` items.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules a file declares as `#[cfg(test)] mod name;`, kept in files of their own.
fn test_modules(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| w[1].strip_prefix("mod ")?.strip_suffix(';'))
        .map(|name| name.trim().to_string())
        .collect()
}

/// Every `crate::a::b::...` path in `code`, with `use crate::{a, b::c}` groups expanded to their
/// first segments.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    paths_after(code, "crate::")
}

/// Every `PREFIXa::b::...` path in `code`, with `use PREFIX{a, b::c}` groups expanded.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let segs: Vec<String> = item
                    .trim()
                    .split("::")
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                if !segs.is_empty() {
                    out.push(segs);
                }
            }
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let segs: Vec<String> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

/// `src/cli` module names a file's code reaches through `crate::cli::`, and through `super::` in
/// a top-level file (`super::` in a folder's file names the folder's own modules).
fn cli_imports(code: &str, top_level: bool) -> BTreeSet<String> {
    let mut paths = paths_after(code, "crate::cli::");
    if top_level {
        paths.extend(paths_after(code, "super::"));
    }
    paths.into_iter().map(|segs| segs[0].clone()).collect()
}

struct Source {
    module: String,
    imports: BTreeSet<String>,
}

fn sources() -> Vec<Source> {
    sources_in(src_dir())
}

/// The files of a crate's `src` folder and the modules of that crate each imports.
fn sources_in(root: PathBuf) -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    // (file, module, text), each file read once
    let paths: Vec<(PathBuf, String, String)> = files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&root).unwrap().to_path_buf();
            (
                f.clone(),
                module_of(&rel),
                std::fs::read_to_string(f).unwrap(),
            )
        })
        .collect();
    let modules: BTreeSet<String> = paths.iter().map(|(_, m, _)| m.clone()).collect();
    // files that are `#[cfg(test)] mod name;` of their parent: tests, which may use anything
    let tests: BTreeSet<String> = paths
        .iter()
        .flat_map(|(_, module, text)| {
            test_modules(text)
                .into_iter()
                .map(move |name| format!("{module}::{name}"))
        })
        .collect();
    paths
        .iter()
        .filter(|(_, module, _)| {
            !tests
                .iter()
                .any(|t| module == t || module.starts_with(&(t.clone() + "::")))
        })
        .map(|(file, module, text)| {
            let mut imports = BTreeSet::new();
            // `super::` and `self::` paths too, made absolute: a file's parent module is its
            // folder's (`base/matmul/avx2.rs` -> `base::matmul`), a `mod.rs`'s the folder above.
            let is_mod = file
                .file_name()
                .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
            let parent: Vec<String> = {
                let mut segs: Vec<String> = module.split("::").map(str::to_string).collect();
                if !is_mod {
                    segs.pop();
                }
                segs
            };
            let own: Vec<String> = module.split("::").map(str::to_string).collect();
            let relative = |prefix: &str, base: &[String]| -> Vec<Vec<String>> {
                paths_after(&code(text), prefix)
                    .into_iter()
                    .map(|segs| base.iter().cloned().chain(segs).collect())
                    .collect()
            };
            let mut all = crate_paths(&code(text));
            let parent_of_mod = match is_mod {
                true => own[..own.len().saturating_sub(1)].to_vec(),
                false => parent.clone(),
            };
            all.extend(relative("super::", &parent_of_mod));
            all.extend(relative("self::", if is_mod { &own } else { &parent }));
            for segs in all {
                // the longest prefix that names a module
                for n in (1..=segs.len()).rev() {
                    let candidate = segs[..n].join("::");
                    if modules.contains(&candidate) {
                        let own =
                            candidate == *module || module.starts_with(&(candidate.clone() + "::"));
                        if !own {
                            imports.insert(candidate);
                        }
                        break;
                    }
                }
            }
            Source {
                module: module.clone(),
                imports,
            }
        })
        .collect()
}

fn folder(module: &str) -> &str {
    module.split("::").next().unwrap()
}

#[test]
fn folders_import_only_earlier_folders() {
    let mut broken = Vec::new();
    for source in sources() {
        let from = folder(&source.module);
        if from == "lib" {
            continue;
        }
        let from_rank = rank(from).unwrap_or_else(|| {
            panic!("reference/src/{from} is not in the layer list of tests/tests/layering.rs")
        });
        for import in &source.imports {
            let to = folder(import);
            let to_rank = rank(to).expect("imports name modules of the crate");
            if to != from && to_rank >= from_rank {
                broken.push(format!("{} imports {import}", source.module));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports against the reading order {LAYERS:?}:\n{}",
        broken.join("\n")
    );
}

/// The crates whose files must not import each other round a cycle: the reference, and the
/// crates around it that users read (the exporter and the runner).
const ACYCLIC: [&str; 3] = ["reference/src", "export/src", "onnx-runner/src"];

#[test]
fn no_import_cycles_between_files() {
    for dir in ACYCLIC {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
        if let Some(cycle) = import_cycle(&sources_in(root)) {
            panic!("import cycle in {dir}: {}", cycle.join(" -> "));
        }
    }
}

/// A cycle of imports among `sources`, if there is one.
fn import_cycle(sources: &[Source]) -> Option<Vec<String>> {
    let graph: BTreeMap<&str, Vec<&str>> = sources
        .iter()
        .map(|s| {
            (
                s.module.as_str(),
                s.imports.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    // Depth-first search; a back edge is a cycle.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit<'a>(
        v: &'a str,
        graph: &BTreeMap<&'a str, Vec<&'a str>>,
        marks: &mut BTreeMap<&'a str, Mark>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<&'a str>> {
        marks.insert(v, Mark::Open);
        stack.push(v);
        for &w in graph.get(v).into_iter().flatten() {
            match marks.get(w).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let start = stack.iter().position(|&x| x == w).unwrap();
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(w);
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(w, graph, marks, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(v, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for &v in graph.keys() {
        if marks.get(v).copied().unwrap_or(Mark::New) == Mark::New
            && let Some(cycle) = visit(v, &graph, &mut marks, &mut Vec::new())
        {
            return Some(cycle.into_iter().map(str::to_string).collect());
        }
    }
    None
}

#[test]
fn no_command_imports_another() {
    let root = cli_dir();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 20,
        "read only {} files under {}",
        files.len(),
        root.display()
    );
    let mut broken = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap();
        let module = folder(&module_of(rel)).to_string();
        if module == "mod" {
            continue;
        }
        let code = code(&std::fs::read_to_string(file).unwrap());
        let top_level = rel.components().count() == 1;
        if !top_level && code.contains("super::super") {
            broken.push(format!(
                "{}: name modules outside its folder as `crate::cli::...`",
                rel.display()
            ));
        }
        for import in cli_imports(&code, top_level) {
            if import != module && !CLI_SHARED.contains(&import.as_str()) {
                broken.push(format!(
                    "{} (command `{module}`) imports the command `{import}`",
                    rel.display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "commands may import only {CLI_SHARED:?}:\n{}",
        broken.join("\n")
    );
}

/// The check is not vacuous: it sees the imports it is meant to police.
#[test]
fn the_parser_sees_imports() {
    let paths = crate_paths("use crate::base::model::Model;\nuse crate::{m2r2::cost, io};\n");
    assert_eq!(
        paths,
        vec![
            vec!["base".to_string(), "model".into(), "Model".into()],
            vec!["m2r2".to_string(), "cost".into()],
            vec!["io".to_string()],
        ]
    );
    assert_eq!(
        code("use crate::a; // crate::b\n#[cfg(test)]\nuse crate::c;"),
        "use crate::a; "
    );
    assert_eq!(
        test_modules("pub mod a;\n#[cfg(test)]\nmod tests;\n\n#[cfg(test)]\nmod verify_tests;\n"),
        ["tests", "verify_tests"]
    );
    // a test file is left out like an inline test module; the file it tests is not
    let modules: Vec<String> = sources().into_iter().map(|s| s.module).collect();
    assert!(modules.contains(&"base::tree".to_string()));
    assert!(
        !modules.iter().any(|m| m.starts_with("base::tree::")),
        "{modules:?}"
    );
    assert_eq!(
        cli_imports(
            "use crate::cli::run::EpArgs;\nuse crate::cli::{common, report::x};",
            false
        ),
        BTreeSet::from(["run".to_string(), "common".into(), "report".into()])
    );
    assert!(cli_imports("use super::model::ModelArgs;", false).is_empty());
    assert_eq!(
        cli_imports("use super::generate::f;", true),
        BTreeSet::from(["generate".to_string()])
    );
    let model = sources()
        .into_iter()
        .find(|s| s.module == "base::model")
        .expect("base/model.rs is read");
    assert!(model.imports.contains("base::layer"), "{:?}", model.imports);
    let early_exit = sources()
        .into_iter()
        .find(|s| s.module == "decode::early_exit")
        .expect("decode/early_exit.rs is read");
    assert!(
        early_exit.imports.iter().any(|i| i.starts_with("m2r2::")),
        "{:?}",
        early_exit.imports
    );
}
