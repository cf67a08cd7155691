-- ARGV: prefix, limit ('' for when the earliest pending delivery is due). The limit
-- most recently updated deliveries, newest first (each as HGETALL's fields); or the
-- due index's lowest score (a string), false when none is pending.
local p = ARGV[1]
if ARGV[2] == '' then
  local first = redis.call('ZRANGE', deliveries_due(p), 0, 0, 'WITHSCORES')
  return first[2] or false
end
local limit = tonumber(ARGV[2])
if limit < 1 then return {} end
local found = {}
for _, member in ipairs(redis.call('ZREVRANGE', deliveries_updated(p), 0, limit - 1)) do
  local fields = redis.call('HGETALL', delivery_key(p, member))
  if #fields > 0 then found[#found + 1] = fields end
end
return found
