-- KEYS: log, meta. ARGV: owner, minid ('' none), ttl_ms, done ('' unless the batch
-- ends with the terminal event), then for each entry of the batch: first, next
-- (last + 1), data
local after = ARGV[#ARGV - 1]  -- the batch's next sequence number
local written = tonumber(redis.call('HGET', KEYS[2], 'next') or '0')
if tonumber(after) <= written then
  return 0  -- this batch is stored already: a retried call
end
if redis.call('HGET', KEYS[2], 'done') then
  return 0  -- nothing follows the terminal event (a stalled replica's late frames)
end
local size = 0
for i = 5, #ARGV, 3 do
  redis.call('XADD', KEYS[1], '0-' .. ARGV[i + 1], 'f', ARGV[i], 'd', ARGV[i + 2])
  size = size + #ARGV[i + 2]
end
if ARGV[2] ~= '' then
  -- The entries below minid hold only events older than the newest replay_events
  -- (usually none or a few): count their bytes out, then trim them.
  local old = redis.call('XRANGE', KEYS[1], '-', '(' .. ARGV[2])
  if #old > 0 then
    for _, entry in ipairs(old) do
      size = size - #field(entry[2], 'd')
    end
    redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])
  end
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'next', after)
redis.call('HINCRBY', KEYS[2], 'bytes', int(size))
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], 'done', ARGV[4])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
