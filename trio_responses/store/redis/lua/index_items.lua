-- KEYS: none. ARGV: source ("r:" response id or "c:" conversation id), ttl_ms, prefix,
-- owner ("" without), then item ids. A source whose record is gone is skipped (and
-- forgotten) by the reader; the index lives no longer than its newest source's TTL.
for i = 5, #ARGV do
  index_item(ARGV[3], ARGV[4], ARGV[i], ARGV[1], ARGV[2])
end
return 1
