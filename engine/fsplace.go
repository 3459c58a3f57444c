package engine

import (
	"path"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Placement under fair share: a request held back by a quota is not
// placed; GPUs it may not take (reserved for others in a window its time
// limit would reach, GPUs of a model its model quota has no room for) are
// masked as held before the usual bin-packing (place.BestHeld).

// maskedHeld marks, in a masked copy of a machine's holdings, a GPU the
// request may not take.
const maskedHeld = -2

// fsFind is find with quotas and reservations.
func (e *Engine) fsFind(a *alloc, skip func(int) bool, now time.Time) (int, []int) {
	if r := &a.a.Request; r.Machine != "" {
		if a.named == nil {
			a.named = e.byName[r.Machine]
		}
		if e.cluster.Index.Free(a.named.pos) < r.GPUs {
			return -1, nil // its machine is full: nothing else to look at
		}
	}
	fa := a.fs
	if fa == nil {
		return e.plainFind(a, skip, nil)
	}
	fa.quota, fa.resWhy = "", ""
	if fq := e.quotaBlock(a, now); fq != nil {
		fa.quota = fq.key
		a.fsWhy = true
		return -1, nil
	}
	held := e.fsMasker(a, now, e.cluster.Held, nil)
	mi, gpus := e.plainFind(a, skip, held)
	if mi >= 0 || held == nil {
		return mi, gpus
	}
	if len(e.fs.res) > 0 {
		// Would it fit but for the reservations? Then they are the reason.
		fits := a.a.Request.Reservation != ""
		if !fits {
			saved := e.fs.resBy
			e.fs.resBy = nil
			m, _ := e.plainFind(a, skip, e.fsMasker(a, now, e.cluster.Held, nil))
			e.fs.resBy = saved
			fits = m >= 0
		}
		if fits {
			fa.resWhy = e.resWhy(a, now)
			a.fsWhy = true
		}
	}
	return -1, nil
}

// plainFind places a on the machine its request names, or the best one,
// with masked holdings when held is not nil.
func (e *Engine) plainFind(a *alloc, skip func(int) bool, held func(int) []int64) (int, []int) {
	r := &a.a.Request
	if r.Machine != "" {
		if a.named == nil {
			a.named = e.byName[r.Machine]
		}
		if gpus := e.cluster.OnHeld(a.named.pos, r, skip, held); gpus != nil {
			return a.named.pos, gpus
		}
		return -1, nil
	}
	return e.cluster.BestHeld(r, skip, held)
}

// fsMasker returns the masked holdings a sees at t, machine by machine,
// from base (the holdings per machine position), or nil when nothing is
// masked for it. count is what a quota counts (nil: its count now; the
// ETA simulation passes its own). The slice it returns is reused from
// call to call.
func (e *Engine) fsMasker(a *alloc, t time.Time, base [][]int64, count func(*fsQuota) int) func(int) []int64 {
	if a.fs == nil {
		return nil
	}
	models := e.quotaMasks(a, count)
	if len(models) == 0 && len(e.fs.resBy) == 0 && a.a.Request.Reservation == "" {
		return nil
	}
	var buf []int64
	return func(i int) []int64 {
		mc := e.ms[i]
		res := e.fs.resBy[mc.m.Name]
		if len(models) == 0 && len(res) == 0 && a.a.Request.Reservation == "" {
			return base[i]
		}
		buf = append(buf[:0], base[i]...)
		for p := range buf {
			// A held GPU is masked too: preemption frees holders it could
			// take, and must not free one it may not take.
			if buf[p] < 0 {
				continue
			}
			g := &mc.m.GPUs[p]
			for _, m := range models {
				if ok, _ := path.Match(m, g.Model); ok {
					buf[p] = maskedHeld
				}
			}
			if buf[p] != maskedHeld && (len(res) > 0 || a.a.Request.Reservation != "") {
				if masked, _ := e.resMasked(a, mc.m.Name, g.Index, t); masked {
					buf[p] = maskedHeld
				}
			}
		}
		return buf
	}
}

// fsWhy is why_queued under fair share: the quota or reservation that
// holds a back, else base (placement's own explanation).
func (e *Engine) fsWhy(a *alloc, base string, now time.Time) string {
	fa := a.fs
	if fa == nil {
		return base
	}
	defer func() { a.fsWhy = fa.quota != "" || fa.resWhy != "" }()
	if fa.quota != "" {
		// What held it back at its last placement may have changed since.
		if fq := e.quotaBlock(a, now); fq != nil {
			fa.quota = fq.key
			return e.quotaWhy(fq, a, now)
		}
		fa.quota = ""
	}
	if fa.resWhy != "" {
		return fa.resWhy
	}
	return base
}

// fsExplainNeeded reports whether a's explanation must be written again
// after a pass: fair share holds it back, or did when it was last written.
func (e *Engine) fsExplainNeeded(a *alloc) bool { return a.fsWhy }

// fsAllocCheck refuses at once a request that can never fit its quotas or
// names a reservation it may not use.
func (e *Engine) fsAllocCheck(c arbiter.Caller, r arbiter.Request, now time.Time) error {
	fs := &e.fs
	if !fs.on && r.Reservation == "" {
		return nil
	}
	if r.Reservation != "" && fs.res[r.Reservation] == nil {
		return arbiter.Errorf(arbiter.EInvalid, "reservation %q does not exist (see arbiter reservations)", arbiter.Clip(r.Reservation, 64))
	}
	return e.fsCheck(c, e.pendingAlloc(c, r, now))
}

// fsCheck refuses at once a request that can never fit its quotas, or
// names a reservation it may not use.
func (e *Engine) fsCheck(c arbiter.Caller, a *alloc) error {
	if r := &a.a.Request; r.Reservation != "" {
		if err := e.resMember(c, r); err != nil {
			return err
		}
	}
	if why := e.quotaNever(a); why != "" {
		return arbiter.Errorf(arbiter.EForbidden, "over quota: %s; ask for less, or ask an admin (arbiter quotas)", why)
	}
	return nil
}
