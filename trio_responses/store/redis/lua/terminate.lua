-- KEYS: log, meta, retained, retained:bytes, retained:total.
-- ARGV: id, expected next, terminal frame, retention_ms, max_streams, max_bytes, prefix
local written = redis.call('HGET', KEYS[2], 'next')
if not written or redis.call('HGET', KEYS[2], 'done') then
  return {0}  -- no log, or it has its terminal event
end
if written ~= ARGV[2] then
  return {-1}  -- appended to since the frame was built: build it again
end
return end_log(bounds(3, 4), KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
