// Package clock holds the one fake clock the tests of this module use.
//
// The engine takes now as an argument and the running parts take a
// func() time.Time (control.Options.Now, webhook.Options.Now, …); a test
// hands them Fake.Now and moves time by hand with Advance or Set, so a
// deadline is reached when the test says so, not after a wait. Fake is safe
// for concurrent use: the code under test reads it from its own goroutines
// while the test moves it.
package clock

import (
	"sync"
	"time"
)

// Fake is a clock that moves only when told to. The zero value reads the
// zero time; use NewFake.
type Fake struct {
	mu sync.Mutex // guards t
	t  time.Time
}

// NewFake returns a fake clock that reads t until it is moved.
func NewFake(t time.Time) *Fake {
	return &Fake{t: t}
}

// Now returns the clock's time. Its method value (fake.Now) is what the
// code under test takes as its clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

// Advance moves the clock forward by d (backward if d is negative) and
// returns the new time.
func (f *Fake) Advance(d time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
	return f.t
}

// Set moves the clock to t, forward or back.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = t
}
