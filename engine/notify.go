package engine

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Notifications to people (docs/guides/fair-share.md). A person's
// subscription is a webhook subscription with a principal (records of the
// webhooks capability, so the one outbox dispatcher delivers them, signed,
// with retries): notification kinds, a format (standard, or slack: {"text"})
// and a match. When something of one of those kinds happens to that person
// — their allocation is ready, idle, near its time limit, being
// preempted; a reservation of their group starts; a task (matching their
// pattern) completes or fails; GPUs matching their request are free — the
// engine emits one `notification` event per subscription, with subject
// notify/<id>, which only that subscription takes.

// notifier indexes the personal subscriptions.
type notifier struct {
	seenLen  int
	seenNext int64
	subs     []*arbiter.Webhook // personal, in id order
	free     map[string]bool    // gpu.free: matching GPUs were free at the last look
	anyKind  map[string]bool    // kinds some subscription takes
}

// maxNotifyPerPerson bounds one person's subscriptions.
const maxNotifyPerPerson = 20

// index brings the index up to date with the webhook records.
func (e *Engine) notifyIndex() *notifier {
	n := &e.fs.notify
	h := &e.webhooks
	if n.anyKind != nil && len(h.subs) == n.seenLen && h.next == n.seenNext {
		return n
	}
	n.seenLen, n.seenNext = len(h.subs), h.next
	n.subs = n.subs[:0]
	n.anyKind = map[string]bool{}
	if n.free == nil {
		n.free = map[string]bool{}
	}
	for _, id := range sortedKeys(h.subs) {
		w := h.subs[id]
		if w.Principal == "" {
			continue
		}
		n.subs = append(n.subs, w)
		for _, k := range w.Kinds {
			n.anyKind[k] = true
		}
	}
	return n
}

// notifyOn makes the notifications of an event the engine emitted.
func (e *Engine) notifyOn(now time.Time, kind, subject string, data any) {
	if len(e.webhooks.subs) == 0 {
		return
	}
	n := e.notifyIndex()
	if !n.anyKind[kind] {
		return
	}
	switch v := data.(type) {
	case arbiter.Allocation:
		who := v.Principal
		for _, w := range n.subs {
			if w.Enabled && wantsKind(w, kind) && (w.Principal == who || who == "" && w.Principal == v.Owner) {
				e.notify(now, w, kind, subject, allocText(kind, &v), v)
			}
		}
	case arbiter.Reservation:
		g := e.fs.groups[v.Group]
		for _, w := range n.subs {
			// Their group: the first that lists them, as for their allocations.
			if w.Enabled && wantsKind(w, kind) && g != nil && e.fs.groupOf(w.Principal, w.Principal) == g {
				e.notify(now, w, kind, subject, fmt.Sprintf("reservation %s of group %s started: %s until %s", v.ID, v.Group,
					arbiter.Plural(v.GPUs, "GPU"), v.WindowEnd.UTC().Format(time.RFC3339)), v)
			}
		}
	}
}

// notifyTask makes the notifications of a task event.
func (e *Engine) notifyTask(now time.Time, kind, subject string, raw json.RawMessage) {
	if len(e.webhooks.subs) == 0 || (kind != arbiter.EventTaskCompleted && kind != arbiter.EventTaskFailed) {
		return
	}
	n := e.notifyIndex()
	if !n.anyKind[kind] {
		return
	}
	var ev arbiter.TaskEvent
	if json.Unmarshal(raw, &ev) != nil {
		return
	}
	text := fmt.Sprintf("task %s completed", ev.Name)
	if kind == arbiter.EventTaskFailed {
		text = fmt.Sprintf("task %s failed after %s: %s", ev.Name, arbiter.Plural(ev.Attempts, "attempt"), arbiter.Clip(ev.Error, 200))
	}
	for _, w := range n.subs {
		if !w.Enabled || !wantsKind(w, kind) {
			continue
		}
		if w.Match != nil && w.Match.Task != "" {
			if ok, _ := path.Match(w.Match.Task, ev.Name); !ok {
				continue
			}
		}
		e.notify(now, w, kind, subject, text, json.RawMessage(raw))
	}
}

