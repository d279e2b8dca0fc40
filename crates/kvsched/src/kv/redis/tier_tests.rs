//! Tests of `tier`.
use super::cluster::key_slot;
use super::*;

#[test]
fn keys_are_namespaced_by_tag_without_hash_tags() {
    let t = RedisTier::new(RedisConfig::standalone("127.0.0.1:1").unwrap().tag("m:7")).unwrap();
    let k = ChunkKey(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    assert_eq!(
        t.redis_key(k),
        b"kvsched:m:7:0123456789abcdef0011223344556677".to_vec()
    );
    // Keys of one model spread over slots (no `{...}` hash tag pins them to one).
    let slots: std::collections::BTreeSet<u16> = (0..64u128)
        .map(|i| key_slot(&t.redis_key(ChunkKey::chain(ChunkKey(i), 1, 0, &[1]))))
        .collect();
    assert!(slots.len() > 32, "{}", slots.len());
}

#[test]
fn empty_calls_make_no_round_trip_and_big_values_are_refused() {
    let t = RedisTier::new(
        RedisConfig::standalone("127.0.0.1:1")
            .unwrap()
            .max_value_bytes(4),
    )
    .unwrap();
    let c = CancelToken::new();
    assert_eq!(t.get(&[], &c).unwrap(), Vec::<Option<Vec<u8>>>::new());
    assert_eq!(t.exists(&[], &c).unwrap(), Vec::<bool>::new());
    t.put(&[]).unwrap();
    assert!(matches!(
        t.put(&[(ChunkKey(1), vec![0; 5])]),
        Err(TierError::Refused(_))
    ));
    assert_eq!(t.counts(), RedisCounts::default());
}

#[test]
fn a_cancelled_token_stops_before_the_first_pipeline() {
    let t = RedisTier::new(RedisConfig::standalone("127.0.0.1:1").unwrap()).unwrap();
    let c = CancelToken::new();
    c.cancel();
    assert!(matches!(
        t.get(&[ChunkKey(1)], &c),
        Err(TierError::Cancelled)
    ));
    assert_eq!(t.counts().round_trips, 0);
}

#[test]
fn a_missing_ca_file_is_a_config_error() {
    let cfg = RedisConfig::from_url("rediss://127.0.0.1:1?ca=/nonexistent/ca.pem").unwrap();
    match RedisTier::new(cfg) {
        Err(ConfigError::CaCert { path, .. }) => {
            assert_eq!(path, std::path::Path::new("/nonexistent/ca.pem"))
        }
        other => panic!("{:?}", other.err()),
    }
}
