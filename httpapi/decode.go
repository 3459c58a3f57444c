package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// readBody reads r's body, at most limit bytes, checking its Content-Type.
// Every JSON body goes through it and decodeJSON. Errors: invalid for a
// content type other than JSON, too_large past the limit.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, buf *bytes.Buffer) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return arbiter.Errorf(arbiter.EInvalid, "Content-Type %q is not supported: send application/json", arbiter.Clip(ct, 60))
		}
	}
	// MaxBytesReader also tells the server to close the connection rather
	// than read the rest of an oversized body.
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return arbiter.Errorf(arbiter.ETooLarge, "request body is larger than the limit of %d bytes", limit)
		}
		return arbiter.Errorf(arbiter.EInvalid, "reading the request body: %v", err)
	}
	return nil
}

// bufPool holds body buffers; large ones are dropped rather than kept.
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func getBuf() *bytes.Buffer {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	return b
}

func putBuf(b *bytes.Buffer) {
	if b.Cap() <= 64<<10 {
		bufPool.Put(b)
	}
}

// decodeJSON decodes exactly one JSON value from data into v, refusing
// fields v does not have. Errors are invalid, with messages that name the
// field at fault and what it should be.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(data, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return arbiter.Errorf(arbiter.EInvalid, "request body holds more than one JSON value: send exactly one object")
	}
	return nil
}

// jsonError turns an encoding/json error into an invalid *arbiter.Error
// a person can act on.
func jsonError(data []byte, err error) error {
	var ae *arbiter.Error
	if errors.As(err, &ae) {
		return ae
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		got := te.Value
		switch te.Value {
		case "string":
			got = "string " + stringBefore(data, te.Offset)
		case "number":
			got = "number " + numberBefore(data, te.Offset)
		}
		if te.Field == "" {
			return arbiter.Errorf(arbiter.EInvalid, "request body: want %s, got %s", want(te.Type), got)
		}
		return arbiter.Errorf(arbiter.EInvalid, "%s: want %s, got %s", te.Field, want(te.Type), got)
	case errors.As(err, &se):
		return arbiter.Errorf(arbiter.EInvalid, "request body is not valid JSON (at byte %d): %s", se.Offset,
			strings.TrimPrefix(se.Error(), "json: "))
	case errors.Is(err, io.EOF):
		return arbiter.Errorf(arbiter.EInvalid, "request body is empty: send a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return arbiter.Errorf(arbiter.EInvalid, "request body ends in the middle of a JSON value")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return arbiter.Errorf(arbiter.EInvalid, "unknown field %s in the request body: check its spelling (see /api/v1/openapi.json)", arbiter.Clip(f, 80))
	}
	return arbiter.Errorf(arbiter.EInvalid, "request body: %s", strings.TrimPrefix(err.Error(), "json: "))
}

// stringBefore returns the JSON string literal that ends at data[end],
// clipped for a message.
func stringBefore(data []byte, end int64) string {
	if end <= 0 || end > int64(len(data)) || data[end-1] != '"' {
		return `""`
	}
	for i := end - 2; i >= 0; i-- {
		if data[i] != '"' {
			continue
		}
		// A quote preceded by an odd number of backslashes is escaped.
		n := 0
		for j := i - 1; j >= 0 && data[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			var s string
			if json.Unmarshal(data[i:end], &s) != nil {
				return `""`
			}
			return strconv.Quote(arbiter.Clip(s, 40))
		}
	}
	return `""`
}

// numberBefore returns the JSON number that ends at data[end], clipped.
func numberBefore(data []byte, end int64) string {
	if end <= 0 || end > int64(len(data)) {
		return ""
	}
	i := end
	for i > 0 && strings.IndexByte("0123456789+-.eE", data[i-1]) >= 0 {
		i--
	}
	return arbiter.Clip(string(data[i:end]), 40)
}

// want describes a Go type as what a JSON value must be.
func want(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		if t.String() == "time.Time" {
			return "an RFC 3339 time string"
		}
		return "an object"
	case reflect.Pointer:
		return want(t.Elem())
	}
	return "another type"
}

