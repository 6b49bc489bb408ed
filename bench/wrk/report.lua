-- Prints one JSON line with wrk's own counters when the run ends, so the bench reads exact
-- numbers (microseconds, status counts) instead of wrk's rounded text. Requests go to the
-- URL given on the command line, unchanged.

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
