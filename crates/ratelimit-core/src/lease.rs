//! A fleet-wide concurrency limit as leases: the fleet's `limit` permits are handed out to the
//! instances in leases, each instance grants permits to its requests from its own lease (no
//! round trip on the request path), and once per sync round asks Redis for more or gives back
//! what it does not use. Pure code: time comes in as milliseconds, nothing is sent here.
//!
//! Two sides:
//! - [`serve`] is what Redis runs atomically (one Lua script call) for one instance's
//!   [`LeaseRequest`]: the fleet's state is a hash of instance -> [`Holder`] (its lease, what
//!   it wants, the last request number applied, and when the lease expires on Redis's clock).
//! - [`LeaseHolder`] is an instance's view: its lease, its permits in use, and what it has
//!   asked for.
//!
//! **Invariant.** The leases recorded in Redis and not expired add up to at most `limit`, and
//! an instance's own lease is never more than its record in Redis; so the leases the
//! instances hold add up to at most `limit`, whatever messages are delayed, lost, reordered or
//! duplicated, and whichever instances crash. Why: an instance's lease grows only from a reply
//! to the last request it sent (Redis recorded the grant before replying); it shrinks itself
//! before telling Redis (a request's `keep` is what it holds from then on); Redis applies an
//! instance's requests in the order they were sent (a request numbered no later than the last
//! applied is stale and changes nothing); and an instance counts its lease as expired `ttl`
//! after it *sent* the request, Redis `ttl` after it *applied* it, which is later.
//!
//! **Expiry.** A lease not renewed expires `ttl` after the last request Redis applied: with
//! [`EXPIRY_ROUNDS`] intervals as `ttl`, a crashed instance's permits are back in the fleet
//! within three intervals of its last round. Clocks: the instance measures its `ttl` on its
//! own clock from the moment it sent, Redis on its clock from the moment it applied; only the
//! two clocks' rates need to agree (a caller may shorten the instance's `ttl` by a margin).
//!
//! **Permits in use.** An instance grants a permit only when its permits in use are fewer
//! than its lease, and never shrinks its lease below them by itself, so while its lease is
//! renewed (Redis answers) the permits in use across the fleet are at most `limit`. A lease
//! that expires with requests still in flight (the instance could not reach Redis for `ttl`)
//! leaves those requests running beyond it: they are counted in
//! [`LeaseHolder::expired_in_use`], and the failure mode (`on_failure=`) governs what the
//! instance grants meanwhile.
//!
//! **Sharing.** Each request says what the instance would like to hold (`want`: its peak use
//! since the last round, plus what it refused, plus one while it has traffic; nothing when
//! idle, so an idle instance gives its lease back). Redis grants up to `want` from what no
//! other lease holds; while another instance wants more than it holds, a lease grows only up
//! to the instance's fair part (max-min fair over the instances' wants, [`fair_level`]), and
//! every reply carries that part as `target`: an instance above it stops granting new permits
//! beyond it, so the surplus comes back as its requests finish. An instance with all the
//! traffic ends up holding the whole limit; two with more demand than the limit end up with
//! half each.

use std::collections::BTreeMap;

/// A lease's lifetime in sync intervals: a lease not renewed for this long expires.
pub const EXPIRY_ROUNDS: u64 = 3;

/// One instance's record in Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// Permits leased to the instance.
    pub lease: u32,
    /// What it asked to hold in its last request.
    pub want: u32,
    /// The number of the last request applied.
    pub seq: u64,
    /// When the lease expires, on Redis's clock (ms).
    pub expires_ms: u64,
    /// The permits its requests held when it sent its last request, whether leased or not
    /// (admitted under `on_failure=` while Redis did not answer, or under a lease that ran
    /// out): the others count `max(lease, claim)` as taken.
    pub claim: u32,
}

impl Holder {
    /// What the other instances count as taken by this one.
    fn taken(&self) -> u64 {
        u64::from(self.lease.max(self.claim))
    }
}

/// What an instance sends once per round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The instance's id (its field in Redis's hash).
    pub instance: u64,
    /// Increases with every request the instance sends.
    pub seq: u64,
    /// What the instance holds from now on (it already stopped granting beyond it).
    pub keep: u32,
    /// What it would like to hold.
    pub want: u32,
    /// The permits its requests hold now, leased or not: recorded as its claim, and granted
    /// as lease as far as no other record holds them.
    pub in_use: u32,
    /// Whether the lease may grow beyond what it keeps (`false` while the instance waits
    /// for the fleet's claims after Redis failed or forgot it).
    pub grow: bool,
}

