package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// sessions keeps the dashboard's signed-in sessions (arbiter.Session): a
// record each, gone at its expiry (a deadline), at log out, or when its
// token is removed or changed. Sessions emit no events: an event stream is
// read by every role, and who signed in when is not its business.
type sessions struct {
	m map[string]*session
}

type session struct {
	s  arbiter.Session
	dl deadline
}

func (ss *sessions) init() {
	if ss.m == nil {
		ss.m = map[string]*session{}
	}
}

func (ss *sessions) kinds() []string { return []string{arbiter.RecordSession} }

func (ss *sessions) load(e *Engine, recs []arbiter.Record, now time.Time) error {
	ss.init()
	var bad []string
	for _, r := range recs {
		s, err := coordDecode[arbiter.Session](r)
		if err != nil || s.ID != r.Key {
			bad = append(bad, fmt.Sprintf("session %.12s…: unreadable record", r.Key))
			continue
		}
		x := ss.add(s)
		if !s.ExpiresAt.After(now) {
			ss.end(e, x)
			continue
		}
		e.dl.set(&x.dl, s.ExpiresAt)
	}
	if len(bad) > 0 {
		return fmt.Errorf("sessions: %s", strings.Join(bad, "; "))
	}
	return nil
}

func (ss *sessions) add(s arbiter.Session) *session {
	x := &session{s: s}
	x.dl = newDeadline(func(e *Engine, _ time.Time) { e.sessions.end(e, x) })
	ss.m[s.ID] = x
	return x
}

// end removes a session.
func (ss *sessions) end(e *Engine, x *session) {
	e.dl.clear(&x.dl)
	delete(ss.m, x.s.ID)
	e.removeRecord(arbiter.RecordSession, x.s.ID)
}

func (ss *sessions) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	ss.init()
	switch c := cmd.(type) {
	case arbiter.StartSession:
		res, err := ss.start(e, c.Session, c.TTL, now)
		return res, err, true
	case arbiter.EndSession:
		if x := ss.m[c.ID]; x != nil {
			ss.end(e, x)
		}
		return arbiter.None{}, nil, true
	case arbiter.EndSessions:
		return ss.endAllBut(e, c.Keep), nil, true
	}
	return nil, nil, false
}

// endAllBut ends every session whose token is not in keep (principal →
// fingerprint) and returns how many ended.
func (ss *sessions) endAllBut(e *Engine, keep map[string]string) int {
	n := 0
	for _, x := range ss.sorted() {
		if fp, ok := keep[x.s.Principal]; !ok || fp != x.s.TokenFP {
			ss.end(e, x)
			n++
		}
	}
	return n
}

func (ss *sessions) start(e *Engine, s arbiter.Session, ttl time.Duration, now time.Time) (any, error) {
	if err := arbiter.ValidateSHA256("session id", s.ID); err != nil {
		return nil, err
	}
	if err := arbiter.ValidateName("principal", s.Principal); err != nil {
		return nil, err
	}
	if err := arbiter.ValidateSHA256("token fingerprint", s.TokenFP); err != nil {
		return nil, err
	}
	if ttl <= 0 || ttl > arbiter.SessionTTL {
		return nil, arbiter.Errorf(arbiter.EInvalid, "a session must last more than 0 and at most %s", arbiter.SessionTTL)
	}
	if ss.m[s.ID] != nil {
		return nil, arbiter.Errorf(arbiter.EConflict, "session id already in use: draw another")
	}
	// Past the bound, the principal's oldest session ends.
	var mine []*session
	for _, x := range ss.m {
		if x.s.Principal == s.Principal {
			mine = append(mine, x)
		}
	}
	if len(mine) >= arbiter.MaxSessionsPerPrincipal {
		sort.Slice(mine, func(i, j int) bool { return mine[i].s.CreatedAt.Before(mine[j].s.CreatedAt) })
		for _, x := range mine[:len(mine)-arbiter.MaxSessionsPerPrincipal+1] {
			ss.end(e, x)
		}
	}
	s.CreatedAt, s.ExpiresAt = now, now.Add(ttl)
	x := ss.add(s)
	e.dl.set(&x.dl, s.ExpiresAt)
	e.putRecord(arbiter.RecordSession, s.ID, s)
	return s, nil
}

func (ss *sessions) sorted() []*session {
	out := make([]*session, 0, len(ss.m))
	for _, x := range ss.m {
		out = append(out, x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].s.ID < out[j].s.ID })
	return out
}

func (ss *sessions) records() []arbiter.Record {
	xs := ss.sorted()
	out := make([]arbiter.Record, len(xs))
	for i, x := range xs {
		out[i] = arbiter.Record{Kind: arbiter.RecordSession, Key: x.s.ID, Value: x.s}
	}
	return out
}
