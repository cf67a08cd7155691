-- KEYS: lease, control. ARGV: response id, maxlen, ttl_ms
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'id', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