// notifyFree tells the people watching for free GPUs when GPUs matching
// their request become free (once, until they are taken again).
func (e *Engine) notifyFree(now time.Time) {
	if len(e.webhooks.subs) == 0 {
		return
	}
	n := e.notifyIndex()
	if !n.anyKind[arbiter.NotifyGPUFree] {
		return
	}
	for _, w := range n.subs {
		if !w.Enabled || !wantsKind(w, arbiter.NotifyGPUFree) {
			continue
		}
		var m arbiter.NotifyMatch
		if w.Match != nil {
			m = *w.Match
		}
		r := m.Request(w.Principal)
		var mi int
		if r.Machine != "" {
			mi = -1
			if mc := e.byName[r.Machine]; mc != nil && e.cluster.On(mc.pos, &r, nil) != nil {
				mi = mc.pos
			}
		} else {
			mi, _ = e.cluster.Best(&r, nil)
		}
		free := mi >= 0
		if free && !n.free[w.ID] {
			mc := e.ms[mi]
			e.notify(now, w, arbiter.NotifyGPUFree, "machine/"+mc.m.Name,
				fmt.Sprintf("%s matching your request %s free on %s (%d free there)", arbiter.Plural(r.GPUs, "GPU"), isAre(r.GPUs), mc.m.Name, e.cluster.Index.Free(mi)),
				map[string]any{"machine": mc.m.Name, "free": e.cluster.Index.Free(mi), "match": m})
		}
		n.free[w.ID] = free
	}
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

func wantsKind(w *arbiter.Webhook, kind string) bool {
	for _, k := range w.Kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// notify emits one notification for subscription w.
func (e *Engine) notify(now time.Time, w *arbiter.Webhook, kind, subject, text string, data any) {
	e.emit(now, arbiter.EventNotification, arbiter.NotifySubject(w.ID), arbiter.Notification{
		Subscription: w.ID, Principal: w.Principal, Kind: kind, Text: arbiter.Clip(text, 1000), Subject: subject, Data: data})
}

// allocText is the line a person reads about their allocation.
func allocText(kind string, a *arbiter.Allocation) string {
	name := fmt.Sprintf("allocation %d (%s)", a.ID, arbiter.ShortOwner(a.Owner))
	where := ""
	if a.Machine != nil {
		idx := make([]string, len(a.Devices))
		for i, d := range a.Devices {
			idx[i] = fmt.Sprint(d.Index)
		}
		where = fmt.Sprintf("%s on %s [%s]", arbiter.Plural(len(a.Devices), "GPU"), *a.Machine, strings.Join(idx, ","))
	}
	ends := ""
	if a.EndsAt != nil {
		ends = a.EndsAt.UTC().Format(time.RFC3339)
	}
	switch kind {
	case arbiter.NotifyReady:
		return fmt.Sprintf("%s is ready: %s", name, where)
	case arbiter.NotifyIdle:
		return fmt.Sprintf("%s has been idle since %s: release it if you are done", name, a.IdleSince.UTC().Format(time.RFC3339))
	case arbiter.NotifyTimeLimit:
		return fmt.Sprintf("%s ends at %s: %s", name, ends, a.EndReason)
	case arbiter.NotifyPreempting:
		return fmt.Sprintf("%s is %s and ends at %s: save your work", name, a.EndReason, ends)
	}
	return name + ": " + kind
}

// notifyCreate adds a person's subscription.
func (e *Engine) notifyCreate(c arbiter.CreateNotify, now time.Time) (any, error) {
	w := c.Webhook
	switch {
	case c.Caller.Role != arbiter.RoleAdmin:
		if w.Principal != "" && w.Principal != c.Caller.Name {
			return nil, arbiter.Errorf(arbiter.EForbidden, "a subscription of %q is theirs to make (or an admin's)", arbiter.Clip(w.Principal, 64))
		}
		w.Principal = c.Caller.Name
		w.NoLoopback = true
	case w.Principal == "":
		w.Principal = c.Caller.Name
	}
	if w.Principal == "" {
		return nil, arbiter.Errorf(arbiter.EInvalid, "principal is required on a server without tokens: say whose allocations to hear about (their owner name)")
	}
	if w.Format == "" {
		w.Format = arbiter.WebhookStandard
	}
	if w.Format != arbiter.WebhookStandard && w.Format != arbiter.WebhookSlack {
		return nil, arbiter.Errorf(arbiter.EInvalid, "format %q: want standard or slack", arbiter.Clip(w.Format, 40))
	}
	mine := 0
	for _, x := range e.webhooks.subs {
		if x.Principal == w.Principal {
			mine++
		}
	}
	if mine >= maxNotifyPerPerson {
		return nil, arbiter.Errorf(arbiter.EConflict, "%s already has %d subscriptions; remove some first (arbiter notify rm)", w.Principal, maxNotifyPerPerson)
	}
	e.webhooks.init()
	e.fs.etaDirty = true // gpu.free is looked at with the next Flush
	return e.webhooks.create(e, arbiter.CreateWebhook{Caller: c.Caller, Webhook: w, AllowLinkLocal: c.AllowLinkLocal}, now)
}

// notifyDelete removes a person's subscription.
func (e *Engine) notifyDelete(c arbiter.DeleteNotify, now time.Time) (any, error) {
	e.webhooks.init()
	w, err := e.webhooks.get(c.ID)
	if err != nil || w.Principal == "" {
		return nil, arbiter.Errorf(arbiter.ENotFound, "subscription %q does not exist (see arbiter notify list)", arbiter.Clip(c.ID, 64))
	}
	if c.Caller.Role != arbiter.RoleAdmin && w.Principal != c.Caller.Name {
		return nil, arbiter.Errorf(arbiter.EForbidden, "subscription %s is %s's; only they or an admin may remove it", c.ID, w.Principal)
	}
	delete(e.fs.notify.free, c.ID)
	return e.webhooks.delete(e, arbiter.DeleteWebhook(c), now)
}
