//! `GET metrics`: the Prometheus text exposition format, version 0.0.4.

use std::fmt::Write as _;

use ratelimit_core::concurrency::ConcurrencyLimit;
use ratelimit_core::{Limits, NANOS_PER_SEC};

use crate::store::{BlockCounts, SyncInfo, ZoneInfo};

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family: every zone's sample(s) under one `# HELP` and `# TYPE`.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const FAMILIES: [Family; 31] = [
    Family {
        name: "rate_limit_requests_total",
        kind: "counter",
        help: "Requests the zone decided, by outcome.",
    },
    Family {
        name: "rate_limit_keys",
        kind: "gauge",
        help: "Keys whose state differs from a fresh key's.",
    },
    Family {
        name: "rate_limit_zone_slots",
        kind: "gauge",
        help: "Keys the zone's table can hold.",
    },
    Family {
        name: "rate_limit_zone_size_bytes",
        kind: "gauge",
        help: "Shared memory of the zone.",
    },
    Family {
        name: "rate_limit_zone_fullness",
        kind: "gauge",
        help: "Keys tracked divided by the zone's slots (0 to 1).",
    },
    Family {
        name: "rate_limit_evictions_total",
        kind: "counter",
        help: "Keys dropped to make room for new ones while their state still mattered.",
    },
    Family {
        name: "rate_limit_usage_tokens_total",
        kind: "counter",
        help: "Tokens of usage-based lines (usage=): reserved at the door, used (owed when the request ended), refunded, overrun (charged past the reservation), forgiven by debt=.",
    },
    Family {
        name: "rate_limit_usage_settled_total",
        kind: "counter",
        help: "Usage-based requests settled, with a usage the response reported (found) or without (missing).",
    },
    Family {
        name: "rate_limit_spent_usd_total",
        kind: "counter",
        help: "Dollars priced lines (usage= with prices=) charged: the cost of the models the responses named.",
    },
    Family {
        name: "rate_limit_unpriced_total",
        kind: "counter",
        help: "Requests of priced lines whose model had no price (they kept their reservation).",
    },
    Family {
        name: "rate_limit_usage_bad_total",
        kind: "counter",
        help: "Usage-based requests whose response reported a malformed usage (a count not an integer from 0 to 2^53), settled as missing.",
    },
    Family {
        name: "rate_limit_no_slot_total",
        kind: "counter",
        help:
            "New keys refused because every slot of their window held requests in flight or queued.",
    },
    Family {
        name: "rate_limit_overrides",
        kind: "gauge",
        help: "Keys with their own limits in the zone.",
    },
    Family {
        name: "rate_limit_rate_per_second",
        kind: "gauge",
        help: "The zone's rate now, in requests per second.",
    },
    Family {
        name: "rate_limit_burst",
        kind: "gauge",
        help: "The zone's burst now.",
    },
    Family {
        name: "rate_limit_quota_limit",
        kind: "gauge",
        help: "A quota zone's limit per period now (keys without an override).",
    },
    Family {
        name: "rate_limit_blocked_keys",
        kind: "gauge",
        help: "Keys blocked now (zones with block= only).",
    },
    Family {
        name: "rate_limit_blocks_not_recorded_total",
        kind: "counter",
        help: "Rejected keys a full block table could not block: it keeps the blocks it \
               holds (zones with block= only).",
    },
    Family {
        name: "rate_limit_sync_round_trips_total",
        kind: "counter",
        help: "Successful sync round trips to Redis of the instance (sync zones only).",
    },
    Family {
        name: "rate_limit_sync_errors_total",
        kind: "counter",
        help: "Sync rounds that failed or timed out (sync zones only).",
    },
    Family {
        name: "rate_limit_sync_lag_seconds",
        kind: "gauge",
        help: "Duration of the last successful sync round trip (sync zones only).",
    },
    Family {
        name: "rate_limit_sync_instances",
        kind: "gauge",
        help: "Instances seen alive in the fleet's heartbeats (sync zones only).",
    },
    Family {
        name: "rate_limit_sync_fallback",
        kind: "gauge",
        help: "1 while the on_failure mode is in force (sync zones only).",
    },
    Family {
        name: "rate_limit_sync_keys_total",
        kind: "counter",
        help: "Keys sent to Redis by the instance's sync rounds (sync zones only).",
    },
    Family {
        name: "rate_limit_sync_bad_values_total",
        kind: "counter",
        help: "Values from Redis dropped for being out of bounds (sync zones only).",
    },
    Family {
        name: "rate_limit_in_flight",
        kind: "gauge",
        help: "Requests holding slots of the zone's keys now (concurrency zones only).",
    },
    Family {
        name: "rate_limit_queued",
        kind: "gauge",
        help: "Requests waiting in the zone's queues now (concurrency zones only).",
    },
    Family {
        name: "rate_limit_concurrency_limit",
        kind: "gauge",
        help: "Requests in flight a key may have; with limit=adaptive, the limit of the key \
               with the most in flight (concurrency zones only).",
    },
    Family {
        name: "rate_limit_lease_permits",
        kind: "gauge",
        help: "Permits of the fleet's limits this instance's live leases hold, over the \
               zone's keys (sync concurrency zones only).",
    },
    Family {
        name: "rate_limit_latency_seconds",
        kind: "gauge",
        help: "limit=adaptive: the last window's median latency of the key with the most in \
               flight.",
    },
    Family {
        name: "rate_limit_no_load_latency_seconds",
        kind: "gauge",
        help: "limit=adaptive: the no-load latency learnt for the key with the most in flight.",
    },
];

