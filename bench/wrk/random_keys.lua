-- Requests `<path>?k=<n>` with n uniform in 1..KEYS (the first script argument, default
-- 100000), and prints the same JSON summary as report.lua at the end. LuaJIT's math.random
-- starts from the same seed in every run, so every limiter sees the same key sequence.

local keys = 100000

function init(args)
   keys = tonumber(args[1]) or keys
end

function request()
   return wrk.format(nil, wrk.path .. "?k=" .. math.random(1, keys))
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
