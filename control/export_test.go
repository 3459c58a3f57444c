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
