//! Tests of `config`.
use super::*;

#[test]
fn url_standalone_with_acl_user_and_db() {
    let c = RedisConfig::from_url("redis://alice:p%40ss@127.0.0.1:7000/2?tag=m1&pool=8").unwrap();
    assert!(!c.cluster && !c.tls);
    assert_eq!(
        c.seeds,
        vec![NodeAddr {
            host: "127.0.0.1".into(),
            port: 7000
        }]
    );
    assert_eq!(c.username, Some(Secret("alice".into())));
    assert_eq!(c.password, Some(Secret("p@ss".into())));
    assert_eq!((c.db, c.tag.as_str(), c.pool_size), (2, "m1", 8));
    c.validate().unwrap();
}

#[test]
fn url_cluster_seeds_tls_and_defaults() {
    let c = RedisConfig::from_url("rediss://:pw@a:1,b,[::1]:3?ca=/tmp/ca.pem&ttl_ms=500").unwrap();
    assert!(c.cluster && c.tls);
    let seeds: Vec<String> = c.seeds.iter().map(|s| s.to_string()).collect();
    assert_eq!(seeds, ["a:1", "b:6379", "[::1]:3"]);
    assert_eq!(c.username, None);
    assert_eq!(c.ttl, Some(Duration::from_millis(500)));
    assert_eq!(
        c.ca_cert.as_deref(),
        Some(std::path::Path::new("/tmp/ca.pem"))
    );
    c.validate().unwrap();
    let single = RedisConfig::from_url("redis://h?cluster=yes").unwrap();
    assert!(single.cluster);
}

#[test]
fn url_errors_name_the_part_and_never_echo_it() {
    let secret = "Hunter2secret";
    for url in [
        format!("http://u:{secret}@h"),
        format!("redis://u:{secret}"), // password taken for a port
        format!("redis://{secret}:{secret}"), // idem, no '@'
        format!("redis://u:{secret}@h:99999"),
        format!("redis://u:{secret}@h/x{secret}"),
        format!("redis://u:{secret}@h?pool={secret}"),
        format!("redis://{secret}@h"),
        format!("redis://u:{secret}@"),
        format!("redis://u:{secret}@h,"),
        format!("redis://u:{secret}@127.0.0.1:99999"),
        format!("redis://u:{secret}@bad_host!"),
        format!("redis://u:{secret}%zz@h"),
        format!("REDIS://u:{secret}@h"),
        format!("redis:/u:{secret}@h"),
        format!(" redis://u:{secret}@h"),
        format!("redis://:{secret}%@h"),
        format!("redis://u:6379?{secret}@h:1?nope=1"),
        format!("redis://u:a/b?{secret}@h"),
        format!("redis://u:a/b?x&{secret}=1@h"),
    ] {
        let text = RedisConfig::from_url(&url).expect_err(&url).to_string();
        assert!(!text.contains(secret), "{text}");
    }
    // An unknown query key is named by its position, never repeated.
    match RedisConfig::from_url(&format!("redis://h?tag=a&{}=1", "k".repeat(40))) {
        Err(ConfigError::Query { key, .. }) => assert_eq!(key, "#2"),
        other => panic!("{other:?}"),
    }
    match RedisConfig::from_url("redis://h?pool=x") {
        Err(ConfigError::Query { key, .. }) => assert_eq!(key, "pool"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        RedisConfig::from_url("redis://h:0"),
        Err(ConfigError::Seed { index: 1, .. })
    ));
    assert!(matches!(
        RedisConfig::from_url("redis://a,b:x"),
        Err(ConfigError::Seed { index: 2, .. })
    ));
    assert!(matches!(
        RedisConfig::from_url("redis://h?nope=1"),
        Err(ConfigError::Query { .. })
    ));
    assert!(matches!(
        RedisConfig::from_url("ftp://h"),
        Err(ConfigError::Scheme)
    ));
}

