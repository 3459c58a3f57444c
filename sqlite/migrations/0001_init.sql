-- 0001: machines, allocations and the event outbox.
--
-- Records are stored as the JSON of their arbiter struct (memory-only fields
-- left out) beside the few columns that queries need, so that adding a field
-- to a record needs no migration.

-- meta holds counters: next_allocation_id, next_event_seq.
CREATE TABLE meta (
	key   TEXT PRIMARY KEY,
	value INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE machines (
	name TEXT PRIMARY KEY,
	data TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE allocations (
	id    INTEGER PRIMARY KEY,
	state TEXT NOT NULL,
	owner TEXT NOT NULL,
	data  TEXT NOT NULL
);
CREATE INDEX allocations_state ON allocations (state);

-- time is RFC 3339 with nanoseconds in UTC: exact, and readable in the sqlite3 shell.
CREATE TABLE events (
	seq     INTEGER PRIMARY KEY,
	time    TEXT NOT NULL,
	kind    TEXT NOT NULL,
	subject TEXT NOT NULL,
	data    TEXT
);
