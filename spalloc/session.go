package spalloc

import (
	"errors"
	"sync"

	"github.com/arbiter-hq/arbiter"
)

// Session is one client connection's protocol state: its peer host and its
// notification watches. Handle must be called by one goroutine at a time
// (a connection handles its requests in order); Notify and Watching may be
// called concurrently with it.
type Session struct {
	peer string

	// mu guards the watches, which Handle changes and Notify reads.
	mu       sync.Mutex
	jobs     watch[int64]
	machines watch[string]
}

// NewSession starts the state of a connection from peer (the client's
// host, reported as keepalivehost of the jobs it keeps alive).
func NewSession(peer string) *Session { return &Session{peer: peer} }

// Peer is the session's client host.
func (s *Session) Peer() string { return s.peer }

// start begins a reply line.
func (s *Session) start() []byte { return append(make([]byte, 0, 256), `{"return": `...) }

// Handle runs one request line against b and returns the reply line (ending
// in "\n"): {"return": …}, or {"exception": message} when the command
// fails (bad arguments, or an error from b), the connection staying open.
// A blank line returns nil, nil: no reply. An undispatchable line returns
// a *DispatchError: close the connection without a reply.
func (s *Session) Handle(b Backend, line []byte) ([]byte, error) {
	c, blank, err := decode(line)
	if err != nil || blank {
		return nil, err
	}
	a, err := c.cmd.bind(&c)
	var out []byte
	if err == nil {
		out, err = c.cmd.run(s, b, a)
	}
	if err != nil {
		return EncodeException(exceptionMessage(err)), nil
	}
	return append(out, "}\n"...), nil
}

// exceptionMessage is what the client is told of err: an argument error's
// or an *arbiter.Error's message, else "internal error".
func exceptionMessage(err error) string {
	var ae *ArgError
	if errors.As(err, &ae) {
		return ae.Message
	}
	return arbiter.ErrorMessage(err)
}

// Notify returns the notifications this connection gets for one processing
// step's changes (ids and names in the order given; pass them sorted): at
// most one {"jobs_changed": […]} line with the changed jobs it watches,
// then at most one {"machines_changed": […]} line. Send them after the
// reply of the command that caused the changes. nil when it watches none
// of them.
func (s *Session) Notify(jobs []int64, machines []string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []byte
	if ids := s.jobs.filter(jobs); len(ids) > 0 {
		out = append(out, EncodeJobsChanged(ids)...)
	}
	if names := s.machines.filter(machines); len(names) > 0 {
		out = append(out, EncodeMachinesChanged(names)...)
	}
	return out
}

// Watching reports whether the session watches any job or machine (a
// server may skip Notify for sessions that do not).
func (s *Session) Watching() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs.active() || s.machines.active()
}

// watch is a set of watched keys, or all of them (docs/reference/spalloc.md §5).
type watch[K comparable] struct {
	all  bool
	keys map[K]struct{}
}

func (w *watch[K]) active() bool { return w.all || len(w.keys) > 0 }

// watchAll: notify_x() watches everything.
func (w *watch[K]) watchAll() { w.all, w.keys = true, nil }

// watch: notify_x(k) adds k, unless everything is watched.
func (w *watch[K]) watch(k K) {
	if w.all {
		return
	}
	if w.keys == nil {
		w.keys = map[K]struct{}{}
	}
	w.keys[k] = struct{}{}
}

// unwatch: no_notify_x(k) removes k; no effect when everything is watched.
func (w *watch[K]) unwatch(k K) {
	if !w.all {
		delete(w.keys, k)
	}
}

// stop: no_notify_x() removes the watch entirely.
func (w *watch[K]) stop() { w.all, w.keys = false, nil }

func (w *watch[K]) filter(changed []K) []K {
	if w.all || len(changed) == 0 {
		return changed
	}
	var out []K
	for _, k := range changed {
		if _, ok := w.keys[k]; ok {
			out = append(out, k)
		}
	}
	return out
}
