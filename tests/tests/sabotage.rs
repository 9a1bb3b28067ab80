//! The sabotage helper (`m2r2_tests::sabotage`): the copy is altered exactly as asked, the source
//! export folder stays byte for byte as it was (hard links replaced, external data untouched), and
//! a wrong graph or initializer name is an error naming it.

use export::builder::WeightsDtype;
use export::graphs::{ExportOptions, GraphKind};
use export::proto::tensor_proto::{DataLocation, DataType};
use export::proto::{GraphProto, ModelProto, TensorProto};
use m2r2_tests::sabotage::{
    Sabotage, TINY_TARGETS, initializer_values, initializers, sabotage_export,
};
use prost::Message;
use reference::io::builtin;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::weights::M2r2Weights;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// tiny exported (all four graphs, its tokenizer) into a new temporary folder.
fn export_tiny(weights_dtype: WeightsDtype, external_data: bool) -> tempfile::TempDir {
    let model = builtin::builtin("tiny").expect("the built-in model");
    let m2r2 = M2r2Weights::builtin_for("tiny", &model.config).expect("built-in M2R2 weights");
    let tokenizer =
        Tokenizer::byte_level_builtin(builtin::BUILTIN_VOCAB).expect("the built-in tokenizer");
    let request = export::folder::ExportRequest {
        model: &model,
        tokenizer: Some(&tokenizer),
        m2r2: &m2r2,
        options: ExportOptions {
            model_name: "tiny".into(),
            opset: 17,
            weights_dtype,
            draft_gate: m2r2.config.draft_gate,
            static_cache: None,
            merge_adapters: false,
        },
        graphs: GraphKind::ALL.to_vec(),
        external_data,
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    export::folder::export(&request, &dir.path().join("src"), &mut |_| {}).expect("tiny exports");
    dir
}

/// Every file under `dir` (relative path -> bytes).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("a readable folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root").to_path_buf();
                out.insert(rel, std::fs::read(&path).expect("a readable file"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The first 2-D initializer of `graph` (name, rows, cols).
fn first_matrix(graph: &Path) -> (String, usize, usize) {
    initializers(graph)
        .expect("readable initializers")
        .into_iter()
        .find_map(|(name, dims, _)| match dims.as_slice() {
            &[r, c] if r > 1 && c > 2 => Some((name, r as usize, c as usize)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{}: no 2-D initializer", graph.display()))
}

/// The initializer `name` as stored in the graph file.
fn stored(graph: &Path, name: &str) -> TensorProto {
    export::write::read_graph(graph)
        .expect("a graph")
        .graph
        .expect("a graph body")
        .initializer
        .into_iter()
        .find(|t| t.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{}: no `{name}`", graph.display()))
}

/// Check that `got` is `want` altered as `how` says: column `c` zero and every other value
/// bit-equal, or every value exactly scaled (rounded back to f16 when stored as f16).
fn assert_altered(name: &str, dims: &[i64], how: Sabotage, f16: bool, want: &[f32], got: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (i, (&w, &g)) in want.iter().zip(got).enumerate() {
        let expected = match how {
            Sabotage::Scale(s) if f16 => half::f16::from_f32(w * s).to_f32(),
            Sabotage::Scale(s) => w * s,
            Sabotage::ZeroColumn(c) if i % dims[1] as usize == c => 0.0,
            Sabotage::ZeroColumn(_) => w,
        };
        assert_eq!(
            g.to_bits(),
            expected.to_bits(),
            "{name}[{i}]: {g} vs {expected}"
        );
    }
}

/// Every sabotage of [`TINY_TARGETS`] on one export: the copy's target altered exactly, the
/// target stored inline, every other file of the copy as in the source, the source untouched.
fn check_sabotages(weights_dtype: WeightsDtype, external_data: bool) {
    let dir = export_tiny(weights_dtype, external_data);
    let src = dir.path().join("src");
    let before = snapshot(&src);
    if external_data {
        assert!(
            before.contains_key(Path::new("verifier.onnx.data")),
            "an external-data export"
        );
    }
    for (i, target) in TINY_TARGETS.iter().enumerate() {
        let dst = dir.path().join(format!("sabotaged{i}"));
        let done = sabotage_export(&src, &dst, target.graph, target.initializer, target.how)
            .unwrap_or_else(|e| panic!("{target:?}: {e}"));
        println!("{done:?}");
        assert_eq!(
            (done.graph.as_str(), done.initializer.as_str()),
            (target.graph, target.initializer)
        );
        assert_eq!(done.dtype, weights_dtype.name());
        let want = initializer_values(&src.join(target.graph), target.initializer).expect("values");
        let got = initializer_values(&dst.join(target.graph), target.initializer).expect("values");
        let f16 = weights_dtype == WeightsDtype::F16;
        assert_altered(target.initializer, &done.dims, target.how, f16, &want, &got);
        let changed = want
            .iter()
            .zip(&got)
            .filter(|(w, g)| w.to_bits() != g.to_bits());
        assert_eq!(done.changed_values, changed.count());
        assert!(done.changed_values > 0, "{target:?} changed nothing");
        let t = stored(&dst.join(target.graph), target.initializer);
        assert!(t.external_data.is_empty() && t.raw_data.is_some(), "inline");

        let mut copy = snapshot(&dst);
        let mut rest = before.clone();
        let graph = Path::new(target.graph);
        assert_ne!(copy.remove(graph), rest.remove(graph), "{target:?}");
        assert_eq!(copy, rest, "the other files are copied as they are");
        assert_eq!(snapshot(&src), before, "the source folder is untouched");
    }
}

#[test]
fn f32_inline_export_is_sabotaged_in_the_copy_only() {
    check_sabotages(WeightsDtype::F32, false);
}

#[test]
fn f16_external_data_export_is_sabotaged_in_the_copy_only() {
    check_sabotages(WeightsDtype::F16, true);
}

#[test]
fn wrong_names_and_shapes_are_errors_naming_them() {
    let dir = export_tiny(WeightsDtype::F32, false);
    let src = dir.path().join("src");
    let before = snapshot(&src);
    let (name, _, cols) = first_matrix(&src.join("draft.onnx"));
    let err = |dst: &str, graph: &str, init: &str, how| {
        sabotage_export(&src, &dir.path().join(dst), graph, init, how)
            .expect_err("a sabotage that cannot be done")
    };

    let e = err("a", "draft.onnx", "no.such.weight", Sabotage::Scale(2.0));
    assert!(
        e.contains("no.such.weight") && e.contains("draft.onnx"),
        "{e}"
    );
    assert!(
        !dir.path().join("a").exists(),
        "nothing copied for a refusal"
    );
    let e = err("b", "drafty.onnx", &name, Sabotage::Scale(2.0));
    assert!(e.contains("drafty.onnx"), "{e}");
    let e = err("c", "../src/draft.onnx", &name, Sabotage::Scale(2.0));
    assert!(e.contains("../src/draft.onnx"), "{e}");
    let e = err("d", "draft.onnx", &name, Sabotage::ZeroColumn(cols));
    assert!(
        e.contains(&name) && e.contains(&format!("column {cols}")),
        "{e}"
    );
    // A 1-D initializer has no columns.
    let (vector, _, _) = initializers(&src.join("draft.onnx"))
        .expect("initializers")
        .into_iter()
        .find(|(_, dims, t)| dims.len() == 1 && *t == DataType::Float as i32)
        .expect("a 1-D f32 initializer");
    let e = err("e", "draft.onnx", &vector, Sabotage::ZeroColumn(0));
    assert!(e.contains(&vector) && e.contains("not 2-D"), "{e}");
    // The copy's folder must be empty, so no copy writes through a link.
    let e = err("src", "draft.onnx", &name, Sabotage::Scale(2.0));
    assert!(e.contains("must not exist or be empty"), "{e}");
    let e = err("src/inside", "draft.onnx", &name, Sabotage::Scale(2.0));
    assert!(e.contains("cannot be inside the export folder"), "{e}");
    assert_eq!(snapshot(&src), before, "the source folder is untouched");
}

/// Initializers in the typed fields (`float_data`, f16 bits in `int32_data`) and external data
/// with only `location` (offset 0, length the tensor's size) are read and altered too.
#[test]
fn typed_fields_and_minimal_external_data_are_handled() {
    let tensor = |name: &str, data_type: DataType, dims: Vec<i64>| TensorProto {
        name: Some(name.into()),
        data_type: Some(data_type as i32),
        dims,
        ..Default::default()
    };
    let mut f32_typed = tensor("f32_typed", DataType::Float, vec![2, 3]);
    f32_typed.float_data = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mut f16_typed = tensor("f16_typed", DataType::Float16, vec![3, 2]);
    f16_typed.int32_data = [1.0f32, -2.0, 0.5, 4.0, 0.0, 8.0]
        .iter()
        .map(|&x| i32::from(half::f16::from_f32(x).to_bits()))
        .collect();
    let mut f32_external = tensor("f32_external", DataType::Float, vec![2, 2]);
    f32_external.data_location = Some(DataLocation::External as i32);
    f32_external.external_data = vec![export::proto::StringStringEntryProto {
        key: Some("location".into()),
        value: Some("weights.bin".into()),
    }];
    let mut int64 = tensor("int64", DataType::Int64, vec![2]);
    int64.int64_data = vec![1, 2];
    let model = ModelProto {
        graph: Some(GraphProto {
            initializer: vec![f32_typed, f16_typed, f32_external, int64],
            ..Default::default()
        }),
        ..Default::default()
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("folders");
    std::fs::write(src.join("g.onnx"), model.encode_to_vec()).expect("write");
    let external: Vec<u8> = [9.0f32, 10.0, 11.0, 12.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    std::fs::write(src.join("weights.bin"), &external).expect("write");
    std::fs::write(src.join("sub").join("note.txt"), "kept").expect("write");
    let before = snapshot(&src);

    let cases = [
        (
            "f32_typed",
            Sabotage::ZeroColumn(1),
            vec![1.0, 0.0, 3.0, 4.0, 0.0, 6.0],
            2,
        ),
        (
            "f16_typed",
            Sabotage::Scale(2.0),
            vec![2.0, -4.0, 1.0, 8.0, 0.0, 16.0],
            5,
        ),
        (
            "f32_external",
            Sabotage::ZeroColumn(0),
            vec![0.0, 10.0, 0.0, 12.0],
            2,
        ),
    ];
    for (i, (name, how, want, changed)) in cases.into_iter().enumerate() {
        let dst = dir.path().join(format!("dst{i}"));
        let done = sabotage_export(&src, &dst, "g.onnx", name, how).expect("sabotage");
        assert_eq!(done.changed_values, changed, "{name}");
        let got = initializer_values(&dst.join("g.onnx"), name).expect("values");
        assert_eq!(got, want, "{name}");
        assert_eq!(
            std::fs::read(dst.join("sub").join("note.txt")).expect("copied"),
            b"kept"
        );
        assert_eq!(snapshot(&src), before, "the source folder is untouched");
    }
    let e = sabotage_export(
        &src,
        &dir.path().join("x"),
        "g.onnx",
        "int64",
        Sabotage::Scale(2.0),
    )
    .expect_err("int64 is not handled");
    assert!(e.contains("int64") && e.contains("data_type 7"), "{e}");
}
