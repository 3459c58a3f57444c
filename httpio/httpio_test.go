package httpio

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func TestWriteJSON(t *testing.T) {
	w := httptest.NewRecorder()
	WriteJSON(w, 201, map[string]string{"html": "<b>&</b>"})
	if w.Code != 201 || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("X-Content-Type-Options") != "nosniff" ||
		w.Header().Get("Cache-Control") != "no-store" || strings.TrimSpace(w.Body.String()) != `{"html":"<b>&</b>"}` {
		t.Errorf("got %d %v %q", w.Code, w.Header(), w.Body.String())
	}
}

func TestOnlyParams(t *testing.T) {
	for _, tc := range []struct {
		query   string
		allowed []string
		want    string // "" for no error, else part of the message
	}{
		{"", nil, ""},
		{"state=ready", []string{"state", "owner"}, ""},
		{"stat=ready", []string{"state", "owner"}, `unknown query parameter "stat": this route takes state, owner`},
		{"x=1", nil, `unknown query parameter "x": this route takes none`},
	} {
		q, _ := url.ParseQuery(tc.query)
		err := OnlyParams(q, tc.allowed...)
		switch {
		case tc.want == "" && err != nil, tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: got %v, want %q", tc.query, err, tc.want)
		case err != nil && arbiter.ErrorCode(err) != arbiter.EInvalid:
			t.Errorf("%q: code %s, want invalid", tc.query, arbiter.ErrorCode(err))
		}
	}
}

func TestSince(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	if n, err := Since(r, "", 42); n != 42 || err != nil {
		t.Errorf("nothing given: %d %v, want the last sequence number", n, err)
	}
	if n, err := Since(r, "7", 42); n != 7 || err != nil {
		t.Errorf("since=7: %d %v", n, err)
	}
	r.Header.Set("Last-Event-ID", "9")
	if n, err := Since(r, "", 42); n != 9 || err != nil {
		t.Errorf("Last-Event-ID 9: %d %v", n, err)
	}
	for _, bad := range []string{"-1", "+3", "x", "1e3", "99999999999999999999"} {
		if _, err := Since(r, bad, 42); arbiter.ErrorCode(err) != arbiter.EInvalid {
			t.Errorf("since=%q: %v, want invalid", bad, err)
		}
	}
}

func FuzzSince(f *testing.F) {
	for _, s := range []string{"", "0", "17", "-1", "abc", "9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, err := Since(httptest.NewRequest("GET", "/", nil), v, 5)
		if err != nil {
			if arbiter.ErrorCode(err) != arbiter.EInvalid {
				t.Fatalf("since=%q: %v is not invalid", v, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("since=%q gave %d", v, n)
		}
	})
}

func TestContextError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ContextError(ctx, context.Canceled); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Errorf("a cancelled request: %v, want unavailable", err)
	}
	other := errors.New("boom")
	if err := ContextError(context.Background(), other); err != other {
		t.Errorf("another error: %v, want it unchanged", err)
	}
}
