package engine

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// locks is the lock capability (docs/reference/coordination.md §1): named,
// TTL-bounded exclusive reservations with a secret token and a fencing
// number. A held lock is a record (kind "lock"); the last fencing number
// given is a record of its own, so numbers are never reused even after
// every lock is released. Expiry is a deadline: a lock is gone at the first
// command or tick at or after its expiry, before anything else is decided.
type locks struct {
	held  map[string]*heldLock
	fence int64 // the last fencing number given
}

type heldLock struct {
	l  arbiter.Lock
	dl deadline
}

// lockFenceKind is the record kind of the fencing counter (key "last").
const lockFenceKind = "lock.fence"

type lockFence struct {
	Last int64 `json:"last"`
}

func (k *locks) init() {
	if k.held == nil {
		k.held = map[string]*heldLock{}
	}
}

func (k *locks) kinds() []string { return []string{arbiter.RecordLock, lockFenceKind} }

func (k *locks) load(e *Engine, recs []arbiter.Record, now time.Time) error {
	k.init()
	var bad []string
	for _, r := range recs {
		switch r.Kind {
		case lockFenceKind:
			f, err := coordDecode[lockFence](r)
			if err != nil {
				bad = append(bad, err.Error())
				continue
			}
			k.fence = max(k.fence, f.Last)
		case arbiter.RecordLock:
			l, err := coordDecode[arbiter.Lock](r)
			if err != nil || l.Name != r.Key {
				bad = append(bad, fmt.Sprintf("lock %q: unreadable record", r.Key))
				continue
			}
			k.fence = max(k.fence, l.Fence)
			h := k.add(l)
			if !l.ExpiresAt.After(now) {
				k.expire(e, h, now)
				continue
			}
			e.dl.set(&h.dl, l.ExpiresAt)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("locks: %s", strings.Join(bad, "; "))
	}
	return nil
}

func (k *locks) add(l arbiter.Lock) *heldLock {
	h := &heldLock{l: l}
	h.dl = newDeadline(func(e *Engine, now time.Time) { e.locks.expire(e, h, now) })
	k.held[l.Name] = h
	return h
}

func (k *locks) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	k.init()
	switch c := cmd.(type) {
	case arbiter.AcquireLock:
		res, err := k.acquire(e, c, now)
		return res, err, true
	case arbiter.ExtendLock:
		res, err := k.extend(e, c, now)
		return res, err, true
	case arbiter.ReleaseLock:
		res, err := k.release(e, c, now)
		return res, err, true
	}
	return nil, nil, false
}

func (k *locks) records() []arbiter.Record {
	out := []arbiter.Record{{Kind: lockFenceKind, Key: "last", Value: lockFence{k.fence}}}
	names := make([]string, 0, len(k.held))
	for n := range k.held {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, arbiter.Record{Kind: arbiter.RecordLock, Key: n, Value: k.held[n].l})
	}
	return out
}

func (k *locks) acquire(e *Engine, c arbiter.AcquireLock, now time.Time) (any, error) {
	if err := arbiter.ValidateLockName(c.Name); err != nil {
		return nil, err
	}
	holder := strings.TrimSpace(c.Holder)
	if holder == "" {
		return nil, arbiter.Errorf(arbiter.EInvalid, "holder is required: say who takes the lock (it is shown to others, it is not a credential)")
	}
	if err := arbiter.ValidateText("holder", holder, arbiter.MaxLockHolderBytes); err != nil {
		return nil, err
	}
	// A note may run over several lines, as the original stored any note.
	if err := arbiter.ValidateLines("note", c.Note, arbiter.MaxLockNoteBytes); err != nil {
		return nil, err
	}
	if len(c.Token) > arbiter.MaxLockTokenBytes {
		return nil, arbiter.Errorf(arbiter.EInvalid, "token is longer than %d bytes", arbiter.MaxLockTokenBytes)
	}
	ttl := arbiter.ClampLockTTL(c.TTL)
	if h := k.held[c.Name]; h != nil {
		if !h.l.Matches(c.Token) {
			return nil, arbiter.NewLockHeldError(arbiter.EConflict, h.l.Public(now),
				"only the token it was acquired with extends it (the holder name is not a credential); wait for its release or expiry")
		}
		h.l.Holder = holder
		if c.Note != "" {
			h.l.Note = c.Note
		}
		h.l.ExpiresAt = now.Add(ttl)
		e.dl.set(&h.dl, h.l.ExpiresAt)
		k.save(e, h)
		st := h.l.Public(now)
		e.emit(now, arbiter.EventLockExtended, "lock/"+c.Name, arbiter.LockEvent{LockState: st, By: c.Caller.Name})
		return arbiter.LockGrant{LockState: st, Token: c.Token}, nil
	}
	if len(c.NewToken) < 16 {
		return nil, arbiter.Errorf(arbiter.EInvalid, "no new token was drawn for the lock (a transport bug)")
	}
	k.fence++
	h := k.add(arbiter.Lock{
		Name: c.Name, Holder: holder, TokenHash: arbiter.HashLockToken(c.NewToken), Fence: k.fence,
		AcquiredAt: now, ExpiresAt: now.Add(ttl), Note: c.Note,
	})
	e.dl.set(&h.dl, h.l.ExpiresAt)
	k.save(e, h)
	e.putRecord(lockFenceKind, "last", lockFence{k.fence})
	st := h.l.Public(now)
	e.emit(now, arbiter.EventLockAcquired, "lock/"+c.Name, arbiter.LockEvent{LockState: st, By: c.Caller.Name})
	return arbiter.LockGrant{LockState: st, Token: c.NewToken}, nil
}