/// Redis's answer to a [`LeaseRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseReply {
    /// The request was applied.
    Granted {
        /// The request's number.
        seq: u64,
        /// The instance's lease now (at least `keep` while its record was alive).
        lease: u32,
        /// Its fair part of the limit while another instance is short (it grants no new
        /// permit beyond it), else at least its lease.
        target: u32,
        /// Instances holding a live record, this one included.
        instances: u32,
        /// Whether Redis held a live record of the instance: an instance that sent a lease
        /// to keep and is not known was forgotten (Redis restarted empty, a replica took
        /// over, its record expired while it could not answer).
        known: bool,
    },
    /// A request older than one already applied: nothing changed.
    Stale {
        /// The request's number.
        seq: u64,
    },
}

/// What the Lua script does with one request, at `now_ms` on Redis's clock: expired records
/// dropped, the request applied unless stale, the instance's record written.
pub fn serve(
    holders: &mut BTreeMap<u64, Holder>,
    limit: u32,
    request: &LeaseRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> LeaseReply {
    serve_young(false, holders, limit, request, now_ms, ttl_ms)
}

/// [`serve`] on a Redis that keeps when its lease records began (`since`, on its clock; set
/// by the first request when `None`, as after a restart or a `FLUSHALL`): for `ttl` and one
/// interval from then no lease grows, since the leases of records lost with the data live
/// that long on their holders' clocks, and their holders claim what is in use meanwhile.
pub fn serve_since(
    since: &mut Option<u64>,
    holders: &mut BTreeMap<u64, Holder>,
    limit: u32,
    request: &LeaseRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> LeaseReply {
    let began = *since.get_or_insert(now_ms);
    let young = now_ms < hold_end(began, ttl_ms);
    serve_young(young, holders, limit, request, now_ms, ttl_ms)
}

/// [`serve`], with no lease growing when the records are `young`.
fn serve_young(
    young: bool,
    holders: &mut BTreeMap<u64, Holder>,
    limit: u32,
    request: &LeaseRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> LeaseReply {
    holders.retain(|_, holder| holder.expires_ms > now_ms);
    let mine = holders.get(&request.instance).copied();
    if mine.is_some_and(|holder| request.seq <= holder.seq) {
        return LeaseReply::Stale { seq: request.seq };
    }
    let held = mine.map_or(0, |holder| holder.lease);
    let others = holders
        .iter()
        .filter(|(&instance, _)| instance != request.instance)
        .map(|(_, holder)| holder);
    let taken: u64 = others.clone().map(Holder::taken).sum();
    let claim = request.in_use.min(limit);
    // An instance keeps at most what its record holds (an expired record holds nothing),
    // and what its requests hold as far as no other record holds it.
    let unclaimed = u64::from(limit).saturating_sub(taken) as u32;
    let keep = request.keep.min(held).max(claim.min(unclaimed));
    let want = request.want.min(limit).max(keep);
    let free = u64::from(limit).saturating_sub(taken + u64::from(keep));
    let wants: Vec<u32> = others
        .clone()
        .map(|holder| holder.want)
        .chain([want])
        .collect();
    let level = fair_level(limit, &wants);
    // Others short of what they want, or more in use than the limit: the fair part rules.
    let short = others.clone().any(|holder| holder.want > holder.lease)
        || taken + u64::from(keep.max(claim)) > u64::from(limit);
    let forgotten = mine.is_none() && request.keep > 0;
    let (mut cap, target) = if short {
        let target = want.min(level);
        (target.max(keep), target)
    } else {
        // While nobody else is short the instance may use all it holds.
        (want, want.max(keep))
    };
    if !request.grow || forgotten || young {
        cap = keep;
    }
    let grow = u64::from(cap.saturating_sub(keep)).min(free) as u32;
    let lease = keep + grow;
    holders.insert(
        request.instance,
        Holder {
            lease,
            want,
            seq: request.seq,
            expires_ms: now_ms.saturating_add(ttl_ms),
            claim,
        },
    );
    LeaseReply::Granted {
        seq: request.seq,
        lease,
        target,
        instances: holders.len() as u32,
        known: mine.is_some(),
    }
}

/// KEYS[1] the key's lease hash (field: instance id, value `lease want seq expires_ms claim`;
/// a record without `claim` claims nothing). ARGV: [1] instance, [2] the request's number,
/// [3] what it keeps, [4] what it wants, [5] the limit, [6] the lease's lifetime (ms), [7] its
/// permits in use, [8] `1` when the lease may grow. [`serve`] on Redis's clock: expired
/// records dropped, a stale request ignored, the permits in use claimed, the grant taken from
/// what no other live record holds or claims, growth capped at the fair part while another
/// instance is short or more is in use than the limit, and none for a request that may not
/// grow or keeps a lease Redis does not know. KEYS[2], when given (not on Redis Cluster,
/// where it would be in another slot), is when the server's lease records began
/// ([`serve_since`]).
/// Returns `[applied (1) or stale (0), seq, lease, target, instances, known (1) or not (0)]`.
pub const SERVE_SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local hash, instance = KEYS[1], ARGV[1]
local seq, keep, want = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local limit, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local claim, may_grow = math.min(tonumber(ARGV[7]), limit), ARGV[8] == '1'
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local all = redis.call('HGETALL', hash)
local others, mine = {}, nil
for i = 1, #all, 2 do
  local l, w, s, e, c = string.match(all[i + 1], '^(%d+) (%d+) (%d+) (%d+) ?(%d*)$')
  if not l or tonumber(e) <= now then
    redis.call('HDEL', hash, all[i])
  elseif all[i] == instance then
    mine = {tonumber(l), tonumber(w), tonumber(s)}
  else
    others[#others + 1] = {tonumber(l), tonumber(w), tonumber(c) or 0}
  end
end
if mine and seq <= mine[3] then return {0, seq, 0, 0, 0, 0} end
local held = 0
if mine then held = mine[1] end
local taken, short = 0, false
for _, other in ipairs(others) do
  taken = taken + math.max(other[1], other[3])
  if other[2] > other[1] then short = true end
end
local forgotten = (not mine) and keep > 0
keep = math.max(math.min(keep, held), math.min(claim, math.max(limit - taken, 0)))
want = math.max(math.min(want, limit), keep)
if taken + math.max(keep, claim) > limit then short = true end
local free = math.max(limit - taken - keep, 0)
local function used(level)
  local sum = math.min(want, level)
  for _, other in ipairs(others) do sum = sum + math.min(other[2], level) end
  return sum
end
local low, high = 0, limit
while low < high do
  local mid = low + math.floor((high - low + 1) / 2)
  if used(mid) <= limit then low = mid else high = mid - 1 end
end
local target, cap = math.min(want, low), want
if short then cap = math.max(target, keep) else target = math.max(want, keep) end
if #KEYS > 1 then
  local since = tonumber(redis.call('GET', KEYS[2]))
  if not since then
    since = now
    redis.call('SET', KEYS[2], now)
  end
  if now < since + ttl + math.floor(ttl / 3) then cap = keep end
end
if forgotten or not may_grow then cap = keep end
local lease = keep + math.min(math.max(cap - keep, 0), free)
redis.call('HSET', hash, instance,
  string.format('%d %d %d %d %d', lease, want, seq, now + ttl, claim))
redis.call('PEXPIRE', hash, 2 * ttl)
local known = 0
if mine then known = 1 end
return {1, seq, lease, target, #others + 1, known}
"#;

/// When a hold begun at `from_ms` ends: `ttl` and one interval later, long enough for every
/// lease Redis lost to expire on its holder's clock and for its holder's claim to arrive
/// ([`LeaseHolder::hold`], [`serve_since`]; the script's `ttl + ttl / 3`).
pub fn hold_end(from_ms: u64, ttl_ms: u64) -> u64 {
    from_ms.saturating_add(ttl_ms + ttl_ms / EXPIRY_ROUNDS)
}

/// The max-min fair level: the largest `level` with `sum(min(want, level)) <= limit`, so that
/// an instance wanting less than its equal part gets what it wants and the others share the
/// rest equally (permits left over by rounding are granted to whoever asks while nobody else
/// is short).
///
/// ```
/// use ratelimit_core::lease::fair_level;
///
/// assert_eq!(fair_level(12, &[12, 12, 12]), 4);
/// assert_eq!(fair_level(12, &[2, 12, 12]), 5);
/// assert_eq!(fair_level(12, &[12, 0, 0]), 12);
/// ```
pub fn fair_level(limit: u32, wants: &[u32]) -> u32 {
    let used = |level: u32| -> u64 { wants.iter().map(|&w| u64::from(w.min(level))).sum() };
    let (mut low, mut high) = (0u32, limit);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if used(mid) <= u64::from(limit) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    low
}

/// An instance's side of the leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The instance's id, as its requests carry it.
    pub instance: u64,
    /// Permits it may have in use (0 once expired).
    pub lease: u32,
    /// Permits its requests hold now.
    pub in_use: u32,
    /// Its fair part, from the last reply applied.
    pub target: u32,
    /// When its lease expires on its own clock (ms): `ttl` after the request it answered.
    pub expires_ms: u64,
    /// The number of the last request sent.
    pub seq: u64,
    /// When it was sent, on the instance's clock (ms).
    pub sent_ms: u64,
    /// The requests sent before it (number, when), newest first, for their late replies.
    pub earlier: [(u64, u64); 3],
    /// The most permits in use at once since the last request.
    pub peak: u32,
    /// Permits refused since the last request.
    pub refused: u32,
    /// Instances with a live lease record, from the last reply.
    pub instances: u32,
    /// Leases that expired while permits were in use (Redis unreachable for `ttl`).
    pub expired_in_use: u64,
    /// Until when (ms, its clock) its lease may not grow: the fleet's claims are coming in
    /// after Redis failed or forgot the leases ([`LeaseHolder::hold`]).
    pub hold_until_ms: u64,
    /// What its last request kept.
    kept: u32,
}

impl LeaseHolder {
    /// An instance holding nothing yet.
    pub fn new(instance: u64) -> LeaseHolder {
        LeaseHolder {
            instance,
            lease: 0,
            in_use: 0,
            target: 0,
            expires_ms: 0,
            seq: 0,
            sent_ms: 0,
            earlier: [(0, 0); 3],
            peak: 0,
            refused: 0,
            instances: 1,
            expired_in_use: 0,
            hold_until_ms: 0,
            kept: 0,
        }
    }

    /// The lease as of `now_ms`: nothing once expired.
    fn expire(&mut self, now_ms: u64) {
        if self.lease > 0 && now_ms >= self.expires_ms {
            if self.in_use > 0 {
                self.expired_in_use += 1;
            }
            self.lease = 0;
        }
    }

    /// One permit for a request, if the lease has room for it.
    pub fn acquire(&mut self, now_ms: u64) -> bool {
        self.expire(now_ms);
        // Beyond its fair part, a freed permit is not granted again: it goes back to the fleet.
        if self.in_use < self.lease.min(self.target) {
            self.in_use += 1;
            self.peak = self.peak.max(self.in_use);
            true
        } else {
            self.refused = self.refused.saturating_add(1);
            false
        }
    }

    /// A request finished: its permit is free again.
    pub fn release(&mut self) {
        self.in_use = self.in_use.saturating_sub(1);
    }

    /// The round's request: the lease is shrunk first to what it keeps (its permits in use,
    /// and no more than its fair part or what it wants).
    pub fn request(&mut self, now_ms: u64, limit: u32) -> LeaseRequest {
        self.expire(now_ms);
        let busy = self.peak.max(self.in_use);
        let extra = if busy > 0 || self.refused > 0 { 1 } else { 0 };
        let want = busy
            .saturating_add(self.refused)
            .saturating_add(extra)
            .min(limit);
        let keep = self.lease.min(self.in_use.max(self.target.min(want)));
        self.lease = keep;
        self.earlier.rotate_right(1);
        self.earlier[0] = (self.seq, self.sent_ms);
        self.seq += 1;
        self.sent_ms = now_ms;
        self.peak = self.in_use;
        self.refused = 0;
        self.kept = keep;
        LeaseRequest {
            instance: self.instance,
            seq: self.seq,
            keep,
            want,
            in_use: self.in_use,
            grow: now_ms >= self.hold_until_ms,
        }
    }

    /// Redis's reply. The reply to the last request sent sets the lease (never above the
    /// grant; down to the fair part as requests finish). A reply to an earlier one (a round
    /// trip longer than the interval) renews the lease from when that request was sent and
    /// changes nothing else: a later request may have given permits back since.
    pub fn apply(&mut self, reply: &LeaseReply, now_ms: u64, ttl_ms: u64) {
        let LeaseReply::Granted {
            seq,
            lease,
            target,
            instances,
            known,
        } = *reply
        else {
            return;
        };
        self.expire(now_ms);
        if seq == self.seq && !known && self.kept > 0 {
            // Redis lost the lease it kept: the other instances' leases it lost too are in
            // use until they expire on their own clocks, and their claims are coming.
            self.hold(now_ms, ttl_ms);
        }
        if seq == self.seq {
            self.expires_ms = self.sent_ms.saturating_add(ttl_ms);
            self.target = target;
            self.instances = instances.max(1);
            self.lease = lease.min(self.in_use.max(target));
        } else if let Some(&(_, sent_ms)) = self.earlier.iter().find(|(sent, _)| *sent == seq) {
            // Its grant was at least what that request kept, and the lease has only shrunk
            // since: the lease stands as it is.
            self.expires_ms = self.expires_ms.max(sent_ms.saturating_add(ttl_ms));
        }
        self.expire(now_ms);
    }

    /// No growth until the fleet's claims are in: for `ttl` and one interval from `now_ms`,
    /// its requests keep what they hold and ask for no more. Called when Redis answers again
    /// after `on_failure=` applied (the others admitted under theirs meanwhile, and reach
    /// Redis within a round of it), and when Redis forgot the lease it kept (restarted empty,
    /// a replica promoted): every lease Redis lost expires on its holder's clock within
    /// `ttl`, its holder claims what its requests still hold at its next round, and only
    /// then is the rest free.
    pub fn hold(&mut self, now_ms: u64, ttl_ms: u64) {
        self.hold_until_ms = self.hold_until_ms.max(hold_end(now_ms, ttl_ms));
    }

    /// `on_failure=local_share`: the permits it may grant alone, `limit` over the instances
    /// known at the last reply.
    pub fn local_share(&self, limit: u32) -> u32 {
        limit / self.instances.max(1)
    }
}

/// What an instance's requests read of a key's lease, one word in the zone's shared memory
/// written by the sync loop: the permits they may hold (`min(lease, target)` of its
/// [`LeaseHolder`]) and until when (ms on the instance's monotonic clock). Past `until_ms`
/// the lease is gone and the zone's failure mode decides. `0` is no lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseWord {
    /// Permits the instance's requests may hold (at most 2^24 - 1, the largest `limit=`).
    pub permits: u32,
    /// When the lease expires (ms, instance's clock; 40 bits: 34 years).
    pub until_ms: u64,
}

impl LeaseWord {
    const PERMITS_MASK: u64 = (1 << 24) - 1;
    const UNTIL_MASK: u64 = (1 << 40) - 1;

    /// `[until_ms:40][permits:24]`.
    ///
    /// ```
    /// use ratelimit_core::lease::LeaseWord;
    ///
    /// let word = LeaseWord { permits: 12, until_ms: 123_456 };
    /// assert_eq!(LeaseWord::unpack(word.pack()), word);
    /// assert_eq!(word.permits_at(123_455), Some(12));
    /// assert_eq!(word.permits_at(123_456), None);
    /// ```
    pub fn pack(&self) -> u64 {
        ((self.until_ms & Self::UNTIL_MASK) << 24) | (u64::from(self.permits) & Self::PERMITS_MASK)
    }

    /// Inverse of [`LeaseWord::pack`].
    pub fn unpack(word: u64) -> LeaseWord {
        LeaseWord {
            permits: (word & Self::PERMITS_MASK) as u32,
            until_ms: word >> 24,
        }
    }

    /// The permits at `now_ms`, `None` once the lease expired.
    #[inline]
    pub fn permits_at(&self, now_ms: u64) -> Option<u32> {
        (now_ms < self.until_ms).then_some(self.permits)
    }

    /// What the requests of `holder` may hold now.
    pub fn of(holder: &LeaseHolder) -> LeaseWord {
        LeaseWord {
            permits: holder.lease.min(holder.target),
            until_ms: if holder.lease > 0 {
                holder.expires_ms
            } else {
                0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(reply: LeaseReply) -> (u32, u32) {
        match reply {
            LeaseReply::Granted { lease, target, .. } => (lease, target),
            LeaseReply::Stale { .. } => panic!("stale"),
        }
    }

    #[test]
    fn grants_what_is_free_and_shares_when_short() {
        let mut holders = BTreeMap::new();
        let ask = |instance, seq, keep, want| LeaseRequest {
            instance,
            seq,
            keep,
            want,
            in_use: keep,
            grow: true,
        };
        // Alone: everything it wants.
        let reply = serve(&mut holders, 12, &ask(1, 1, 0, 12), 0, 300);
        assert_eq!(granted(reply), (12, 12));
        // A second instance finds nothing free (nobody else is short yet: no part named).
        let reply = serve(&mut holders, 12, &ask(2, 1, 0, 12), 10, 300);
        assert_eq!(granted(reply), (0, 12));
        // The first is told its fair part and keeps what it still uses (8).
        let reply = serve(&mut holders, 12, &ask(1, 2, 8, 12), 100, 300);
        assert_eq!(granted(reply), (8, 6));
        // The second gets what was given back, up to its part.
        let reply = serve(&mut holders, 12, &ask(2, 2, 0, 12), 110, 300);
        assert_eq!(granted(reply), (4, 6));
        // A stale request changes nothing.
        assert_eq!(
            serve(&mut holders, 12, &ask(1, 1, 12, 12), 120, 300),
            LeaseReply::Stale { seq: 1 }
        );
        // The first stops renewing: its lease expires 300 ms after its last request.
        let reply = serve(&mut holders, 12, &ask(2, 3, 4, 12), 399, 300);
        assert_eq!(granted(reply), (4, 6));
        let reply = serve(&mut holders, 12, &ask(2, 4, 4, 12), 400, 300);
        assert_eq!(granted(reply), (12, 12));
    }

    fn request(instance: u64, seq: u64, keep: u32, in_use: u32, grow: bool) -> LeaseRequest {
        LeaseRequest {
            instance,
            seq,
            keep,
            want: 12,
            in_use,
            grow,
        }
    }

    #[test]
    fn permits_in_use_are_claimed_before_any_lease_grows() {
        // Redis answers again after a failure mode: the leases it recorded expired, and each
        // of three instances has 4 requests in flight under `local_share`.
        let mut holders = BTreeMap::new();
        for instance in 1..=3 {
            let reply = serve(&mut holders, 12, &request(instance, 9, 0, 4, false), 0, 300);
            assert_eq!(granted(reply).0, 4, "instance {instance}");
        }
        // Held back no more: nothing is free.
        let reply = serve(&mut holders, 12, &request(1, 10, 4, 4, true), 10, 300);
        assert_eq!(granted(reply).0, 4);
        // More in use than the limit (each admitted 12 under `open`): the second gets no
        // lease beyond what no record claims, and both are told their fair part.
        let mut holders = BTreeMap::new();
        let reply = serve(&mut holders, 12, &request(1, 1, 0, 12, true), 0, 300);
        assert_eq!(granted(reply), (12, 12));
        let reply = serve(&mut holders, 12, &request(2, 1, 0, 12, true), 0, 300);
        assert_eq!(granted(reply), (0, 6));
        let reply = serve(&mut holders, 12, &request(1, 2, 12, 12, true), 10, 300);
        assert_eq!(granted(reply), (12, 6));
    }

    #[test]
    fn a_lease_redis_forgot_does_not_grow_and_holds_the_instance_back() {
        // Redis restarted empty while the instance held 4: it keeps what is in use, gets no
        // more although 12 look free, and is told it was not known.
        let mut holders = BTreeMap::new();
        let reply = serve(&mut holders, 12, &request(1, 5, 4, 3, true), 0, 300);
        let LeaseReply::Granted { lease, known, .. } = reply else {
            panic!("stale");
        };
        assert_eq!((lease, known), (3, false));
        let mut holder = LeaseHolder::new(1);
        holder.lease = 4;
        holder.target = 4;
        holder.in_use = 3;
        holder.expires_ms = 1_000;
        let sent = holder.request(100, 12);
        assert!(sent.grow && sent.keep > 0);
        let reply = serve(&mut BTreeMap::new(), 12, &sent, 100, 300);
        holder.apply(&reply, 110, 300);
        // Held back for the lease's lifetime and one interval: its next requests ask for no
        // growth until then.
        assert_eq!(holder.hold_until_ms, 110 + 400);
        assert!(!holder.request(200, 12).grow);
        assert!(holder.request(510, 12).grow);
    }

    #[test]
    fn a_holder_grows_only_from_the_reply_to_its_last_request() {
        let mut holders = BTreeMap::new();
        let mut instance = LeaseHolder::new(7);
        let first = instance.request(0, 10);
        assert_eq!((first.keep, first.want), (0, 0));
        assert!(!instance.acquire(1));
        let second = instance.request(100, 10);
        assert_eq!(second.want, 2);
        let old = serve(&mut holders, 10, &first, 150, 300);
        let new = serve(&mut holders, 10, &second, 160, 300);
        instance.apply(&new, 170, 300);
        instance.apply(&old, 171, 300);
        assert_eq!(instance.lease, 2);
        assert!(instance.acquire(172) && instance.acquire(173) && !instance.acquire(174));
        // Expired 300 ms after the request was sent, with two permits in use.
        assert!(!instance.acquire(400));
        assert_eq!((instance.lease, instance.expired_in_use), (0, 1));
    }
}
