package control

// Pending is how many commands are applied and wait in the batch being
// collected.
func (l *Loop) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		return 0
	}
	return len(l.pending.calls)
}

// Queued is how many commands wait in the channel for the applier (review
// tests: a command the applier has taken is no longer counted).
func (l *Loop) Queued() int { return len(l.cmds) }
