-- KEYS: sizes, owners. ARGV: ttl_ms, prefix. Forgets, in every index, the members
-- whose record its TTL removed; returns how many. An emptied per-owner index is
-- forgotten as well.
local cutoff = int(now_us() - tonumber(ARGV[1]) * 1000)
local forgotten = 0
local suffixes = redis.call('SMEMBERS', KEYS[2])
table.insert(suffixes, '')  -- the whole store's index
for _, suffix in ipairs(suffixes) do
  local index = ARGV[2] .. 'finished' .. suffix
  local total = ARGV[2] .. 'stored:total' .. suffix
  forgotten = forgotten + forget_stale(index, total, KEYS[1], cutoff)
  if suffix ~= '' and redis.call('ZCARD', index) == 0 then
    redis.call('SREM', KEYS[2], suffix)
    redis.call('DEL', total)
  end
end
return forgotten
