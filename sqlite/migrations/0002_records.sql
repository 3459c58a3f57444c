-- 0002: durable records of every other kind (tasks, locks, schedules, pools,
-- grid machines …), as JSON under (kind, key), so that a new capability needs
-- no new table. The allocations state index goes: nothing queries by state
-- (Load reads everything), and it cost a page write on every commit.
CREATE TABLE records (
	kind TEXT NOT NULL,
	key  TEXT NOT NULL,
	data TEXT NOT NULL,
	PRIMARY KEY (kind, key)
) WITHOUT ROWID;

DROP INDEX allocations_state;