/// Render every zone's metrics.
///
/// ```
/// use ratelimit_admin::metrics::escape_label;
///
/// assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
/// ```
pub fn render(zones: &[(String, ZoneInfo)]) -> String {
    render_with_blocks(zones, &[])
}

/// [`render`] with each zone's penalty box (`blocks[i]` for `zones[i]`; `None` or missing for
/// a zone without `block=`): `outcome="blocked"` requests and `rate_limit_blocked_keys`.
pub fn render_with_blocks(zones: &[(String, ZoneInfo)], blocks: &[Option<BlockCounts>]) -> String {
    let mut out = String::new();
    for family in &FAMILIES {
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
        for (index, (name, info)) in zones.iter().enumerate() {
            let block = blocks.get(index).copied().flatten();
            let zone = escape_label(name);
            let mut sample = |extra: &str, value: &str| {
                let _ = writeln!(out, "{}{{zone=\"{zone}\"{extra}}} {value}", family.name);
            };
            zone_samples(family.name, info, block, &mut sample);
        }
    }
    out
}

/// One zone's samples of the family `family`, each handed to `sample` as its labels after
/// `zone=` and its value; none where the zone does not have what the family counts.
fn zone_samples(
    family: &str,
    info: &ZoneInfo,
    block: Option<BlockCounts>,
    sample: &mut dyn FnMut(&str, &str),
) {
    match family {
        "rate_limit_requests_total" => {
            for (outcome, value) in info.counters.by_outcome() {
                sample(&format!(",outcome=\"{outcome}\""), &value.to_string());
            }
            if let Some(block) = block {
                let value = block.blocked_requests.to_string();
                sample(",outcome=\"blocked\"", &value);
                let value = block.blocked_dry_run_requests.to_string();
                sample(",outcome=\"blocked_dry_run\"", &value);
            }
        }
        "rate_limit_blocked_keys" => {
            if let Some(block) = block {
                sample("", &block.blocked_keys.to_string());
            }
        }
        "rate_limit_blocks_not_recorded_total" => {
            if let Some(block) = block {
                sample("", &block.not_recorded.to_string());
            }
        }
        "rate_limit_keys" => sample("", &info.keys.to_string()),
        "rate_limit_zone_slots" => sample("", &info.slots.to_string()),
        "rate_limit_zone_size_bytes" => sample("", &info.size.to_string()),
        "rate_limit_zone_fullness" => sample("", &fullness(info)),
        "rate_limit_evictions_total" => sample("", &info.evictions.to_string()),
        "rate_limit_no_slot_total" => sample("", &info.no_slot.to_string()),
        "rate_limit_overrides" => sample("", &info.overrides.to_string()),
        "rate_limit_usage_tokens_total"
        | "rate_limit_usage_settled_total"
        | "rate_limit_usage_bad_total"
        | "rate_limit_spent_usd_total"
        | "rate_limit_unpriced_total" => usage_samples(family, info, sample),
        "rate_limit_rate_per_second" | "rate_limit_burst"
            if info.concurrency.is_some() || info.quota.is_some() => {}
        "rate_limit_quota_limit" => {
            if info.quota.is_some() {
                sample("", &info.limits.quota_limit().to_string());
            }
        }
        "rate_limit_rate_per_second" => sample("", &per_second(&info.limits)),
        "rate_limit_burst" => sample("", &info.limits.burst.to_string()),
        "rate_limit_in_flight"
        | "rate_limit_queued"
        | "rate_limit_concurrency_limit"
        | "rate_limit_lease_permits"
        | "rate_limit_latency_seconds"
        | "rate_limit_no_load_latency_seconds" => {
            if let Some(value) = concurrency_value(family, info) {
                sample("", &value);
            }
        }
        sync_family => {
            if let Some(sync) = &info.sync {
                sample("", &sync_value(sync_family, sync));
            }
        }
    }
}

