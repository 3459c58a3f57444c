package client

// Fuzz targets for what the client parses from a server: the event stream
// (Events), a swap's log stream (FollowSwap) and an error answer's body
// (decodeError). Whatever a server sends: no panic, what is delivered keeps
// the order the client promises, memory stays bounded, and an error's
// message is bounded and holds no raw control characters.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// fixedAnswer is a round tripper that answers every request with one
// status, content type and body, without a network.
type fixedAnswer struct {
	status int
	ctype  string
	body   func() io.Reader
}

func (a fixedAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	h := http.Header{}
	if a.ctype != "" {
		h.Set("Content-Type", a.ctype)
	}
	return &http.Response{StatusCode: a.status, Status: strconv.Itoa(a.status) + " " + http.StatusText(a.status),
		Header: h, Body: io.NopCloser(a.body()), Request: r, ProtoMajor: 1, ProtoMinor: 1}, nil
}

func fixedClient(a fixedAnswer) *Client {
	return NewWithOptions("http://arbiter.test", "", Options{HTTPClient: &http.Client{Transport: a}})
}

// repeatStream is head, then chunk n times, then tail, without holding it
// all in memory.
func repeatStream(head, chunk []byte, n int, tail []byte) io.Reader {
	rs := []io.Reader{bytes.NewReader(head)}
	if len(chunk) > 0 && n > 0 {
		rs = append(rs, io.LimitReader(&cycle{b: chunk}, int64(len(chunk))*int64(n)))
	}
	return io.MultiReader(append(rs, bytes.NewReader(tail))...)
}

type cycle struct {
	b []byte
	i int
}

func (c *cycle) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k := copy(p[n:], c.b[c.i:])
		n += k
		c.i = (c.i + k) % len(c.b)
	}
	return n, nil
}

// maxStreamRepeat bounds the repeated part of a fuzzed stream: past two
// event lines' limit, enough to show a buffer that is not bounded.
const maxStreamRepeat = 2*maxEventLine + 64<<10

func streamRepeats(chunk []byte, reps uint32) int {
	if len(chunk) == 0 {
		return 0
	}
	return min(int(reps), maxStreamRepeat/len(chunk))
}

// oversizedEvent reports whether, in the part of stream that Events reads
// before it would stop on its own (a line over maxEventLine, an event that
// is not an arbiter.Event), one event gathers more than maxEventLine bytes
// of data: what the client would hold in memory for it.
func oversizedEvent(stream io.Reader) bool {
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventLine)
	var data strings.Builder
	has := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if has {
				var ev arbiter.Event
				if json.Unmarshal([]byte(data.String()), &ev) != nil {
					return false // the client stops here
				}
			}
			data.Reset()
			has = false
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		if field != "data" {
			continue
		}
		if has {
			data.WriteByte('\n')
		}
		data.WriteString(strings.TrimPrefix(value, " "))
		has = true
		if data.Len() > maxEventLine {
			return true
		}
	}
	return false
}

// FuzzEventStream: any bytes as the server's event stream (a head, a chunk
// repeated up to ~8 MiB, a tail), read from a given since. No panic; the
// events delivered have Seq > since and in increasing order (events
// without a Seq aside), as Events promises; a reconnection would resume
// from no earlier than since; and no single event makes the client hold
// more than maxEventLine bytes of data (the stream is refused instead).
func FuzzEventStream(f *testing.F) {
	f.Add([]byte("id: 4\n\n"), []byte(": ping\n\n"), uint32(3), []byte("id: 5\nevent: lock.acquired\ndata: {\"seq\":5,\"kind\":\"lock.acquired\"}\n\n"), int64(-1))
	f.Add([]byte("id: 7\nevent: x\ndata: {\"kind\":\"x\"}\n\nid: 6\ndata: {}\n\n"), []byte(nil), uint32(0), []byte("data: {\"seq\":9}\r\n\r\n"), int64(5))
	f.Add([]byte("data: {\n"), []byte("data:\n"), uint32(1000), []byte("data: }\n\n"), int64(0))
	f.Add([]byte("data: [1]\n\n"), []byte(nil), uint32(0), []byte(nil), int64(3))
	f.Fuzz(func(t *testing.T, head, chunk []byte, reps uint32, tail []byte, since int64) {
		n := streamRepeats(chunk, reps)
		c := fixedClient(fixedAnswer{status: 200, ctype: "text/event-stream", body: func() io.Reader { return repeatStream(head, chunk, n, tail) }})
		last := since
		prev := since
		var seqs []int64
		_, connected, fnErr, err := c.eventsOnce(context.Background(), &last, func(ev arbiter.Event) error {
			if ev.Seq != 0 {
				if ev.Seq <= prev {
					t.Errorf("delivered Seq %d after %d (since %d): not in increasing order", ev.Seq, prev, since)
				}
				prev = ev.Seq
				seqs = append(seqs, ev.Seq)
			}
			return nil
		})
		if !connected || fnErr != nil || err == nil {
			t.Fatalf("connected %v, fn error %v, error %v: want connected and an error saying how the stream ended", connected, fnErr, err)
		}
		if since >= 0 && last < since {
			t.Errorf("since %d, delivered %v: a reconnection would resume from %d, before since", since, seqs, last)
		}
		if oversizedEvent(repeatStream(head, chunk, n, tail)) && !strings.Contains(err.Error(), "longer than") {
			t.Errorf("an event of more than %d bytes of data was gathered in memory, not refused (stream %q + %q×%d + %q): %v",
				maxEventLine, arbiter.Clip(string(head), 80), arbiter.Clip(string(chunk), 80), n, arbiter.Clip(string(tail), 80), arbiter.Clip(err.Error(), 200))
		}
		if t.Failed() {
			t.Logf("stream %q + %q×%d + %q", arbiter.Clip(string(head), 200), arbiter.Clip(string(chunk), 80), n, arbiter.Clip(string(tail), 200))
		}
	})
}

