-- ARGV: prefix, cutoff. Drops the settled deliveries updated at or before cutoff,
-- and the oldest beyond WEBHOOK_MAX_SETTLED; returns how many.
local p = ARGV[1]
local old = redis.call('ZRANGEBYSCORE', deliveries_settled(p), '-inf', ARGV[2])
for _, member in ipairs(old) do
  drop_delivery(p, member)
end
return #old + bound_settled(p)