/// The samples of a usage family (`usage=` tokens and settlements, `prices=` spend) for a
/// zone with `usage=`; none for another.
fn usage_samples(family: &str, info: &ZoneInfo, sample: &mut dyn FnMut(&str, &str)) {
    let Some(usage) = &info.usage else {
        return;
    };
    match family {
        "rate_limit_usage_tokens_total" => {
            for (kind, value) in [
                ("reserved", usage.tokens_reserved),
                ("used", usage.tokens_used),
                ("refunded", usage.tokens_refunded),
                ("overrun", usage.tokens_overrun),
                ("forgiven", usage.tokens_forgiven),
            ] {
                sample(&format!(",kind=\"{kind}\""), &value.to_string());
            }
        }
        "rate_limit_usage_settled_total" => {
            sample(",usage=\"found\"", &usage.settled_with_usage.to_string());
            sample(
                ",usage=\"missing\"",
                &usage.settled_without_usage.to_string(),
            );
        }
        "rate_limit_usage_bad_total" => sample("", &usage.bad_usage.to_string()),
        "rate_limit_spent_usd_total" => {
            if let Some(spend) = usage.spend {
                sample("", &dollars(spend.spent_micro_usd));
            }
        }
        _ => {
            if let Some(spend) = usage.spend {
                sample("", &spend.unpriced.to_string());
            }
        }
    }
}

/// The value of a concurrency family for `info`, if it has one.
fn concurrency_value(family: &str, info: &ZoneInfo) -> Option<String> {
    let concurrency = info.concurrency.as_ref()?;
    let adaptive = concurrency.busiest.and_then(|key| key.adaptive);
    let seconds = |us: u32| format!("{:.6}", f64::from(us) / 1e6);
    Some(match family {
        "rate_limit_in_flight" => concurrency.in_flight.to_string(),
        "rate_limit_queued" => concurrency.queued.to_string(),
        "rate_limit_lease_permits" => concurrency.lease?.to_string(),
        "rate_limit_concurrency_limit" => match concurrency.limits.limit {
            ConcurrencyLimit::Fixed(limit) => limit.to_string(),
            ConcurrencyLimit::Adaptive(_) => concurrency.busiest?.limit.to_string(),
        },
        "rate_limit_latency_seconds" => seconds(adaptive?.latency_us),
        _ => seconds(adaptive?.no_load_us),
    })
}

/// The value of a `rate_limit_sync_*` family.
fn sync_value(family: &str, sync: &SyncInfo) -> String {
    match family {
        "rate_limit_sync_round_trips_total" => sync.round_trips.to_string(),
        "rate_limit_sync_errors_total" => sync.errors.to_string(),
        "rate_limit_sync_lag_seconds" => format!("{:.6}", sync.lag_us as f64 / 1e6),
        "rate_limit_sync_instances" => sync.instances.to_string(),
        "rate_limit_sync_keys_total" => sync.keys_sent.to_string(),
        "rate_limit_sync_bad_values_total" => sync.bad_values.to_string(),
        _ => u8::from(sync.fallback).to_string(),
    }
}

