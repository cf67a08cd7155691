-- ARGV: prefix, owner, id, container ('' for a /v1/files file), created_at, the object
-- (JSON), the bytes, max_files, max_bytes. Returns 1 (stored), 0 (its container is
-- gone or expired: nothing written), -1 (past max_files), -2 (past max_bytes).
local id, container, created, object, content = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local max_files, max_bytes = tonumber(ARGV[8]), tonumber(ARGV[9])
local owner = F.owner
if container ~= '' then
  local c = redis.call('HMGET', container_key(container), 'owner', 'status')
  if c[1] ~= owner or c[2] == 'expired' then return 0 end
end
local old = redis.call('HMGET', file_key(id), 'owner', 'size')
local files, size = held(owner, 'files'), held(owner, 'bytes')
local new_files, new_size = files + 1, size + string.len(content)
if old[1] == owner then
  new_files, new_size = files, new_size - tonumber(old[2])
end
if new_files > max_files and new_files > files then return -1 end
if new_size > max_bytes and new_size > size then return -2 end
drop_file(id)
redis.call('HSET', file_key(id), 'owner', owner, 'container', container,
  'size', int(string.len(content)), 'object', object)
redis.call('SET', content_key(id), content)
redis.call('ZADD', list_key(owner, container), created, id)
redis.call('HINCRBY', quota_key(owner), 'files', 1)
redis.call('HINCRBY', quota_key(owner), 'bytes', int(string.len(content)))
return 1
