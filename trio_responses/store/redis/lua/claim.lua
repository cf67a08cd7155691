-- KEYS: lease, running, record, log, meta, retained, retained:bytes, retained:total,
-- then the record's index (index, total, sizes, owners).
-- ARGV: id, replica, record json, record size, expected next ('' when the log needs
-- no terminal event), terminal frame, retention_ms, max_streams, max_bytes, prefix,
-- then the index's bounds (suffix, ttl_ms, max, max_bytes, prefix), then, for a
-- background response, its webhook event (id, type, owner ('' without one), JSON,
-- now): its deliveries are written with the recovered final state.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}  -- the replica is alive
end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return {0}  -- claimed by another replica already
end
local written = redis.call('HGET', KEYS[5], 'next')
local open = written and not redis.call('HGET', KEYS[5], 'done')
if ARGV[5] == '' then
  if open then return {-1} end
elseif not open or written ~= ARGV[5] then
  return {-1}  -- the log changed since the frame was built: build it again
end
local x = records(9, 11)
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[3], 'PX', int(x.ttl_ms))
finished_record(x, ARGV[1], tonumber(ARGV[4]))
if ARGV[16] then
  enqueue(x.prefix, ARGV[18], ARGV[16], ARGV[17], ARGV[19], ARGV[20])
end
if ARGV[5] ~= '' then
  return end_log(bounds(6, 7), KEYS[4], KEYS[5], ARGV[1], ARGV[5], ARGV[6])
end
return {1}
