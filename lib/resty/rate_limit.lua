-- resty.rate_limit: the zones of ngx_http_rate_limit_module from Lua (OpenResty).
--
-- The shape of lua-resty-limit-traffic (resty.limit.req and friends): new, incoming,
-- uncommit, set_rate, set_burst, combine, and errors as `nil, "rejected"`; `conn` gives
-- resty.limit.conn's shape (incoming, is_committed, leaving, uncommit) over concurrency zones. State lives in
-- the module's shared-memory zones (declared with rate_limit_zone), so a Lua location and a
-- rate_limit location count together, and the admin API, metrics and runtime changes see
-- both. The C functions called here are documented in docs/c-abi.md.

local ffi = require "ffi"
local base = require "resty.core.base"

local C = ffi.C
local get_request = base.get_request
local ffi_new = ffi.new
local ffi_string = ffi.string
local tonumber = tonumber
local tostring = tostring
local type = type
local setmetatable = setmetatable

ffi.cdef[[
typedef struct {
    int64_t   burst;
    uint64_t  delay;
    uint64_t  cost;
    int32_t   delay_mode;
} ngx_http_rate_limit_lua_opts_t;

typedef struct {
    int32_t   outcome;
    uint64_t  delay_ns;
    uint64_t  excess_milli;
    uint64_t  remaining;
    uint64_t  reset_ns;
    uint64_t  retry_after_ns;
} ngx_http_rate_limit_lua_decision_t;

int ngx_http_rate_limit_lua_abi_version(void);
int ngx_http_rate_limit_lua_parse_opts(const unsigned char *words, size_t len,
    ngx_http_rate_limit_lua_opts_t *out, unsigned char *err, size_t *err_len);
int ngx_http_rate_limit_lua_incoming(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, const ngx_http_rate_limit_lua_opts_t *opts,
    int commit, ngx_http_rate_limit_lua_decision_t *out);
int ngx_http_rate_limit_lua_uncommit(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, const ngx_http_rate_limit_lua_opts_t *opts);
int ngx_http_rate_limit_lua_settle(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, const ngx_http_rate_limit_lua_opts_t *opts,
    uint64_t reserved, uint64_t used, int64_t debt, uint64_t *forgiven);
int ngx_http_rate_limit_lua_state(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, const ngx_http_rate_limit_lua_opts_t *opts,
    ngx_http_rate_limit_lua_decision_t *out);
int ngx_http_rate_limit_lua_set_limits(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *rate, size_t rate_len, int64_t burst,
    unsigned char *err, size_t *err_len);
int ngx_http_rate_limit_lua_block(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, uint64_t duration_ns,
    unsigned char *err, size_t *err_len);
int ngx_http_rate_limit_lua_blocked(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, uint64_t *left_ns);

typedef struct {
    int32_t   outcome;
    uint32_t  in_flight;
    uint32_t  limit;
    uint32_t  queued;
    uint64_t  ticket;
    uint64_t  retry_after_ns;
} ngx_http_rate_limit_lua_conn_t;

int ngx_http_rate_limit_lua_conn_incoming(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, uint64_t cost, int commit,
    ngx_http_rate_limit_lua_conn_t *out);
int ngx_http_rate_limit_lua_conn_turn(void *r, uint64_t ticket, int give_up,
    ngx_http_rate_limit_lua_conn_t *out);
int ngx_http_rate_limit_lua_conn_leaving(void *r, const unsigned char *zone, size_t zone_len,
    const unsigned char *key, size_t key_len, int64_t latency_ns,
    ngx_http_rate_limit_lua_conn_t *out);
int ngx_http_rate_limit_lua_conn_set(void *r, const unsigned char *zone, size_t zone_len,
    int64_t limit, int64_t queue, unsigned char *err, size_t *err_len);
]]

local _M = {
    _VERSION = "0.1.0",
    -- The C ABI this file was written for; the module must export the same.
    ABI_VERSION = 4,
}

local mt = { __index = _M }

