//! Arbitrary requests never panic, always get a well-formed answer, and a refused one changes
//! nothing.

use proptest::prelude::*;
use ratelimit_admin::concurrency::ConcurrencyKeyState;
use ratelimit_admin::memory::MemoryZone;
use ratelimit_admin::{handle, AdminZone, JSON_CONTENT_TYPE};
use ratelimit_core::adaptive::AdaptiveBounds;
use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencyLimits};
use ratelimit_core::{Algorithm, Limits, Rate};

fn zones() -> Vec<MemoryZone> {
    let limits = |rate: &str, burst| Limits {
        rate: Rate::parse(rate).unwrap(),
        burst,
    };
    let zones = vec![
        MemoryZone::new("one", Algorithm::LeakyBucket, limits("10r/s", 5)),
        MemoryZone::new("token", Algorithm::TokenBucket, limits("1r/m", 1)),
        MemoryZone::new("log", Algorithm::SlidingLog, limits("100r/m", 0)),
        MemoryZone::new("window", Algorithm::SlidingWindow, limits("10r/s", 0)),
        MemoryZone::concurrency(
            "app",
            ConcurrencyLimits {
                limit: ConcurrencyLimit::Fixed(10),
                queue: 5,
            },
        ),
        MemoryZone::concurrency(
            "auto",
            ConcurrencyLimits {
                limit: ConcurrencyLimit::Adaptive(AdaptiveBounds::new(4, 500)),
                queue: 0,
            },
        ),
    ];
    for zone in &zones {
        zone.track(b"k", 1);
        zone.track(b"a/b", 0);
        let key = ConcurrencyKeyState {
            lease: None,
            in_flight: 2,
            queued: 1,
            limit: 10,
            adaptive: None,
        };
        zone.set_in_flight(b"k", key);
    }
    zones
}

/// Everything a request could change in a zone: limits, overrides, whether two keys are
/// tracked, a concurrency zone's limits.
type ZoneSnapshot = (
    Limits,
    Vec<(Vec<u8>, Limits)>,
    bool,
    bool,
    Option<ConcurrencyLimits>,
);

fn snapshot(zones: &[MemoryZone]) -> Vec<ZoneSnapshot> {
    zones
        .iter()
        .map(|zone| {
            let tracked = (
                zone.key_state(b"k").is_some(),
                zone.key_state(b"a/b").is_some(),
            );
            (
                zone.limits(),
                zone.overrides(),
                tracked.0,
                tracked.1,
                zone.concurrency_limits(),
            )
        })
        .collect()
}

fn method() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"GET".to_vec()),
        Just(b"HEAD".to_vec()),
        Just(b"PATCH".to_vec()),
        Just(b"PUT".to_vec()),
        Just(b"DELETE".to_vec()),
        Just(b"POST".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ]
}

fn path() -> impl Strategy<Value = Vec<u8>> {
    let segment = prop_oneof![
        Just("zones".to_string()),
        Just("one".to_string()),
        Just("log".to_string()),
        Just("window".to_string()),
        Just("app".to_string()),
        Just("auto".to_string()),
        Just("keys".to_string()),
        Just("overrides".to_string()),
        Just("metrics".to_string()),
        Just("k".to_string()),
        Just("a%2Fb".to_string()),
        Just("%".to_string()),
        Just("%f".to_string()),
        Just("%FF".to_string()),
        Just(String::new()),
        "[ -~]{0,6}",
    ];
    prop_oneof![
        proptest::collection::vec(segment, 0..6).prop_map(|s| s.join("/").into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..40),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let rate = prop_oneof![
        Just("\"10r/s\"".to_string()),
        Just("\"50r/m\"".to_string()),
        Just("\"1000r/m\"".to_string()),
        Just("\"0.5r/s\"".to_string()),
        Just("\"0r/s\"".to_string()),
        Just("5".to_string()),
        Just("null".to_string()),
        "\"[ -~]{0,8}\"",
    ];
    let burst = prop_oneof![
        Just("0".to_string()),
        Just("3".to_string()),
        Just("-1".to_string()),
        Just("1.5".to_string()),
        Just("4194304".to_string()),
        Just("\"2\"".to_string()),
        Just("99999999999999999999999".to_string()),
    ];
    let count = prop_oneof![
        Just("0".to_string()),
        Just("4".to_string()),
        Just("600".to_string()),
        Just("32768".to_string()),
        Just("16777216".to_string()),
        Just("-2".to_string()),
        Just("\"7\"".to_string()),
    ];
    let counts = (
        proptest::option::of(count.clone()),
        proptest::option::of(count.clone()),
        proptest::option::of(count),
    );
    let object = (
        proptest::option::of(rate),
        proptest::option::of(burst),
        counts,
        any::<bool>(),
    )
        .prop_map(|(rate, burst, (limit, queue, min), extra)| {
            let mut fields = Vec::new();
            if let Some(rate) = rate {
                fields.push(format!("\"rate\": {rate}"));
            }
            if let Some(burst) = burst {
                fields.push(format!("\"burst\": {burst}"));
            }
            for (name, value) in [("limit", limit), ("queue", queue), ("min", min)] {
                if let Some(value) = value {
                    fields.push(format!("\"{name}\": {value}"));
                }
            }
            if extra {
                fields.push("\"other\": []".to_string());
            }
            format!("{{{}}}", fields.join(", ")).into_bytes()
        });
    prop_oneof![
        3 => object,
        1 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => "[ -~]{0,32}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn any_request_gets_an_answer(
        method in method(),
        path in path(),
        body in body(),
        write_allowed in any::<bool>(),
    ) {
        let zones = zones();
        let before = snapshot(&zones);
        let response = handle(&method, &path, &body, write_allowed, &zones);

        prop_assert!(
            [200, 201, 204, 400, 403, 404, 405, 413, 507].contains(&response.status),
            "status {}", response.status
        );
        prop_assert_eq!(response.allow.is_some(), response.status == 405);
        if response.status == 204 {
            prop_assert!(response.body.is_empty());
        } else if response.content_type == JSON_CONTENT_TYPE {
            let value: serde_json::Value = serde_json::from_slice(&response.body)
                .map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
            if response.status >= 400 {
                prop_assert!(value["error"].is_string(), "{}", value);
            }
        } else {
            prop_assert!(response.body_text().starts_with("# HELP "));
        }

        let after = snapshot(&zones);
        if response.status >= 400 {
            prop_assert_eq!(&before, &after, "a refused request changed something");
        }
        if !write_allowed {
            prop_assert_eq!(&before, &after, "a read-only location changed something");
            prop_assert!(!response.changed);
        }
        if response.changed {
            prop_assert!(response.status < 300);
        }
    }
}
