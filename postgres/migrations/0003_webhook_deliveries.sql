-- 0003: the webhook delivery log. Store-only data the engine never sees: the
-- dispatcher turns committed events into deliveries (moving its cursor in
-- the same transaction, so a crash loses none), records every attempt, and
-- the API lists them.
CREATE TABLE webhook_deliveries (
	id              text PRIMARY KEY,
	webhook         text NOT NULL,
	event_seq       bigint NOT NULL,
	event_kind      text NOT NULL,
	body            bytea NOT NULL,
	state           text NOT NULL,
	attempts        integer NOT NULL DEFAULT 0,
	next_attempt_at timestamptz,
	last_status     integer NOT NULL DEFAULT 0,
	last_error      text NOT NULL DEFAULT '',
	created_at      timestamptz NOT NULL,
	updated_at      timestamptz NOT NULL
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_order ON webhook_deliveries (event_seq, id);

CREATE TABLE webhook_attempts (
	delivery_id text NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
	n           integer NOT NULL,
	at          timestamptz NOT NULL,
	status      integer NOT NULL,
	error       text NOT NULL,
	duration_ms double precision NOT NULL,
	PRIMARY KEY (delivery_id, n)
);

-- The seq of the last event turned into deliveries.
CREATE TABLE webhook_cursor (
	name text PRIMARY KEY,
	seq  bigint NOT NULL
);