#[test]
fn a_query_value_out_of_range_names_the_query_key() {
    for (url, named) in [
        ("redis://h?timeout_ms=0", "timeout_ms"),
        ("redis://h?connect_timeout_ms=0", "connect_timeout_ms"),
        (
            "redis://h?checkout_timeout_ms=3600001",
            "checkout_timeout_ms",
        ),
        ("redis://h?ttl_ms=0", "ttl_ms"),
        ("redis://h?max_value_bytes=0", "max_value_bytes"),
        ("redis://h?max_value_bytes=536870913", "max_value_bytes"),
        ("redis://h?max_value_bytes=1k", "max_value_bytes"),
        ("redis://h?pool=0", "pool"),
        ("redis://h?tag=a%20b", "tag"),
        ("redis://h?ca=/x", "ca"),
    ] {
        let e = RedisConfig::from_url(url).expect_err(url);
        assert!(
            matches!(&e, ConfigError::Query { key, .. } if key == named),
            "{url}: {e:?}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("url: query key {named}: ")),
            "{e}"
        );
    }
    let c = RedisConfig::from_url("redis://h?timeout_ms=3600000&pool=1024&ttl_ms=1").unwrap();
    c.validate().unwrap();
    let c = RedisConfig::from_url("redis://h?max_value_bytes=65536").unwrap();
    assert_eq!(c.max_value_bytes, 65536);
}

#[test]
fn a_password_holding_query_characters_is_the_password() {
    let c = RedisConfig::from_url("redis://u:6379?SECRET&x=y@h:1/3?tag=t").unwrap();
    assert_eq!(c.password, Some(Secret("6379?SECRET&x=y".into())));
    assert_eq!(c.username, Some(Secret("u".into())));
    assert_eq!((c.db, c.tag.as_str()), (3, "t"));
    assert_eq!(c.redacted_url(), "redis://***:***@h:1/3");
    // A '/' in a query value is no userinfo boundary.
    let c = RedisConfig::from_url("rediss://h?ca=/tmp/a@b.pem").unwrap();
    assert_eq!(c.password, None);
    assert_eq!(
        c.ca_cert.as_deref(),
        Some(std::path::Path::new("/tmp/a@b.pem"))
    );
}

#[test]
fn debug_and_redacted_url_hide_credentials() {
    let c = RedisConfig::from_url("redis://kvuser:TopSecret99@h:1").unwrap();
    let d = format!("{c:?}");
    assert!(!d.contains("TopSecret99") && !d.contains("kvuser"), "{d}");
    assert_eq!(c.redacted_url(), "redis://***:***@h:1");
    let c = RedisConfig::standalone("h:1")
        .unwrap()
        .credentials(None, "pw");
    assert_eq!(c.redacted_url(), "redis://:***@h:1");
}

#[test]
fn validate_names_the_field() {
    let base = RedisConfig::standalone("127.0.0.1:6379").unwrap();
    let field = |c: RedisConfig| match c.validate() {
        Err(ConfigError::Setting { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(base.clone().tag("{x}")), "tag");
    assert_eq!(field(base.clone().tag("a b")), "tag");
    assert_eq!(field(base.clone().tag("")), "tag");
    assert_eq!(field(base.clone().tag("x".repeat(129))), "tag");
    assert_eq!(field(base.clone().pool_size(0)), "pool_size");
    assert_eq!(field(base.clone().io_timeout(Duration::ZERO)), "io_timeout");
    assert_eq!(
        field(
            base.clone()
                .backoff(Duration::from_secs(2), Duration::from_secs(1))
        ),
        "backoff max"
    );
    assert_eq!(field(base.clone().ttl(Some(Duration::ZERO))), "ttl");
    assert_eq!(field(base.clone().max_value_bytes(0)), "max_value_bytes");
    assert_eq!(field(base.clone().max_redirects(0)), "max_redirects");
    assert_eq!(field(base.clone().ca_cert("/x")), "ca_cert");
    base.tag("llama-3:8b/bf16").validate().unwrap();
}
