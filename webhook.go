package arbiter

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Webhook formats (docs/reference/coordination.md §3).
const (
	// WebhookStandard signs per Standard Webhooks: webhook-id,
	// webhook-timestamp, webhook-signature "v1,<base64 HMAC-SHA256 of
	// id.timestamp.body>" with a "whsec_<base64>" secret. Any event kind.
	WebhookStandard = "standard"
	// WebhookSpark is the compatibility form of seed 000: x-spark-event
	// swap_complete|swap_failed and, with a secret, x-spark-signature
	// "sha256=<hex HMAC-SHA256 of the body>". Swap ends only.
	WebhookSpark = "spark"
)

// RecordWebhook is the record kind of webhook subscriptions (key: id).
const RecordWebhook = "webhook"

// Event kinds of webhook subscriptions; the data is the public Webhook.
const (
	EventWebhookCreated  = "webhook.created"
	EventWebhookUpdated  = "webhook.updated"
	EventWebhookDisabled = "webhook.disabled"
	EventWebhookDeleted  = "webhook.deleted"
)

// Limits of subscriptions.
const (
	MaxWebhookURLBytes = 2048
	MaxWebhookKinds    = 32
)

// Webhook is a subscription: events of Kinds are POSTed to URL in Format.
// Kinds are exact kinds ("swap.complete"), prefixes ("swap.*") or "*"
// (patterns leave out swap.log; see Wants).
// Secret is kept in the record to sign with and never shown by a read
// (Public); it is shown once, when the subscription is created.
type Webhook struct {
	ID             string    `json:"id"`
	URL            string    `json:"url"`
	Secret         string    `json:"secret,omitempty"`
	HasSecret      bool      `json:"has_secret"`
	Kinds          []string  `json:"kinds"`
	Format         string    `json:"format"`
	Enabled        bool      `json:"enabled"`
	DisabledReason string    `json:"disabled_reason,omitempty"`
	CreatedBy      string    `json:"created_by,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Principal makes it a person's subscription (arbiter notify): it gets
	// only the notifications made for it (fairshare.go), Kinds naming
	// notification kinds, narrowed by Match.
	Principal string       `json:"principal,omitempty"`
	Match     *NotifyMatch `json:"match,omitempty"`
	// NoLoopback: a person made it for themselves without the admin role,
	// so it may not target the server's own loopback, where services
	// trust whoever can connect (docs/guides/security.md). An admin may
	// make a person's subscription that does.
	NoLoopback bool `json:"no_loopback,omitempty"`
}

// Public returns w without its secret.
func (w Webhook) Public() Webhook {
	w.HasSecret = w.Secret != ""
	w.Secret = ""
	w.Kinds = append([]string{}, w.Kinds...)
	if w.Match != nil {
		m := *w.Match
		w.Match = &m
	}
	return w
}

// EventVisible reports whether c may read ev. Admins read every event;
// others not the webhook subscriptions (their URLs are often credentials)
// nor the notifications, except their own personal subscription's
// (docs/guides/security.md, the role table).
func EventVisible(c Caller, ev *Event) bool {
	if c.Role == RoleAdmin {
		return true
	}
	if ev.Kind != EventNotification && !strings.HasPrefix(ev.Kind, "webhook.") {
		return true
	}
	// Webhook and Notification both name their person as "principal".
	var of struct {
		Principal string `json:"principal"`
	}
	return c.Name != "" && json.Unmarshal(ev.Data, &of) == nil && of.Principal == c.Name
}

// Wants reports whether the subscription takes events of kind. Patterns
// ("*", "swap.*") do not match swap.log, the output lines of swaps: a
// subscription names it to get them.
func (w *Webhook) Wants(kind string) bool {
	if w.Format == WebhookSpark {
		return kind == EventSwapComplete || kind == EventSwapFailed
	}
	for _, k := range w.Kinds {
		switch {
		case k == kind:
			return true
		case kind == EventSwapLog:
			// A swap's output lines go only to who names swap.log: a
			// pattern means the lifecycle, not every line of output.
		case k == "*":
			return true
		case strings.HasSuffix(k, ".*") && strings.HasPrefix(kind, strings.TrimSuffix(k, "*")):
			return true
		}
	}
	return false
}

// Validate checks a subscription (its URL with ValidateWebhookURL).
// allowLinkLocal is the configuration's [webhooks] allow_link_local.
// Errors: invalid, naming the field.
func (w *Webhook) Validate(allowLinkLocal bool) error {
	if w.ID != "" {
		if err := ValidateName("webhook id", w.ID); err != nil {
			return err
		}
		if w.ID == "deliveries" { // GET /api/v1/webhooks/deliveries is the delivery log
			return Errorf(EInvalid, "webhook id %q is reserved: choose another", w.ID)
		}
	}
	if err := ValidateWebhookURL(w.URL, allowLinkLocal); err != nil {
		return err
	}
	if w.NoLoopback {
		if err := refuseLoopbackURL(w.URL); err != nil {
			return err
		}
	}
	switch w.Format {
	case WebhookStandard, WebhookSlack:
		if w.Format == WebhookSlack && w.Principal == "" {
			return Errorf(EInvalid, "the slack format is for personal subscriptions (arbiter notify add)")
		}
		if err := ValidateStandardSecret(w.Secret); err != nil {
			return err
		}
	case WebhookSpark:
		if w.Secret != "" {
			if err := ValidateText("secret", w.Secret, 256); err != nil {
				return err
			}
		}
	default:
		return Errorf(EInvalid, "format %q is not standard or spark", Clip(w.Format, 40))
	}
	if w.Principal != "" {
		if len(w.Kinds) == 0 {
			return Errorf(EInvalid, "kinds is empty: name the notification kinds, some of %s", strings.Join(NotifyKinds(), ", "))
		}
		return w.validateNotify()
	}
	if w.Match != nil {
		return Errorf(EInvalid, "match is for personal subscriptions (arbiter notify add)")
	}
	if len(w.Kinds) == 0 && w.Format == WebhookStandard {
		return Errorf(EInvalid, "kinds is empty: name the event kinds to deliver, e.g. [\"swap.complete\", \"swap.failed\"], [\"lock.*\"] or [\"*\"]")
	}
	if len(w.Kinds) > MaxWebhookKinds {
		return Errorf(EInvalid, "kinds has more than %d entries", MaxWebhookKinds)
	}
	for _, k := range w.Kinds {
		if err := checkWebhookKind(k); err != nil {
			return err
		}
		if w.Format == WebhookSpark && k != EventSwapComplete && k != EventSwapFailed {
			return Errorf(EInvalid, "the spark format carries swap.complete and swap.failed only, not %q", Clip(k, 60))
		}
	}
	return nil
}

// checkWebhookKind checks one of a subscription's kinds: an event kind the
// server emits, a prefix of some (swap.*), or *. A misspelt kind would
// never deliver anything.
func checkWebhookKind(k string) error {
	if !webhookEventPattern(k) {
		return Errorf(EInvalid, "kind %q is not an event kind (like swap.complete), a prefix (like swap.*) or *", Clip(k, 60))
	}
	if k == "*" || IsEventKind(k) {
		return nil
	}
	if p, ok := strings.CutSuffix(k, ".*"); ok {
		if slices.ContainsFunc(eventKinds, func(e string) bool { return strings.HasPrefix(e, p+".") }) {
			return nil
		}
		return Errorf(EInvalid, "kind %q matches no event kind; the kinds start with %s", Clip(k, 60), strings.Join(kindPrefixes(), ", "))
	}
	msg := fmt.Sprintf("kind %q is not an event kind", Clip(k, 60))
	best, bestD := "", 3
	for _, e := range eventKinds {
		if d := EditDistance(k, e); d < bestD {
			best, bestD = e, d
		}
	}
	if best != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", best)
	}
	return Errorf(EInvalid, "%s; docs/reference/native.md §6 lists the kinds, and a prefix such as swap.* takes a family", msg)
}

// kindPrefixes are the families of event kinds, as prefixes (swap.*); a
// kind of no family (notification) is itself.
func kindPrefixes() []string {
	var out []string
	for _, e := range eventKinds {
		p, _, dotted := strings.Cut(e, ".")
		if dotted {
			p += ".*"
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func webhookEventPattern(k string) bool {
	if k == "*" {
		return true
	}
	k = strings.TrimSuffix(k, ".*")
	if k == "" || len(k) > 64 || k[0] == '.' || k[len(k)-1] == '.' {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// ValidateStandardSecret checks a Standard Webhooks secret: "whsec_"
// followed by the base64 of 24 to 64 random bytes.
func ValidateStandardSecret(s string) error {
	rest, ok := strings.CutPrefix(s, "whsec_")
	if !ok {
		return Errorf(EInvalid, "secret must start with whsec_ (Standard Webhooks); leave it out to have one generated")
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(b) < 24 || len(b) > 64 {
		return Errorf(EInvalid, "secret must be whsec_ and the base64 of 24 to 64 random bytes; leave it out to have one generated")
	}
	return nil
}

// webhookMetadataHosts are cloud metadata service names refused as webhook targets.
var webhookMetadataHosts = map[string]bool{
	"metadata": true, "metadata.google.internal": true, "metadata.goog": true,
	"instance-data": true, "instance-data.ec2.internal": true, "metadata.azure.internal": true,
}

// WebhookAddrRefused reports why a webhook may not be sent to address a
// (a link-local, unspecified, multicast or cloud metadata address), or ""
// when it may. The dispatcher checks every address it connects to, so a
// name that resolves to such an address is refused too.
func WebhookAddrRefused(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an IP address"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local address (such as the cloud metadata service 169.254.169.254)"
	case a.IsUnspecified():
		return "an unspecified address"
	case a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return "a multicast address"
	case a == netip.MustParseAddr("fd00:ec2::254"), a == netip.MustParseAddr("100.100.100.200"):
		return "a cloud metadata address"
	}
	return ""
}

// ValidateWebhookURL checks a webhook target: an http:// or https:// URL of
// at most 2048 bytes with a host, no credentials and no fragment; unless
// allowLinkLocal, not a link-local, unspecified, multicast or cloud
// metadata address or name. Errors: invalid.
func ValidateWebhookURL(raw string, allowLinkLocal bool) error {
	if raw == "" {
		return Errorf(EInvalid, "url is empty: give the receiver's http:// or https:// URL")
	}
	if len(raw) > MaxWebhookURLBytes {
		return Errorf(EInvalid, "url is longer than %d bytes", MaxWebhookURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return Errorf(EInvalid, "url %q is not an http:// or https:// URL with a host", Clip(raw, 80))
	}
	if u.User != nil {
		return Errorf(EInvalid, "url must not hold credentials (user:password@): use a secret to authenticate deliveries")
	}
	if u.Fragment != "" {
		return Errorf(EInvalid, "url must not have a #fragment")
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "" {
		return Errorf(EInvalid, "url %q has no host", Clip(raw, 80))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || p[0] == '+' {
			return Errorf(EInvalid, "url port %q is not a port number", Clip(p, 10))
		}
	}
	addr, ipErr := netip.ParseAddr(host)
	if ipErr != nil && (strings.Trim(host, "0123456789.") == "" ||
		strings.HasPrefix(host, "0x") && strings.Trim(host, "0123456789abcdefx.") == "") {
		// 2852039166, 0xa9fea9fe, 169.254.43518: numeric forms that some
		// resolvers read as addresses.
		return Errorf(EInvalid, "url host %q is not a valid IP address or host name", Clip(host, 60))
	}
	if allowLinkLocal {
		return nil
	}
	if ipErr == nil {
		if why := WebhookAddrRefused(addr); why != "" {
			return Errorf(EInvalid, "url host %s is %s; webhooks may not target it unless [webhooks] allow_link_local = true", host, why)
		}
	}
	if webhookMetadataHosts[host] {
		return Errorf(EInvalid, "url host %s is a cloud metadata service; webhooks may not target it unless [webhooks] allow_link_local = true", host)
	}
	return nil
}

// refuseLoopbackURL refuses a URL (valid per ValidateWebhookURL) whose
// host is a loopback address or a localhost name. Errors: invalid.
func refuseLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return Errorf(EInvalid, "url %q is not an http:// or https:// URL with a host", Clip(raw, 80))
	}
	if host := u.Hostname(); LoopbackHost(host) {
		return Errorf(EInvalid, "url host %s is the server's loopback; your own subscriptions may not target it (an admin may make it for you)", Clip(host, 60))
	}
	return nil
}

// LoopbackHost reports whether host — a name or an address, without a
// port, an IPv6 address in brackets or not — is this host's loopback: a
// loopback address, or a localhost name (RFC 6761).
func LoopbackHost(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().IsLoopback()
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// CreateWebhook adds a subscription (admin). The transport fills Secret
// (drawing a new one for the standard format when none is given); the engine
// gives an id when Webhook.ID is "", and sets Enabled, CreatedBy and the
// times. Result: Webhook with its secret (shown once). Errors: invalid for a
// subscription that does not validate, conflict for an id in use.
type CreateWebhook struct {
	Caller         Caller
	Webhook        Webhook
	AllowLinkLocal bool
}

// SetWebhookEnabled enables or disables a subscription; Reason says why it
// is disabled (the dispatcher disables one whose receiver answered 410).
// Result: Webhook (public). Errors: not_found.
type SetWebhookEnabled struct {
	Caller  Caller
	ID      string
	Enabled bool
	Reason  string
}

// DeleteWebhook removes a subscription. Result: Webhook (public, as it was).
// Errors: not_found.
type DeleteWebhook struct {
	Caller Caller
	ID     string
}

func (CreateWebhook) isCommand()          {}
func (CreateWebhook) result() Webhook     { return Webhook{} }
func (SetWebhookEnabled) isCommand()      {}
func (SetWebhookEnabled) result() Webhook { return Webhook{} }
func (DeleteWebhook) isCommand()          {}
func (DeleteWebhook) result() Webhook     { return Webhook{} }

// Delivery states.
const (
	DeliveryPending   = "pending"   // waiting for its (next) attempt
	DeliveryDelivered = "delivered" // a 2xx answer
	DeliveryFailed    = "failed"    // given up: retries ran out, 410, or the subscription is gone
)

// Delivery is one event on its way to one subscription. ID is stable across
// retries and is sent as webhook-id, so receivers can drop duplicates. Body
// is the exact payload, fixed when the delivery is created.
type Delivery struct {
	ID            string            `json:"id"`
	Webhook       string            `json:"webhook"`
	EventSeq      int64             `json:"event_seq"`
	EventKind     string            `json:"event_kind"`
	Body          []byte            `json:"-"`
	State         string            `json:"state"`
	Attempts      int               `json:"attempts"`
	NextAttemptAt *time.Time        `json:"next_attempt_at"`
	LastStatus    int               `json:"last_status,omitempty"`
	LastError     string            `json:"last_error,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	UpdatedAt     time.Time         `json:"updated_at"`
	History       []DeliveryAttempt `json:"history,omitempty"`
}

