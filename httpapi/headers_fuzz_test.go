package httpapi

// Fuzz targets for what the server reads from headers rather than a body:
// the artifact uploads (any bytes, any X-Content-SHA256) and the headers
// that carry a credential or a name (X-Lab-Host, X-Operator-Token,
// X-Lock-Token, X-Swap-Lock-Token), over the real control loop.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter/artifact"
)

// wireHeader is v as a handler would see it after net/http read it off
// the wire: false for a value net/http refuses (control characters other
// than a tab), else v without its leading and trailing spaces and tabs.
func wireHeader(v string) (string, bool) {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return "", false
		}
	}
	return strings.Trim(v, " \t"), true
}

// FuzzArtifactUpload: any bytes with any X-Content-SHA256 (the bytes' own
// hash, written in upper case or with spaces, or anything at all) to both
// upload routes (PUT /api/v1/tasks/{id}/artifact and the fleet's PUT
// /v1/model/{id}). Never a 5xx (503 aside); the bytes are taken exactly
// when the header names their sha256; a refused upload stores nothing and
// emits no event; an accepted one answers the bytes' hash as the id, and
// the store gives back those very bytes under it.
func FuzzArtifactUpload(f *testing.F) {
	e := newFuzzEnv(f)
	h := e.srv.Handler()
	arts := e.srv.tasks.Artifacts.(*artifact.Store)
	f.Add(uint8(0), []byte("weights"), uint8(0), "")
	f.Add(uint8(1), []byte("weights"), uint8(1), "")
	f.Add(uint8(0), []byte(""), uint8(2), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
	f.Add(uint8(1), []byte("x"), uint8(2), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85")
	f.Add(uint8(1), []byte("x"), uint8(2), "../../etc/passwd")
	f.Add(uint8(0), []byte("\x00\xff"), uint8(3), "")
	f.Fuzz(func(t *testing.T, route uint8, body []byte, how uint8, header string) {
		sum := sha256.Sum256(body)
		want := hex.EncodeToString(sum[:])
		switch how % 4 {
		case 0:
			header = want
		case 1:
			header = " " + strings.ToUpper(want) + "\t"
		case 3:
			header = want[:63] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", want[63])+1)%16])
		}
		header, ok := wireHeader(header)
		if !ok {
			return
		}
		target := "/api/v1/tasks/" + e.task + "/artifact?worker=gpubox"
		if route%2 == 1 {
			target = "/v1/model/" + e.task
		}
		r := testRequest("PUT", target, bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+testAgent)
		r.Header.Set("X-Lab-Host", "gpubox")
		r.Header.Set("Content-Type", "application/octet-stream")
		if header != "" {
			r.Header.Set("X-Content-SHA256", header)
		}
		had := arts.Has(want)
		blobs, err := arts.List()
		if err != nil {
			t.Fatal(err)
		}
		before := e.loop.LastSeq()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("PUT %s X-Content-SHA256 %q, %d bytes: %d %s", target, header, len(body), w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("PUT %s X-Content-SHA256 %q: the answer is not JSON: %s", target, header, w.Body)
		}
		named := strings.ToLower(strings.TrimSpace(header)) == want
		if named != (w.Code < 300) {
			t.Fatalf("PUT %s X-Content-SHA256 %q for bytes of sha256 %s: %d %s", target, header, want, w.Code, w.Body)
		}
		if w.Code >= 400 {
			after, _ := arts.List()
			if len(after) != len(blobs) || (!had && arts.Has(want)) {
				t.Fatalf("PUT %s X-Content-SHA256 %q refused (%d) yet the store went from %d to %d blobs", target, header, w.Code, len(blobs), len(after))
			}
			if e.loop.LastSeq() != before {
				t.Fatalf("PUT %s X-Content-SHA256 %q refused (%d) yet events were emitted", target, header, w.Code)
			}
			return
		}
		var ans struct {
			ArtifactID string `json:"artifact_id"` // the fleet's answer
			Artifact   struct {
				ID string `json:"id"`
			} `json:"artifact"` // the native one
		}
		json.Unmarshal(w.Body.Bytes(), &ans)
		if id := ans.ArtifactID + ans.Artifact.ID; id != want {
			t.Fatalf("PUT %s: accepted as %q, want the bytes' sha256 %s: %s", target, id, want, w.Body)
		}
		rc, size, err := arts.Open(want)
		if err != nil {
			t.Fatalf("accepted %s, yet the store cannot open it: %v", want, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || size != int64(len(body)) || !bytes.Equal(got, body) {
			t.Fatalf("accepted %s (%d bytes), the store gives back %d bytes (size %d): %v", want, len(body), len(got), size, err)
		}
	})
}

// FuzzCredentialHeaders: any value of the headers that name a caller or
// carry a secret, on the routes that read them: X-Lock-Token (extend,
// release), X-Swap-Lock-Token (a swap request, not a dry run, which reads
// no lock; the compatible lock's release), X-Operator-Token (the fleet's
// operator routes: cancel, manifest reload, the job list) and X-Lab-Host
// (a /v1 worker call without other credentials). Never a 5xx (503 aside);
// a refused call emits no event; and nothing is let in unless the secret
// is exactly right: "{token}" and "{op}" in the value stand for the
// lock's token and the operator token, so the fuzzer tries near misses.
func FuzzCredentialHeaders(f *testing.F) {
	e := newFuzzEnv(f)
	h := e.srv.Handler()
	call := func(method, target string, hdr map[string]string, body string) *httptest.ResponseRecorder {
		r := testRequest(method, target, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	tokens := map[string]string{}
	acquire := func(tb testing.TB, name string) {
		w := call("POST", "/api/v1/locks/"+name, map[string]string{"Authorization": "Bearer " + testAdmin}, `{"holder":"ops","ttl_s":86400}`)
		var g struct {
			Token string `json:"token"`
		}
		if json.Unmarshal(w.Body.Bytes(), &g); w.Code != 200 && w.Code != 201 || g.Token == "" {
			tb.Fatalf("acquire %s: %d %s", name, w.Code, w.Body)
		}
		tokens[name] = g.Token
	}
	acquire(f, "gpu")
	acquire(f, "swap") // guards the default service's swaps too; swap:vllm is left free
	type route struct {
		method, path, header, lock, body string
		bearer                           string
	}
	routes := []route{
		{"POST", "/api/v1/locks/gpu/extend", "X-Lock-Token", "gpu", `{}`, testUser},
		{"DELETE", "/api/v1/locks/gpu", "X-Lock-Token", "gpu", ``, testUser},
		{"POST", "/api/v1/services/vllm/swaps", "X-Swap-Lock-Token", "swap", `{"model_key":"gemma"}`, testUser},
		{"DELETE", "/api/swap/lock", "X-Swap-Lock-Token", "swap", ``, testUser},
		{"POST", "/v1/job/{task}/cancel", "X-Operator-Token", "", ``, ""},
		{"POST", "/v1/manifest/reload", "X-Operator-Token", "", ``, ""},
		{"GET", "/v1/jobs", "X-Operator-Token", "", ``, ""},
		{"POST", "/v1/job/{task}/heartbeat", "X-Lab-Host", "", ``, ""},
		{"POST", "/v1/job/{task}/heartbeat", "X-Lab-Host", "", ``, testAgent},
	}
	for i := range routes {
		f.Add(uint8(i), "{token}")
		f.Add(uint8(i), "{op}")
	}
	f.Add(uint8(0), "{token}x")
	f.Add(uint8(3), " {token}\t")
	f.Add(uint8(4), "{op}\x00")
	f.Add(uint8(7), "gpubox")
	f.Add(uint8(8), "../gpu box")
	f.Fuzz(func(t *testing.T, ri uint8, val string) {
		rt := routes[int(ri)%len(routes)]
		if rt.lock != "" && tokens[rt.lock] == "" {
			acquire(t, rt.lock)
		}
		val = strings.ReplaceAll(strings.ReplaceAll(val, "{token}", tokens[rt.lock]), "{op}", taskOpToken)
		val, ok := wireHeader(val)
		if !ok {
			return
		}
		hdr := map[string]string{rt.header: val}
		if rt.bearer != "" {
			hdr["Authorization"] = "Bearer " + rt.bearer
		}
		target := strings.ReplaceAll(rt.path, "{task}", e.task)
		before := e.loop.LastSeq()
		w := call(rt.method, target, hdr, rt.body)
		if w.Code >= 500 && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s %s: %q: %d %s", rt.method, target, rt.header, val, w.Code, w.Body)
		}
		if w.Code >= 400 && e.loop.LastSeq() != before {
			t.Fatalf("%s %s %s: %q: refused (%d) yet events were emitted", rt.method, target, rt.header, val, w.Code)
		}
		in := w.Code != http.StatusUnauthorized && w.Code != http.StatusForbidden && w.Code != http.StatusLocked
		switch rt.header {
		case "X-Lock-Token", "X-Swap-Lock-Token":
			if w.Code < 300 && val != tokens[rt.lock] {
				t.Fatalf("%s %s with %s %q (the token is %q): %d %s", rt.method, target, rt.header, val, tokens[rt.lock], w.Code, w.Body)
			}
			if w.Code < 300 && rt.method == "DELETE" {
				tokens[rt.lock] = "" // released: taken again by the next call
			}
		case "X-Operator-Token":
			if in && val != taskOpToken {
				t.Fatalf("%s %s with %s %q: let in: %d %s", rt.method, target, rt.header, val, w.Code, w.Body)
			}
		case "X-Lab-Host":
			if rt.bearer == "" && in {
				t.Fatalf("%s %s with %s %q and no credentials: let in: %d %s", rt.method, target, rt.header, val, w.Code, w.Body)
			}
		}
	})
}
