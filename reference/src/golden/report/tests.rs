//! Tests of the check report: rows over tolerance, integer divergences, stops, tolerances.

use super::*;
use ndarray::array;

#[test]
fn rows_over_tolerance_are_counted_and_the_first_named() {
    let want = array![[0.0f32, 1.0], [2.0, 3.0], [4.0, 5.0]];
    let got = array![[0.0f32, 1.0], [2.5, 3.0], [4.0, 5.2]];
    let c = compare_rows(
        "logits",
        "model.onnx",
        want.view(),
        got.view(),
        Tolerance::absolute(0.1),
    );
    assert!(!c.ok);
    assert_eq!((c.first_row, c.rows_over, c.values_over), (Some(1), 2, 2));
    assert_eq!(c.at, vec![1, 0]);
    assert!((c.row_max_abs[2] - 0.2).abs() < 1e-6 && c.row_max_abs[0] == 0.0);
    let c = c.in_rounds("verified row", &[None, Some(0), Some(1)]);
    assert_eq!(c.first_failure().unwrap(), "verified row 1 (round 0)");
    let inf = array![[f32::NEG_INFINITY, 1.0]];
    assert!(compare_rows("d", "", inf.view(), inf.view(), Tolerance::absolute(0.0),).ok);
    assert!(
        c.describe(&|_| None)
            .contains("2 of 3 verified rows and 2 values over")
    );
}

#[test]
fn integer_rows_report_one_divergence_without_padding() {
    // rounds of two drafts, the second round drafted one (padding -1 never shown)
    let want = [5, 6, 7, -1, 8, 9];
    let got = [5, 6, 7, 4, 1, 2];
    let c = compare_int_rows("round_drafted", "draft.onnx", &want, &got, 2, true);
    assert_eq!((c.first_row, c.rows_over, c.values_over), (Some(1), 2, 3));
    let d = c.divergence.as_ref().unwrap();
    assert_eq!(
        (d.golden.clone(), d.recomputed.clone()),
        (vec![7, -1], vec![7, 4])
    );
    let text = |id: i64| (id == 7).then(|| "seven".to_string());
    let c = c.in_rounds("round", &[Some(0), Some(1), Some(2)]);
    let line = c.describe(&text);
    assert!(
        line.starts_with("first divergence at round 1: token golden"),
        "{line}"
    );
    assert!(line.contains("\"seven\" (7)"), "{line}");
}

#[test]
fn stops_at_end_of_turn_against_a_golden_that_ran_on() {
    let none = |_: i64| None;
    // the golden ran on past end of turn (2); the deployment stopped there
    let rules = |longer_stopped, shorter_budget| StopRules {
        longer_stopped,
        shorter_budget,
    };
    let stops = |want: &[i64], got: &[i64], rules| {
        compare_stops("", "recomputed", (want, got), &[2], rules, &none)
    };
    let c = stops(&[4, 2, 9, 9], &[4, 2], rules(false, None)).unwrap();
    assert!(c.ok, "{c:?}");
    // both stop at end of turn but at different places
    let c = stops(&[4, 2], &[4, 5, 2], rules(true, None)).unwrap();
    assert!(
        !c.ok && c.note.contains("golden 2 tokens, recomputed 3"),
        "{c:?}"
    );
    assert!(stops(&[1], &[1], rules(true, None)).is_none());
    // the shorter one ran its budget of 2 steps: its end says nothing about stopping
    let c = stops(&[4, 5, 9], &[4, 5], rules(true, Some(2))).unwrap();
    assert!(c.ok && c.note.contains("ran its whole budget"), "{c:?}");
    // without a stop token and short of its budget: a difference, said as it is
    let c = stops(&[4, 5, 9], &[4, 5], rules(true, Some(8))).unwrap();
    assert!(
        !c.ok
            && c.note
                .contains("recomputed ended without a stop token after 2"),
        "{c:?}"
    );
    assert!(
        c.describe(&none).starts_with("at step 1: golden 3 tokens"),
        "{}",
        c.describe(&none)
    );
}

#[test]
fn tolerance_follows_onnx_runtimes_convention() {
    let t = Tolerance {
        atol: 1e-3,
        rtol: 1e-2,
    };
    // |got - want| <= atol + rtol |want|
    assert!(t.excess(100.0, 101.0) <= 1.0); // 1 <= 0.001 + 1
    assert!(t.excess(100.0, 101.1) > 1.0);
    assert!(t.excess(0.0, 0.0009) <= 1.0);
    assert!(t.excess(0.0, 0.0011) > 1.0);
    assert_eq!(t.excess(1.0, f32::NAN), f32::INFINITY);
    let exact = Tolerance::absolute(0.0);
    assert_eq!(exact.excess(2.0, 2.0), 0.0);
    assert_eq!(exact.excess(2.0, 2.0 + 1e-6), f32::INFINITY);
}

#[test]
fn a_bound_is_a_finite_number_at_least_zero() {
    for x in [0.0, 1e-4, 5e-2, 1e30] {
        Tolerance::check_bound("--atol", x).unwrap();
    }
    for x in [-1e-4, f32::NAN, f32::INFINITY] {
        let err = Tolerance::check_bound("--rtol", x).unwrap_err().to_string();
        assert_eq!(err, format!("--rtol must be a finite number >= 0, got {x}"));
    }
}

/// Non-finite values: the same one in both places is equal (NaN and NaN too), a NaN in one only
/// is a difference reported as NaN (not `inf`), an infinity against a number one of `inf`.
#[test]
fn equal_non_finite_values_are_equal_and_a_lone_nan_differs_by_nan() {
    let tol = Tolerance::absolute(1e-4);
    let check = |want: ndarray::Array2<f32>, got: ndarray::Array2<f32>| {
        compare_rows("logits", "", want.view(), got.view(), tol)
    };
    let odd = array![[1.0f32, f32::NAN], [f32::INFINITY, f32::NEG_INFINITY]];
    let c = check(odd.clone(), odd.clone());
    assert!(
        c.ok && c.max_abs == 0.0 && c.row_max_abs == vec![0.0, 0.0],
        "{c:?}"
    );
    // a NaN where the other has a number, in row 1 beside a difference of 0.5
    let want = array![[1.0f32, 2.0], [3.0, 4.0]];
    let got = array![[1.0f32, 2.0], [3.5, f32::NAN]];
    let c = check(want.clone(), got);
    assert!(!c.ok && c.max_abs.is_nan() && c.max_rel.is_nan(), "{c:?}");
    assert_eq!(
        (c.at.clone(), c.first_row, c.values_over),
        (vec![1, 1], Some(1), 2)
    );
    assert!(
        c.row_max_abs[0] == 0.0 && c.row_max_abs[1].is_nan(),
        "{c:?}"
    );
    assert!(
        c.describe(&|_| None).contains("worst NaN at [1, 1]"),
        "{c:?}"
    );
    // the same the other way round, and an infinity against a number
    assert!(check(array![[f32::NAN]], array![[1.0f32]]).max_abs.is_nan());
    let c = check(array![[f32::INFINITY]], array![[1.0f32]]);
    assert!(!c.ok && c.max_abs == f32::INFINITY, "{c:?}");
}
