-- 0004: who may write to this database. One server at a time holds the
-- lease (docs/guides/operations.md, "One server per store"): it takes it at
-- start, renews it well within ttl, and every Save checks, in its
-- transaction, that the term is still its own, so a server that lost the
-- lease (paused, partitioned, taken over) writes nothing. The HA issue turns
-- this row into leadership: the term is its monotonic epoch, url where
-- followers forward to.
CREATE TABLE leader_lease (
	id          integer PRIMARY KEY CHECK (id = 1),
	term        bigint NOT NULL,
	holder      text NOT NULL,
	host        text NOT NULL DEFAULT '',
	pid         integer NOT NULL DEFAULT 0,
	url         text NOT NULL DEFAULT '',
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL
);
