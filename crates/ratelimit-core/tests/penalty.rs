//! Properties of the penalty box over random rejection timelines: blocks stay within
//! `block..=block_max`, escalate by exactly 2× (capped) only when the key comes back within
//! `block_max` of its last release, start over otherwise, and a replay never lets a blocked
//! key through or charges it.

use proptest::prelude::*;
use ratelimit_core::penalty::{
    duration_text, parse_duration_ns, BlockPolicy, BlockWord, StatusMatcher,
};
use ratelimit_core::replay::{policy_from_specs, Replay};
use ratelimit_core::{LimitSpec, ZoneSpec};

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;

fn block_policy() -> impl Strategy<Value = BlockPolicy> {
    (1..120_000u64, 0..8u32).prop_map(|(block_ms, doublings)| BlockPolicy {
        block_ns: block_ms * MS,
        block_max_ns: block_ms * MS * (1 << doublings) + block_ms * MS / 3,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Rejections at random gaps: each block is `block` for a fresh key, or twice the last
    /// one capped at `block_max` when the last release is at most `block_max` ago.
    #[test]
    fn escalation_doubles_within_block_max_and_starts_over_after(
        policy in block_policy(),
        gaps in prop::collection::vec(0..600 * SECOND, 1..40),
    ) {
        let mut word = BlockWord::default();
        let mut now = 1_000 * SECOND;
        let mut last: Option<(u64, u64)> = None; // (until, duration)
        for gap in gaps {
            now += gap;
            let blocked_before = word.blocked_for_ns(now).is_some();
            let (next, block) = word.after_rejection(now, &policy);
            let duration = block.duration_ns();
            prop_assert!(duration >= policy.block_ns / MS * MS);
            prop_assert!(duration <= policy.block_max_ns.div_ceil(MS) * MS);
            if blocked_before {
                // Rejected while blocked: the same block.
                prop_assert_eq!(next, word);
                continue;
            }
            let expected = match last {
                Some((until, previous)) if now <= until + policy.block_max_ns => {
                    (previous * 2).min(policy.block_max_ns.div_ceil(MS) * MS)
                }
                _ => policy.block_ns.div_ceil(MS) * MS,
            };
            // Whole milliseconds: the block word keeps its end in ms.
            prop_assert!(duration.abs_diff(expected) <= MS, "{} vs {}", duration, expected);
            prop_assert_eq!(next.blocked_for_ns(now), Some(block.until_ns - now));
            last = Some((block.until_ns, duration));
            word = next;
        }
    }

    /// Whatever the word, a key is never blocked for longer than the word's end says, and a
    /// spent word is not blocking.
    #[test]
    fn words_round_trip(until_ms in 0..(1u64 << 42), level in 0..64u8, now in any::<u64>()) {
        let word = BlockWord::new(until_ms, level);
        prop_assert_eq!(word.until_ms(), until_ms.max(1));
        prop_assert_eq!(word.level(), level);
        if let Some(left) = word.blocked_for_ns(now) {
            prop_assert_eq!(now + left, word.until_ms() * MS);
        }
        let policy = BlockPolicy { block_ns: SECOND, block_max_ns: SECOND };
        if word.is_spent(now, &policy) {
            prop_assert!(word.blocked_for_ns(now).is_none());
        }
    }

    /// `on_status=` lists: exactly the codes listed, in any order, match; the text it
    /// prints reads back to the same matcher.
    #[test]
    fn status_lists(codes in prop::collection::vec(100..600u16, 1..12), probe in 0..1000u16) {
        let value = codes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
        let matcher = StatusMatcher::parse("on_status=", &value).unwrap();
        prop_assert_eq!(matcher.matches(probe), codes.contains(&probe));
        let again = StatusMatcher::parse("on_status=", &matcher.to_string()).unwrap();
        prop_assert_eq!(again, matcher);
    }

    /// Durations print as nginx time text that parses back to the same value.
    #[test]
    fn durations_round_trip(ms in 0..(400u64 * 86_400_000)) {
        prop_assert_eq!(parse_duration_ns(&duration_text(ms * MS)), Some(ms * MS));
    }

    /// A replay with `block=` never passes or charges a request inside a block, and each
    /// block starts at a rejection.
    #[test]
    fn replayed_blocks_hold(
        gaps in prop::collection::vec(0..2 * SECOND, 1..200),
        block_s in 1..30u64,
    ) {
        let words = format!("rate=2r/s burst=3 block={block_s}s block_max={}s", block_s * 4);
        let zone = ZoneSpec::parse_words(
            &words.split_whitespace().collect::<Vec<_>>(),
        )
        .unwrap();
        let limit = LimitSpec::parse_words(&["nodelay"]).unwrap();
        let policy = policy_from_specs(&zone, Some(&limit)).unwrap();
        let mut replay = Replay::new(policy).with_penalty(zone.block, None);
        let mut now = 0;
        let mut blocked_until = 0;
        for gap in gaps {
            now += gap;
            let verdict = replay.decide_request("k", now, None);
            if now < blocked_until {
                prop_assert!(verdict.blocked);
                prop_assert!(!verdict.charged);
                prop_assert_eq!(verdict.decision.retry_after_ns, blocked_until - now);
            } else {
                prop_assert!(!verdict.blocked);
            }
            if let Some(block) = verdict.block {
                prop_assert_eq!(verdict.as_str(), "REJECTED");
                blocked_until = block.until_ns;
            }
        }
    }
}
