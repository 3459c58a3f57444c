package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// audit keeps the audit trail (arbiter.AuditEntry): a record per entry,
// keyed by its sequence number, the newest Config.AuditKeep kept. Entries
// emit no events (the trail is the admins'; events are everyone's).
type audit struct {
	kept []arbiter.AuditEntry // oldest first
	last int64
}

func auditKey(seq int64) string { return fmt.Sprintf("%020d", seq) }

func (a *audit) kinds() []string { return []string{arbiter.RecordAudit} }

func (a *audit) load(e *Engine, recs []arbiter.Record, _ time.Time) error {
	var bad []string
	for _, r := range recs {
		en, err := coordDecode[arbiter.AuditEntry](r)
		if err != nil || auditKey(en.Seq) != r.Key {
			bad = append(bad, fmt.Sprintf("audit %s: unreadable record", r.Key))
			continue
		}
		a.kept = append(a.kept, en)
		a.last = max(a.last, en.Seq)
	}
	sort.Slice(a.kept, func(i, j int) bool { return a.kept[i].Seq < a.kept[j].Seq })
	a.trim(e)
	if len(bad) > 0 {
		return fmt.Errorf("audit: %s", strings.Join(bad, "; "))
	}
	return nil
}

func (a *audit) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	c, ok := cmd.(arbiter.RecordAuditEntries)
	if !ok {
		return nil, nil, false
	}
	for _, en := range c.Entries {
		a.last++
		en.Seq, en.Time = a.last, now
		if en.Kind != arbiter.AuditRefused {
			en.Kind = arbiter.AuditAction
		}
		// Written whatever the request held: clipped and escaped, never refused.
		for _, f := range []*string{&en.Principal, &en.Role, &en.Via, &en.Address, &en.Action, &en.Target, &en.Detail} {
			*f = arbiter.Clip(arbiter.EscapeText(*f, false), 512)
		}
		en.Count = max(en.Count, 0)
		e.putRecord(arbiter.RecordAudit, auditKey(en.Seq), en)
		a.kept = append(a.kept, en)
	}
	a.trim(e)
	return arbiter.None{}, nil, true
}

// trim forgets the oldest entries beyond the bound.
func (a *audit) trim(e *Engine) {
	if over := len(a.kept) - e.cfg.AuditKeep; over > 0 {
		for _, en := range a.kept[:over] {
			e.removeRecord(arbiter.RecordAudit, auditKey(en.Seq))
		}
		a.kept = append([]arbiter.AuditEntry(nil), a.kept[over:]...)
	}
}

func (a *audit) records() []arbiter.Record {
	out := make([]arbiter.Record, len(a.kept))
	for i, en := range a.kept {
		out[i] = arbiter.Record{Kind: arbiter.RecordAudit, Key: auditKey(en.Seq), Value: en}
	}
	return out
}
