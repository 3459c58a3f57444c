package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// hostile is what a server that lets anything through could hand back
// (issue 12, finding 4): a screen clear, a colour, a fake row, a bidi
// override.
const hostile = "bob\x1b[2J\x1b[31mFAKE\nroot gpu0 ready\u202e"

// hostileServer answers the reads of ps, tasks list and lock show with
// the hostile text in every free-text field.
func hostileServer(t *testing.T) string {
	t.Helper()
	now := time.Now().UTC()
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /api/v1/allocations", func(w http.ResponseWriter, _ *http.Request) {
		answer(w, map[string]any{"allocations": []arbiter.Allocation{{
			ID: 1, Owner: hostile, Label: hostile, State: arbiter.StateQueued, CreatedAt: now,
			WhyQueued: arbiter.Str(hostile), Request: arbiter.Request{GPUs: 1},
		}}})
	})
	mux.HandleFunc("GET /api/v1/tasks", func(w http.ResponseWriter, _ *http.Request) {
		answer(w, map[string]any{"tasks": []arbiter.Task{{
			ID: strings.Repeat("a", 64), Name: hostile, Status: arbiter.TaskFailed, ClaimedBy: hostile,
			LastError: hostile, InManifest: true, UpdatedAt: now, Spec: &arbiter.TaskSpec{},
		}}})
	})
	mux.HandleFunc("GET /api/v1/locks/{name}", func(w http.ResponseWriter, _ *http.Request) {
		exp := now.Add(time.Minute)
		answer(w, arbiter.LockState{Name: "l", Held: true, Holder: hostile, Fence: 1, ExpiresAt: &exp})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"code":"invalid","message":"` + "no\\u001b[2J such\\nrow\\u202e" + `"}}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestCLIEscapesWhatItPrints is finding 4 seen from the terminal: nothing
// the server hands back reaches it as a control sequence or a fake row,
// in tables, in JSON or in error messages.
func TestCLIEscapesWhatItPrints(t *testing.T) {
	url := hostileServer(t)
	for _, args := range [][]string{
		{"ps"},
		{"ps", "-o", "json"},
		{"tasks", "list"},
		{"lock", "show", "l"},
		{"release", "7"},
	} {
		_, out, errs := runCLI(t, url, args...)
		for _, s := range []string{out, errs} {
			if strings.ContainsAny(s, "\x1b\u202e\r") {
				t.Errorf("arbiter %v printed a control character: %q", args, s)
			}
			for _, line := range strings.Split(s, "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "root gpu0") {
					t.Errorf("arbiter %v printed a fake row: %q", args, s)
				}
			}
		}
		if args[len(args)-1] == "json" {
			var v []arbiter.Allocation
			if err := json.Unmarshal([]byte(out), &v); err != nil || len(v) != 1 || v[0].Owner != hostile {
				t.Errorf("-o json is no longer the same JSON: %v %+v", err, v)
			}
		}
	}
	_, out, _ := runCLI(t, url, "ps")
	if !strings.Contains(out, `bob\x1b[2J\x1b[31mFAKE\nroot gpu0 ready\u202e`) {
		t.Errorf("ps does not show the owner escaped:\n%s", out)
	}
}

// TestTermWriterKeepsRawOutput: what is not the server's text (a command
// run under alloc, an artifact on stdout) bypasses the escaping.
func TestTermWriterKeepsRawOutput(t *testing.T) {
	var b strings.Builder
	w := newTermWriter(&b)
	if newTermWriter(w) != w {
		t.Fatal("wrapped twice")
	}
	if n, err := w.Write([]byte("a\x1bb\n\tc")); err != nil || n != 6 {
		t.Fatalf("Write = %d, %v; want 6 (the bytes given)", n, err)
	}
	if got, want := b.String(), "a\\x1bb\n\tc"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if rawOut(w) != &b {
		t.Fatal("rawOut does not unwrap")
	}
}

// TestTableKeepsCharactersWhole: a table longer than its buffer keeps
// every multi-byte character whole (the escaping sees whole cells).
func TestTableKeepsCharactersWhole(t *testing.T) {
	var buf bytes.Buffer
	tw := newTable(newTermWriter(&buf), 0)
	fmt.Fprintln(tw, "ID\tLABEL")
	fmt.Fprintln(tw, "x\ty") // an odd byte: the buffer's edge falls inside a character
	for i := 0; i < 100; i++ {
		fmt.Fprintf(tw, "%d\t%s\n", i, safe(strings.Repeat("é", 41)))
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	if i := strings.Index(buf.String(), `\x`); i >= 0 {
		t.Fatalf("a character cut in two: %q", buf.String()[max(i-20, 0):i+20])
	}
	if n := strings.Count(buf.String(), "é"); n != 4100 {
		t.Fatalf("%d characters é, want 4,100", n)
	}
}

// TestJSONOutputStaysJSON: -o json through the terminal's escaping is
// still JSON, and the same strings, whatever a value holds.
func TestJSONOutputStaysJSON(t *testing.T) {
	var buf bytes.Buffer
	in := map[string]string{"owner": "eve\x7fx\x1b[2J\u202e\u0085é"}
	if err := WriteJSON(newTermWriter(&buf), in); err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, buf.Bytes())
	}
	if out["owner"] != in["owner"] {
		t.Fatalf("owner %q, want %q", out["owner"], in["owner"])
	}
}
