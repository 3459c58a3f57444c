-- 0003: the webhook delivery log. Store-only data the engine never sees: the
-- dispatcher turns committed events into deliveries (moving its cursor in
-- the same transaction, so a crash loses none), records every attempt, and
-- the API lists them. next_attempt_at is Unix nanoseconds so that it sorts.
CREATE TABLE webhook_deliveries (
	id              TEXT PRIMARY KEY,
	webhook         TEXT NOT NULL,
	event_seq       INTEGER NOT NULL,
	event_kind      TEXT NOT NULL,
	body            BLOB NOT NULL,
	state           TEXT NOT NULL,
	attempts        INTEGER NOT NULL DEFAULT 0,
	next_attempt_at INTEGER,
	last_status     INTEGER NOT NULL DEFAULT 0,
	last_error      TEXT NOT NULL DEFAULT '',
	created_at      TEXT NOT NULL,
	updated_at      TEXT NOT NULL
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_order ON webhook_deliveries (event_seq, id);

CREATE TABLE webhook_attempts (
	delivery_id TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
	n           INTEGER NOT NULL,
	at          TEXT NOT NULL,
	status      INTEGER NOT NULL,
	error       TEXT NOT NULL,
	duration_ms REAL NOT NULL,
	PRIMARY KEY (delivery_id, n)
) WITHOUT ROWID;

-- The seq of the last event turned into deliveries.
CREATE TABLE webhook_cursor (
	name TEXT PRIMARY KEY,
	seq  INTEGER NOT NULL
) WITHOUT ROWID;