// allocateBody is the body of POST /api/v1/allocations: arbiter.Request's
// fields, with keepalive_s telling absent from null.
type allocateBody struct {
	Owner       string               `json:"owner"`
	Label       string               `json:"label"`
	GPUs        int                  `json:"gpus"`
	MinVRAMGiB  float64              `json:"min_vram_gib"`
	RequireCUDA bool                 `json:"require_cuda"`
	MinCompute  string               `json:"min_compute"`
	Model       string               `json:"model"`
	Tags        []string             `json:"tags"`
	Machine     string               `json:"machine"`
	Priority    int                  `json:"priority"`
	IdleExempt  bool                 `json:"idle_exempt"`
	Pool        string               `json:"pool"`
	Grid        *arbiter.GridRequest `json:"grid"`
	KeepaliveS  keepalive            `json:"keepalive_s"`
	// Fair share (fairshare.go).
	TimeLimitS  *float64 `json:"time_limit_s"`
	Preemptible bool     `json:"preemptible"`
	Reservation string   `json:"reservation"`
}

// keepalive is keepalive_s as sent: absent, null, or a number.
type keepalive struct {
	set  bool // present in the body
	null bool
	v    float64
}

// UnmarshalJSON records that keepalive_s was present, and whether null.
func (k *keepalive) UnmarshalJSON(b []byte) error {
	k.set = true
	switch {
	case string(b) == "null":
		k.null = true
		return nil
	case len(b) > 0 && (b[0] == '-' || b[0] >= '0' && b[0] <= '9'):
		v, err := strconv.ParseFloat(string(b), 64)
		if err != nil {
			return arbiter.Errorf(arbiter.EInvalid, "keepalive_s: %s is out of range", arbiter.Clip(string(b), 40))
		}
		k.v = v
		return nil
	}
	got := "a " + jsonKind(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		_ = json.Unmarshal(b, &s)
		got = "string " + strconv.Quote(arbiter.Clip(s, 40))
	}
	return arbiter.Errorf(arbiter.EInvalid, "keepalive_s: want a number of seconds or null, got %s", got)
}

func jsonKind(b []byte) string {
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "object"
	case '[':
		return "list"
	case 't', 'f':
		return "boolean"
	}
	return "value"
}

// decodeAllocate turns an allocation body into a valid request: it
// decodes data (decodeJSON), applies the defaults (keepalive_s absent →
// defKeepalive; owner empty → the caller's token name), makes the caller's
// token name the owner (arbiter.Request.SetPrincipal) and validates.
// Errors: invalid, naming the field at fault.
func decodeAllocate(data []byte, c arbiter.Caller, defKeepalive float64) (arbiter.Request, error) {
	var b allocateBody
	if err := decodeJSON(data, &b); err != nil {
		return arbiter.Request{}, err
	}
	req := arbiter.Request{
		Owner:       b.Owner,
		Label:       b.Label,
		GPUs:        b.GPUs,
		MinVRAMGiB:  b.MinVRAMGiB,
		RequireCUDA: b.RequireCUDA,
		MinCompute:  b.MinCompute,
		Model:       b.Model,
		Tags:        b.Tags,
		Machine:     b.Machine,
		Priority:    b.Priority,
		IdleExempt:  b.IdleExempt,
		Pool:        b.Pool,
		Grid:        b.Grid,
		TimeLimitS:  b.TimeLimitS,
		Preemptible: b.Preemptible,
		Reservation: b.Reservation,
	}
	switch {
	case !b.KeepaliveS.set:
		k := defKeepalive
		req.KeepaliveS = &k
	case !b.KeepaliveS.null:
		k := b.KeepaliveS.v
		req.KeepaliveS = &k
	}
	if req.Owner == "" {
		req.Owner = c.Name
	}
	req.SetPrincipal(c.Name) // as the engine does: validated as it will be stored
	if err := req.Validate(); err != nil {
		return arbiter.Request{}, err
	}
	return req, nil
}

// decodeMachine turns a registration body into a machine: arbiter.Machine
// JSON, with what the server owns forced (kind gpu, source agent, not
// draining, not down; the last-seen time is the engine's). Errors: invalid.
func decodeMachine(data []byte) (arbiter.Machine, error) {
	var m arbiter.Machine
	if err := decodeJSON(data, &m); err != nil {
		return arbiter.Machine{}, err
	}
	m.Kind, m.Source = arbiter.KindGPU, arbiter.SourceAgent
	m.Draining, m.Down = false, false
	m.LastSeen = time.Time{}
	if err := m.Validate(); err != nil {
		return arbiter.Machine{}, err
	}
	return m, nil
}
