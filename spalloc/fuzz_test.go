package spalloc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"unicode/utf8"
)

// fuzzSeeds are whole connections: requests of every command, bad ones,
// partial and long lines.
var fuzzSeeds = []string{
	"{\"command\": \"version\"}\n",
	"{\"command\": \"create_job\", \"args\": [2, 1], \"kwargs\": {\"owner\": \"a\", \"keepalive\": null, \"machine\": null, \"tags\": null, \"min_ratio\": 0.333, \"max_dead_boards\": 0, \"max_dead_links\": null, \"require_torus\": false}}\n{\"command\": \"get_job_state\", \"args\": [1]}\r\n",
	"{\"command\": \"create_job\", \"kwargs\": {\"owner\": \"a\"}}\n{\"command\": \"get_job_machine_info\", \"args\": [1]}\n{\"command\": \"list_jobs\"}\n{\"command\": \"destroy_job\", \"args\": [1, \"x\"]}\n",
	"{\"command\": \"notify_job\"}\n{\"command\": \"no_notify_machine\", \"args\": [\"m\"]}\n{\"command\": \"list_machines\"}\n",
	"{\"command\": \"where_is\", \"kwargs\": {\"machine\": \"m\", \"chip_x\": 10, \"chip_y\": 17}}\n{\"command\": \"where_is\", \"kwargs\": {\"job_id\": 1, \"chip_x\": 0, \"chip_y\": 0}}\n",
	"{\"command\": \"get_board_position\", \"args\": [\"m\", 0, 0, 0]}\n{\"command\": \"get_board_at_position\", \"args\": [\"m\", 0, 0, 0]}\n",
	"{\"command\": \"power_on_job_boards\", \"args\": [1.0]}\n{\"command\": \"job_keepalive\", \"kwargs\": {\"job_id\": 1, \"client\": 3}}\n",
	"\n\n   \n{\"command\": \"version\"",
	"{\"command\": \"nope\"}\n{\"command\": \"version\"}\n",
	"[1,2,3]\n",
	"{\"command\": \"create_job\", \"args\": [1e308, -0.0, 3]}\n",
	"\xff\xfe\n",
}

// FuzzConnection feeds arbitrary bytes as one connection: framing, decoding
// and every command against a fake backend. Every reply must be one JSON
// object line with exactly one of "return" and "exception"; a dispatch
// error or a too-long line ends the connection; nothing panics.
func FuzzConnection(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := newFakeBackend(machine4x2())
		s := NewSession("peer")
		lr := NewLineReader(bytes.NewReader(data), 4096)
		for {
			line, err := lr.ReadLine()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrLineTooLong) {
					t.Fatalf("ReadLine: %v", err)
				}
				return
			}
			if len(line) > 4096 {
				t.Fatalf("line of %d bytes past the limit", len(line))
			}
			reply, err := s.Handle(b, line)
			if err != nil {
				var de *DispatchError
				if !errors.As(err, &de) || reply != nil {
					t.Fatalf("Handle: %q, %v", reply, err)
				}
				return
			}
			if reply == nil {
				if len(bytes.TrimSpace(line)) != 0 {
					t.Fatalf("no reply to %q", line)
				}
				continue
			}
			checkReply(t, reply)
			_ = s.Notify([]int64{1, 2}, []string{"m"})
		}
	})
}

func checkReply(t *testing.T, reply []byte) {
	t.Helper()
	if !bytes.HasSuffix(reply, []byte("\n")) || bytes.Count(reply, []byte("\n")) != 1 {
		t.Fatalf("reply %q is not one line", reply)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(reply, &m); err != nil {
		t.Fatalf("reply %q is not a JSON object: %v", reply, err)
	}
	_, ret := m["return"]
	_, exc := m["exception"]
	if len(m) != 1 || ret == exc {
		t.Fatalf("reply %q has not exactly one of return and exception", reply)
	}
}

// FuzzHandle fuzzes single request lines, seeded with every command.
func FuzzHandle(f *testing.F) {
	for _, s := range fuzzSeeds {
		for _, l := range bytes.Split([]byte(s), []byte("\n")) {
			f.Add(l)
		}
	}
	for _, c := range Commands() {
		f.Add([]byte(`{"command": "` + c + `", "args": [1, 2], "kwargs": {"machine": "m", "x": 1}}`))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		reply, err := NewSession("p").Handle(newFakeBackend(machine4x2()), line)
		if err != nil || reply == nil {
			return
		}
		checkReply(t, reply)
	})
}

// FuzzScanner checks the request scanner against encoding/json: the same
// documents are valid (up to the nesting bound) and strings unquote alike.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`{"a": [1, -0.5e+3, "x\u00e9\n", true, null, {}]}`, `[]`, `"\ud800"`, `01`, `1.`, `-`, `{"a" 1}`, `[1,]`, `"\x01"`, `1e5`, `{"a":1}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sc := scanner{b: data}
		raw, err := sc.value()
		if err == nil {
			sc.ws()
			if sc.i != len(data) {
				err = errSyntax
			}
		}
		valid := json.Valid(data)
		if (err == nil) != valid && !(valid && bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")) > maxDepth) {
			t.Fatalf("scanner %v, encoding/json valid=%v for %q", err, valid, data)
		}
		if err == nil && len(raw) > 0 && raw[0] == '"' && utf8.Valid(raw) { // decode refuses invalid UTF-8 first
			var want string
			_ = json.Unmarshal(raw, &want)
			if got := unquote(raw); got != want {
				t.Fatalf("unquote(%s) = %q, want %q", raw, got, want)
			}
		}
	})
}
