-- KEYS: log, meta, retained, retained:bytes, retained:total.
-- ARGV: id, retention_ms, max_streams, max_bytes, prefix
local b = bounds(3, 2)
redis.call('DEL', KEYS[1], KEYS[2])
if redis.call('ZREM', b.index, ARGV[1]) == 1 then
  local sum = tonumber(redis.call('GET', b.total) or '0') - drop_log(b, ARGV[1])
  redis.call('SET', b.total, int(math.max(sum, 0)))
end
return {1, redis.call('ZCARD', b.index), tonumber(redis.call('GET', b.total) or '0')}
