//! Request and geometry validation: each bad input is its typed error, with its message.

use kvsched::rules::geometry::{CacheGroup, Geometry, GeometryError};
use kvsched::rules::recovery::{validate_request, validate_requests, InvalidSet, RecoveryError};

use super::helpers::{async_req, geo, sync_req};

#[test]
fn validation_errors() {
    let g = geo(
        vec![
            CacheGroup::full_attention(16),
            CacheGroup::sliding_window(16, 16),
        ],
        None,
    );
    let ok = async_req("ok", 32, vec![vec![1, 2], vec![0, 3]]);
    assert_eq!(validate_request(&g, ok.view()), Ok(()));

    let r = async_req("t", 32, vec![vec![1, 2]]);
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::TableCount {
            given: 1,
            groups: 2
        })
    );
    let r = sync_req("x", 16, 17, vec![vec![1, 2], vec![3, 4]]);
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::ScheduledExceedsComputed {
            scheduled: 17,
            computed: 16
        })
    );
    let mut r = async_req("y", 32, vec![vec![1, 2], vec![3, 4]]);
    r.num_scheduled_tokens = 16;
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::AsyncWithScheduled { scheduled: 16 })
    );
    // A null in the full-attention table below P (P = 48 - 16 = 32: indices 0, 1).
    let r = sync_req("n", 48, 16, vec![vec![1, 0, 5], vec![0, 0, 0]]);
    assert_eq!(
        validate_request(&g, r.view()),
        Err(RecoveryError::NullInFullAttention {
            group: 0,
            index: 1,
            pre_step_tokens: 32
        })
    );
    // At or past P a null is accepted, as are nulls in the sliding window.
    let r = sync_req("n2", 48, 16, vec![vec![1, 2, 0], vec![0, 0, 0]]);
    assert_eq!(validate_request(&g, r.view()), Ok(()));

    // validate_requests: the index of the first bad request; duplicate ids.
    let reqs = vec![
        ok.clone(),
        async_req("b", 16, vec![vec![4], vec![5]]),
        async_req("ok", 16, vec![vec![6], vec![7]]),
    ];
    assert_eq!(
        validate_requests(&g, &reqs),
        Err((
            2,
            RecoveryError::DuplicateRequestId {
                id: "ok".to_string()
            }
        ))
    );
    let reqs = vec![ok.clone(), async_req("bad", 16, vec![vec![4]])];
    assert_eq!(
        validate_requests(&g, &reqs),
        Err((
            1,
            RecoveryError::TableCount {
                given: 1,
                groups: 2
            }
        ))
    );
    assert_eq!(validate_requests(&g, &[]), Ok(()));

    // A qualified report with the wrong list count.
    let e = InvalidSet::with_groups([], &[vec![1u64]], &g).unwrap_err();
    assert_eq!(
        e,
        RecoveryError::ReportGroupCount {
            given: 1,
            groups: 2
        }
    );
    let e = InvalidSet::with_groups([1], &[vec![1u64], vec![], vec![]], &g).unwrap_err();
    assert_eq!(
        e,
        RecoveryError::ReportGroupCount {
            given: 3,
            groups: 2
        }
    );
    // Messages name the problem as docs/replay.md#bad-input-classes shows.
    assert_eq!(
        RecoveryError::TableCount {
            given: 2,
            groups: 3
        }
        .to_string(),
        "2 tables given, 3 groups configured"
    );
    // One of a thing is singular.
    for (e, text) in [
        (
            RecoveryError::TableCount {
                given: 2,
                groups: 1,
            },
            "2 tables given, 1 group configured",
        ),
        (
            RecoveryError::TableCount {
                given: 1,
                groups: 2,
            },
            "1 table given, 2 groups configured",
        ),
        (
            RecoveryError::ReportGroupCount {
                given: 1,
                groups: 2,
            },
            "1 list given, 2 groups configured",
        ),
        (
            RecoveryError::ReportGroupCount {
                given: 0,
                groups: 1,
            },
            "0 lists given, 1 group configured",
        ),
    ] {
        assert_eq!(e.to_string(), text);
    }
}

#[test]
fn geometry_errors() {
    assert_eq!(Geometry::new(vec![], None, 0), Err(GeometryError::NoGroups));
    assert_eq!(
        Geometry::new(
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::full_attention(24)
            ],
            Some(32),
            0
        ),
        Err(GeometryError::NotAMultiple {
            scheduler_block_size: 32,
            group: 1,
            block_size: 24
        })
    );
    assert_eq!(
        Geometry::new(
            vec![
                CacheGroup::full_attention(16),
                CacheGroup::full_attention(24)
            ],
            None,
            0
        )
        .unwrap()
        .scheduler_block_size(),
        48
    );
}
