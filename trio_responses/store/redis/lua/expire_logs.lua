-- KEYS: retained, retained:bytes, retained:total.
-- ARGV: retention_ms, max_streams, max_bytes, prefix
return trim_logs(bounds(1, 1))
