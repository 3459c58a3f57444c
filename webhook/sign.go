package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Header names of the two signing forms.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	HeaderSparkEvt  = "x-spark-event"
	HeaderSparkSig  = "x-spark-signature"
)

// SignStandard returns the webhook-signature value of a Standard Webhooks
// message: "v1," and the base64 HMAC-SHA256, keyed with the secret's
// decoded bytes, of "id.timestamp.body". Errors: the secret is not
// "whsec_<base64>".
func SignStandard(secret, id string, ts time.Time, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return "", fmt.Errorf("webhook: the secret is not whsec_<base64>: %w", err)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write(strconv.AppendInt(nil, ts.Unix(), 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil)), nil
}

// SignSpark returns the x-spark-signature value of seed 000: "sha256=" and
// the hex HMAC-SHA256 of the exact body, keyed with the secret's bytes.
func SignSpark(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// VerifySpark reports, in constant time, whether sig is body's
// x-spark-signature under secret: what a receiver of the compatibility form
// checks.
func VerifySpark(secret string, body []byte, sig string) bool {
	return hmac.Equal([]byte(SignSpark(secret, body)), []byte(sig))
}

// StandardBody is the payload of the standard form: the event kind as
// type, its time, its sequence number and subject, and its data (the record
// after the change).
type StandardBody struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Seq       int64           `json:"seq"`
	Subject   string          `json:"subject"`
	Data      json.RawMessage `json:"data"`
}

// SparkBody is the payload of the compatibility form, field for field as
// seed 000 sends it, times included: StartedAt and FinishedAt are written as
// Python's isoformat() writes a UTC time (see PyISOTime).
type SparkBody struct {
	Event      string  `json:"event"` // swap_complete | swap_failed
	JobID      string  `json:"job_id"`
	ModelKey   string  `json:"model_key"`
	State      string  `json:"state"`
	ReturnCode *int    `json:"returncode"`
	StartedAt  *string `json:"started_at"`
	FinishedAt *string `json:"finished_at"`
	DryRun     bool    `json:"dry_run"`
}

// PyISOTime writes t as seed 000 did (arbiter.PyISOFormat); nil for nil.
// Receivers of the spark form are Python services reading it with
// datetime.fromisoformat.
func PyISOTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := arbiter.PyISOFormat(*t)
	return &s
}

// Body returns the exact payload of event ev in format ("standard",
// "slack" — {"text"} of a notification — or "spark"), and false when the event is not delivered in that format (the
// spark form carries swap ends only) or not at all (dry-run swaps fire
// nothing).
func Body(format string, ev *arbiter.Event) ([]byte, bool) {
	if strings.HasPrefix(ev.Kind, "swap.") && ev.Kind != arbiter.EventSwapLog {
		var s struct {
			DryRun bool `json:"dry_run"`
		}
		if json.Unmarshal(ev.Data, &s) == nil && s.DryRun {
			return nil, false
		}
	}
	switch format {
	case arbiter.WebhookSlack:
		// A person's Slack-compatible receiver: their notification's line.
		var n struct {
			Text string `json:"text"`
		}
		if ev.Kind != arbiter.EventNotification || json.Unmarshal(ev.Data, &n) != nil || n.Text == "" {
			return nil, false
		}
		b, err := json.Marshal(n)
		return b, err == nil
	case arbiter.WebhookSpark:
		if ev.Kind != arbiter.EventSwapComplete && ev.Kind != arbiter.EventSwapFailed {
			return nil, false
		}
		var s arbiter.Swap
		if err := json.Unmarshal(ev.Data, &s); err != nil {
			return nil, false
		}
		b, err := json.Marshal(SparkBody{
			Event: strings.Replace(ev.Kind, ".", "_", 1), JobID: s.ID, ModelKey: s.ModelKey, State: s.State,
			ReturnCode: s.ReturnCode, StartedAt: PyISOTime(s.StartedAt), FinishedAt: PyISOTime(s.FinishedAt), DryRun: s.DryRun,
		})
		return b, err == nil
	default:
		data := ev.Data
		if len(data) == 0 {
			data = json.RawMessage("null")
		}
		b, err := json.Marshal(StandardBody{Type: ev.Kind, Timestamp: ev.Time.UTC(), Seq: ev.Seq, Subject: ev.Subject, Data: data})
		return b, err == nil
	}
}