func (k *locks) extend(e *Engine, c arbiter.ExtendLock, now time.Time) (any, error) {
	if err := arbiter.ValidateLockName(c.Name); err != nil {
		return nil, err
	}
	if c.Note != nil {
		if err := arbiter.ValidateLines("note", *c.Note, arbiter.MaxLockNoteBytes); err != nil {
			return nil, err
		}
	}
	h := k.held[c.Name]
	if h == nil {
		return nil, arbiter.Errorf(arbiter.EConflict, "lock %q is not held (it may have expired): acquire it again", c.Name)
	}
	if !h.l.Matches(c.Token) {
		return nil, arbiter.Errorf(arbiter.EForbidden, "the token presented does not hold lock %q", c.Name)
	}
	if c.Note != nil {
		h.l.Note = *c.Note
	}
	h.l.ExpiresAt = now.Add(arbiter.ClampLockTTL(c.TTL))
	e.dl.set(&h.dl, h.l.ExpiresAt)
	k.save(e, h)
	st := h.l.Public(now)
	e.emit(now, arbiter.EventLockExtended, "lock/"+c.Name, arbiter.LockEvent{LockState: st, By: c.Caller.Name})
	return arbiter.LockGrant{LockState: st}, nil
}

func (k *locks) release(e *Engine, c arbiter.ReleaseLock, now time.Time) (any, error) {
	if err := arbiter.ValidateLockName(c.Name); err != nil {
		return nil, err
	}
	h := k.held[c.Name]
	if h == nil {
		return arbiter.LockRelease{Released: false, Lock: arbiter.FreeLock(c.Name)}, nil
	}
	if c.Force {
		if c.Caller.Role != arbiter.RoleAdmin {
			return nil, arbiter.Errorf(arbiter.EForbidden, "only an admin may force the release of lock %q; release it with its token", c.Name)
		}
	} else if !h.l.Matches(c.Token) {
		return nil, arbiter.Errorf(arbiter.EForbidden, "the token presented does not hold lock %q", c.Name)
	}
	st := h.l.Public(now)
	k.drop(e, h)
	e.emit(now, arbiter.EventLockReleased, "lock/"+c.Name, arbiter.LockEvent{LockState: st, Forced: c.Force, By: c.Caller.Name})
	return arbiter.LockRelease{Released: true, Lock: st}, nil
}

// expire frees a lock whose TTL has run out.
func (k *locks) expire(e *Engine, h *heldLock, now time.Time) {
	if k.held[h.l.Name] != h {
		return
	}
	st := h.l.Public(now)
	k.drop(e, h)
	e.emit(now, arbiter.EventLockExpired, "lock/"+h.l.Name, arbiter.LockEvent{LockState: st})
}

func (k *locks) drop(e *Engine, h *heldLock) {
	e.dl.clear(&h.dl)
	delete(k.held, h.l.Name)
	e.removeRecord(arbiter.RecordLock, h.l.Name)
}

func (k *locks) save(e *Engine, h *heldLock) { e.putRecord(arbiter.RecordLock, h.l.Name, h.l) }

// gate is the single decision a guarded operation makes about lock name
// for a caller presenting token, from one reading of the lock: blocked
// (the lock is held and token is not its token) or not. held is the lock
// when it is held (its fence tells which acquisition authorised the caller).
// Expired locks are already gone: Apply acts on deadlines first.
func (k *locks) gate(name, token string) (held *arbiter.Lock, blocked bool) {
	h := k.held[name]
	if h == nil {
		return nil, false
	}
	l := h.l
	return &l, !l.Matches(token)
}

// coordDecode reads a record's value: the json.RawMessage a store gives at
// load, or the value itself.
func coordDecode[T any](r arbiter.Record) (T, error) {
	var v T
	switch x := r.Value.(type) {
	case T:
		return x, nil
	case *T:
		if x != nil {
			return *x, nil
		}
	case json.RawMessage:
		if err := json.Unmarshal(x, &v); err != nil {
			return v, fmt.Errorf("%s %q: %w", r.Kind, r.Key, err)
		}
		return v, nil
	}
	b, err := json.Marshal(r.Value)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		return v, fmt.Errorf("%s %q: %w", r.Kind, r.Key, err)
	}
	return v, nil
}
