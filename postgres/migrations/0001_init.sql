-- 0001: machines, allocations and the event outbox.
--
-- Records are stored as the JSON of their arbiter struct (memory-only fields
-- left out) beside the few columns that queries need, so that adding a field
-- to a record needs no migration. Records are jsonb (queryable); event data
-- is json, kept byte for byte as the engine wrote it.

-- meta holds counters: next_allocation_id, next_event_seq.
CREATE TABLE meta (
	key   text PRIMARY KEY,
	value bigint NOT NULL
);

CREATE TABLE machines (
	name text PRIMARY KEY,
	data jsonb NOT NULL
);

CREATE TABLE allocations (
	id    bigint PRIMARY KEY,
	state text NOT NULL,
	owner text NOT NULL,
	data  jsonb NOT NULL
);
CREATE INDEX allocations_state ON allocations (state);

-- time is RFC 3339 with nanoseconds in UTC, as in the SQLite store: exact
-- (timestamptz keeps only microseconds) and castable with time::timestamptz.
CREATE TABLE events (
	seq     bigint PRIMARY KEY,
	time    text NOT NULL,
	kind    text NOT NULL,
	subject text NOT NULL,
	data    json
);