local NS_PER_SEC = 1e9
local MAX_KEY_BYTES = 65535
-- The largest burst a zone holds (Limits::MAX_BURST); the rate may allow less, which the
-- module says.
local MAX_BURST = 4194303
-- ratelimit_core::adaptive::MAX_LIMIT and ratelimit_core::concurrency::MAX_QUEUE.
local MAX_CONN_LIMIT = 16777215
local MAX_QUEUE = 32767
local RATE_SYNTAX = 'must be a positive number of requests (at most 3 decimals) per s, m, h '
                    .. 'or d, such as "10r/s"'
-- retry_after_ns of a request no wait lets through (it costs more than the zone admits at
-- once): reported as a nil retry_after.
local NEVER_NS = ffi_new("uint64_t", 0) - 1
local PASSED, DELAYED, REJECTED = 1, 2, 3

-- One of each per worker: Lua runs one handler at a time and none of the calls yields.
local decision = ffi_new("ngx_http_rate_limit_lua_decision_t")
local err_buf_len = 512
local err_buf = ffi.new("unsigned char[?]", err_buf_len)
local err_len = ffi.new("size_t[1]")
local left_ns = ffi.new("uint64_t[1]")
local forgiven_out = ffi.new("uint64_t[1]")

local function abi_error()
    local ok, version = pcall(function() return C.ngx_http_rate_limit_lua_abi_version() end)
    if not ok then
        return "ngx_http_rate_limit_module is not loaded (load_module it after the lua module)"
    end
    if version ~= _M.ABI_VERSION then
        return "ABI version mismatch: ngx_http_rate_limit_module has " .. tostring(version)
               .. ", resty.rate_limit needs " .. _M.ABI_VERSION
    end
    return nil
end

local function buffer_error()
    return ffi_string(err_buf, err_len[0])
end

-- A negative status as a message, for limiter `self` (nil for errors without one).
-- `decided`: the call filled `decision` (incoming, state), which then holds the largest
-- burst for -9.
local function status_error(self, status, decided)
    if status == -1 then
        return "no request: resty.rate_limit works only while handling a request"
    elseif status == -2 then
        return 'unknown zone "' .. self.zone .. '"'
    elseif status == -3 then
        return "empty key"
    elseif status == -4 then
        return "key is more than " .. MAX_KEY_BYTES .. " bytes"
    elseif status == -6 then
        return buffer_error()
    elseif status == -7 then
        return '"burst" is not used by the algorithm of zone "' .. self.zone .. '"'
    elseif status == -8 then
        return 'internal error in zone "' .. self.zone .. '"'
    elseif status == -9 then
        local most = decided and (" (at most " .. tostring(tonumber(decision.remaining)) .. ")")
                     or ""
        return "burst " .. tostring(tonumber(self.opts.burst)) .. ' is too large for the rate of '
               .. 'zone "' .. self.zone .. '"' .. most .. ": a bucket must drain or refill "
               .. "within 100 years"
    elseif status == -10 then
        if self.is_conn then
            return 'zone "' .. self.zone .. '" is not a concurrency zone: use rate_limit.new'
        end
        return 'zone "' .. self.zone .. '" is a concurrency zone: use rate_limit.conn'
    elseif status == -11 then
        return 'this request holds no slot of the key in zone "' .. self.zone .. '"'
    elseif status == -12 then
        return 'zone "' .. self.zone .. '" is not a leaky_bucket or token_bucket zone: '
               .. 'only a bucket can settle usage'
    end
    return "bad argument (status " .. tostring(status) .. ")"
end

