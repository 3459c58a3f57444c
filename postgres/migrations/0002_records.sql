-- 0002: durable records of every other kind (tasks, locks, schedules, pools,
-- grid machines …), as JSON under (kind, key), so that a new capability needs
-- no new table. The allocations state index goes: nothing queries by state
-- (Load reads everything), and it cost an index update on every commit.
CREATE TABLE records (
	kind text NOT NULL,
	key  text NOT NULL,
	data jsonb NOT NULL,
	PRIMARY KEY (kind, key)
);

DROP INDEX allocations_state;
