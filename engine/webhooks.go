package engine

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// webhooks is the webhook-subscription capability: which events go where,
// in which format. Deliveries are not the engine's business: the webhook
// dispatcher reads the event outbox and keeps its own log in the store.
type webhooks struct {
	subs map[string]*arbiter.Webhook
	next int64 // the number of the last generated id ("wh1", "wh2" …)
}

// webhookSeqKind is the record kind of the id counter (key "last").
const webhookSeqKind = "webhook.seq"

// maxWebhooks bounds the subscriptions.
const maxWebhooks = 1000

type webhookSeq struct {
	Last int64 `json:"last"`
}

func (h *webhooks) init() {
	if h.subs == nil {
		h.subs = map[string]*arbiter.Webhook{}
	}
}

func (h *webhooks) kinds() []string { return []string{arbiter.RecordWebhook, webhookSeqKind} }

func (h *webhooks) load(_ *Engine, recs []arbiter.Record, _ time.Time) error {
	h.init()
	var bad []string
	for _, r := range recs {
		switch r.Kind {
		case webhookSeqKind:
			if s, err := coordDecode[webhookSeq](r); err == nil {
				h.next = max(h.next, s.Last)
			} else {
				bad = append(bad, err.Error())
			}
		case arbiter.RecordWebhook:
			w, err := coordDecode[arbiter.Webhook](r)
			if err != nil || w.ID != r.Key {
				bad = append(bad, fmt.Sprintf("webhook %q: unreadable record", r.Key))
				continue
			}
			h.subs[w.ID] = &w
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("webhooks: %s", strings.Join(bad, "; "))
	}
	return nil
}

func (h *webhooks) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	h.init()
	switch c := cmd.(type) {
	case arbiter.CreateWebhook:
		res, err := h.create(e, c, now)
		return res, err, true
	case arbiter.SetWebhookEnabled:
		res, err := h.setEnabled(e, c, now)
		return res, err, true
	case arbiter.DeleteWebhook:
		res, err := h.delete(e, c, now)
		return res, err, true
	}
	return nil, nil, false
}

func (h *webhooks) records() []arbiter.Record {
	out := []arbiter.Record{{Kind: webhookSeqKind, Key: "last", Value: webhookSeq{h.next}}}
	ids := make([]string, 0, len(h.subs))
	for id := range h.subs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		out = append(out, arbiter.Record{Kind: arbiter.RecordWebhook, Key: id, Value: *h.subs[id]})
	}
	return out
}

func (h *webhooks) create(e *Engine, c arbiter.CreateWebhook, now time.Time) (any, error) {
	w := c.Webhook
	if w.Format == "" {
		w.Format = arbiter.WebhookStandard
	}
	if w.Format == arbiter.WebhookSpark && len(w.Kinds) == 0 {
		w.Kinds = []string{arbiter.EventSwapComplete, arbiter.EventSwapFailed}
	}
	w.Kinds = append([]string{}, w.Kinds...)
	if err := w.Validate(c.AllowLinkLocal); err != nil {
		return nil, err
	}
	if len(h.subs) >= maxWebhooks {
		return nil, arbiter.Errorf(arbiter.EConflict, "there are already %d webhook subscriptions; delete some first", maxWebhooks)
	}
	if w.ID != "" {
		if h.subs[w.ID] != nil {
			return nil, arbiter.Errorf(arbiter.EConflict, "webhook id %q is in use: choose another or delete it first", w.ID)
		}
	} else {
		for {
			h.next++
			w.ID = "wh" + strconv.FormatInt(h.next, 10)
			if h.subs[w.ID] == nil {
				break
			}
		}
		e.putRecord(webhookSeqKind, "last", webhookSeq{h.next})
	}
	w.HasSecret = w.Secret != ""
	w.Enabled, w.DisabledReason = true, ""
	w.CreatedBy, w.CreatedAt, w.UpdatedAt = c.Caller.Name, now, now
	h.subs[w.ID] = &w
	e.putRecord(arbiter.RecordWebhook, w.ID, w)
	e.emit(now, arbiter.EventWebhookCreated, "webhook/"+w.ID, w.Public())
	return w, nil
}

func (h *webhooks) get(id string) (*arbiter.Webhook, error) {
	if err := arbiter.ValidateName("webhook id", id); err != nil {
		return nil, err
	}
	w := h.subs[id]
	if w == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "webhook %q does not exist (see arbiter webhooks list)", id)
	}
	return w, nil
}

func (h *webhooks) setEnabled(e *Engine, c arbiter.SetWebhookEnabled, now time.Time) (any, error) {
	w, err := h.get(c.ID)
	if err != nil {
		return nil, err
	}
	if err := arbiter.ValidateText("reason", c.Reason, 1024); err != nil {
		return nil, err
	}
	if w.Enabled == c.Enabled {
		return w.Public(), nil
	}
	w.Enabled, w.UpdatedAt = c.Enabled, now
	w.DisabledReason = ""
	kind := arbiter.EventWebhookUpdated
	if !c.Enabled {
		kind = arbiter.EventWebhookDisabled
		w.DisabledReason = c.Reason
		if w.DisabledReason == "" {
			w.DisabledReason = "disabled by " + c.Caller.Name
		}
	}
	e.putRecord(arbiter.RecordWebhook, w.ID, *w)
	e.emit(now, kind, "webhook/"+w.ID, w.Public())
	return w.Public(), nil
}

func (h *webhooks) delete(e *Engine, c arbiter.DeleteWebhook, now time.Time) (any, error) {
	w, err := h.get(c.ID)
	if err != nil {
		return nil, err
	}
	delete(h.subs, w.ID)
	e.removeRecord(arbiter.RecordWebhook, w.ID)
	e.emit(now, arbiter.EventWebhookDeleted, "webhook/"+w.ID, w.Public())
	return w.Public(), nil
}
