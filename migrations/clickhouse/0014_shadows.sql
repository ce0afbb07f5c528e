-- Shadow requests (a candidate strategy run on a share of live requests, its answer never
-- returned): their inference events are stored with type = 'shadow', so every reader of
-- type = 'inference' (windows, rollup, results) leaves them out, and shadow_of names the
-- primary request they are compared with. `shadow` on a primary's row says whether its
-- shadow was sent or dropped (the coverage of the paired analysis). Older rows read ''.
ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS shadow_of String DEFAULT '';
ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS shadow LowCardinality(String) DEFAULT ''
