-- 0005: high availability (docs/guides/high-availability.md). The lease's
-- row always exists from now on (term 0 and long expired until a server
-- takes it), so taking it is one compare-and-set UPDATE on its term; and
-- replicas is the roster: one row per server replica, refreshed at every
-- renewal, so a replica can tell who else is there and two replicas
-- started with one node_id are refused.
INSERT INTO leader_lease (id, term, holder, acquired_at, expires_at)
	VALUES (1, 0, '', now(), 'epoch') ON CONFLICT (id) DO NOTHING;

CREATE TABLE replicas (
	node_id    text PRIMARY KEY,
	instance   text NOT NULL,
	url        text NOT NULL DEFAULT '',
	spalloc    text NOT NULL DEFAULT '',
	host       text NOT NULL DEFAULT '',
	pid        integer NOT NULL DEFAULT 0,
	version    text NOT NULL DEFAULT '',
	started_at timestamptz NOT NULL,
	seen_at    timestamptz NOT NULL
);