fn fullness(info: &ZoneInfo) -> String {
    if info.slots == 0 {
        return "0".to_string();
    }
    float(info.keys as f64 / info.slots as f64)
}

fn per_second(limits: &Limits) -> String {
    let unit_secs = (limits.rate.unit.nanos() / NANOS_PER_SEC) as f64;
    float(limits.rate.milli_requests as f64 / 1000.0 / unit_secs)
}

/// Micro-dollars as dollars, exactly (`1.2345` for 1,234,500).
fn dollars(micro: u64) -> String {
    let (whole, fraction) = (micro / 1_000_000, micro % 1_000_000);
    if fraction == 0 {
        return whole.to_string();
    }
    let fraction = format!("{fraction:06}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

/// A float as Prometheus reads it (Rust's shortest round-trip form, never `inf`/`NaN` here).
fn float(value: f64) -> String {
    if value.is_finite() {
        format!("{value}")
    } else {
        "0".to_string()
    }
}

/// Escape a label value: backslash, double quote and line feed, as the format requires.
pub fn escape_label(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Counters;
    use ratelimit_core::{Algorithm, Rate};

    fn info() -> ZoneInfo {
        let limits = Limits {
            rate: Rate::parse("30r/m").unwrap(),
            burst: 4,
        };
        ZoneInfo {
            algorithm: Algorithm::LeakyBucket,
            key: "$binary_remote_addr".into(),
            size: 1 << 20,
            slots: 1000,
            keys: 25,
            limits,
            config_limits: limits,
            counters: Counters {
                passed: 7,
                delayed: 1,
                rejected: 2,
                delayed_dry_run: 0,
                rejected_dry_run: 3,
            },
            evictions: 5,
            no_slot: 0,
            usage: None,
            quota: None,
            overrides: 1,
            override_capacity: 512,
            concurrency: None,
            stream: false,
            line_burst: None,
            sync: Some(SyncInfo {
                connected: true,
                mode: "synced",
                last_sync_age_ms: Some(40),
                instances: 3,
                round_trips: 12,
                errors: 1,
                lag_us: 1_500,
                fallback: false,
                keys_sent: 40,
                bad_values: 2,
            }),
        }
    }

    #[test]
    fn every_family_has_help_type_and_one_sample_per_zone() {
        let zones = [
            ("one".into(), info()),
            ("t\"w\\o\n".into(), info()),
            ("app".into(), concurrency_info()),
        ];
        let text = render(&zones);
        for family in &FAMILIES {
            assert!(text.contains(&format!("# HELP {} ", family.name)));
            assert!(text.contains(&format!("# TYPE {} {}\n", family.name, family.kind)));
        }
        #[rustfmt::skip]
        let samples = [
            "rate_limit_requests_total{zone=\"one\",outcome=\"passed\"} 7",
            "rate_limit_requests_total{zone=\"one\",outcome=\"delayed\"} 1",
            "rate_limit_requests_total{zone=\"one\",outcome=\"rejected\"} 2",
            "rate_limit_requests_total{zone=\"one\",outcome=\"delayed_dry_run\"} 0",
            "rate_limit_requests_total{zone=\"one\",outcome=\"rejected_dry_run\"} 3",
            "rate_limit_keys{zone=\"one\"} 25",
            "rate_limit_zone_slots{zone=\"one\"} 1000",
            "rate_limit_zone_size_bytes{zone=\"one\"} 1048576",
            "rate_limit_zone_fullness{zone=\"one\"} 0.025",
            "rate_limit_evictions_total{zone=\"one\"} 5",
            "rate_limit_overrides{zone=\"one\"} 1",
            "rate_limit_rate_per_second{zone=\"one\"} 0.5",
            "rate_limit_burst{zone=\"one\"} 4",
            "rate_limit_sync_round_trips_total{zone=\"one\"} 12",
            "rate_limit_sync_errors_total{zone=\"one\"} 1",
            "rate_limit_sync_lag_seconds{zone=\"one\"} 0.001500",
            "rate_limit_sync_instances{zone=\"one\"} 3",
            "rate_limit_sync_fallback{zone=\"one\"} 0",
            "rate_limit_sync_keys_total{zone=\"one\"} 40",
            "rate_limit_sync_bad_values_total{zone=\"one\"} 2",
            "rate_limit_keys{zone=\"t\\\"w\\\\o\\n\"} 25",
            "rate_limit_in_flight{zone=\"app\"} 41",
            "rate_limit_queued{zone=\"app\"} 3",
            "rate_limit_concurrency_limit{zone=\"app\"} 37",
            "rate_limit_latency_seconds{zone=\"app\"} 0.131000",
            "rate_limit_no_load_latency_seconds{zone=\"app\"} 0.100500",
        ];
        for sample in samples {
            assert!(
                text.lines().any(|line| line == sample),
                "{sample} missing:\n{text}"
            );
        }
        // Samples of a family follow its TYPE line, one family after the other.
        let families: Vec<&str> = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| line.split('{').next().unwrap())
            .collect();
        let mut deduped = families.clone();
        deduped.dedup();
        // Every family but rate_limit_blocked_keys and rate_limit_blocks_not_recorded_total
        // (zones with block= only), the three rate_limit_usage_* (zones a usage= line
        // charged only: t/usage.rs, t/usage_bad.rs), rate_limit_quota_limit (quota zones
        // only: t/quota.rs), the two of priced lines (t/prices.rs) and
        // rate_limit_lease_permits (sync concurrency zones only: below).
        assert_eq!(deduped.len(), FAMILIES.len() - 9);
        assert!(text.ends_with('\n'));
        // A concurrency zone has no rate nor burst.
        assert!(!text.contains("rate_limit_burst{zone=\"app\"}"), "{text}");
        assert!(!text.contains("rate_limit_rate_per_second{zone=\"app\"}"));
    }

    /// A zone of `limit=adaptive` whose busiest key has 37 slots.
    fn concurrency_info() -> ZoneInfo {
        use crate::concurrency::{AdaptiveKeyState, ConcurrencyInfo, ConcurrencyKeyState};
        use ratelimit_core::adaptive::AdaptiveBounds;
        use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencyLimits};
        let limits = ConcurrencyLimits {
            limit: ConcurrencyLimit::Adaptive(AdaptiveBounds::new(4, 500)),
            queue: 10,
        };
        ZoneInfo {
            algorithm: ratelimit_core::Algorithm::Concurrency,
            sync: None,
            concurrency: Some(ConcurrencyInfo {
                lease: None,
                limits,
                config: limits,
                queue_timeout_ns: 5_000_000_000,
                in_flight: 41,
                queued: 3,
                busiest: Some(ConcurrencyKeyState {
                    lease: None,
                    in_flight: 36,
                    queued: 3,
                    limit: 37,
                    adaptive: Some(AdaptiveKeyState {
                        phase: "track",
                        no_load_us: 100_500,
                        latency_us: 131_000,
                    }),
                }),
            }),
            ..info()
        }
    }

    #[test]
    fn a_sync_concurrency_zone_shows_its_lease() {
        let mut zone = concurrency_info();
        if let Some(concurrency) = zone.concurrency.as_mut() {
            concurrency.lease = Some(9);
        }
        let text = render(&[("app".into(), zone)]);
        assert!(
            text.lines()
                .any(|line| line == "rate_limit_lease_permits{zone=\"app\"} 9"),
            "{text}"
        );
        let plain = render(&[("app".into(), concurrency_info())]);
        assert!(!plain.contains("rate_limit_lease_permits{"), "{plain}");
    }

    #[test]
    fn an_empty_table_is_not_full() {
        let mut empty = info();
        empty.slots = 0;
        assert_eq!(fullness(&empty), "0");
    }
}