-- The options table as rate_limit's words: the module parses them as the directive does.
local function option_words(opts)
    if opts.on_status ~= nil then
        return nil, 'invalid parameter "on_status": in Lua, call incoming(key, false) at '
                    .. "access and charge(key) at log when the status matches"
    end
    local words = {}
    for _, name in ipairs({ "burst", "delay", "cost" }) do
        local value = opts[name]
        if value ~= nil then
            if type(value) ~= "number" then
                return nil, name .. " must be a number, got " .. type(value)
            end
            words[#words + 1] = name .. "=" .. tostring(value)
        end
    end
    if opts.nodelay then
        words[#words + 1] = "nodelay"
    end
    for name in pairs(opts) do
        if name ~= "burst" and name ~= "delay" and name ~= "cost" and name ~= "nodelay" then
            return nil, 'unknown option "' .. tostring(name) .. '"'
        end
    end
    return table.concat(words, " ")
end

--- A limiter over zone `zone_name` (a rate_limit_zone), with `rate_limit`'s options:
--- `{burst = N, delay = N, nodelay = true, cost = N}`. Returns the limiter or nil and a
--- message. May run in any phase; the zone itself is looked up by each call.
function _M.new(zone_name, opts)
    local err = abi_error()
    if err then
        return nil, err
    end
    if type(zone_name) ~= "string" or zone_name == "" then
        return nil, "zone name must be a non-empty string"
    end
    if opts ~= nil and type(opts) ~= "table" then
        return nil, "options must be a table"
    end
    local words, werr = option_words(opts or {})
    if not words then
        return nil, werr
    end
    local parsed = ffi_new("ngx_http_rate_limit_lua_opts_t")
    err_len[0] = err_buf_len
    local status = C.ngx_http_rate_limit_lua_parse_opts(words, #words, parsed, err_buf, err_len)
    if status ~= 0 then
        if status == -6 then
            return nil, buffer_error()
        end
        return nil, "invalid options (status " .. status .. ")"
    end
    return setmetatable({ zone = zone_name, opts = parsed }, mt)
end

-- The request a call on `key` runs in, or nil and the message for a key that is no string or
-- a phase without a request.
local function request_for(self, key)
    if type(key) ~= "string" then
        return nil, "key must be a string, got " .. type(key)
    end
    local r = get_request()
    if not r then
        return nil, status_error(self, -1)
    end
    return r
end

-- Seconds until a rejected request would pass, or nil when none ever would.
local function retry_after()
    if decision.retry_after_ns == NEVER_NS then
        return nil
    end
    return tonumber(decision.retry_after_ns) / NS_PER_SEC
end

--- Decide a request for `key`. With `commit` true it is charged (and counted in the zone's
--- metrics); otherwise a request that would pass changes nothing. A rejection is counted
--- either way and, in a zone with block=, blocks the key; a blocked key is rejected with
--- the time left of its block. Returns `0, excess, remaining` (pass), `seconds,
--- excess, remaining` (delay: the caller sleeps, as with resty.limit.req), `nil, "rejected",
--- retry_after` (no retry_after when the request's cost is more than the zone ever admits at
--- once) or `nil, message`.
function _M.incoming(self, key, commit)
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    local zone = self.zone
    local status = C.ngx_http_rate_limit_lua_incoming(r, zone, #zone, key, #key, self.opts,
                                                      commit and 1 or 0, decision)
    if status ~= 0 then
        return nil, status_error(self, status, true)
    end
    local outcome = decision.outcome
    local remaining = tonumber(decision.remaining)
    if outcome == REJECTED then
        return nil, "rejected", retry_after()
    end
    local excess = tonumber(decision.excess_milli) / 1000
    if outcome == DELAYED then
        return tonumber(decision.delay_ns) / NS_PER_SEC, excess, remaining
    end
    return 0, excess, remaining
end

--- Charge a request to `key` now, for on_status semantics: call `incoming(key, false)` at
--- access (a key over its limit is rejected there, and blocked in a zone with block=; a
--- blocked key is refused) and `charge(key)` at log when the response's status is one to
--- count (`if ngx.status == 401`). Returns what `incoming(key, true)` returns.
function _M.charge(self, key)
    return _M.incoming(self, key, true)
end

--- Block `key` by hand for `seconds` (keeping its escalation level), as the admin API's PUT
--- zones/NAME/blocked/KEY does. The zone needs block=. Returns true or nil and a message.
function _M.block(self, key, seconds)
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    if type(seconds) ~= "number" or seconds <= 0 or seconds ~= seconds then
        return nil, "seconds must be a positive number"
    end
    local zone = self.zone
    err_len[0] = err_buf_len
    local status = C.ngx_http_rate_limit_lua_block(r, zone, #zone, key, #key,
                                                   seconds * NS_PER_SEC, err_buf, err_len)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    return true
end

--- How long `key` stays blocked, in seconds, or nil when it is not blocked (or the zone has
--- no block=). On error: nil and a message.
function _M.blocked(self, key)
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    local zone = self.zone
    local status = C.ngx_http_rate_limit_lua_blocked(r, zone, #zone, key, #key, left_ns)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    local left = tonumber(left_ns[0])
    if left == 0 then
        return nil
    end
    return left / NS_PER_SEC
end

-- A whole number of at least `least`, or nil and a message naming `name`.
local function whole(name, value, least)
    if type(value) ~= "number" or value ~= value or value % 1 ~= 0 or value < least
       or value > 2^53 then
        return nil, name .. " must be a whole number of at least " .. least .. ", got "
                    .. tostring(value)
    end
    return value
end

--- Reserve `tokens` for `key` at the door of a usage-based request (a leaky or token
--- bucket zone): `incoming(key, true)` with a cost of `tokens`; returns what it returns. A
--- reservation larger than the zone's burst is never admitted. Settle it when the request
--- ends with `settle`.
function _M.reserve(self, key, tokens)
    local ok, err = whole("tokens", tokens, 1)
    if not ok then
        return nil, err
    end
    local cost = self.opts.cost
    self.opts.cost = tokens
    local first, second, third = _M.incoming(self, key, true)
    self.opts.cost = cost
    return first, second, third
end

--- Settle a reservation of `reserved` tokens for `key` that used `used` (in log_by_lua,
--- once the usage is known): less is given back, more is charged into debt, up to `debt`
--- tokens past the bucket's capacity (default: one capacity). Returns `true, forgiven`
--- (the tokens that bound forgave) or nil and a message.
function _M.settle(self, key, reserved, used, debt)
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    local ok
    ok, err = whole("reserved", reserved, 1)
    if not ok then
        return nil, err
    end
    ok, err = whole("used", used, 0)
    if not ok then
        return nil, err
    end
    if debt ~= nil then
        ok, err = whole("debt", debt, 0)
        if not ok then
            return nil, err
        end
    end
    local zone = self.zone
    local status = C.ngx_http_rate_limit_lua_settle(r, zone, #zone, key, #key, self.opts,
                                                    reserved, used, debt or -1, forgiven_out)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    return true, tonumber(forgiven_out[0])
end

--- Give back a request charged to `key` (after a later limit refused, or the request was
--- not served after all). Returns true or nil and a message.
function _M.uncommit(self, key)
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    local zone = self.zone
    local status = C.ngx_http_rate_limit_lua_uncommit(r, zone, #zone, key, #key, self.opts)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    return true
end

--- Where `key` stands, charging nothing: `remaining` requests, `reset` seconds until the key
--- is fresh again, `retry_after` seconds until a request would pass (0: it would now; nil:
--- never, its cost is more than the zone admits at once). For the RateLimit and Retry-After
--- headers. Returns nil and a message on error.
function _M.state(self, key)
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    local zone = self.zone
    local status = C.ngx_http_rate_limit_lua_state(r, zone, #zone, key, #key, self.opts,
                                                   decision)
    if status ~= 0 then
        return nil, status_error(self, status, true)
    end
    local wait = 0
    if decision.outcome == REJECTED then
        wait = retry_after()
    end
    return tonumber(decision.remaining), tonumber(decision.reset_ns) / NS_PER_SEC, wait
end

local function set_limits(self, rate, burst)
    local r = get_request()
    if not r then
        return nil, status_error(self, -1)
    end
    local zone = self.zone
    err_len[0] = err_buf_len
    local status = C.ngx_http_rate_limit_lua_set_limits(r, zone, #zone, rate, #rate, burst,
                                                        err_buf, err_len)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    return true
end

--- Change the zone's rate for every worker at once, as the admin API's PATCH does (and with
--- its checks). `rate`: a number of requests per second, or a rate string ("30r/m").
function _M.set_rate(self, rate)
    if type(rate) == "number" then
        -- NaN, infinities and non-positive numbers are no rate (and "inf" would read as one).
        if rate ~= rate or rate <= 0 or rate == math.huge then
            return nil, "invalid rate " .. tostring(rate) .. ": " .. RATE_SYNTAX
        end
        rate = tostring(rate) .. "r/s"
    elseif type(rate) ~= "string" then
        return nil, "rate must be a number or a string, got " .. type(rate)
    end
    -- The module reads an empty rate as "no change": it is no rate here.
    if rate == "" then
        return nil, 'invalid rate "": ' .. RATE_SYNTAX
    end
    return set_limits(self, rate, -1)
end

--- Change the zone's burst for every worker at once, as the admin API's PATCH does.
function _M.set_burst(self, burst)
    if type(burst) ~= "number" then
        return nil, "burst must be a number, got " .. type(burst)
    end
    -- Checked as a number before the int64_t conversion, which would wrap 1e300 or NaN.
    if burst ~= burst or burst < 0 or burst > MAX_BURST or burst % 1 ~= 0 then
        return nil, "invalid burst " .. tostring(burst) .. ": must be an integer from 0 to "
                    .. MAX_BURST
    end
    return set_limits(self, "", burst)
end

--- resty.limit.traffic's combine: `limiters[i]` decides `keys[i]`; the request is charged to
--- all of them or to none. Returns the longest delay, or nil and the first refusal
--- ("rejected" or a message). With `states`, `states[i]` receives limiter i's second value.
function _M.combine(limiters, keys, states)
    local n = #limiters
    local longest = 0
    -- Look at all but the last, charge the last, then charge the others: a refusal found
    -- while charging (another worker got there first) gives back what was charged.
    for i = 1, n do
        local lim, key = limiters[i], keys[i]
        if not lim then
            return nil, "missing limiters[" .. i .. "]"
        end
        if key == nil then
            return nil, "missing keys[" .. i .. "]"
        end
        local delay, info = lim:incoming(key, i == n)
        if not delay then
            return nil, info
        end
        if i == n then
            if states then
                states[i] = info
            end
            if delay > longest then
                longest = delay
            end
        end
    end
    for i = 1, n - 1 do
        local delay, info = limiters[i]:incoming(keys[i], true)
        if not delay then
            for j = 1, i - 1 do
                limiters[j]:uncommit(keys[j])
            end
            limiters[n]:uncommit(keys[n])
            return nil, info
        end
        if states then
            states[i] = info
        end
        if delay > longest then
            longest = delay
        end
    end
    return longest
end

-- resty.limit.conn's shape over a concurrency zone (algorithm=concurrency).

local conn_mt = {}
conn_mt.__index = conn_mt

local CONN_ADMITTED, CONN_REJECTED = 1, 3
local conn_out = ffi_new("ngx_http_rate_limit_lua_conn_t")
local ngx_sleep = ngx.sleep
-- The longest pause between two looks at a ticket while waiting in the queue.
local MAX_POLL = 0.008

--- A limiter over concurrency zone `zone_name`: `{cost = N}` slots per request (default 1).
--- The zone's `limit=` and `queue=` apply; `lim:set_conn(n)` and `lim:set_burst(n)` change
--- them for every worker, as the admin API's PATCH does. Returns the limiter or nil and a
--- message.
function _M.conn(zone_name, opts)
    local err = abi_error()
    if err then
        return nil, err
    end
    if type(zone_name) ~= "string" or zone_name == "" then
        return nil, "zone name must be a non-empty string"
    end
    if opts ~= nil and type(opts) ~= "table" then
        return nil, "options must be a table"
    end
    local cost = 1
    for name, value in pairs(opts or {}) do
        if name ~= "cost" then
            return nil, 'unknown option "' .. tostring(name) .. '"'
        end
        if type(value) ~= "number" or value < 1 or value % 1 ~= 0 then
            return nil, "cost must be a positive integer"
        end
        cost = value
    end
    return setmetatable({ zone = zone_name, cost = cost, is_conn = true, committed = false },
                        conn_mt)
end

--- A request of `cost` slots arrives for `key`. With `commit`, it takes its slots, or waits
--- in the zone's queue (sleeping, so only where ngx.sleep works) until its turn or its
--- queue_timeout. Returns `0, conn` (admitted; `conn`: the key's requests in flight, this
--- one included), `nil, "rejected"`, or `nil, message`. Without `commit` nothing changes:
--- `0, conn` if a request would get its slots now, `0.001, conn` if it would wait in the
--- queue, `nil, "rejected"` if it would be refused.
function conn_mt.incoming(self, key, commit)
    self.committed = false
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    local zone = self.zone
    local status = C.ngx_http_rate_limit_lua_conn_incoming(r, zone, #zone, key, #key,
                                                           self.cost, commit and 1 or 0,
                                                           conn_out)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    local outcome = conn_out.outcome
    if outcome == CONN_ADMITTED then
        self.committed = commit and true or false
        return 0, tonumber(conn_out.in_flight)
    elseif outcome == CONN_REJECTED then
        return nil, "rejected"
    end
    if not commit then
        return 0.001, tonumber(conn_out.in_flight)
    end
    -- Queued: look at the ticket until its turn (the module enforces queue_timeout).
    local ticket = conn_out.ticket
    local pause = 0.001
    while true do
        local ok = pcall(ngx_sleep, pause)
        if not ok then
            C.ngx_http_rate_limit_lua_conn_turn(r, ticket, 1, conn_out)
            return nil, "cannot wait in the queue here: ngx.sleep is not allowed in this phase"
        end
        status = C.ngx_http_rate_limit_lua_conn_turn(r, ticket, 0, conn_out)
        if status ~= 0 then
            return nil, status_error(self, status)
        end
        outcome = conn_out.outcome
        if outcome == CONN_ADMITTED then
            self.committed = true
            return 0, tonumber(conn_out.in_flight)
        elseif outcome == CONN_REJECTED then
            return nil, "rejected"
        end
        if pause < MAX_POLL then
            pause = pause * 2
        end
    end
end

--- Whether the last `incoming` took slots (to be given back by `leaving`).
function conn_mt.is_committed(self)
    return self.committed
end

local function conn_leave(self, key, latency_ns)
    local r, err = request_for(self, key)
    if not r then
        return nil, err
    end
    local zone = self.zone
    local status = C.ngx_http_rate_limit_lua_conn_leaving(r, zone, #zone, key, #key, latency_ns,
                                                          conn_out)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    return tonumber(conn_out.in_flight)
end

--- The request is done with `key`: its slots are given back (they are anyway when the
--- request ends). `latency` (seconds, optional) is a sample for `limit=adaptive`: the smaller
--- of it and the time the slots were held counts; without it, the time they were held.
--- Returns the key's requests in flight now, or nil and a message.
function conn_mt.leaving(self, key, latency)
    local latency_ns = -2
    if latency ~= nil then
        if type(latency) ~= "number" or latency < 0 then
            return nil, "latency must be a non-negative number of seconds"
        end
        latency_ns = latency * NS_PER_SEC
    end
    return conn_leave(self, key, latency_ns)
end

--- Give back the slots the last committed `incoming` took, with no latency sample.
--- Returns true, or nil and a message.
function conn_mt.uncommit(self, key)
    local in_flight, err = conn_leave(self, key, -1)
    if not in_flight then
        return nil, err
    end
    return true
end

local function conn_set(self, limit, queue)
    local r = get_request()
    if not r then
        return nil, status_error(self, -1)
    end
    local zone = self.zone
    err_len[0] = err_buf_len
    local status = C.ngx_http_rate_limit_lua_conn_set(r, zone, #zone, limit, queue, err_buf,
                                                      err_len)
    if status ~= 0 then
        return nil, status_error(self, status)
    end
    return true
end

--- A count for conn_set, checked as a Lua number before the int64_t conversion (which
--- would wrap 1e300 or NaN, and would pass -1, the ABI's "unchanged"): nil and the message
--- when it is not an integer from `low` to `high`.
local function conn_count(value, name, low, high)
    if type(value) ~= "number" then
        return nil, name .. " must be an integer, got " .. type(value)
    end
    if value ~= value or value % 1 ~= 0 or value < low or value > high then
        return nil, "invalid " .. name .. " " .. tostring(value)
                    .. ": must be an integer from " .. low .. " to " .. high
    end
    return value
end

--- Change the zone's limit for every worker at once (the admin API's PATCH).
function conn_mt.set_conn(self, limit)
    local value, err = conn_count(limit, "limit", 1, MAX_CONN_LIMIT)
    if not value then
        return nil, err
    end
    return conn_set(self, value, -1)
end

--- Change the zone's queue places for every worker at once (the admin API's PATCH).
function conn_mt.set_burst(self, queue)
    local value, err = conn_count(queue, "queue", 0, MAX_QUEUE)
    if not value then
        return nil, err
    end
    return conn_set(self, -1, value)
end

return _M
