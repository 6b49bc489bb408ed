local field = 'i' .. ARGV[1]
local last = tonumber(redis.call('HGET', KEYS[1], field) or '0') or 0
local send = tonumber(ARGV[2])
if send <= last then
  return tonumber(redis.call('HGET', KEYS[1], 'n') or '0') or 0
end
local add = tonumber(ARGV[3])
for at = 5, #ARGV, 2 do
  if tonumber(ARGV[at]) <= last then
    add = tonumber(ARGV[3]) - tonumber(ARGV[at + 1])
  end
end
if add < 0 then add = 0 end
local total = redis.call('HINCRBY', KEYS[1], 'n', string.format('%d', add))
redis.call('HSET', KEYS[1], field, ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return total
