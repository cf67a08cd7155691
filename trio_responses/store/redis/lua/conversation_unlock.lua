-- KEYS: meta. ARGV: holder
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'holder', 'lock_until')
end
return 1
