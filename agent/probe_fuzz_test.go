package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// modelsAnswer answers every request with a status and a body, without a
// network.
type modelsAnswer struct {
	status int
	body   []byte
}

func (a modelsAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: a.status, Status: strconv.Itoa(a.status) + " " + http.StatusText(a.status),
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(a.body)), Request: r}, nil
}

// FuzzProbeModels: any answer of a vLLM endpoint's GET /v1/models — a
// fuzzed body, or a model list of n models {id, root} — to the agent's
// readiness probe. No panic; "ready" only when a listed model has the
// swap's served name (as id or root) and its root, when given, is the
// swap's model; and the reason it is not ready, which becomes a line of
// the swap's log and the failed swap's reason, is bounded (the server
// keeps MaxSwapLogLine bytes of a line, and takes a request body of 1 MiB
// by default) and, once escaped as the agent sends it, passes the text
// rule.
func FuzzProbeModels(f *testing.F) {
	f.Add(200, []byte(`{"object":"list","data":[{"id":"gemma","root":"google/gemma-3-27b-it"}]}`), "", "", uint16(0))
	f.Add(200, []byte(`{"data":[{"id":"llama","root":"meta/llama"}]}`), "", "", uint16(0))
	f.Add(200, []byte(`{"data":null}`), "", "", uint16(0))
	f.Add(200, []byte(nil), "other\x1b[2J", "x\u202e", uint16(3))
	f.Add(500, []byte(`oops`), "", "", uint16(0))
	f.Add(200, []byte(`[1,2]`), "", "", uint16(0))
	f.Fuzz(func(t *testing.T, status int, body []byte, id, root string, n uint16) {
		if status < 100 || status > 999 {
			return
		}
		if n > 0 {
			type model struct {
				ID   string `json:"id"`
				Root string `json:"root,omitempty"`
			}
			list := struct {
				Data []model `json:"data"`
			}{Data: make([]model, min(int(n), 20000))}
			for i := range list.Data {
				list.Data[i] = model{id, root}
			}
			body, _ = json.Marshal(list)
		}
		r := &swapRunner{http: &http.Client{Transport: modelsAnswer{status, body}}}
		sw := &arbiter.Swap{ID: "s1", Kind: arbiter.ServiceVLLM, ServedNames: []string{"gemma"}, Repo: "google/gemma-3-27b-it", ModelKey: "gemma"}
		why := r.probe(context.Background(), "http://127.0.0.1:8000/v1/models", sw)
		if why == "" {
			var models struct {
				Data []struct {
					ID   string `json:"id"`
					Root string `json:"root"`
				} `json:"data"`
			}
			json.Unmarshal(body, &models)
			ok := false
			for _, m := range models.Data {
				if (m.ID == "gemma" || m.Root == "gemma") && (m.Root == "" || strings.TrimRight(m.Root, "/") == sw.Repo) {
					ok = true
				}
			}
			if status < 200 || status > 299 || !ok {
				t.Fatalf("status %d body %q: ready, yet no model of the list serves gemma from %s", status, arbiter.Clip(string(body), 300), sw.Repo)
			}
			return
		}
		line := "arbiter agent: not ready yet: " + why
		if len(line) > arbiter.MaxSwapLogLine {
			t.Fatalf("status %d body %q…: the reason is %d bytes, more than a log line's %d: %q", status, arbiter.Clip(string(body), 200), len(line), arbiter.MaxSwapLogLine, arbiter.Clip(why, 200))
		}
		if err := arbiter.ValidateLines("reason", arbiter.EscapeText(line, true), len(line)*4+16); err != nil {
			t.Fatalf("status %d body %q: the escaped reason %q: %v", status, body, why, err)
		}
	})
}
