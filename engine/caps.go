package engine

// capabilities lists the engine's capabilities in the order Apply offers them
// a command. Each is a field of Engine defined in its own file; adding one is
// a field, a line here and its file.
func (e *Engine) capabilities() []capability {
	return []capability{&e.pools, &e.locks, &e.swaps, &e.webhooks, &e.schedules, &e.tasks, &e.grids, &e.gt, &e.sessions, &e.audit, &e.fs}
}
