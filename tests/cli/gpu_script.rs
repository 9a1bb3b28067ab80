//! scripts/gpu/device.sh runs on a lent GPU machine that no CI run sees (docs/GPU.md): a flag
//! renamed here after the script was written would only show up there, in a 15-minute lease.
//! This test reads every call the script makes to this build's binary (`$M SUBCOMMAND ...`) and
//! to the repository's Python scripts (`python3 "$R/scripts/X.py" ...`, with the `m2r2` flags of
//! their `'NAME: ARGS'` rows), and requires each `--flag` it passes to be one that `--help`
//! lists. (The baseline binary, an older build, is not checked.)

use super::golden_python::python;
use std::path::Path;
use std::process::Command;

/// The script's lines with `\`-continuations joined, each with the number of its first line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let (mut current, mut first) = (String::new(), 1);
    for (i, line) in text.lines().enumerate() {
        if current.is_empty() {
            first = i + 1;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                lines.push((first, std::mem::take(&mut current)));
            }
        }
    }
    lines
}

/// Shell words of `line`, quotes kept inside their word (`"a b"` is one word).
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let (mut word, mut quote) = (String::new(), None);
    for c in line.chars() {
        match (quote, c) {
            (None, '"' | '\'') => {
                quote = Some(c);
                word.push(c);
            }
            (Some(q), c) if c == q => {
                quote = None;
                word.push(c);
            }
            (None, c) if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Where one command's words end: a pipe, a redirection, a list operator.
fn ends_command(word: &str) -> bool {
    word.starts_with('|')
        || word.starts_with('>')
        || word.starts_with("2>")
        || word.starts_with("&&")
        || word.starts_with(';')
        || word.ends_with(';')
}

/// The words of the command that starts at `rest`, up to its end.
fn own(rest: &[String]) -> &[String] {
    let n = rest.iter().take_while(|w| !ends_command(w)).count();
    &rest[..n]
}

/// The `--flags` of the command whose words start at `rest` (values and expansions skipped).
fn flags(rest: &[String]) -> Vec<String> {
    own(rest)
        .iter()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.split('=').next().unwrap_or(w).to_string())
        .collect()
}

/// One call the script makes: what to ask for `--help`, and the flags it passes.
#[derive(Debug)]
struct Call {
    line: usize,
    program: Program,
    flags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Program {
    /// `$M golden write`: the subcommand path
    M2r2(Vec<String>),
    /// `scripts/X.py`, relative to the repository
    Python(String),
}

fn calls(text: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    for (line, text) in logical_lines(text) {
        let words = words(&text);
        for (at, word) in words.iter().enumerate() {
            let rest = &words[at + 1..];
            if word == "$M" {
                // `--bin $M`: the binary as another program's value, not a call
                let path: Vec<String> = rest
                    .iter()
                    .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                    .take_while(|w| !w.starts_with('-'))
                    .cloned()
                    .collect();
                if !path.is_empty() {
                    let flags = flags(&rest[path.len()..]);
                    calls.push(Call {
                        line,
                        program: Program::M2r2(path),
                        flags,
                    });
                }
            } else if let Some(script) = word
                .trim_matches('"')
                .strip_prefix("$R/")
                .filter(|s| s.starts_with("scripts/") && s.ends_with(".py"))
            {
                calls.push(Call {
                    line,
                    program: Program::Python(script.to_string()),
                    flags: flags(rest),
                });
                calls.extend(row_calls(line, rest));
            }
        }
    }
    calls
}

/// The `'NAME: ARGS'` rows a Python script passes on to `m2r2` (`--onnx-row` and genai_builder's
/// `--row` to `m2r2 run`, bench_speculative's `--extra` to `m2r2 generate`).
fn row_calls(line: usize, rest: &[String]) -> Vec<Call> {
    let mut calls = Vec::new();
    for pair in own(rest).windows(2) {
        let command = match pair[0].as_str() {
            "--onnx-row" | "--row" => "run",
            "--extra" => "generate",
            _ => continue,
        };
        let row = pair[1].trim_matches(|c| c == '"' || c == '\'');
        if let Some((_, args)) = row.split_once(':') {
            calls.push(Call {
                line,
                program: Program::M2r2(vec![command.into()]),
                flags: flags(&words(args)),
            });
        }
    }
    calls
}

fn help(program: &Program, root: &Path) -> String {
    let out = match program {
        Program::M2r2(path) => Command::new(env!("CARGO_BIN_EXE_m2r2"))
            .args(path)
            .arg("--help")
            .output(),
        Program::Python(script) => Command::new(python())
            .arg(root.join(script))
            .arg("--help")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output(),
    }
    .expect("the program runs");
    assert!(
        out.status.success(),
        "{program:?} --help failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `flag` stands in `help` as a whole word (`--draft-len`, not the start of `--draft-len-max`).
fn lists(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let next = help[i + flag.len()..].chars().next();
        !matches!(next, Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn the_gpu_script_passes_only_flags_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("scripts/gpu/device.sh");
    let text = std::fs::read_to_string(&script).expect("scripts/gpu/device.sh");
    let calls = calls(&text);
    // the parse found what the script is made of (a parser that sees nothing checks nothing)
    let m2r2 = calls
        .iter()
        .filter(|c| matches!(c.program, Program::M2r2(_)))
        .count();
    let python_flags = calls
        .iter()
        .filter(|c| matches!(c.program, Program::Python(_)) && !c.flags.is_empty())
        .count();
    assert!(m2r2 >= 30 && python_flags >= 5, "{calls:#?}");
    let mut helps: Vec<(Program, String)> = Vec::new();
    let mut unknown = Vec::new();
    for call in calls.iter().filter(|c| !c.flags.is_empty()) {
        if !helps.iter().any(|(p, _)| *p == call.program) {
            helps.push((call.program.clone(), help(&call.program, root)));
        }
        let (_, help) = helps.iter().find(|(p, _)| *p == call.program).unwrap();
        for flag in &call.flags {
            if !lists(help, flag) {
                unknown.push(format!("line {}: {:?} {flag}", call.line, call.program));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "device.sh passes flags its programs do not take:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_parse_reads_continuations_quotes_and_values() {
    let text = "timeout 60 $M golden write --model smollm2 \\\n  --prompt \"a --not-a-flag b\" \
                --out $G/x > /dev/null && echo done\n\
                python3 \"$R/scripts/bench_speculative.py\" --bin $M --no-reference \
                --onnx-row 'chain 2: --draft-len 2' 2>&1 | tail -6\n";
    let calls = calls(text);
    assert_eq!(calls.len(), 3, "{calls:#?}");
    assert_eq!((calls[0].line, calls[1].line), (1, 3));
    assert_eq!(calls[2].program, Program::M2r2(vec!["run".into()]));
    assert_eq!(calls[2].flags, ["--draft-len"]);
    assert_eq!(
        calls[0].program,
        Program::M2r2(vec!["golden".into(), "write".into()])
    );
    assert_eq!(calls[0].flags, ["--model", "--prompt", "--out"]);
    assert_eq!(
        calls[1].program,
        Program::Python("scripts/bench_speculative.py".into())
    );
    assert_eq!(calls[1].flags, ["--bin", "--no-reference", "--onnx-row"]);
    assert!(lists("  --draft-len <N>\n", "--draft-len"));
    assert!(!lists("  --draft-len-max <N>\n", "--draft-len"));
}