// DeliveryAttempt is one POST of a delivery: the status the receiver
// answered (0 when none) or the error, and how long it took.
type DeliveryAttempt struct {
	N          int       `json:"n"`
	At         time.Time `json:"at"`
	Status     int       `json:"status"`
	Error      string    `json:"error,omitempty"`
	DurationMS float64   `json:"duration_ms"`
}

// DeliveryFilter selects deliveries to list: of one webhook and/or state,
// the newest Limit (default 100, at most 1000).
type DeliveryFilter struct {
	Webhook string
	State   string
	Limit   int
}

// DeliveryLog is the webhook delivery log: store-only data (the engine never
// sees it) that the dispatcher writes and the API reads. The SQLite and
// PostgreSQL stores implement it beside Store. Methods are safe for
// concurrent use; errors are wrapped store errors. Times are kept to the
// microsecond.
type DeliveryLog interface {
	// WebhookCursor returns the Seq of the last event the dispatcher has
	// turned into deliveries; 0 at first.
	WebhookCursor(ctx context.Context) (int64, error)
	// EnqueueDeliveries inserts ds (pending; ids already present are left
	// as they are) and moves the cursor to cursor, in one transaction: after
	// a crash, an event is either fully enqueued or not at all.
	EnqueueDeliveries(ctx context.Context, ds []Delivery, cursor int64) error
	// PendingDeliveries returns up to limit pending deliveries with their
	// bodies, the earliest next attempt first, leaving out those of the
	// subscriptions in skip.
	PendingDeliveries(ctx context.Context, limit int, skip []string) ([]Delivery, error)
	// RecordAttempt saves d's new state (State, Attempts, NextAttemptAt,
	// LastStatus, LastError, UpdatedAt) and appends attempt a to its
	// history, in one transaction. a.N == 0 saves the state alone.
	// Errors: not_found for an unknown delivery.
	RecordAttempt(ctx context.Context, d Delivery, a DeliveryAttempt) error
	// Deliveries lists deliveries passing f, newest first, with their
	// attempts (History) and without bodies.
	Deliveries(ctx context.Context, f DeliveryFilter) ([]Delivery, error)
	// TrimDeliveries deletes finished (delivered or failed) deliveries
	// beyond the newest keep, with their attempts.
	TrimDeliveries(ctx context.Context, keep int) error
}