// FuzzFollowSwapStream: any bytes as a swap's log stream, resumed from
// line next. No panic; the lines handed on are numbered from next on, in
// increasing order; the stream ends with the swap (an end event) or an
// error that says why.
func FuzzFollowSwapStream(f *testing.F) {
	f.Add([]byte("id: 0\nevent: log\ndata: {\"n\":0,\"line\":\"loading\"}\n\nevent: end\ndata: {\"id\":\"s1\",\"state\":\"complete\"}\n\n"), 0)
	f.Add([]byte("event: log\ndata: {\"n\":3,\"line\":\"a\"}\n\nevent: log\ndata: {\"n\":2,\"line\":\"b\"}\n\nevent: log\ndata: {\"n\":9223372036854775806,\"line\":\"c\"}\n\nevent: end\ndata: {}\n\n"), 1)
	f.Add([]byte("event: end\ndata: {\"id\":5}\n\n"), 0)
	f.Add([]byte(": ping\n\nevent: log\ndata: {\"n\":-1}\n\n"), -3)
	f.Fuzz(func(t *testing.T, stream []byte, next int) {
		c := fixedClient(fixedAnswer{status: 200, ctype: "text/event-stream", body: func() io.Reader { return bytes.NewReader(stream) }})
		start := next
		prev := next - 1
		if next < 0 {
			return // the client starts at 0
		}
		_, done, connected, err := c.followOnce(context.Background(), "s1", &next, func(n int, l string) {
			if n <= prev || n < start {
				t.Errorf("line %d handed on after line %d (from %d): not in increasing order", n, prev, start)
			}
			prev = n
		})
		if !connected {
			t.Fatalf("not connected: %v", err)
		}
		if done != (err == nil) {
			t.Fatalf("done %v with error %v", done, err)
		}
		if next < start {
			t.Errorf("the next line to resume from went back from %d to %d: lines would be handed on again", start, next)
		}
		if t.Failed() {
			t.Logf("stream %q", stream)
		}
	})
}

// errorMessageLimit bounds an error's message made from a server's answer:
// a server's own message may be long, but not the whole of a 64 KiB body.
const errorMessageLimit = 4096

// FuzzDecodeError: any status and body as an error answer. No panic; an
// *arbiter.Error with a code; its message is bounded and passes the text
// rule (no raw control characters, bidi controls or invalid UTF-8 reach a
// terminal), and so does its code.
func FuzzDecodeError(f *testing.F) {
	f.Add(409, []byte(`{"error":{"code":"conflict","message":"lock gpu is held by bob"}}`))
	f.Add(502, []byte("<html><body>Bad Gateway</body></html>"))
	f.Add(400, []byte(`{"error":{"code":"invalid","message":"bad\ttab\nline"}}`))
	f.Add(503, []byte("upstream \r\n down"))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 100 || status > 999 {
			return
		}
		resp := &http.Response{StatusCode: status, Status: strconv.Itoa(status) + " " + http.StatusText(status), Body: io.NopCloser(bytes.NewReader(body))}
		err := decodeError(resp)
		var ae *arbiter.Error
		if !errors.As(err, &ae) || ae.Code == "" {
			t.Fatalf("status %d body %q: %#v, want an *arbiter.Error with a code", status, body, err)
		}
		if len(ae.Message) > errorMessageLimit {
			t.Errorf("status %d body %q…: a message of %d bytes", status, arbiter.Clip(string(body), 100), len(ae.Message))
		}
		if e := arbiter.ValidateLines("message", ae.Message, len(ae.Message)); e != nil {
			t.Errorf("status %d body %q: message %q: %v", status, body, arbiter.Clip(ae.Message, 300), e)
		}
		if e := arbiter.ValidateText("code", ae.Code, 64); e != nil {
			t.Errorf("status %d body %q: code %q: %v", status, body, arbiter.Clip(ae.Code, 100), e)
		}
	})
}
