-- ARGV: prefix, replica, now, lease_until, limit, scan, per_endpoint ('' for no
-- bound), then endpoint id, count pairs (what the replica posts to each already).
-- Leases to the replica, until lease_until, up to limit pending deliveries due by now
-- whose lease ended (the due index scores each by the later of its next attempt and
-- its lease), the longest due first, looking at the first scan of them and passing
-- over those of an endpoint that has per_endpoint (counting the pairs); counts an
-- attempt for each; returns them (each as HGETALL's fields).
local p, replica, now, lease_until = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local limit, scan, per_endpoint = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if limit < 1 then return {} end
local taken = {}
for i = 8, #ARGV - 1, 2 do
  taken[ARGV[i]] = tonumber(ARGV[i + 1])
end
local claimed = {}
local due = redis.call('ZRANGEBYSCORE', deliveries_due(p), '-inf', now, 'LIMIT', 0, scan)
for _, member in ipairs(due) do
  if #claimed >= limit then break end
  local key = delivery_key(p, member)
  local endpoint = redis.call('HGET', key, 'endpoint')
  if not endpoint then
    redis.call('ZREM', deliveries_due(p), member)  -- only if the index was tampered with
  elseif per_endpoint == nil or (taken[endpoint] or 0) < per_endpoint then
    taken[endpoint] = (taken[endpoint] or 0) + 1
    redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HSET', key, 'leased_by', replica, 'lease_until', lease_until)
    redis.call('ZADD', deliveries_due(p), lease_until, member)
    claimed[#claimed + 1] = redis.call('HGETALL', key)
  end
end
return claimed
