//! Tests of `figures`.
use super::*;

#[test]
fn median_min_max_and_ratio_direction() {
    let s = Stats::of(vec![3.0, 1.0, 2.0]).expect("stats");
    assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
    assert_eq!(s.runs, vec![3.0, 1.0, 2.0]);
    let s = Stats::of(vec![4.0, 1.0, 2.0, 3.0]).expect("stats");
    assert_eq!(s.median, 2.5);
    assert!(Stats::of(Vec::new()).is_none());
    assert_eq!(ratio(Better::Higher, 200.0, 100.0), Some(2.0));
    assert_eq!(ratio(Better::Lower, 50.0, 100.0), Some(2.0));
    assert_eq!(ratio(Better::Lower, 0.0, 100.0), None);
    assert!(Stats::of(vec![0.9, 1.1]).expect("stats").crosses_1());
    assert!(!Stats::of(vec![1.0, 1.1]).expect("stats").crosses_1());
}
