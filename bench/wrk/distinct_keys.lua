-- Requests `<path>?k=<seed>-<thread>-<n>`, every one for a key never sent before, paced: each
-- connection waits the first script argument's milliseconds (default 0) between a response
-- and its next request, so C connections offer about C * 1000 / delay requests a second.
-- The second argument is a seed that keeps the keys of several wrk processes apart. Prints the
-- same JSON summary as report.lua at the end.

local threads = 0
local delay_ms = 0
local prefix = "0"
local counter = 0

function setup(thread)
   threads = threads + 1
   thread:set("thread_id", threads)
end

function init(args)
   delay_ms = tonumber(args[1]) or 0
   prefix = (args[2] or "0") .. "-" .. tostring(thread_id)
end

function delay()
   return delay_ms
end

function request()
   counter = counter + 1
   return wrk.format(nil, wrk.path .. "?k=" .. prefix .. "-" .. counter)
end

function done(summary, latency, requests)
   local errors = summary.errors
   io.write(string.format(
      '{"duration_us": %d, "requests": %d, "non_2xx_3xx": %d, "connect_errors": %d, ' ..
      '"read_errors": %d, "write_errors": %d, "timeouts": %d, ' ..
      '"p50_us": %d, "p99_us": %d, "p999_us": %d, "max_us": %d}\n',
      summary.duration, summary.requests, errors.status, errors.connect, errors.read,
      errors.write, errors.timeout, latency:percentile(50), latency:percentile(99),
      latency:percentile(99.9), latency.max))
end
