-- KEYS: log, meta, retained, retained:bytes, retained:total.
-- ARGV: id, retention_ms, max_streams, max_bytes, prefix
local b = bounds(3, 2)
local written = redis.call('HGET', KEYS[2], 'next')
if not written then
  return {0}
end
if not redis.call('HGET', KEYS[2], 'done') then
  -- finished without a terminal frame (not the protocol): readers end at the last frame
  redis.call('HSET', KEYS[2], 'done', tostring(tonumber(written) - 1))
end
redis.call('PEXPIRE', KEYS[1], int(b.retention_ms))
redis.call('PEXPIRE', KEYS[2], int(b.retention_ms))
return retain_log(b, KEYS[2], ARGV[1])
