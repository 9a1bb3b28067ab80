//! The shape of token trees: nodes, parents, paths, levels, and shapes refused.

use super::*;

#[test]
fn shape_2_1_1_is_two_chains() {
    let tree = TokenTree::parse("2,1,1").unwrap();
    // root; depth 1: 1, 2; depth 2: 3 (of 1), 4 (of 2); depth 3: 5 (of 3), 6 (of 4)
    assert_eq!(tree.nodes(), 7);
    let parents: Vec<_> = (0..7).map(|i| tree.parent(i)).collect();
    assert_eq!(
        parents,
        [None, Some(0), Some(0), Some(1), Some(2), Some(3), Some(4)]
    );
    assert_eq!(tree.path(6), [0, 2, 4, 6]);
    assert_eq!(tree.path(0), [0]);
    assert_eq!(tree.level(1), 1..3);
    assert_eq!(tree.level(3), 5..7);
    assert_eq!(tree.level(4), 7..7);
    assert_eq!(tree.children(0), 1..3);
    assert_eq!(tree.children(2), 4..5);
    assert_eq!(tree.children(6), 7..7);
    assert_eq!(tree.max_depth(), 3);
    assert_eq!(tree.position(5, 10), 13);
    assert!(tree.sees(6, 4) && tree.sees(6, 0) && tree.sees(6, 6));
    assert!(!tree.sees(6, 3) && !tree.sees(6, 1) && !tree.sees(2, 1) && !tree.sees(0, 1));
    assert_eq!(tree, TokenTree::from_parents(&[0, 0, 1, 2, 3, 4]).unwrap());
}

#[test]
fn a_chain_is_a_chunk() {
    let tree = TokenTree::chain(3).unwrap();
    assert_eq!(tree, TokenTree::parse("1, 1,1").unwrap());
    assert_eq!(TokenTree::chain(0).unwrap().nodes(), 1);
    // a chain's keys are the chunk's: lo..=position, its slots its positions
    for i in 0..4 {
        assert_eq!(tree.position(i, 5), 5 + i);
        assert_eq!(
            tree.key_slots(i, 5, 2, true),
            (2..=5 + i).collect::<Vec<_>>()
        );
        assert_eq!(
            tree.key_slots(i, 5, 2, false),
            (2..5 + i).collect::<Vec<_>>()
        );
    }
}

/// The keys of node 6 of `2,1,1` (path 0, 2, 4, 6) with the root at 4 and a window of 3.
#[test]
fn key_slots_skip_other_branches_and_the_window() {
    let tree = TokenTree::parse("2,1,1").unwrap();
    // no window: cache 0..4, then slots of 0, 2, 4, 6
    assert_eq!(tree.key_slots(6, 4, 0, true), [0, 1, 2, 3, 4, 6, 8, 10]);
    assert_eq!(tree.key_slots(6, 4, 0, false), [0, 1, 2, 3, 4, 6, 8]);
    // node 6 at position 7, window 3: positions 5..=7, i.e. nodes 2 (slot 6), 4, 6
    assert_eq!(tree.key_slots(6, 4, 5, true), [6, 8, 10]);
    // node 1 at position 5, window 3: cache 3, the root, itself
    assert_eq!(tree.key_slots(1, 4, 3, true), [3, 4, 5]);
}

#[test]
fn bad_shapes_are_refused_with_the_reason() {
    let err = |spec: &str| TokenTree::parse(spec).unwrap_err().to_string();
    assert!(
        err("2,0,1").contains("width at depth 2 is 0"),
        "{}",
        err("2,0,1")
    );
    assert!(err("").contains("`` is not a width"), "{}", err(""));
    assert!(err("2,x").contains("`x` is not a width"));
    assert!(err("-1").contains("`-1` is not a width"));
    // 1 + 8 + 64 = 73 nodes
    let big = err("8,8");
    assert!(
        big.contains("8,8 has 73 nodes") && big.contains("at most 64"),
        "{big}"
    );
    // sizes that overflow are refused, not wrapped
    let huge = err("99999999999,99999999999,99999999999");
    assert!(huge.contains("too many nodes"), "{huge}");
    assert_eq!(TokenTree::from_widths(&[63]).unwrap().nodes(), 64);
    assert!(TokenTree::chain(64).is_err());
    let order = TokenTree::from_parents(&[0, 1, 0]).unwrap_err().to_string();
    assert!(order.contains("node 3 has parent 0"), "{order}");
    assert!(TokenTree::from_parents(&[1]).is_err());
}
