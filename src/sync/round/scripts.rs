//! The Lua scripts a round runs in Redis (loaded once per connection, called by hash).

use crate::sync::overrides::OVERRIDES_SCRIPT;
use crate::sync::quota::QUOTA_SCRIPT;

/// Applies the instances' deltas to many keys at once, each on Redis's clock (`TIME`: nodes'
/// clocks need not agree). ARGV: this instance's id, this send's number (unique in the
/// instance), the sync interval (ms); then per key (KEYS[k]): its delta, `T` (ns per
/// request), `K`, the idle expiry (ms), `n`, and `n` pairs of (number, requests) for the
/// earlier sends whose delta this one carries again (they timed out or failed, so Redis may
/// have applied them after all, or may yet). Returns three integers per key: how far the
/// fleet's TAT leads Redis's clock (us), the fleet's requests in this and the previous sync
/// window, and in the previous one alone.
///
/// Per key and instance (`s`/`f`/`a` + id) it keeps the last send it applied, the earliest
/// send that one carried, and when it applied it: a late send already carried adds nothing,
/// a send after it adds its delta less what the applied one already added (so a send that
/// timed out but was applied is charged once), and a delta is charged from no earlier than
/// the instance's previous applied send (its requests were all admitted after it; one
/// interval back for a first send): charging them all at `now` would count the interval's
/// drain against the fleet twice. `r` is the `T` the TAT was written at: after an admin
/// change, the lead is re-expressed at the new `T` first (the backlog kept in requests). The
/// TAT stays at most two buckets and one interval ahead. Numbers are written with `%.0f`:
/// Lua's `tostring` would round a us time to 14 digits.
pub(super) const KEY_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = ARGV[1]
local sent = tonumber(ARGV[2])
local I = tonumber(ARGV[3]) * 1000
local w = math.floor(now / I)
local out = {}
local at = 4
for k = 1, #KEYS do
  local delta = tonumber(ARGV[at])
  local tns = tonumber(ARGV[at + 1])
  local T = tns / 1000
  local K = tonumber(ARGV[at + 2])
  local n = tonumber(ARGV[at + 4])
  local h = redis.call('HMGET', KEYS[k], 't', 'w', 'c', 'p', 'r', 's' .. id, 'f' .. id, 'a' .. id)
  local last = tonumber(h[6]) or -1
  local from = tonumber(h[7]) or -1
  local since = tonumber(h[8]) or (now - I)
  local applied = since
  if sent <= last then
    if sent >= from then delta = 0 end
  else
    from = sent
    for i = at + 5, at + 3 + 2 * n, 2 do
      local earlier = tonumber(ARGV[i])
      if earlier == last then delta = math.max(0, delta - tonumber(ARGV[i + 1])) end
      if earlier < from then from = earlier end
    end
    last = sent
    applied = now
  end
  local cap = 2 * K * T + I
  local tat = tonumber(h[1]) or 0
  local r = tonumber(h[5])
  if r and r > 0 and r ~= tns and tat > now then tat = now + (tat - now) * tns / r end
  if since > now then since = now end
  if tat < since then tat = since end
  tat = tat + delta * T
  if tat > now + cap then tat = now + cap end
  local ahead = tat - now
  if ahead < 0 then ahead = 0 end
  local hw = tonumber(h[2]) or w
  local c = tonumber(h[3]) or 0
  local p = tonumber(h[4]) or 0
  if hw == w - 1 then p = c; c = 0 elseif hw ~= w then p = 0; c = 0 end
  c = c + delta
  redis.call('HSET', KEYS[k], 't', string.format('%.0f', tat), 'r', ARGV[at + 1],
    'w', string.format('%.0f', w), 'c', c, 'p', p,
    's' .. id, string.format('%.0f', last), 'f' .. id, string.format('%.0f', from),
    'a' .. id, string.format('%.0f', applied))
  redis.call('PEXPIRE', KEYS[k], ARGV[at + 3])
  out[#out + 1] = ahead
  out[#out + 1] = p + c
  out[#out + 1] = p
  at = at + 5 + 2 * n
end
return out
"#;

/// Records this instance alive (a sorted set scored by Redis's milliseconds) and returns how
/// many were alive within ARGV[2] ms.
pub(super) const HEARTBEAT_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"#;

/// A zone's limits (packed `Limits`) shared by the fleet, in a hash: `v` the limits in force,
/// `c` the configuration file's value they were last set from. ARGV[1], when not empty, is
/// this instance's value; ARGV[2], sent in a loop's first round only, its file's value.
/// An admin change (ARGV[1] alone) replaces `v`. A loop's first round replaces `v` only
/// when its file says something else than `c` (the file was edited and reloaded): a restart
/// with the same file takes the fleet's value, as one instance keeps an admin change across
/// reloads until its file changes. The reply is `v` (`false` when never set).
pub(super) const LIMITS_SCRIPT: &str = r#"
if ARGV[2] ~= '' then
  if redis.call('HGET', KEYS[1], 'c') ~= ARGV[2] then
    redis.call('HSET', KEYS[1], 'c', ARGV[2], 'v', ARGV[1])
  end
elseif ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'v', ARGV[1])
end
return redis.call('HGET', KEYS[1], 'v')
"#;

/// Every script the loop calls, loaded on a new connection.
pub(super) const SCRIPTS: [&str; 5] = [
    KEY_SCRIPT,
    HEARTBEAT_SCRIPT,
    LIMITS_SCRIPT,
    OVERRIDES_SCRIPT,
    QUOTA_SCRIPT,
];
